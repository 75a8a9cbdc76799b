//! Command-line parsing and the subcommands.
//!
//! Arguments are parsed with `lexopt` (the binary's dependency only: libcuhook.so, which
//! programs preload, links none of this). Every option takes `--opt value` and `--opt=value`;
//! errors name the option as the user typed it.

mod args;
mod demo;
mod demo_build;
mod export;
mod library;
mod private_dir;
mod reader;
mod run;
mod signals;
mod symbols;
mod view;

use std::ffi::OsString;

const USAGE: &str = "\
cuhook — see every CUDA allocation and free a program makes

Usage:
  cuhook run [--report FILE] [--trace FILE] [--lib PATH] [--] COMMAND [ARGS...]
      Run COMMAND with libcuhook.so preloaded. Prints the exit report on stderr (and
      writes it to FILE with --report); --trace writes one JSON object per event to FILE.
      Exits with COMMAND's exit status. In FILE, %p is the process id and %r the MPI rank
      (mpirun -n 4 cuhook run --report r.%r.txt --trace t.%r.jsonl -- ./app).
  cuhook demo [--keep DIR] [--lib PATH]
      Run the bundled demo programs (fake CUDA driver and runtime) under cuhook and show
      the trace and the report; --keep DIR keeps their traces and reports for `cuhook view`.
      What `cargo run --release` does.
  cuhook view [-o FILE] TRACE.jsonl...
      Write FILE (default memory.html): a self-contained page showing each trace as a lane —
      live bytes over time per memory type and device, events by API, peaks, the summary.
  cuhook export --format perfetto [-o FILE] TRACE.jsonl...
      Write the traces as Chrome trace-event JSON (default trace.json) for Perfetto
      (ui.perfetto.dev, opened locally) or chrome://tracing.
  cuhook symbols
      List every hooked symbol: name, group, and the name cuGetProcAddress is asked for.
  cuhook --help | -h | help      This text. Every subcommand also takes --help.
  cuhook --version | -V          The version.

Where `cuhook run` finds libcuhook.so, first match wins: --lib PATH; $CUHOOK_LIB; beside
the cuhook binary (in a cargo target directory, the newer of libcuhook.so and
deps/libcuhook.so); ../lib, ../lib64 or ../lib/<arch>-linux-gnu next to its directory (where
scripts/install-c.sh puts it).

Exit status of run: the command's; 126 when it cannot be executed, 127 when it is not
found, 125 when cuhook itself fails before starting it (no library, an unusable --report or
--trace path), 2 for a usage error.

Environment (also honoured by libcuhook.so under LD_PRELOAD):
  CUHOOK_DISABLE=1          do not install
  CUHOOK_LOG=LEVEL          error|warn|info|debug|trace (default warn), on stderr
  CUHOOK_REPORT=stderr|PATH exit report (%p in PATH becomes the process id, %r the rank)
  CUHOOK_TRACE=PATH         one JSON line per event (%p, %r as above)
  CUHOOK_EXCLUDE=A,B        never patch objects whose path contains A or B
  CUHOOK_SCAN_MANAGED=all|stored|off
                            loaded device code read for __managed__ variables
  CUHOOK_GROUP_DLOPEN=0     handle a dlopen that brings new dependencies by a walk of
                            every loaded object (default 1: from the library it opened)
  CUHOOK_LIB=PATH           the libcuhook.so `cuhook run` and `cuhook demo` preload
";

/// Exit status for a usage error.
pub const USAGE_ERROR: i32 = 2;

pub fn main(args: Vec<OsString>) -> i32 {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let arg = match parser.next() {
        Ok(a) => a,
        Err(e) => return args::usage_error("cuhook", "", e),
    };
    let command = match arg {
        // `cargo run --release` with no arguments shows the demo.
        None => return demo::main(Vec::new()),
        Some(Long("help") | Short('h')) => {
            print!("{USAGE}");
            return 0;
        }
        Some(Long("version") | Short('V')) => {
            println!("cuhook {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Some(Value(command)) => command,
        Some(other) => return args::usage_error("cuhook", "", other.unexpected()),
    };
    let rest: Vec<OsString> = parser.raw_args().map(|r| r.collect()).unwrap_or_default();
    match command.to_str() {
        Some("run") => run::main(rest),
        Some("demo") => demo::main(rest),
        Some("symbols") => symbols::main(rest),
        Some("view") => view::main(rest),
        Some("export") => export::main(rest),
        Some("help") => {
            print!("{USAGE}");
            0
        }
        _ => {
            eprintln!(
                "cuhook: unknown command `{}`. Try `cuhook --help`.",
                command.to_string_lossy()
            );
            USAGE_ERROR
        }
    }
}
