//! `cuhook view TRACE.jsonl... -o memory.html`: the traces as one self-contained HTML page (no
//! network): live bytes over time per device and memory type, allocations and frees coloured
//! by API, peaks marked, details on hover, and the exit report's summary; one lane per trace
//! (per rank under MPI).

mod json;
mod model;

use std::ffi::OsString;
use std::path::PathBuf;

const HELP: &str = "\
Usage: cuhook view [-o FILE] TRACE.jsonl...

Writes FILE (default memory.html): one self-contained HTML page, no network needed, showing
each trace (written by `cuhook run --trace` or CUHOOK_TRACE) as a lane: live bytes over time
per memory type and device, peaks marked, allocation and free events coloured by API, details
of any moment on hover, and the same summary as the exit report. Give several traces (e.g.
t.*.jsonl from `mpirun ... cuhook run --trace t.%r.jsonl`) for one lane per rank. Large traces
are downsampled for drawing; the summaries and peaks stay exact. Open the page with
`#order` for the event-order axis, `#bucket=N` to pin the details of bucket N (0-1199).

  -o, --output FILE   where to write the page
";

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");

/// Parsed `view` options.
#[derive(Debug, PartialEq)]
struct Options {
    output: PathBuf,
    traces: Vec<PathBuf>,
}

fn parse(args: &[OsString]) -> Result<Options, String> {
    let mut output = PathBuf::from("memory.html");
    let mut traces = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].to_str() {
            Some("-o" | "--output") => {
                output = args
                    .get(i + 1)
                    .ok_or("-o needs a file name")?
                    .clone()
                    .into();
                i += 2;
            }
            Some(s) if s.starts_with('-') && s.len() > 1 => {
                return Err(format!("unknown option `{s}`"))
            }
            _ => {
                traces.push(args[i].clone().into());
                i += 1;
            }
        }
    }
    if traces.is_empty() {
        return Err("no trace file given".to_owned());
    }
    Ok(Options { output, traces })
}

/// Sort key that orders `t.2.jsonl` before `t.10.jsonl` (lanes in rank order).
fn natural_key(name: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut text = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut n = u64::from(c as u8 - b'0');
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            key.push((std::mem::take(&mut text), n));
        } else {
            text.push(c);
        }
    }
    key.push((text, 0));
    key
}

/// The page for `traces` (name, reader).
fn page<R: std::io::BufRead>(traces: Vec<(String, R)>) -> std::io::Result<String> {
    let data = json::model(&model::build(traces)?);
    Ok(PAGE
        .replacen("/*CUHOOK_SCRIPT*/", SCRIPT, 1)
        .replacen("/*CUHOOK_DATA*/", &data, 1))
}

pub fn main(args: &[OsString]) -> i32 {
    if super::wants_help(args) {
        print!("{HELP}");
        return 0;
    }
    let mut opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuhook view: {e}. Try `cuhook view --help`.");
            return super::USAGE_ERROR;
        }
    };
    opts.traces
        .sort_by_cached_key(|p| natural_key(&p.to_string_lossy()));
    let mut traces = Vec::new();
    for path in &opts.traces {
        match std::fs::File::open(path) {
            Ok(f) => traces.push((
                path.display().to_string(),
                std::io::BufReader::with_capacity(1 << 20, f),
            )),
            Err(e) => {
                eprintln!("cuhook view: cannot read {}: {e}", path.display());
                return 1;
            }
        }
    }
    let count = traces.len();
    let html = match page(traces) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cuhook view: cannot read a trace: {e}");
            return 1;
        }
    };
    if let Err(e) = std::fs::write(&opts.output, html) {
        eprintln!("cuhook view: cannot write {}: {e}", opts.output.display());
        return 1;
    }
    println!(
        "cuhook view: wrote {} ({} trace{})",
        opts.output.display(),
        count,
        if count == 1 { "" } else { "s" }
    );
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_lane_order() {
        let o = parse(&[
            "-o".into(),
            "m.html".into(),
            "t.10.jsonl".into(),
            "t.2.jsonl".into(),
        ])
        .unwrap();
        assert_eq!(o.output, PathBuf::from("m.html"));
        assert_eq!(o.traces.len(), 2);
        assert_eq!(parse(&[]).unwrap_err(), "no trace file given");
        assert!(natural_key("t.2.jsonl") < natural_key("t.10.jsonl"));
        assert!(natural_key("a/t.9.jsonl") < natural_key("b/t.1.jsonl"));
    }

    #[test]
    fn the_page_is_self_contained() {
        let html = page(vec![("x</script>.jsonl".to_owned(), &b""[..])]).unwrap();
        assert!(!html.contains("/*CUHOOK_DATA*/") && !html.contains("/*CUHOOK_SCRIPT*/"));
        // One closing tag per script element: no name can end one early.
        assert_eq!(html.matches("</script>").count(), 2);
        for external in ["http://", "https://", "src=", "href="] {
            assert!(!html.contains(external), "{external}");
        }
    }
}
