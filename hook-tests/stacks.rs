//! Call sites of live memory (issue 37): a program that leaks from three call sites, run under
//! `libcuhook.so` with `CUHOOK_STACKS`, gets an exit report that groups its live ranges by call
//! site, each named by function and source line (the program is built without frame pointers:
//! the stacks come from the unwind tables).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `fixtures/stacks/leaks.c`, built with debug information and without frame pointers.
fn build_leaks(dir: &Path) -> PathBuf {
    build_leaks_with(dir, &[])
}

/// [`build_leaks`] with more arguments for the compiler driver (linker options).
fn build_leaks_with(dir: &Path, extra: &[&str]) -> PathBuf {
    let fixtures = common::fixtures_dir();
    let exe = dir.join("leaks");
    let status = cuhook_fixtures::cc()
        .args(extra)
        .args(["-O1", "-g", "-fomit-frame-pointer", "-rdynamic", "-o"])
        .arg(&exe)
        .arg(root().join("fixtures/stacks/leaks.c"))
        .arg("-I")
        .arg(root().join("fixtures/cuda"))
        .arg(format!("-L{}", fixtures.display()))
        .arg("-l:libcuda.so.1")
        .arg(format!("-Wl,-rpath,{}", fixtures.display()))
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling fixtures/stacks/leaks.c failed");
    exe
}

/// The line of `MARK(name)` in leaks.c.
fn marked_line(name: &str) -> usize {
    let text = std::fs::read_to_string(root().join("fixtures/stacks/leaks.c")).unwrap();
    let mark = format!("MARK({name})");
    text.lines()
        .position(|l| l.contains(&mark))
        .expect("marker")
        + 1
}

fn run_leaks(exe: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", common::libcuhook())
        .env("CUHOOK_REPORT", "stderr")
        .env_remove("CUHOOK_DISABLE")
        .env_remove("CUHOOK_TRACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(stdout.lines().next(), Some("leaked 9"));
    format!("{stdout}{err}")
}

/// The report's call-site section: one block per site, largest first, with count, bytes and
/// API, then frames naming the leaking function at the allocation's line and `main`; the
/// balanced site (all freed) is not there; cuhook's own frames are not in any stack.
#[test]
fn the_exit_report_names_the_lines_that_leaked() {
    let dir = common::scratch("stacks-report");
    let exe = build_leaks(&dir);
    let report = run_leaks(&exe, &[("CUHOOK_STACKS", "16")]);
    let section = report
        .split("Live allocations at exit by call site")
        .nth(1)
        .unwrap_or_else(|| panic!("no call-site section:\n{report}"));
    assert!(section.starts_with(": 3 sites (16 frames"), "{section}");
    // One block per site: its line (two spaces in), then its frames (six).
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for line in section.lines().skip(1).take_while(|l| !l.is_empty()) {
        match line.strip_prefix("      ") {
            Some(frame) => blocks.last_mut().unwrap().1.push(frame.to_owned()),
            None => blocks.push((line.trim().to_owned(), Vec::new())),
        }
    }
    let expect = [
        ("1 allocation, 8.0 MiB (cuMemAlloc_v2)", "leak_big", "big"),
        (
            "3 allocations, 3.0 MiB (cuMemAllocAsync)",
            "leak_async",
            "async",
        ),
        (
            "5 allocations, 20.0 KiB (cuMemAlloc_v2)",
            "leak_small",
            "small",
        ),
    ];
    assert_eq!(blocks.len(), 3, "{section}");
    for ((head, function, mark), (line, frames)) in expect.iter().zip(&blocks) {
        assert_eq!(line, head, "{section}");
        let first = frames.first().map(String::as_str).unwrap_or_default();
        assert!(
            first.starts_with(&format!("{function} ("))
                && first.ends_with(&format!("/fixtures/stacks/leaks.c:{})", marked_line(mark))),
            "{function} at its MARK({mark}) line expected first:\n{section}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.starts_with("main (") && f.contains("leaks.c:")),
            "{section}"
        );
        assert!(
            !frames.iter().any(|f| f.contains("cuhook")),
            "cuhook's own frames in a stack:\n{section}"
        );
    }
    assert!(!section.contains("balanced"), "{section}");
}

/// A program whose segments have unmapped gaps between them (linked with its segments 64 KiB
/// apart, each filling one page): glibc then describes each segment as a mapping of its own, so
/// `_dl_find_object` on a return address gives the code segment alone, and the unwind tables lie
/// in another. The unwinder read them only inside the code's mapping, found none, and every
/// stack ended at cuhook's own frame (a layout the test binary itself had in some builds).
#[test]
fn call_sites_are_named_in_a_program_whose_segments_have_gaps() {
    let dir = common::scratch("stacks-gaps");
    let exe = build_leaks_with(
        &dir,
        &["-Wl,-z,separate-code", "-Wl,-z,max-page-size=0x10000"],
    );
    let report = run_leaks(&exe, &[("CUHOOK_STACKS", "16")]);
    let section = report
        .split("Live allocations at exit by call site")
        .nth(1)
        .unwrap_or_else(|| panic!("no call-site section:\n{report}"));
    for function in ["leak_big", "leak_async", "leak_small", "main"] {
        assert!(
            section
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{function} ("))),
            "{function} named in no stack:\n{section}"
        );
    }
}

/// The C API names the stack of a range (`cuhook_stack_of`) and gives its frames
/// (`cuhook_stack_frames`): the first is in the function that allocated.
#[test]
fn the_c_api_gives_a_ranges_stack_and_its_frames() {
    let dir = common::scratch("stacks-capi");
    let exe = build_leaks(&dir);
    let out = run_leaks(&exe, &[("CUHOOK_STACKS", "16"), ("LEAKS_ASK", "1")]);
    let line = out
        .lines()
        .find(|l| l.starts_with("stack "))
        .unwrap_or_else(|| panic!("{out}"));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_owned()
    };
    assert_eq!(field("rc"), "0", "{line}");
    assert!(field("id").parse::<u32>().unwrap() >= 2, "{line}");
    assert!(field("frames").parse::<usize>().unwrap() >= 2, "{line}");
    assert_eq!(field("first"), "leak_small", "{line}");
    assert_eq!(field("none"), "0", "{line}");
    // Stacks off: recorded as none.
    let out = run_leaks(&exe, &[("LEAKS_ASK", "1")]);
    assert!(out.contains("stack rc=0 id=0 frames=0"), "{out}");
}

/// Without `CUHOOK_STACKS` the report has no call-site section; a bad value is named in a
/// warning and recording stays off.
#[test]
fn stacks_are_off_unless_asked_for() {
    let dir = common::scratch("stacks-off");
    let exe = build_leaks(&dir);
    let report = run_leaks(&exe, &[]);
    assert!(!report.contains("by call site"), "{report}");
    let report = run_leaks(&exe, &[("CUHOOK_STACKS", "1000")]);
    assert!(report.contains("CUHOOK_STACKS"), "{report}");
    assert!(!report.contains("by call site"), "{report}");
}

/// A table of one unique stack: the first site gets it, the others are counted as "other".
#[test]
fn a_full_stack_table_counts_the_rest_as_other() {
    let dir = common::scratch("stacks-full");
    let exe = build_leaks(&dir);
    let report = run_leaks(&exe, &[("CUHOOK_STACKS", "8"), ("CUHOOK_STACKS_MAX", "1")]);
    let section = report
        .split("Live allocations at exit by call site")
        .nth(1)
        .unwrap_or_else(|| panic!("{report}"));
    assert!(section.starts_with(": 1 site (8 frames"), "{section}");
    assert!(section.contains("stack table full"), "{section}");
}

/// `cuhook run --stacks 16 --trace`: the report's call-site section, alloc events in the trace
/// naming their stack, one stack line per stack with its frames (the leaking function's among
/// them, symbolized), and the CLI reading the whole trace back without an unreadable line.
#[test]
fn cuhook_run_records_stacks_into_the_report_and_the_trace() {
    let dir = common::scratch("stacks-run");
    let exe = build_leaks(&dir);
    let trace = dir.join("t.jsonl");
    let out = common::cuhook_command()
        .args(["run", "--stacks", "16", "--trace"])
        .arg(&trace)
        .arg("--lib")
        .arg(common::libcuhook())
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Live allocations at exit by call site: 3 sites"),
        "{err}"
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let allocs: Vec<&serde_json::Value> = lines.iter().filter(|v| v["event"] == "alloc").collect();
    assert_eq!(allocs.len(), 13, "{text}");
    assert!(
        allocs.iter().all(|v| v["stack"].as_u64() >= Some(2)),
        "{text}"
    );
    let stacks: Vec<&serde_json::Value> = lines.iter().filter(|v| v["frames"].is_array()).collect();
    for a in &allocs {
        assert!(
            stacks.iter().any(|s| s["stack"] == a["stack"]),
            "no stack line for {a}"
        );
    }
    let big = stacks
        .iter()
        .find(|s| {
            s["frames"][0]["symbol"]
                .as_str()
                .is_some_and(|f| f.starts_with("leak_big ("))
        })
        .unwrap_or_else(|| panic!("no stack of leak_big:\n{text}"));
    assert!(
        big["frames"][0]["module"]
            .as_str()
            .unwrap()
            .ends_with("/leaks"),
        "{big}"
    );
    assert!(
        big["frames"][0]["offset"]
            .as_str()
            .unwrap()
            .starts_with("0x"),
        "{big}"
    );
    let out = common::cuhook_command()
        .args(["export", "--format", "perfetto", "-o"])
        .arg(dir.join("t.json"))
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("unreadable"), "{err}");
    // The Perfetto export carries each allocation's stack as an argument.
    let perfetto = std::fs::read_to_string(dir.join("t.json")).unwrap();
    assert!(perfetto.contains("\"stack\":\"leak_big ("), "{perfetto}");
    // `cuhook view`: the page's data names the call sites with their frames.
    let page = dir.join("memory.html");
    let out = common::cuhook_command()
        .args(["view", "-o"])
        .arg(&page)
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let sites = html
        .split("\"sites\":[")
        .nth(1)
        .unwrap_or_else(|| panic!("no sites in the page data"));
    assert!(
        sites.starts_with("{\"frames\":[\"leak_big ("),
        "{}",
        &sites[..200.min(sites.len())]
    );
}
