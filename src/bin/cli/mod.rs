//! Command-line parsing and the subcommands.

mod demo;
mod demo_build;
mod private_dir;
mod run;
mod signals;
mod symbols;
mod view;

use std::ffi::OsString;

const USAGE: &str = "\
cuhook — see every CUDA allocation and free a program makes

Usage:
  cuhook run [--report FILE] [--trace FILE] [--] COMMAND [ARGS...]
      Run COMMAND with libcuhook.so preloaded. Prints the exit report on stderr (and
      writes it to FILE with --report); --trace writes one JSON object per event to FILE.
      Exits with COMMAND's exit status. In FILE, %p is the process id and %r the MPI rank
      (mpirun -n 4 cuhook run --report r.%r.txt --trace t.%r.jsonl -- ./app).
  cuhook demo
      Run the bundled demo programs (fake CUDA driver and runtime) under cuhook and show
      the trace and the report. What `cargo run --release` does.
  cuhook view [-o FILE] TRACE.jsonl...
      Write FILE (default memory.html): a self-contained page showing each trace as a lane —
      live bytes over time per memory type and device, events by API, peaks, the summary.
  cuhook symbols
      List every hooked symbol: name, group, and the name cuGetProcAddress is asked for.
  cuhook help | --help | -h
      This text. Every subcommand also takes --help.

Environment (also honoured by libcuhook.so under LD_PRELOAD):
  CUHOOK_DISABLE=1          do not install
  CUHOOK_LOG=LEVEL          error|warn|info|debug|trace (default warn), on stderr
  CUHOOK_REPORT=stderr|PATH exit report (%p in PATH becomes the process id, %r the rank)
  CUHOOK_TRACE=PATH         one JSON line per event (%p, %r as above)
  CUHOOK_EXCLUDE=A,B        never patch objects whose path contains A or B
  CUHOOK_SCAN_MANAGED=all|stored|off
                            loaded device code read for __managed__ variables
";

/// Exit status for a usage error.
pub const USAGE_ERROR: i32 = 2;

pub fn main(args: Vec<OsString>) -> i32 {
    let Some(first) = args.first().and_then(|a| a.to_str()) else {
        return demo::main(&[]);
    };
    let rest = &args[1..];
    match first {
        "run" => run::main(rest),
        "demo" => demo::main(rest),
        "symbols" => symbols::main(rest),
        "view" => view::main(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            0
        }
        "--version" | "-V" => {
            println!("cuhook {}", env!("CARGO_PKG_VERSION"));
            0
        }
        other => {
            eprintln!("cuhook: unknown command `{other}`. Try `cuhook --help`.");
            USAGE_ERROR
        }
    }
}

/// Whether the arguments ask for help.
pub fn wants_help(args: &[OsString]) -> bool {
    args.iter().any(|a| a == "--help" || a == "-h")
}
