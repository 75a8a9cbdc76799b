//! `cuhook demo`: the bundled demo programs under cuhook, with a readable trace and the report;
//! `--keep DIR` keeps the traces and reports for `cuhook view`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use cuhook::report::replay::TraceEvent;

use super::private_dir::PrivateDir;
use super::run::{exit_code, run_under_cuhook};

const HELP: &str = "\
Usage: cuhook demo [--keep DIR] [--lib PATH]

Runs three small CUDA programs that know nothing about cuhook — one on the driver API, one on
the shared CUDA runtime, one with the runtime linked statically (nvcc's default) — under cuhook,
on the fake CUDA driver of this crate's tests (compiled first, with `cc` or $CC), and shows
what cuhook saw: every allocation and free as it happened, and the exit report. On a machine
with a GPU, run your own program with `cuhook run -- COMMAND`.

  --keep DIR   keep each program's trace (DIR/NAME.jsonl) and report (DIR/NAME.txt), and
               print the `cuhook view` command that draws them
  --lib PATH   the libcuhook.so to preload (default: as `cuhook run` finds it)
  -h, --help   this text
";

/// Parsed `demo` options.
#[derive(Debug, Default, PartialEq)]
struct Options {
    keep: Option<PathBuf>,
    lib: Option<PathBuf>,
}

/// `None` when `--help` was asked for.
fn parse(args: Vec<OsString>) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut o = Options::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Long("keep") => o.keep = Some(p.value()?.into()),
            Long("lib") => o.lib = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(None),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Some(o))
}

const PROGRAMS: [(&str, &str); 3] = [
    ("demo_driver", "driver API: cuMemAlloc, stream-ordered pool reuse, VMM map/unmap, pinned host, a _ptsz entry point"),
    ("demo_rt_shared", "shared CUDA runtime (libcudart.so): cudaMalloc, cudaMallocAsync, managed, pinned host"),
    ("demo_rt_static", "static CUDA runtime: the same calls, visible only through cuGetProcAddress"),
];

fn human(size: u64) -> String {
    let n = size as f64;
    match n {
        n if n >= (1 << 20) as f64 => format!("{:.1} MiB", n / (1 << 20) as f64),
        n if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        n => format!("{n} B"),
    }
}

fn readable(ev: &TraceEvent) -> String {
    let mut tags = Vec::new();
    for (bit, name) in [
        (1, "stream-ordered"),
        (2, "pool"),
        (4, "vmm"),
        (8, "pinned"),
        (16, "registered"),
        (64, "purged"),
        (128, "global"),
        (256, "imported"),
        (512, "graph"),
    ] {
        if ev.flags & bit != 0 {
            tags.push(name);
        }
    }
    let kind = match ev.kind {
        cuhook::events::EventKind::Alloc => "alloc",
        cuhook::events::EventKind::Free => "free",
    };
    format!(
        "  {:<5} {:<26} {:>16} {:>10}  {:<7} dev {:<2} {}",
        kind,
        ev.api,
        format!("{:#x}", ev.address),
        human(ev.size),
        ev.mem_type.name(),
        ev.device,
        tags.join(",")
    )
}

/// Print the events of the trace at `path`, readably.
fn print_trace(path: &Path) {
    let read = std::fs::File::open(path).and_then(|f| {
        super::reader::read(std::io::BufReader::new(f), |ev| {
            println!("{}", readable(ev))
        })
    });
    match read {
        Ok(tally) => {
            if let Some(problem) = tally.problem() {
                println!("  ({problem})");
            }
        }
        Err(e) => println!("  (no trace: {e})"),
    }
}

pub fn main(args: Vec<OsString>) -> i32 {
    let opts = match super::args::options_or_exit(parse(args), "demo", HELP) {
        Ok(o) => o,
        Err(status) => return status,
    };
    let lib = match super::library::find(opts.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cuhook demo: {e}");
            return super::run::SETUP_FAILED;
        }
    };
    if let Some(keep) = &opts.keep {
        if let Err(e) = std::fs::create_dir_all(keep) {
            eprintln!("cuhook demo: --keep {}: {e}", keep.display());
            return super::run::SETUP_FAILED;
        }
    }
    // Removed on every way out.
    let build = match PrivateDir::new("cuhook-demo-") {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "cuhook demo: cannot create a directory in {}: {e}",
                std::env::temp_dir().display()
            );
            return super::run::SETUP_FAILED;
        }
    };
    let dir = match super::demo_build::build(build.path()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuhook demo: {e}");
            return 1;
        }
    };
    let out_dir = opts.keep.as_deref().unwrap_or(build.path());
    println!("cuhook demo: three CUDA programs on the fake driver, each run with libcuhook.so preloaded.\n");
    let mut worst = 0;
    let mut kept = Vec::new();
    for (program, what) in PROGRAMS {
        let trace = out_dir.join(format!("{program}.jsonl"));
        let _ = std::fs::remove_file(&trace);
        println!("━━ {program}: {what}");
        let outcome = match run_under_cuhook(
            &lib,
            &[dir.join(program).into_os_string()],
            Some(&trace),
            &[],
        ) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("cuhook demo: {e}");
                return 1;
            }
        };
        println!("Events, in order:");
        print_trace(&trace);
        for r in &outcome.reports {
            println!("\n{r}");
        }
        if opts.keep.is_some() {
            let report = out_dir.join(format!("{program}.txt"));
            if let Err(e) = std::fs::write(&report, outcome.reports.join("\n")) {
                eprintln!("cuhook demo: cannot write {}: {e}", report.display());
                return 1;
            }
            kept.push(trace);
        }
        worst = worst.max(exit_code(outcome.status));
    }
    let me = std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cuhook".to_owned());
    if let Some(keep) = &opts.keep {
        let traces: Vec<String> = kept.iter().map(|t| t.display().to_string()).collect();
        println!(
            "Kept in {}: each program's trace (NAME.jsonl) and report (NAME.txt). Draw them:\n  {me} view -o {} {}",
            keep.display(),
            keep.join("memory.html").display(),
            traces.join(" ")
        );
    }
    println!(
        "Try it on your own program: {me} run -- COMMAND (e.g. `{me} run -- python3 train.py`)."
    );
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_read_back() {
        let line = "{\"event\":\"alloc\",\"api\":\"cuMemAllocAsync\",\"address\":\"0x7f00\",\"size\":2097152,\"mem_type\":\"cuda\",\"device\":0,\"flags\":3,\"stream\":\"0x1\",\"pool\":\"0x0\",\"tid\":7}";
        let mut rows = Vec::new();
        super::super::reader::read(line.as_bytes(), |ev| rows.push(readable(ev))).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert!(
            r.contains("cuMemAllocAsync")
                && r.contains("2.0 MiB")
                && r.contains("stream-ordered,pool"),
            "{r}"
        );
    }

    #[test]
    fn options() {
        let o = parse(vec!["--keep=out".into(), "--lib".into(), "l.so".into()])
            .unwrap()
            .unwrap();
        assert_eq!(o.keep, Some("out".into()));
        assert_eq!(o.lib, Some("l.so".into()));
        let e = parse(vec!["extra".into()]).unwrap_err();
        assert_eq!(
            super::super::args::explain(e),
            "unexpected argument `extra`"
        );
    }
}
