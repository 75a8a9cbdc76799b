//! `cuhook run`: a command under LD_PRELOAD=libcuhook.so, its exit status passed through, the
//! exit report printed.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use super::private_dir::PrivateDir;
use super::{library, signals};

const HELP: &str = "\
Usage: cuhook run [--report FILE] [--trace FILE] [--stacks N] [--lib PATH] [--] COMMAND [ARGS...]

Runs COMMAND with libcuhook.so preloaded. Every process of the command writes an exit report;
the command's own report, and those of other processes that used CUDA, are printed on stderr
when it ends. Exits with COMMAND's exit status.

  --report FILE   also write the report(s) to FILE
  --trace FILE    write one JSON object per event (alloc/free) to FILE (`cuhook view` draws it)
  --stacks N      record N frames (1-64) of each allocation's call stack: the report then
                  groups the memory still live at exit by call site, as function (file:line)
  --lib PATH      the libcuhook.so to preload (default: $CUHOOK_LIB, else beside this binary
                  or in ../lib; `cuhook --help` gives the whole search order)
  -h, --help      this text

Options come before COMMAND (or before `--`), as `--report FILE` or `--report=FILE`. In FILE,
%p becomes the process id (for --report: COMMAND's), %r the MPI rank (from
OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, MV2_COMM_WORLD_RANK or SLURM_PROCID; 0 outside a
launcher), %% a %. Under MPI: mpirun -n 4 cuhook run --trace t.%r.jsonl -- ./app

A FILE that cannot be written (its directory missing, a symbolic link, a FIFO nobody reads) is
refused before COMMAND starts.

Exit status: COMMAND's (128+N when a signal N ended it); 126 when COMMAND cannot be executed,
127 when it is not found, 125 when cuhook fails before starting it, 2 for a usage error.
";

/// Exit status when cuhook itself fails before the command runs (as `env` and `timeout` do).
pub const SETUP_FAILED: i32 = 125;
/// Exit status for a command that exists but cannot be executed (as a shell's).
pub const NOT_EXECUTABLE: i32 = 126;
/// Exit status for a command that does not exist (as a shell's).
pub const NOT_FOUND: i32 = 127;

/// Parsed `run` options.
#[derive(Debug, Default, PartialEq)]
pub struct Options {
    pub report: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    pub stacks: Option<u32>,
    pub lib: Option<PathBuf>,
    pub command: Vec<OsString>,
}

/// `None` when `--help` was asked for.
pub fn parse(args: Vec<OsString>) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut o = Options::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Long("report") => o.report = Some(p.value()?.into()),
            Long("trace") => o.trace = Some(p.value()?.into()),
            Long("stacks") => {
                let n: u32 = p.value()?.parse()?;
                if !(1..=64).contains(&n) {
                    return Err(lexopt::Error::from(format!(
                        "--stacks {n}: the frames recorded per allocation must be 1 to 64"
                    )));
                }
                o.stacks = Some(n);
            }
            Long("lib") => o.lib = Some(p.value()?.into()),
            Long("help") | Short('h') => return Ok(None),
            // The command and everything after it are the command's own.
            Value(first) => {
                o.command.push(first);
                o.command.extend(p.raw_args()?);
                break;
            }
            other => return Err(other.unexpected()),
        }
    }
    if o.command.is_empty() {
        return Err(lexopt::Error::from("no command given".to_owned()));
    }
    Ok(Some(o))
}

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
fn spawn_error(program: &OsStr, e: std::io::Error) -> RunError {
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

/// Whether `%p` in `template` changes the name (a name per process).
fn per_process(template: &OsStr) -> bool {
    cuhook::report::expand_path_for(template, 1) != cuhook::report::expand_path_for(template, 2)
}

/// Why a file at `path` cannot be made, in words, or `None` when its directory looks fine.
fn directory_problem(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("directory {} does not exist", dir.display()))
        }
        Err(e) => return Some(format!("directory {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => return Some(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
    }
    let mut c = dir.as_os_str().as_bytes().to_vec();
    c.push(0);
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr().cast(), libc::W_OK | libc::X_OK) } != 0 {
        return Some(format!(
            "directory {} is not writable ({})",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Some("is a directory".to_owned());
    }
    None
}

/// Where `--report` goes: a file opened before the command starts, or (with `%p`) a name that
/// is known only once the command has its process id.
enum ReportSink {
    /// The file, its name, and whether this run created it.
    Opened(File, OsString, bool),
    PerProcess(OsString),
}

/// Open `path` for writing the report: never through a symbolic link (one planted in a shared
/// directory would redirect it; the same rule the library keeps for `CUHOOK_REPORT`), never
/// waiting for a reader of a FIFO. Not truncated until the report is written.
fn open_report(path: &OsStr) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    // Writes may block again once the file is open (a FIFO whose reader is there).
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// The reason `open_report` failed, in words.
fn open_problem(path: &Path, e: &std::io::Error) -> String {
    if let Some(p) = directory_problem(path) {
        return p;
    }
    match e.raw_os_error() {
        Some(libc::ELOOP) => "is a symbolic link (name the file itself)".to_owned(),
        Some(libc::ENXIO) => "is a FIFO that nobody reads".to_owned(),
        _ => e.to_string(),
    }
}

/// Check `--report` before the command starts.
fn prepare_report(template: &Path) -> Result<ReportSink, String> {
    let t = template.as_os_str();
    let refuse = |why: String| format!("--report {}: {why}", template.display());
    if per_process(t) {
        let example = cuhook::report::expand_path_for(t, std::process::id());
        if let Some(why) = directory_problem(Path::new(&example)) {
            return Err(refuse(why));
        }
        return Ok(ReportSink::PerProcess(t.to_owned()));
    }
    let path = cuhook::report::expand_path_for(t, 0);
    let existed = std::fs::symlink_metadata(&path).is_ok();
    match open_report(&path) {
        Ok(f) => Ok(ReportSink::Opened(f, path, !existed)),
        Err(e) => Err(refuse(open_problem(Path::new(&path), &e))),
    }
}

/// Check `--trace` before the command starts: its directory must be there and writable (each
/// process of the command opens the file itself).
fn check_trace(template: &Path) -> Result<(), String> {
    let example = cuhook::report::expand_path_for(template.as_os_str(), std::process::id());
    match directory_problem(Path::new(&example)) {
        Some(why) => Err(format!("--trace {}: {why}", template.display())),
        None => Ok(()),
    }
}

/// Write the report to where `--report` said.
fn write_report(sink: ReportSink, pid: u32, text: &str) -> Result<(), String> {
    use std::io::Write;
    let (mut file, path) = match sink {
        ReportSink::Opened(f, path, _) => (f, path),
        ReportSink::PerProcess(template) => {
            let path = cuhook::report::expand_path_for(&template, pid);
            let f = open_report(&path).map_err(|e| {
                format!(
                    "{}: {}",
                    path.to_string_lossy(),
                    open_problem(Path::new(&path), &e)
                )
            })?;
            (f, path)
        }
    };
    // A FIFO or a terminal cannot be truncated; a regular file must be.
    if file.metadata().is_ok_and(|m| m.is_file()) {
        file.set_len(0)
            .map_err(|e| format!("{}: {e}", path.to_string_lossy()))?;
    }
    file.write_all(text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.to_string_lossy()))
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

pub fn main(args: Vec<OsString>) -> i32 {
    let opts = match super::args::options_or_exit(parse(args), "run", HELP) {
        Ok(o) => o,
        Err(status) => return status,
    };
    let lib = match library::find(opts.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cuhook run: {e}");
            return SETUP_FAILED;
        }
    };
    let report = match opts.report.as_deref().map(prepare_report).transpose() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cuhook run: {e}; the command was not started.");
            return SETUP_FAILED;
        }
    };
    if let Err(e) = opts.trace.as_deref().map(check_trace).transpose() {
        eprintln!("cuhook run: {e}; the command was not started.");
        return SETUP_FAILED;
    }
    let depth = opts.stacks.map(|n| OsString::from(n.to_string()));
    let env: Vec<(&str, &OsStr)> = depth
        .as_deref()
        .map(|d| ("CUHOOK_STACKS", d))
        .into_iter()
        .collect();
    let outcome = match run_under_cuhook(&lib, &opts.command, opts.trace.as_deref(), &env) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuhook run: {e}");
            // The command never ran: a report file made for it goes again.
            if let Some(ReportSink::Opened(_, path, true)) = report {
                let _ = std::fs::remove_file(path);
            }
            return e.exit_code();
        }
    };
    let text = outcome.reports.join("\n");
    if text.is_empty() {
        eprintln!("cuhook run: the command left no report (did it exec a static binary, or run with CUHOOK_DISABLE=1?)");
    } else {
        eprint!("{text}");
    }
    let code = exit_code(outcome.status);
    if let Some(sink) = report {
        if let Err(e) = write_report(sink, outcome.pid, &text) {
            eprintln!("cuhook run: cannot write the report: {e}");
            // The command's own failure says more than ours.
            return if code == 0 { 1 } else { code };
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_and_command() {
        let o = parse(os(&[
            "--report",
            "r.txt",
            "--trace=t.json",
            "--lib",
            "/x/libcuhook.so",
            "--",
            "python3",
            "-c",
            "x",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.report, Some("r.txt".into()));
        assert_eq!(o.trace, Some("t.json".into()));
        assert_eq!(o.lib, Some("/x/libcuhook.so".into()));
        assert_eq!(o.command, os(&["python3", "-c", "x"]));
        // The command's own options stay its own, `--` and `--report` included.
        assert_eq!(
            parse(os(&["ls", "-l", "--", "--report", "x"]))
                .unwrap()
                .unwrap()
                .command,
            os(&["ls", "-l", "--", "--report", "x"])
        );
        assert_eq!(parse(os(&["--help"])).unwrap(), None);
        assert_eq!(
            parse(os(&["--", "--help"])).unwrap().unwrap().command,
            os(&["--help"])
        );
    }

    #[test]
    fn usage_errors_name_the_option() {
        let err = |v: &[&str]| super::super::args::explain(parse(os(v)).unwrap_err());
        assert_eq!(err(&[]), "no command given");
        assert_eq!(err(&["--report"]), "option `--report` needs a value");
        assert_eq!(err(&["--bogus", "x"]), "unknown option `--bogus`");
        assert_eq!(err(&["--trace=t", "-q", "x"]), "unknown option `-q`");
        assert_eq!(
            err(&["--stacks", "0", "x"]),
            "--stacks 0: the frames recorded per allocation must be 1 to 64"
        );
        assert_eq!(
            err(&["--stacks=65", "x"]),
            "--stacks 65: the frames recorded per allocation must be 1 to 64"
        );
        assert!(err(&["--stacks", "many", "x"]).contains("many"));
        assert_eq!(
            parse(os(&["--stacks", "16", "x"])).unwrap().unwrap().stacks,
            Some(16)
        );
    }

    #[test]
    fn spawn_errors_map_to_shell_statuses() {
        let e = |errno: i32, prog: &str| {
            spawn_error(OsStr::new(prog), std::io::Error::from_raw_os_error(errno)).exit_code()
        };
        assert_eq!(e(libc::ENOENT, "nosuchcommand"), NOT_FOUND);
        assert_eq!(e(libc::ENOENT, "/no/such"), NOT_FOUND);
        assert_eq!(e(libc::EACCES, "/etc/passwd"), NOT_EXECUTABLE);
        assert_eq!(e(libc::ENOEXEC, "./script"), NOT_EXECUTABLE);
        assert_eq!(e(libc::EAGAIN, "x"), SETUP_FAILED);
    }

    #[test]
    fn output_paths_are_checked_before_the_run() {
        assert!(per_process(OsStr::new("r.%p.txt")));
        assert!(!per_process(OsStr::new("r.%r.%%p.txt")));
        assert_eq!(
            directory_problem(Path::new("/nonexistent/r.txt")).as_deref(),
            Some("directory /nonexistent does not exist")
        );
        assert_eq!(
            directory_problem(Path::new("/etc/passwd/r.txt")).as_deref(),
            Some("/etc/passwd is not a directory")
        );
        assert_eq!(directory_problem(Path::new("r.txt")), None);
        assert!(check_trace(Path::new("/nonexistent/t.%p.jsonl"))
            .unwrap_err()
            .starts_with("--trace /nonexistent/t.%p.jsonl: directory /nonexistent"));
    }
}
