//! Shared helpers of the hook tests: where the fixtures and libcuhook.so are, running one
//! scenario in its own process, and reading its report lines.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The directory the `cuhook-fixtures` dev-dependency compiled the C fixtures into.
pub fn fixtures_dir() -> PathBuf {
    cuhook_fixtures::dir()
}

/// `count` copies of the fixture library `name` in a folder of their own (each a distinct object
/// to the loader: another path and inode), removed when dropped, also after a failed assertion.
pub struct LibraryCopies {
    dir: PathBuf,
    pub paths: Vec<std::ffi::CString>,
}

impl LibraryCopies {
    pub fn new(name: &str, count: usize) -> LibraryCopies {
        static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "cuhook-test-copies-{}-{serial}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        LibraryCopies {
            paths: (0..count)
                .map(|i| {
                    let copy = dir.join(format!("copy{i}-{name}"));
                    std::fs::copy(fixtures_dir().join(name), &copy).unwrap();
                    std::ffi::CString::new(copy.to_str().unwrap()).unwrap()
                })
                .collect(),
            dir,
        }
    }
}

impl Drop for LibraryCopies {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

/// Run test `name` of this test executable again in a child process, with the environment
/// variable `var` set to `value`, and assert that it passed there (for a test that needs a
/// process of its own, or a setting read once per process).
pub fn rerun_in_child(name: &str, var: &str, value: &str) {
    rerun_in_child_with(name, &[(var, value)]);
}

/// [`rerun_in_child`] with several variables set.
pub fn rerun_in_child_with(name: &str, env: &[(&str, &str)]) {
    let out = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", name, "--nocapture"])
        .envs(env.iter().copied())
        .output()
        .expect("run the test executable again");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// For a test that needs a process of its own: in the test process, run test `name` again in
/// a child with `var` set, assert that it passed there, and return true (nothing is left to do);
/// in that child, return false (run the test).
///
/// ```ignore
/// if common::ran_in_child("my_test", "CUHOOK_TEST_MY_TEST") {
///     return;
/// }
/// ```
pub fn ran_in_child(name: &str, var: &str) -> bool {
    if std::env::var_os(var).is_some() {
        return false;
    }
    rerun_in_child(name, var, "1");
    true
}

/// A hook set of one hook: `symbol` replaced by `replacement`, its original stored in
/// `original`.
pub fn one_hook_set(
    name: &str,
    symbol: &str,
    replacement: usize,
    original: &'static std::sync::atomic::AtomicUsize,
) -> cuhook::hooks::HookSet {
    let hook = cuhook::hooks::Hook::new(symbol, replacement, original).expect("a valid hook");
    cuhook::hooks::HookSet::new(name, vec![hook]).expect("a valid set")
}

/// A fixture library's path, for `dlopen`.
pub fn fixture_path(lib: &str) -> std::ffi::CString {
    std::ffi::CString::new(fixtures_dir().join(lib).to_str().expect("UTF-8 path"))
        .expect("no NUL in the path")
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

/// A prefix holding cuhook as `scripts/install-c.sh` installs it (versioned
/// `libcuhook.so.X.Y.Z` with its soname links, `include/cuhook.h`, `lib/pkgconfig/cuhook.pc`,
/// `bin/cuhook`), made from this build's libcuhook.so and cuhook once per test process, in the
/// target directory's scratch space, and removed when the test process exits.
pub fn installed_c_prefix() -> PathBuf {
    static PREFIX: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current_exe");
            let name = exe.file_name().unwrap().to_string_lossy().into_owned();
            let prefix = scratch_root().join(format!("prefix-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&prefix);
            let out = install_command(&prefix)
                .output()
                .expect("run scripts/install-c.sh");
            assert!(
                out.status.success(),
                "install-c.sh failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            remove_at_exit(prefix.clone());
            prefix
        })
        .clone()
}

/// `sh scripts/install-c.sh --prefix PREFIX` with this build's library and binary.
pub fn install_command(prefix: &std::path::Path) -> Command {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install-c.sh");
    let mut cmd = Command::new("sh");
    cmd.arg(&script)
        .arg("--prefix")
        .arg(prefix)
        .arg("--lib")
        .arg(libcuhook())
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_cuhook"));
    cmd
}

/// Remove `dir` when this process exits (after the test harness has run every test).
fn remove_at_exit(dir: PathBuf) {
    static DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    extern "C" fn remove_all() {
        // No panic may leave an extern "C" function: errors are ignored, a poisoned lock read.
        let dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if dirs.is_empty() {
        // SAFETY: registering a function that takes and returns nothing.
        unsafe { libc::atexit(remove_all) };
    }
    dirs.push(dir);
}

/// `pkg-config --cflags --libs cuhook` against the tree of [`installed_c_prefix`], split into
/// arguments.
pub fn pkg_config_cuhook() -> Vec<String> {
    pkg_config_flags(&installed_c_prefix().join("lib/pkgconfig"), None)
}

/// `pkg-config --cflags --libs cuhook` with `cuhook.pc` from `pc_dir`, under `sysroot` if
/// given (a staged `--destdir` tree).
pub fn pkg_config_flags(
    pc_dir: &std::path::Path,
    sysroot: Option<&std::path::Path>,
) -> Vec<String> {
    let mut cmd = Command::new("pkg-config");
    cmd.args(["--cflags", "--libs", "cuhook"])
        .env("PKG_CONFIG_PATH", pc_dir);
    if let Some(s) = sysroot {
        cmd.env("PKG_CONFIG_SYSROOT_DIR", s);
    }
    let out = output_ok(&mut cmd);
    String::from_utf8(out.stdout)
        .expect("pkg-config output is UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The `cuhook` binary of this build, with none of the caller's cuhook settings.
pub fn cuhook_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuhook"));
    cmd.env_remove("CUHOOK_DISABLE").env_remove("LD_PRELOAD");
    for v in ["CUHOOK_REPORT", "CUHOOK_TRACE"] {
        cmd.env_remove(v);
    }
    cmd
}

/// Where the tests' scratch directories go: the target directory's scratch space, not `/tmp`
/// (`.ci/run` fails when a test run leaves `cuhook*` entries in `/tmp`).
pub fn scratch_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// A fresh, empty directory for one test's files (the caller removes it; see [`scratch`] for
/// one that removes itself).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = scratch_root().join(format!("cuhook-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// A scratch directory removed when dropped — kept, and named on stderr, when the test is
/// failing (panicking), for a look at what it left.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for a look: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// [`scratch_dir`] that removes itself.
pub fn scratch(name: &str) -> Scratch {
    Scratch(scratch_dir(name))
}

/// Run `cmd` to completion; panic with its stderr unless it exited 0.
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
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
