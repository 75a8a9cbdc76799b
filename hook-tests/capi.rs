//! The C API from C: a program compiled against the installed C library (header, versioned
//! libcuhook.so.0, pkg-config file; installed here at test time, because the cdylib does not exist
//! yet when build scripts run).

mod common;

use std::path::PathBuf;
use std::process::Command;

/// Compile `fixtures/capi/<source>` against the installed C library and the fake driver.
fn build_in(source: &str, dir: &std::path::Path) -> PathBuf {
    build_with(source, dir, &[])
}

/// As [`build_in`], with `extra` arguments at the end of the command line (libraries listed
/// after libcuhook).
fn build_with(source: &str, dir: &std::path::Path, extra: &[String]) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = common::installed_c_prefix().join("lib");
    let fixtures = common::fixtures_dir();
    let exe = dir.join(format!(
        "cuhook-{}-{}",
        source.trim_end_matches(".c"),
        std::process::id()
    ));
    let status = cuhook_fixtures::cc()
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root.join("fixtures/capi").join(source))
        .args(common::pkg_config_cuhook())
        .arg("-I")
        .arg(root.join("fixtures/cuda"))
        .arg(format!("-L{}", fixtures.display()))
        .arg("-l:libcuda.so.1")
        .arg(format!(
            "-Wl,-rpath,{}:{}",
            lib_dir.display(),
            fixtures.display()
        ))
        .args(extra)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "compiling fixtures/capi/{source} failed");
    exe
}

/// Builds and runs `fixtures/capi/<source>` with the constructor off (the program installs).
fn run_fixture(source: &str) -> common::Run {
    let exe = build_in(source, &std::env::temp_dir());
    let out = Command::new(&exe)
        .env("CUHOOK_DISABLE", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(exe);
    common::Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The structs of the installed header have the layout the library asserts at its own compile
/// time (src/capi/layout.rs): fixtures/capi/layout.c does not compile otherwise.
#[test]
fn the_header_structs_have_the_layout_the_library_asserts() {
    run_fixture("layout.c").assert_passed(&["header_layouts"]);
}

#[test]
fn c_program_linked_to_libcuhook_uses_the_whole_api() {
    // CUHOOK_DISABLE keeps the constructor from installing, so the program tests install itself.
    let run = run_fixture("capi_test.c");
    run.assert_passed(&[
        "strerror",
        "strerror_unknown",
        "handler_no_install",
        "no_install_no_events",
        "install",
        "install_again",
        "handler",
        "priority_order",
        "alloc_event",
        "lookup_found",
        "lookup_span_outside",
        "lookup_null_info",
        "lookup_unknown_pointer",
        "lookup_before_install",
        "classify_before_install",
        "classify_host",
        "classify_null",
        "existing_alloc",
        "free_event",
        "freed_not_found",
        "null_callback",
        "no_event_bits",
        "unknown_bits",
        "unset_unknown",
        "hooks_install_null",
        "hooks_install_null_symbol",
        "hooks_install_absurd_count",
        "hooks_install_max_count",
        "hooks_uninstall_unknown",
        "exclude_null_clears",
        "rescan",
        "patched_slots",
        "diagnostics",
        "unset",
        "unset_second",
        "unset_replayed",
        "uninstall",
        "uninstall_again",
        "no_slots_after_uninstall",
        "handler_again",
        "reinstalled_by_handler",
    ]);
}

/// In a secure-execution process (setgid here) the constructor installs nothing, even when asked
/// to report. Needs root (to give the program another group) and a filesystem that honours the
/// setgid bit; the program reports AT_SECURE itself, so a run where the kernel did not set it is
/// recognised instead of passing by accident.
#[test]
fn constructor_does_nothing_in_a_secure_process() {
    use std::os::unix::fs::PermissionsExt;
    let whoami = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&whoami.stdout).trim() != "0" {
        eprintln!("skipped: needs root to make a setgid program");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let exe = build_in("secure.c", &dir);
    let plain = Command::new(&exe)
        .env_remove("CUHOOK_DISABLE")
        .env("CUHOOK_REPORT", "stderr")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&plain.stdout).starts_with("secure=0 slots="),
        "{plain:?}"
    );
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("==== cuhook report"),
        "not secure: the constructor installs and reports at exit: {plain:?}"
    );
    // setgid to another group: the kernel marks the process AT_SECURE.
    assert!(Command::new("chgrp")
        .arg("nogroup")
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o2755)).unwrap();
    let out = Command::new(&exe)
        .env_remove("CUHOOK_DISABLE")
        .env("CUHOOK_REPORT", "stderr")
        .env("CUHOOK_LOG", "debug")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if stdout.starts_with("secure=0") {
        eprintln!("skipped: {} does not honour setgid", dir.display());
        return;
    }
    assert!(stdout.starts_with("secure=1 slots=0"), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "no output at all: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(exe);
}

/// The registry reflects only calls that succeeded while the hooks saw them: a refused
/// `cuMemUnmap` leaves no phantom range and no half-removed mapping, and memory freed while the
/// hooks were uninstalled is not reported live after a reinstall (issue 12, items 11 and 12).
#[test]
fn registry_reflects_only_successful_calls_seen_by_the_hooks() {
    let run = run_fixture("registry_truth.c");
    run.assert_passed(&[
        "install",
        "unmap_never_mapped_fails",
        "no_phantom_range",
        "no_events_for_refused_unmap",
        "map",
        "mapped_found",
        "partial_unmap_fails",
        "mapping_intact",
        "still_no_phantom",
        "overlong_unmap_fails",
        "mapping_intact_2",
        "nothing_beyond",
        "unmapped_gone",
        "alloc_live",
        "primary_destroy_refused",
        "refused_teardown_keeps_ranges",
        "refused_teardown_announced_back",
        "free_live",
        "both_found",
        "uninstall",
        "nothing_reported_while_uninstalled",
        "free_unseen",
        "reinstall",
        "freed_not_live_after_reinstall",
        "kept_classified",
        "alloc_after_reinstall",
    ]);
}

/// The soak of issue 12 ("Beyond the list"): fixtures/capi/soak.c on the fake driver, under a
/// watchdog. `CUHOOK_SOAK_SECS` sets its length (default 3 s; the long run in
/// docs/reliability.md used 300).
#[test]
fn soak_allocations_loader_churn_install_toggling_and_forks() {
    let secs: f64 = std::env::var("CUHOOK_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let exe = build_in("soak.c", &std::env::temp_dir());
    let plugin = common::fixtures_dir().join("libcov_plugin.so");
    let mut child = Command::new(&exe)
        .arg(&plugin)
        .arg(secs.to_string())
        .env("CUHOOK_DISABLE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs_f64(secs * 3.0 + 60.0);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let _ = std::fs::remove_file(&exe);
            panic!(
                "soak hung (watchdog); output so far:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let run = common::Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    eprintln!(
        "{}",
        run.stdout
            .lines()
            .filter(|l| l.starts_with("soak "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    run.assert_passed(&[
        "install",
        "handler",
        "phase1_calls_succeed",
        "phase1_no_extra_events",
        "phase1_toggled",
        "reinstalled",
        "phase2_calls_succeed",
        "phase2_events_equal_calls",
        "registry_empty",
        "loader_churn",
        "children_ok",
    ]);
}

/// Issue 12 item 2: `exit()` with the exit report on while three threads `dlopen`/`dlclose`
/// libraries. The report's scan of loaded objects (static-runtime detection) read objects that
/// were not pinned, and crashed the host in some runs. The churn stops after the report and
/// before glibc's `_dl_fini`, which itself races with concurrent loader calls up to glibc 2.36
/// (fixtures/capi/exit_churn.c says how). `CUHOOK_EXIT_RUNS` sets the count.
#[test]
fn the_exit_report_never_reads_an_object_being_unloaded() {
    let runs: usize = std::env::var("CUHOOK_EXIT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = std::env::temp_dir();
    let churn = dir.join(format!("libexit_churn-{}.so", std::process::id()));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = cuhook_fixtures::cc()
        .args([
            "-O1", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&churn)
        .arg(root.join("fixtures/capi/exit_churn.c"))
        .arg(format!(
            "-Wl,-soname,{}",
            churn.file_name().unwrap().to_string_lossy()
        ))
        .args(["-ldl", "-lpthread"])
        .status()
        .expect("run the C compiler");
    assert!(
        status.success(),
        "compiling fixtures/capi/exit_churn.c failed"
    );
    let exe = build_with(
        "exit_during_dlclose.c",
        &dir,
        &[
            churn.display().to_string(),
            format!("-Wl,-rpath,{}", dir.display()),
        ],
    );
    let fixtures = common::fixtures_dir();
    let libs = [
        "libcov_plugin.so",
        "libplugin.so",
        "libnextd.so",
        "libcov_local.so",
    ];
    let mut crashes = Vec::new();
    for run in 0..runs {
        let report = dir.join(format!("cuhook-exit-report-{}-{run}", std::process::id()));
        let out = Command::new(&exe)
            .args(libs.iter().map(|l| fixtures.join(l)))
            .env("CUHOOK_REPORT", &report)
            .output()
            .unwrap();
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        let _ = std::fs::remove_file(&report);
        if !out.status.success() || !text.contains("Coverage warnings") {
            crashes.push((
                run,
                out.status,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
    }
    let _ = std::fs::remove_file(exe);
    let _ = std::fs::remove_file(churn);
    assert!(
        crashes.is_empty(),
        "{} of {runs} runs failed: {:?}",
        crashes.len(),
        &crashes[..crashes.len().min(3)]
    );
}

/// A host built with AddressSanitizer/LeakSanitizer that uses the whole C API (the program of
/// `c_program_linked_to_libcuhook_uses_the_whole_api`, `cuhook_set_exclude` included) exits
/// clean: nothing of ours is reported leaked. (Before, every replaced exclude list was dropped
/// unreachable: LeakSanitizer reported it and failed the host's run.)
#[test]
fn a_sanitizer_built_host_sees_no_leak() {
    if cuhook_fixtures::skip_when_cross("LeakSanitizer does not run under qemu-user") {
        return;
    }
    let dir = common::scratch_dir("capi-asan");
    let exe = build_with("capi_test.c", &dir, &["-fsanitize=address".to_owned()]);
    let out = Command::new(&exe)
        .env("CUHOOK_DISABLE", "1")
        .env("ASAN_OPTIONS", "detect_leaks=1:exitcode=97")
        .output()
        .unwrap();
    let run = common::Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
    assert!(
        !run.stderr.contains("Sanitizer"),
        "the sanitizer reported:\n{}",
        run.stderr
    );
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("exclude"), "{}", run.stdout);
}
