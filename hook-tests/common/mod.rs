//! Shared helpers of the hook tests: where the fixtures and libcuhook.so are, running one
//! scenario in its own process, and reading its report lines.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The directory build.rs compiled the C fixtures into.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CUHOOK_FIXTURES_DIR"))
}

/// `libcuhook.so` of this build (cargo puts the cdylib beside the test executable).
pub fn libcuhook() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test exe has a parent dir");
    for dir in [
        deps.to_path_buf(),
        deps.parent().map(PathBuf::from).unwrap_or_default(),
    ] {
        let p = dir.join("libcuhook.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libcuhook.so not found next to {}: build the cdylib (cargo test builds it)",
        exe.display()
    );
}

/// What one fixture process printed.
#[derive(Debug)]
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// `check NAME ok|FAIL detail` lines as (name, ok, detail).
    pub fn checks(&self) -> Vec<(String, bool, String)> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("check "))
            .map(|l| {
                let mut parts = l.splitn(3, ' ');
                let name = parts.next().unwrap_or("").to_owned();
                let ok = parts.next() == Some("ok");
                (name, ok, parts.next().unwrap_or("").to_owned())
            })
            .collect()
    }

    /// Lines starting with `prefix `, without it.
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        let p = format!("{prefix} ");
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&p))
            .map(str::to_owned)
            .collect()
    }

    /// Panic with the whole output unless the process exited 0 with no failed check and every
    /// name in `required` was checked.
    pub fn assert_passed(&self, required: &[&str]) {
        let checks = self.checks();
        let failed: Vec<_> = checks.iter().filter(|c| !c.1).collect();
        assert!(
            failed.is_empty(),
            "failed checks: {failed:#?}\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.status.success(),
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        for r in required {
            assert!(
                checks.iter().any(|c| c.0 == *r),
                "check `{r}` never ran\n--- stdout\n{}",
                self.stdout
            );
        }
    }
}

/// Run a fixture program with libcuhook.so available to it (`$CUHOOK_LIB`). The fixtures drive
/// cuhook through its API, so its constructor's auto-install is switched off
/// (`CUHOOK_DISABLE=1`) unless `env` says otherwise.
pub fn run_fixture(program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let path = fixtures_dir().join(program);
    let mut cmd = Command::new(&path);
    cmd.args(args)
        .env("CUHOOK_LIB", libcuhook())
        .env("CUHOOK_DISABLE", "1")
        .current_dir(fixtures_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// An in-process hook for a fixture function `int f(int, int)`: counts its calls in `$calls`
/// and forwards to the original the engine published in `$real` (both `AtomicUsize` statics).
#[allow(unused_macros)]
macro_rules! counting_hook {
    ($name:ident, $real:ident, $calls:ident) => {
        extern "C" fn $name(a: std::ffi::c_int, b: std::ffi::c_int) -> std::ffi::c_int {
            $calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: the engine published the original before routing calls here.
            let real: extern "C" fn(std::ffi::c_int, std::ffi::c_int) -> std::ffi::c_int =
                unsafe { std::mem::transmute($real.load(std::sync::atomic::Ordering::Acquire)) };
            real(a, b)
        }
    };
}
