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
    let plain = fixture("plain");
    let out = cuhook(&["run", "--", &plain, "exit", "7"], &[]);
    assert_eq!(out.status.code(), Some(7));
    let out = cuhook(&["run", "--", &plain, "kill", "15"], &[]);
    assert_eq!(out.status.code(), Some(128 + 15));
    let out = cuhook(&["run", "--", "/nonexistent/program"], &[]);
    assert_eq!(out.status.code(), Some(127));
    // qemu-user runs glibc posix_spawn's CLONE_VM|CLONE_VFORK child as a plain fork, so the
    // exec error never reaches the parent: the spawn "succeeds" and the child exits 127.
    if !cuhook_fixtures::skip_when_cross("the exec error message (qemu-user's vfork is a fork)") {
        assert!(text(&out.stderr).contains("cannot run /nonexistent/program"));
    }
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
    let out = Command::new(fixture("plain"))
        .args(["out", "hello"])
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
    // The demo compiles its programs with $CC: the compiler of the fixtures, for the target.
    let out = cuhook(&["demo"], &[("CC", cuhook_fixtures::CC)]);
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
    let out = Command::new(fixture("plain"))
        .args(["err", "after"])
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

/// A fresh, empty directory to serve as `TMPDIR` for one `cuhook run`.
fn tmpdir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-tmp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Item 14: another user pre-creates the directories `cuhook run` used to pick (named after
/// the next process ids), with a forged report and a symlink to a victim file in each. The run
/// must use a fresh directory of its own (mode 0700), print no forged report, write through no
/// symlink, and leave no directory behind.
#[test]
fn run_uses_a_private_directory_nobody_could_prepare() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tmpdir("private");
    let victim = tmp.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut planted = Vec::new();
    for pid in last + 1..last + 400 {
        let d = tmp.join(format!("cuhook-run-{pid}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(
            d.join("report-1.txt"),
            "FORGED report: cuMemAlloc 1 allocs\n",
        )
        .unwrap();
        for child in pid + 1..pid + 4 {
            std::os::unix::fs::symlink(&victim, d.join(format!("report-{child}.txt"))).unwrap();
        }
        planted.push(d);
    }
    let tmp_s = tmp.to_str().unwrap();
    let out = cuhook(
        &[
            "run",
            "--",
            "sh",
            "-c",
            "d=${CUHOOK_REPORT%/*}; stat -c '%a %U' \"$d\"; echo \"$d\"",
        ],
        &[("TMPDIR", tmp_s)],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("FORGED"),
        "a planted report was printed: {stderr}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let mut lines = stdout.lines();
    let mode = lines.next().unwrap_or_default();
    assert!(mode.starts_with("700 "), "directory mode: {mode}");
    let used = PathBuf::from(lines.next().unwrap_or_default());
    assert!(used.starts_with(&tmp), "{used:?}");
    assert!(
        !planted.contains(&used),
        "used a planted directory: {used:?}"
    );
    assert!(!used.exists(), "{used:?} left behind");
    let mut expected = planted.clone();
    expected.push(victim);
    expected.sort();
    assert_eq!(entries(&tmp), expected, "only what was planted is left");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Item 17: a command that cannot start leaves no temporary directory behind.
#[test]
fn run_removes_its_directory_when_the_command_cannot_start() {
    let tmp = tmpdir("nostart");
    for _ in 0..3 {
        let out = cuhook(
            &["run", "--", "/nonexistent/program"],
            &[("TMPDIR", tmp.to_str().unwrap())],
        );
        assert_eq!(out.status.code(), Some(127));
        assert_eq!(entries(&tmp), Vec::<PathBuf>::new());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Signals the test process itself ignores (under `nohup`, say): its children inherit that,
/// so a forwarded one would not end them. Those are skipped, saying so.
fn ignored_by_us(sig: i32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    mask & (1 << (sig - 1)) != 0
}

/// The (first) child process of `pid`, from every thread's `children` list.
fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .find_map(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Item 17: SIGTERM, SIGINT and SIGHUP sent to `cuhook run` reach its command, which ends; `cuhook
/// run` then exits with the command's status and removes its directory. Nothing is left running.
#[test]
fn run_forwards_termination_signals_to_its_command() {
    use std::time::{Duration, Instant};
    let tmp = tmpdir("signals");
    for _round in 0..3 {
        for (sig, name) in [
            (libc::SIGTERM, "TERM"),
            (libc::SIGINT, "INT"),
            (libc::SIGHUP, "HUP"),
        ] {
            if ignored_by_us(sig) {
                eprintln!("skipped SIG{name}: this test process ignores it");
                continue;
            }
            // `sleep` itself, not a shell: what it gets is exactly what `cuhook run` gives it.
            let mut child = Command::new(env!("CARGO_BIN_EXE_cuhook"))
                .args(["run", "--", "sleep", "60"])
                .env("TMPDIR", &tmp)
                .env_remove("LD_PRELOAD")
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let start = Instant::now();
            let command_pid: u32 = loop {
                if let Some(pid) = child_of(child.id()) {
                    break pid;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "the command never started"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            // Let `sleep` finish starting (its constructor-time state is not what is tested).
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: kill(2) on the pid of a child we have not reaped.
            assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
            let status = loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let orphan = !gone(command_pid);
            if orphan {
                // SAFETY: kill(2) on the orphan this test made (still alive: just checked).
                unsafe { libc::kill(command_pid as i32, libc::SIGKILL) };
            }
            assert!(!orphan, "SIG{name}: the command {command_pid} kept running");
            assert_eq!(
                status.and_then(|s| s.code()),
                Some(128 + sig),
                "SIG{name}: cuhook run's status"
            );
            assert_eq!(
                entries(&tmp),
                Vec::<PathBuf>::new(),
                "SIG{name}: left behind"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
