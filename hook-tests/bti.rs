//! Branch protection on aarch64: the `bti/` fixtures (built with `-mbranch-protection=standard`)
//! are BTI-marked, and where the tests run an indirect branch to anything but a landing pad kills
//! the process, in a program and in a shared library. Without this proof, the BTI fixtures passing
//! the engine and coverage tests (hook-tests/engine.rs, hook-tests/coverage.rs) would mean nothing.
//! Nothing to test elsewhere.
#![cfg(target_arch = "aarch64")]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// The GNU property notes of `file`, as `readelf -n` prints them.
fn notes(file: &std::path::Path) -> String {
    let out = common::output_ok(Command::new("readelf").arg("-n").arg(file));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_branch_protected_fixture_is_bti_marked() {
    let dir = common::fixtures_dir().join("bti");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures/bti") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            continue;
        }
        assert!(
            notes(&path).contains("AArch64 feature: BTI"),
            "{} is not BTI-marked: its pages would not be guarded",
            path.display()
        );
        seen += 1;
    }
    assert!(seen >= 8, "only {seen} files in {}", dir.display());
}

fn control(what: &str) -> std::process::Output {
    Command::new(common::fixtures_dir().join("bti/control"))
        .arg(what)
        .current_dir(common::fixtures_dir())
        .output()
        .expect("run bti/control")
}

#[test]
fn indirect_branch_to_a_landing_pad_runs() {
    let out = control("pad");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "pad 7\n");
}

#[test]
fn indirect_branch_elsewhere_is_killed_in_a_program_and_in_a_library() {
    for what in ["nopad", "lib_nopad"] {
        let out = control(what);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGILL),
            "{what}: BTI is not enforced here (the function ran: {:?})",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
