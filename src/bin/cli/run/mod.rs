//! `cuhook run`: a command under LD_PRELOAD=libcuhook.so, its exit status passed through, the
//! exit report printed.
//!
//! Here: the options and the run's steps; the child process is in `child.rs`, the report and
//! trace files in `files.rs`.

mod child;
mod files;

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::ExitStatus;

use super::library;
pub use child::run_under_cuhook;
use files::{check_trace, prepare_report, write_report, ReportSink};

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
mod tests;
