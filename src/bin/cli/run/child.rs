//! The command as a child process: started with the library preloaded, awaited with signals
//! passed on, its reports collected; a failure to start it classified as a shell would.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use super::{NOT_EXECUTABLE, NOT_FOUND, SETUP_FAILED};
use crate::cli::private_dir::PrivateDir;
use crate::cli::signals;

/// Why a command did not run under cuhook; each maps to an exit status.
#[derive(Debug)]
pub enum RunError {
    /// cuhook could not prepare the run (no library, no temporary directory).
    Setup(String),
    /// The command exists but cannot be executed.
    NotExecutable(String),
    /// There is no such command.
    NotFound(String),
}

impl RunError {
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::Setup(_) => SETUP_FAILED,
            RunError::NotExecutable(_) => NOT_EXECUTABLE,
            RunError::NotFound(_) => NOT_FOUND,
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Setup(m) | RunError::NotExecutable(m) | RunError::NotFound(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Classify a failure to start `program` as a shell would: not found (127) or found and not
/// executable (126); anything else is ours (125).
pub(super) fn spawn_error(program: &OsStr, e: std::io::Error) -> RunError {
    let name = program.to_string_lossy();
    let has_slash = program.to_string_lossy().contains('/');
    match e.raw_os_error() {
        Some(libc::ENOENT) if !has_slash => {
            RunError::NotFound(format!("{name}: command not found (not in PATH)"))
        }
        Some(libc::ENOENT) => RunError::NotFound(format!("cannot run {name}: {e}")),
        Some(
            libc::EACCES
            | libc::EPERM
            | libc::ENOEXEC
            | libc::EISDIR
            | libc::ENOTDIR
            | libc::ELOOP
            | libc::ETXTBSY
            | libc::E2BIG
            | libc::ENAMETOOLONG,
        ) => RunError::NotExecutable(format!("cannot run {name}: {e}")),
        _ => RunError::Setup(format!("cannot start {name}: {e}")),
    }
}

/// The result of one command under cuhook.
pub struct Outcome {
    pub status: ExitStatus,
    /// The process id of the command (what `%p` in `--report` names).
    pub pid: u32,
    /// Reports of the command itself first, then of its other processes that used CUDA.
    pub reports: Vec<String>,
}

/// Run `command` with `lib` preloaded, tracing to `trace` when given.
pub fn run_under_cuhook(
    lib: &Path,
    command: &[OsString],
    trace: Option<&Path>,
    extra_env: &[(&str, &OsStr)],
) -> Result<Outcome, RunError> {
    signals::start_forwarding();
    // Dropped (and removed) on every way out of this function.
    let dir = PrivateDir::new("cuhook-run-").map_err(|e| {
        RunError::Setup(format!(
            "cannot create a directory in {}: {e}",
            std::env::temp_dir().display()
        ))
    })?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env("CUHOOK_REPORT", dir.path().join("report-%p.txt"));
    if let Some(t) = trace {
        cmd.env("CUHOOK_TRACE", t);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    signals::unblock_in_child(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| spawn_error(&command[0], e))?;
    let pid = child.id();
    let status = signals::wait(&mut child).map_err(|e| {
        RunError::Setup(format!("waiting for {}: {e}", command[0].to_string_lossy()))
    })?;
    let mut reports = Vec::new();
    let own = PathBuf::from(format!("report-{pid}.txt"));
    if let Some(text) = dir.read(&own) {
        reports.push(text);
    }
    for name in dir.names().into_iter().filter(|n| *n != own) {
        if let Some(text) = dir.read(&name) {
            if !text.contains("(no CUDA allocation or free was seen)") {
                reports.push(text);
            }
        }
    }
    Ok(Outcome {
        status,
        pid,
        reports,
    })
}
