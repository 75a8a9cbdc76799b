//! The C API from C: a program compiled against include/cuhook.h and linked to libcuhook.so
//! (built here, at test time, because the cdylib does not exist yet when build.rs runs).

mod common;

use std::path::PathBuf;
use std::process::Command;

fn build() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = common::libcuhook().parent().unwrap().to_path_buf();
    let fixtures = common::fixtures_dir();
    let exe = std::env::temp_dir().join(format!("cuhook-capi-test-{}", std::process::id()));
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root.join("fixtures/capi/capi_test.c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-I")
        .arg(root.join("fixtures/cuda"))
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-L{}", fixtures.display()))
        .args(["-lcuhook", "-l:libcuda.so.1"])
        .arg(format!(
            "-Wl,-rpath,{}:{}",
            lib_dir.display(),
            fixtures.display()
        ))
        .status()
        .expect("run the C compiler");
    assert!(
        status.success(),
        "compiling fixtures/capi/capi_test.c failed"
    );
    exe
}

#[test]
fn c_program_linked_to_libcuhook_uses_the_whole_api() {
    let exe = build();
    // CUHOOK_DISABLE keeps the constructor from installing, so the program tests install itself.
    let out = Command::new(&exe)
        .env("CUHOOK_DISABLE", "1")
        .output()
        .unwrap();
    let run = common::Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    };
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
    let _ = std::fs::remove_file(exe);
}
