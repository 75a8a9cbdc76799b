//! `cuhook run`: a command under LD_PRELOAD=libcuhook.so, its exit status passed through, the
//! exit report printed.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use super::private_dir::PrivateDir;
use super::signals;

const HELP: &str = "\
Usage: cuhook run [--report FILE] [--trace FILE] [--] COMMAND [ARGS...]

Runs COMMAND with libcuhook.so (found beside this binary) preloaded. Every process of the
command writes an exit report; the command's own report, and those of other processes that
used CUDA, are printed on stderr when it ends. Exits with COMMAND's exit status.

  --report FILE   also write the report(s) to FILE
  --trace FILE    write one JSON object per event (alloc/free) to FILE

In FILE, %p becomes the process id (for --report: COMMAND's), %r the MPI rank (from
OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, MV2_COMM_WORLD_RANK or SLURM_PROCID; 0 outside a
launcher), %% a %. Under MPI: mpirun -n 4 cuhook run --trace t.%r.jsonl -- ./app
";

/// Parsed `run` options.
#[derive(Debug, Default, PartialEq)]
pub struct Options {
    pub report: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    pub command: Vec<OsString>,
}

pub fn parse(args: &[OsString]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let value = |i: usize| {
            args.get(i + 1)
                .cloned()
                .ok_or_else(|| format!("{} needs a file name", a.to_string_lossy()))
        };
        match a.to_str() {
            Some("--report") => {
                o.report = Some(value(i)?.into());
                i += 2;
            }
            Some("--trace") => {
                o.trace = Some(value(i)?.into());
                i += 2;
            }
            Some("--") => {
                o.command = args[i + 1..].to_vec();
                break;
            }
            Some(s) if s.starts_with('-') && o.command.is_empty() => {
                return Err(format!("unknown option `{s}`"))
            }
            _ => {
                o.command = args[i..].to_vec();
                break;
            }
        }
    }
    if o.command.is_empty() {
        return Err("no command given".to_owned());
    }
    Ok(o)
}

/// `libcuhook.so` beside the running binary (or in `deps/`, where `cargo test` leaves it).
pub fn find_library() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the cuhook binary: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for candidate in [dir.join("libcuhook.so"), dir.join("deps/libcuhook.so")] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "libcuhook.so is not beside {} — build it with `cargo build --release`",
        exe.display()
    ))
}

/// The result of one command under cuhook.
pub struct Outcome {
    pub status: ExitStatus,
    /// The process id of the command (what `%p` in `--report` names).
    pub pid: u32,
    /// Reports of the command itself first, then of its other processes that used CUDA.
    pub reports: Vec<String>,
}

/// Run `command` under cuhook, tracing to `trace` when given.
pub fn run_under_cuhook(
    command: &[OsString],
    trace: Option<&Path>,
    extra_env: &[(&str, &OsStr)],
) -> Result<Outcome, String> {
    let lib = find_library()?;
    signals::start_forwarding();
    // Dropped (and removed) on every way out of this function.
    let dir = PrivateDir::new("cuhook-run-").map_err(|e| {
        format!(
            "cannot create a directory in {}: {e}",
            std::env::temp_dir().display()
        )
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
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", command[0].to_string_lossy()))?;
    let pid = child.id();
    let status = signals::wait(&mut child)
        .map_err(|e| format!("waiting for {}: {e}", command[0].to_string_lossy()))?;
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

/// Write `--report FILE`: never through a symlink (one planted in a shared directory would
/// redirect it), the same rule the library keeps for `CUHOOK_REPORT` and `CUHOOK_TRACE`.
fn write_report(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .write_all(text.as_bytes())
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

pub fn main(args: &[OsString]) -> i32 {
    if args.first().is_some_and(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return 0;
    }
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuhook run: {e}. Try `cuhook run --help`.");
            return super::USAGE_ERROR;
        }
    };
    let outcome = match run_under_cuhook(&opts.command, opts.trace.as_deref(), &[]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuhook run: {e}");
            return 127;
        }
    };
    let text = outcome.reports.join("\n");
    if text.is_empty() {
        eprintln!("cuhook run: the command left no report (did it exec a static binary, or run with CUHOOK_DISABLE=1?)");
    } else {
        eprint!("{text}");
    }
    if let Some(path) = &opts.report {
        let path = cuhook::report::expand_path_for(path.as_os_str(), outcome.pid);
        if let Err(e) = write_report(Path::new(&path), &text) {
            eprintln!(
                "cuhook run: cannot write the report to {}: {e}",
                path.to_string_lossy()
            );
        }
    }
    exit_code(outcome.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn options_and_command() {
        let o = parse(&os(&[
            "--report", "r.txt", "--trace", "t.json", "--", "python3", "-c", "x",
        ]))
        .unwrap();
        assert_eq!(o.report, Some("r.txt".into()));
        assert_eq!(o.trace, Some("t.json".into()));
        assert_eq!(o.command, os(&["python3", "-c", "x"]));
        assert_eq!(
            parse(&os(&["ls", "-l"])).unwrap().command,
            os(&["ls", "-l"])
        );
    }

    #[test]
    fn usage_errors_are_explained() {
        assert_eq!(parse(&os(&[])).unwrap_err(), "no command given");
        assert_eq!(
            parse(&os(&["--report"])).unwrap_err(),
            "--report needs a file name"
        );
        assert_eq!(
            parse(&os(&["--bogus", "x"])).unwrap_err(),
            "unknown option `--bogus`"
        );
    }
}
