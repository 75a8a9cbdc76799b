//! The `cuhook` command and libcuhook.so's auto-init: a fixture program run under `cuhook run`,
//! the report's numbers and the trace lines checked; the environment switches; the other
//! subcommands.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn cuhook(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuhook"));
    cmd.args(args)
        .env_remove("CUHOOK_DISABLE")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the cuhook binary")
}

fn fixture(name: &str) -> String {
    common::fixtures_dir().join(name).display().to_string()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cuhook-cli-test-{}-{name}", std::process::id()))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The report line of one API: (allocs, alloc bytes, frees, free bytes).
fn api_row(report: &str, api: &str) -> Option<(u64, u64, u64, u64)> {
    let line = report
        .lines()
        .find(|l| l.split_whitespace().next() == Some(api))?;
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    (n.len() == 4).then(|| (n[0], n[1], n[2], n[3]))
}

#[test]
fn run_reports_and_traces_a_static_runtime_program() {
    let (report, trace) = (temp("report.txt"), temp("trace.jsonl"));
    let _ = std::fs::remove_file(&trace);
    let out = cuhook(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
            "--",
            &fixture("demo_rt_static"),
        ],
        &[],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(text(&out.stdout).contains("demo (runtime API): done"));
    let written = std::fs::read_to_string(&report).expect("--report file written");
    assert!(stderr.contains(&written), "the report is printed too");
    // demo.c: cudaMalloc 32 MiB, cudaMallocAsync 2 MiB twice (one freed), managed 1 MiB, host 64 KiB.
    assert_eq!(
        api_row(&written, "cuMemAlloc_v2"),
        Some((1, 32 << 20, 0, 0)),
        "{written}"
    );
    assert_eq!(
        api_row(&written, "cuMemAllocAsync"),
        Some((2, 4 << 20, 0, 0)),
        "{written}"
    );
    assert_eq!(
        api_row(&written, "cuMemFreeAsync"),
        Some((0, 0, 1, 2 << 20)),
        "{written}"
    );
    assert_eq!(
        api_row(&written, "cuMemFree_v2"),
        Some((0, 0, 2, (32 << 20) + (1 << 20))),
        "{written}"
    );
    assert!(
        written.contains("Live allocations at exit: 1 (2.0 MiB)"),
        "{written}"
    );
    assert!(written.contains("Coverage warnings: 0"), "{written}");
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .expect("trace written")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 9, "{lines:#?}");
    for l in &lines {
        assert!(l.starts_with('{') && l.ends_with('}'), "{l}");
        for key in [
            "\"event\":",
            "\"api\":",
            "\"address\":\"0x",
            "\"size\":",
            "\"mem_type\":",
            "\"device\":",
            "\"flags\":",
            "\"tid\":",
        ] {
            assert!(l.contains(key), "{key} missing in {l}");
        }
    }
    assert!(
        lines[0].contains("\"event\":\"alloc\"")
            && lines[0].contains("\"size\":33554432")
            && lines[0].contains("\"mem_type\":\"cuda\"")
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("\"event\":\"free\""))
            .count(),
        4
    );
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn run_passes_the_exit_status_through() {
    let out = cuhook(&["run", "--", "sh", "-c", "exit 7"], &[]);
    assert_eq!(out.status.code(), Some(7));
    let out = cuhook(&["run", "--", "sh", "-c", "kill -TERM $$"], &[]);
    assert_eq!(out.status.code(), Some(128 + 15));
    let out = cuhook(&["run", "--", "/nonexistent/program"], &[]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("cannot run /nonexistent/program"));
}

/// `cuhook run --trace … -- demo_driver` with extra environment: the output and the trace lines.
fn traced_demo_driver(name: &str, env: &[(&str, &str)]) -> (Output, Vec<String>) {
    let trace = temp(name);
    let _ = std::fs::remove_file(&trace);
    let out = cuhook(
        &[
            "run",
            "--trace",
            trace.to_str().unwrap(),
            "--",
            &fixture("demo_driver"),
        ],
        env,
    );
    let lines = std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_file(&trace);
    (out, lines)
}

#[test]
fn bad_environment_values_warn_and_keep_working() {
    let (out, trace) = traced_demo_driver("bad-env.jsonl", &[("CUHOOK_LOG", "loud")]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("CUHOOK_LOG=\"loud\" is not valid (accepted: error|warn|info|debug|trace)"),
        "{stderr}"
    );
    assert!(trace.len() >= 10, "hooks still installed: {trace:?}");
}

#[test]
fn disable_switch_installs_nothing() {
    let (out, trace) = traced_demo_driver("disabled.jsonl", &[("CUHOOK_DISABLE", "1")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(trace.is_empty(), "{trace:?}");
    assert!(text(&out.stderr).contains("left no report"));
}

#[test]
fn preloaded_into_a_program_without_cuda_it_stays_quiet() {
    let lib = common::libcuhook();
    let out = Command::new("sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", &lib)
        .env_remove("CUHOOK_DISABLE")
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "hello\n");
    assert_eq!(text(&out.stderr), "", "no output unless asked");
}

#[test]
fn symbols_lists_the_hook_table() {
    let out = cuhook(&["symbols"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    for sym in [
        "cuMemAllocAsync_ptsz",
        "cudaMallocFromPoolAsync",
        "cuMemMap",
        "cuGetProcAddress_v2",
        "cuDevicePrimaryCtxReset",
    ] {
        assert!(s.lines().any(|l| l.starts_with(sym)), "{sym} missing:\n{s}");
    }
    assert_eq!(
        s.lines().filter(|l| l.starts_with("cu")).count(),
        cuhook::cuda::HOOKS.len()
    );
}

#[test]
fn help_and_usage_errors() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["demo", "--help"],
        &["symbols", "--help"],
    ] {
        let out = cuhook(args, &[]);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out.stdout).contains("Usage"), "{args:?}");
    }
    let out = cuhook(&["frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown command `frobnicate`"));
    let out = cuhook(&["run"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no command given"));
}

#[test]
fn demo_shows_trace_and_reports() {
    let out = cuhook(&["demo"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert_eq!(s.matches("==== cuhook report").count(), 3, "{s}");
    assert!(
        s.contains("cuMemAllocAsync_ptsz") && s.contains("cudaMallocAsync") && s.contains("vmm"),
        "{s}"
    );
}

#[test]
fn report_warns_about_a_static_runtime_it_cannot_see() {
    let out = Command::new(fixture("late_static"))
        .env("CUHOOK_LIB", common::libcuhook())
        .env("CUHOOK_REPORT", "stderr")
        .env_remove("CUHOOK_DISABLE")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("Coverage warnings: 1"), "{stderr}");
    assert!(stderr.contains("a static CUDA runtime is linked into <main program> but no cuGetProcAddress call was seen"), "{stderr}");
    assert!(
        stderr.contains("(no CUDA allocation or free was seen)"),
        "{stderr}"
    );
    // The same program with cuhook preloaded sees everything and warns about nothing.
    let out = Command::new(fixture("late_static"))
        .env("CUHOOK_LIB", common::libcuhook())
        .env("LD_PRELOAD", common::libcuhook())
        .env("CUHOOK_REPORT", "stderr")
        .env_remove("CUHOOK_DISABLE")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Coverage warnings: 0"), "{stderr}");
    assert!(
        api_row(&stderr, "cuMemAlloc_v2").is_some_and(|r| r.0 == 2),
        "{stderr}"
    );
}

#[test]
fn a_warning_longer_than_the_line_buffer_still_ends_its_line() {
    let long = "x".repeat(3000);
    let out = Command::new("sh")
        .args(["-c", "echo after >&2"])
        .env("LD_PRELOAD", common::libcuhook())
        .env_remove("CUHOOK_DISABLE")
        .env("CUHOOK_LOG", &long)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("cuhook[") && lines[0].contains("CUHOOK_LOG=\"xxx"));
    assert_eq!(lines[1], "after", "the program's own line stays its own");
}
