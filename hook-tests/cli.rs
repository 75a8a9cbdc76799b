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

/// A file of this test process in the target directory's scratch space.
fn temp(name: &str) -> PathBuf {
    common::scratch_root().join(format!("cuhook-cli-test-{}-{name}", std::process::id()))
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

/// A command that cannot start leaves no `--report` file that the run created, and keeps one
/// that was there (untouched).
#[test]
fn a_command_that_cannot_start_leaves_no_report_file() {
    if cuhook_fixtures::skip_when_cross(
        "exec errors (qemu-user's vfork is a fork: the command starts, then exits 127)",
    ) {
        return;
    }
    let dir = common::scratch("cli-nostart-report");
    let (new, old) = (dir.join("new.txt"), dir.join("old.txt"));
    std::fs::write(&old, "kept\n").unwrap();
    for path in [&new, &old] {
        let out = cuhook(
            &[
                "run",
                "--report",
                path.to_str().unwrap(),
                "--",
                "/nonexistent/program",
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(127));
    }
    assert!(!new.exists(), "an empty report was left");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "kept\n");
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

/// Item 38: the statuses a shell gives — 126 for a file that exists but cannot be executed
/// (before: 127 for all), 127 for a command not found — and cuhook's own 125 for a failure
/// before the command starts.
#[test]
fn run_exit_statuses_are_a_shells() {
    if cuhook_fixtures::skip_when_cross(
        "exec errors (qemu-user's vfork is a fork: every one is 127)",
    ) {
        return;
    }
    let dir = common::scratch("cli-exit-statuses");
    let data = dir.join("data.txt");
    std::fs::write(&data, "not a program\n").unwrap();
    for (what, program, code, says) in [
        (
            "a plain file",
            data.to_str().unwrap(),
            126,
            "Permission denied",
        ),
        ("a directory", dir.to_str().unwrap(), 126, "cannot run"),
        (
            "a missing path",
            "/nonexistent/program",
            127,
            "No such file",
        ),
        (
            "a name not in PATH",
            "no-such-command-cuhook-test",
            127,
            "no-such-command-cuhook-test: command not found",
        ),
    ] {
        let out = cuhook(&["run", "--", program], &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
    }
}

/// `--opt=value` works like `--opt value` for every option with a value (before: `--trace=F`
/// and `--output=F` were unknown options).
#[test]
fn options_take_their_value_after_a_space_or_an_equals_sign() {
    let dir = common::scratch("cli-equals");
    let out = common::cuhook_command()
        .current_dir(&dir)
        .args(["run", "--report=r.txt", "--trace=t.jsonl", "--"])
        .arg(fixture("demo_rt_static"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    assert!(
        report.contains("Live allocations at exit: 1 (2.0 MiB)"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("t.jsonl"))
            .unwrap()
            .lines()
            .count(),
        9
    );
    common::output_ok(common::cuhook_command().current_dir(&dir).args([
        "view",
        "--output=page.html",
        "t.jsonl",
    ]));
    assert!(dir.join("page.html").is_file());
}

/// Usage errors exit 2 and name the option or argument as the user typed it; `demo` refuses a
/// stray argument as `symbols` does (before, it ignored it).
#[test]
fn usage_errors_name_what_was_typed() {
    for (args, says) in [
        (
            &["run", "--reprot", "r.txt", "--", "true"][..],
            "cuhook run: unknown option `--reprot`",
        ),
        (
            &["run", "--report"],
            "cuhook run: option `--report` needs a value",
        ),
        (
            &["run", "--lib"],
            "cuhook run: option `--lib` needs a value",
        ),
        (&["view", "-o"], "cuhook view: option `-o` needs a value"),
        (&["view", "--out=x", "t.jsonl"], "unknown option `--out`"),
        (
            &["demo", "extra"],
            "cuhook demo: unexpected argument `extra`",
        ),
        (
            &["demo", "--keep"],
            "cuhook demo: option `--keep` needs a value",
        ),
        (
            &["symbols", "extra"],
            "cuhook symbols: unexpected argument `extra`",
        ),
        (
            &["export", "t.jsonl"],
            "cuhook export: --format is required",
        ),
        (&["--verbose"], "cuhook: unknown option `--verbose`"),
    ] {
        let out = cuhook(args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.contains("--help`."), "{args:?}: {stderr}");
    }
}

#[test]
fn help_lists_the_version_option_and_it_answers() {
    let help = text(&cuhook(&["--help"], &[]).stdout);
    assert!(help.contains("--version"), "{help}");
    assert!(
        help.contains("$CUHOOK_LIB"),
        "the library search order: {help}"
    );
    let out = cuhook(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        format!("cuhook {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// A `--report` or `--trace` that cannot be written is refused before the command starts
/// (before: the command ran, then `--report` failed with exit status 0, and `--trace` gave
/// only the library's warning, with the OS error twice).
#[test]
fn unusable_output_paths_are_refused_before_the_command_starts() {
    let dir = common::scratch("cli-bad-paths");
    let marker = dir.join("ran");
    let link = dir.join("link.txt");
    std::os::unix::fs::symlink(dir.join("elsewhere.txt"), &link).unwrap();
    let touch = format!("touch {}", marker.display());
    for (option, path, says) in [
        (
            "--report",
            "/nonexistent/r.txt",
            "directory /nonexistent does not exist",
        ),
        (
            "--report",
            "/nonexistent/r.%p.txt",
            "directory /nonexistent does not exist",
        ),
        (
            "--report",
            link.to_str().unwrap(),
            "is a symbolic link (name the file itself)",
        ),
        ("--report", dir.to_str().unwrap(), "is a directory"),
        (
            "--trace",
            "/nonexistent/t.jsonl",
            "directory /nonexistent does not exist",
        ),
        (
            "--trace",
            "/etc/passwd/t.%r.jsonl",
            "/etc/passwd is not a directory",
        ),
    ] {
        let out = cuhook(&["run", option, path, "--", "sh", "-c", &touch], &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{option} {path}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "cuhook run: {option} {path}: {says}; the command was not started."
            )),
            "{option} {path}: {stderr}"
        );
        assert!(!marker.exists(), "{option} {path}: the command ran");
    }
    assert!(
        !dir.join("elsewhere.txt").exists(),
        "written through the link"
    );
}

/// This build's `cuhook` at `path`: a hard link, not a copy — a copy is written through a
/// descriptor that a concurrent test's fork may still hold when it is executed ("Text file
/// busy").
fn binary_at(path: &std::path::Path) {
    let bin = env!("CARGO_BIN_EXE_cuhook");
    if std::fs::hard_link(bin, path).is_err() {
        std::fs::copy(bin, path).unwrap();
    }
}

/// The command's view of the library it was given: `$LD_PRELOAD`.
fn preloaded(
    cuhook_exe: &std::path::Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(cuhook_exe);
    cmd.arg("run")
        .args(args)
        .args(["--", "sh", "-c", "echo \"$LD_PRELOAD\""])
        .env_remove("LD_PRELOAD")
        .env_remove("CUHOOK_LIB");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        text(&out.stdout).trim().to_owned(),
        text(&out.stderr),
    )
}

/// `cuhook run` finds its library by the documented order: `--lib`, `$CUHOOK_LIB`, beside the
/// binary, `../lib*`; with none, it says how to get one (exit 125). A named library that is
/// not there is an error, not a reason to look elsewhere.
#[test]
fn run_finds_its_library_by_the_documented_order() {
    let dir = common::scratch("cli-lib-search");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("cuhook");
    binary_at(&exe);
    let real = common::libcuhook();

    let (code, _, stderr) = preloaded(&exe, &[], &[]);
    assert_eq!(code, Some(125), "{stderr}");
    for hint in [
        "--lib PATH",
        "$CUHOOK_LIB",
        "scripts/install-c.sh --prefix",
        "cargo install",
    ] {
        assert!(stderr.contains(hint), "{hint}: {stderr}");
    }
    assert!(
        stderr.contains(&format!("  {}", dir.join("lib/libcuhook.so.0").display())),
        "{stderr}"
    );

    let (code, preload, stderr) = preloaded(&exe, &["--lib", real.to_str().unwrap()], &[]);
    assert_eq!(
        (code, preload.as_str()),
        (Some(0), real.to_str().unwrap()),
        "{stderr}"
    );
    let (code, preload, _) = preloaded(&exe, &[], &[("CUHOOK_LIB", real.as_os_str())]);
    assert_eq!((code, preload.as_str()), (Some(0), real.to_str().unwrap()));
    let (code, _, stderr) = preloaded(
        &exe,
        &[],
        &[("CUHOOK_LIB", "/nonexistent/libcuhook.so".as_ref())],
    );
    assert_eq!(code, Some(125));
    assert!(
        stderr.contains("cuhook run: CUHOOK_LIB /nonexistent/libcuhook.so: "),
        "{stderr}"
    );
    let (code, _, stderr) = preloaded(
        &exe,
        &["--lib=/nonexistent/l.so"],
        &[("CUHOOK_LIB", real.as_os_str())],
    );
    assert_eq!(code, Some(125));
    assert!(
        stderr.contains("cuhook run: --lib /nonexistent/l.so: "),
        "--lib wins: {stderr}"
    );

    // Installed layout: PREFIX/bin/cuhook and PREFIX/lib/libcuhook.so.0.
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    let installed = dir.join("lib/libcuhook.so.0");
    std::fs::copy(&real, &installed).unwrap();
    let (code, preload, stderr) = preloaded(&exe, &[], &[]);
    assert_eq!(
        (code, preload),
        (Some(0), installed.display().to_string()),
        "{stderr}"
    );
    // A link to the binary finds the installation it points into.
    let link = dir.join("cuhook-link");
    std::os::unix::fs::symlink(&exe, &link).unwrap();
    let (_, preload, _) = preloaded(&link, &[], &[]);
    assert_eq!(preload, installed.display().to_string());
    // Beside the binary comes first.
    std::fs::copy(&real, bin.join("libcuhook.so")).unwrap();
    let (_, preload, _) = preloaded(&exe, &[], &[]);
    assert_eq!(preload, bin.join("libcuhook.so").display().to_string());
}

/// In a cargo target directory `cargo build` leaves `libcuhook.so` beside the binary and `cargo
/// test` refreshes only `deps/libcuhook.so`: the newer one is preloaded (before, a stale
/// `libcuhook.so` from an earlier build always won, and tests ran an old library).
#[test]
fn a_stale_library_beside_the_binary_does_not_shadow_a_fresh_one() {
    let dir = common::scratch("cli-stale-lib");
    std::fs::create_dir_all(dir.join("deps")).unwrap();
    let exe = dir.join("cuhook");
    binary_at(&exe);
    let stale = dir.join("libcuhook.so");
    std::fs::write(&stale, "an old build").unwrap();
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let fresh = dir.join("deps/libcuhook.so");
    std::fs::copy(common::libcuhook(), &fresh).unwrap();
    let (code, preload, stderr) = preloaded(&exe, &[], &[]);
    assert_eq!(
        (code, preload),
        (Some(0), fresh.display().to_string()),
        "{stderr}"
    );
    let out = Command::new(&exe)
        .args(["run", "--", &fixture("plain"), "exit", "0"])
        .env_remove("CUHOOK_LIB")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("==== cuhook report"),
        "the fresh library ran: {stderr}"
    );
}

/// `cuhook demo --keep DIR` keeps each program's trace and report and prints the command that
/// draws them; that command works as printed.
#[test]
fn demo_keeps_its_traces_for_the_viewer() {
    let dir = common::scratch("cli-demo-keep");
    let keep = dir.join("kept");
    let out = cuhook(
        &["demo", "--keep", keep.to_str().unwrap()],
        &[("CC", cuhook_fixtures::CC)],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in ["demo_driver", "demo_rt_shared", "demo_rt_static"] {
        let trace = std::fs::read_to_string(keep.join(format!("{p}.jsonl"))).unwrap();
        assert!(trace.lines().count() >= 9, "{p}: {trace}");
        let report = std::fs::read_to_string(keep.join(format!("{p}.txt"))).unwrap();
        assert!(report.contains("==== cuhook report"), "{p}: {report}");
    }
    let command = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.contains(" view -o "))
        .unwrap_or_else(|| panic!("no view command printed:\n{stdout}"));
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words[0], env!("CARGO_BIN_EXE_cuhook"), "{command}");
    common::output_ok(Command::new(words[0]).args(&words[1..]));
    let page = std::fs::read_to_string(keep.join("memory.html")).unwrap();
    assert!(page.contains("demo_rt_static.jsonl"));
}
