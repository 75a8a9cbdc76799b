//! `cuhook demo`: the bundled demo programs under cuhook, with a readable trace and the report.

use cuhook::report::replay::field;

use super::run::{exit_code, run_under_cuhook};
use std::ffi::OsString;

const HELP: &str = "\
Usage: cuhook demo

Runs three small CUDA programs that know nothing about cuhook — one on the driver API, one on
the shared CUDA runtime, one with the runtime linked statically (nvcc's default) — under cuhook,
on the fake CUDA driver of this crate's tests (compiled first, with `cc` or $CC), and shows what cuhook saw: every
allocation and free as it happened, and the exit report. On a machine with a GPU, run your own
program with `cuhook run -- COMMAND`.
";

const PROGRAMS: [(&str, &str); 3] = [
    ("demo_driver", "driver API: cuMemAlloc, stream-ordered pool reuse, VMM map/unmap, pinned host, a _ptsz entry point"),
    ("demo_rt_shared", "shared CUDA runtime (libcudart.so): cudaMalloc, cudaMallocAsync, managed, pinned host"),
    ("demo_rt_static", "static CUDA runtime: the same calls, visible only through cuGetProcAddress"),
];

fn human(size: &str) -> String {
    let n: f64 = size.parse().unwrap_or(0.0);
    match n {
        n if n >= (1 << 20) as f64 => format!("{:.1} MiB", n / (1 << 20) as f64),
        n if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        n => format!("{n} B"),
    }
}

fn readable(line: &str) -> String {
    let flags: u32 = field(line, "flags").parse().unwrap_or(0);
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
        if flags & bit != 0 {
            tags.push(name);
        }
    }
    format!(
        "  {:<5} {:<26} {:>16} {:>10}  {:<7} dev {:<2} {}",
        field(line, "event"),
        field(line, "api"),
        field(line, "address"),
        human(field(line, "size")),
        field(line, "mem_type"),
        field(line, "device"),
        tags.join(",")
    )
}

pub fn main(args: &[OsString]) -> i32 {
    if super::wants_help(args) {
        print!("{HELP}");
        return 0;
    }
    let build_dir = std::env::temp_dir().join(format!("cuhook-demo-{}", std::process::id()));
    let dir = match super::demo_build::build(&build_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cuhook demo: {e}");
            let _ = std::fs::remove_dir_all(&build_dir);
            return 1;
        }
    };
    println!("cuhook demo: three CUDA programs on the fake driver, each run with libcuhook.so preloaded.\n");
    let mut worst = 0;
    for (program, what) in PROGRAMS {
        let trace = build_dir.join(format!("{program}.jsonl"));
        let _ = std::fs::remove_file(&trace);
        println!("━━ {program}: {what}");
        let outcome =
            match run_under_cuhook(&[dir.join(program).into_os_string()], Some(&trace), &[]) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("cuhook demo: {e}");
                    let _ = std::fs::remove_dir_all(&build_dir);
                    return 1;
                }
            };
        println!("Events, in order:");
        let text = std::fs::read_to_string(&trace).unwrap_or_default();
        for line in text.lines() {
            println!("{}", readable(line));
        }
        let _ = std::fs::remove_file(&trace);
        for r in &outcome.reports {
            println!("\n{r}");
        }
        worst = worst.max(exit_code(outcome.status));
    }
    let _ = std::fs::remove_dir_all(&build_dir);
    println!("Try it on your own program: cuhook run -- COMMAND (e.g. `cuhook run -- python3 train.py`).");
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_read_back() {
        let line = "{\"event\":\"alloc\",\"api\":\"cuMemAllocAsync\",\"address\":\"0x7f00\",\"size\":2097152,\"mem_type\":\"cuda\",\"device\":0,\"flags\":3,\"stream\":\"0x1\",\"pool\":\"0x0\",\"tid\":7}";
        assert_eq!(field(line, "api"), "cuMemAllocAsync");
        assert_eq!(field(line, "size"), "2097152");
        let r = readable(line);
        assert!(
            r.contains("2.0 MiB") && r.contains("stream-ordered,pool"),
            "{r}"
        );
    }
}
