//! `cuhook run`: a command under LD_PRELOAD=libcuhook.so, its exit status passed through, the
//! exit report printed.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

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
    let dir = std::env::temp_dir().join(format!("cuhook-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env("CUHOOK_REPORT", dir.join("report-%p.txt"));
    if let Some(t) = trace {
        cmd.env("CUHOOK_TRACE", t);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", command[0].to_string_lossy()))?;
    let pid = child.id();
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {}: {e}", command[0].to_string_lossy()))?;
    let mut reports = Vec::new();
    let own = dir.join(format!("report-{pid}.txt"));
    if let Ok(text) = std::fs::read_to_string(&own) {
        reports.push(text);
    }
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut others: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| *p != own)
            .collect();
        others.sort();
        for p in others {
            if let Ok(text) = std::fs::read_to_string(&p) {
                if !text.contains("(no CUDA allocation or free was seen)") {
                    reports.push(text);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Outcome {
        status,
        pid,
        reports,
    })
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
        if let Err(e) = std::fs::write(&path, &text) {
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
