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

/// `None` when `--help` was asked for.
fn parse(args: Vec<OsString>) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut output = PathBuf::from("memory.html");
    let mut traces = Vec::new();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('o') | Long("output") => output = p.value()?.into(),
            Short('h') | Long("help") => return Ok(None),
            Value(t) => traces.push(t.into()),
            other => return Err(other.unexpected()),
        }
    }
    if traces.is_empty() {
        return Err("no trace file given".into());
    }
    Ok(Some(Options { output, traces }))
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

/// The page for a model.
fn page(model: &model::Model) -> String {
    let data = json::model(model);
    PAGE.replacen("/*CUHOOK_SCRIPT*/", SCRIPT, 1)
        .replacen("/*CUHOOK_DATA*/", &data, 1)
}

/// Open every trace (sorted so that lanes come in rank order) and read it into the model,
/// saying on stderr what could not be read. `Err` holds the message of a failure that leaves
/// nothing to show: a file that cannot be read, or no event in any of them.
pub fn read_traces(program: &str, mut paths: Vec<PathBuf>) -> Result<model::Model, String> {
    paths.sort_by_cached_key(|p| natural_key(&p.to_string_lossy()));
    let mut traces = Vec::new();
    for path in &paths {
        match std::fs::File::open(path) {
            Ok(f) => traces.push((
                path.display().to_string(),
                std::io::BufReader::with_capacity(1 << 20, f),
            )),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        }
    }
    let model = model::build(traces).map_err(|e| format!("cannot read a trace: {e}"))?;
    for (name, tally) in &model.tallies {
        if let Some(problem) = tally.problem() {
            eprintln!("{program}: {name}: {problem}");
        }
    }
    if model.tallies.iter().all(|(_, t)| t.events == 0) {
        let names: Vec<String> = model.tallies.iter().map(|(n, _)| n.clone()).collect();
        return Err(crate::cli::reader::no_event_in(&names));
    }
    for (name, tally) in &model.tallies {
        if tally.events == 0 && tally.lines == 0 {
            eprintln!("{program}: {name}: empty (no CUDA allocation or free was traced)");
        }
    }
    Ok(model)
}

pub fn main(args: Vec<OsString>) -> i32 {
    let opts = match super::args::options_or_exit(parse(args), "view", HELP) {
        Ok(o) => o,
        Err(status) => return status,
    };
    let model = match read_traces("cuhook view", opts.traces) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cuhook view: {e}; no page written.");
            return 1;
        }
    };
    let count = model.tallies.len();
    if let Err(e) = std::fs::write(&opts.output, page(&model)) {
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
        let o = parse(vec![
            "-o".into(),
            "m.html".into(),
            "t.10.jsonl".into(),
            "t.2.jsonl".into(),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.output, PathBuf::from("m.html"));
        assert_eq!(o.traces.len(), 2);
        let o = parse(vec!["--output=n.html".into(), "t.jsonl".into()])
            .unwrap()
            .unwrap();
        assert_eq!(o.output, PathBuf::from("n.html"));
        assert_eq!(
            super::super::args::explain(parse(vec![]).unwrap_err()),
            "no trace file given"
        );
        assert!(natural_key("t.2.jsonl") < natural_key("t.10.jsonl"));
        assert!(natural_key("a/t.9.jsonl") < natural_key("b/t.1.jsonl"));
    }

    #[test]
    fn the_page_is_self_contained() {
        let line = r#"{"event":"alloc","api":"cudaMalloc","address":"0x10","size":1}"#;
        let model = model::build(vec![("x</script>.jsonl".to_owned(), line.as_bytes())]).unwrap();
        let html = page(&model);
        assert!(!html.contains("/*CUHOOK_DATA*/") && !html.contains("/*CUHOOK_SCRIPT*/"));
        // One closing tag per script element: no name can end one early.
        assert_eq!(html.matches("</script>").count(), 2);
        for external in ["http://", "https://", "src=", "href="] {
            assert!(!html.contains(external), "{external}");
        }
    }
}
