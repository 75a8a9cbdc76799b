//! Command-line parsing and the subcommands.

mod demo;
mod private_dir;
mod run;
mod signals;
mod symbols;

use std::ffi::OsString;

const USAGE: &str = "\
cuhook — see every CUDA allocation and free a program makes

Usage:
  cuhook run [--report FILE] [--trace FILE] [--] COMMAND [ARGS...]
      Run COMMAND with libcuhook.so preloaded. Prints the exit report on stderr (and
      writes it to FILE with --report); --trace writes one JSON object per event to FILE.
      Exits with COMMAND's exit status.
  cuhook demo
      Run the bundled demo programs (fake CUDA driver and runtime) under cuhook and show
      the trace and the report. What `cargo run --release` does.
  cuhook symbols
      List every hooked symbol: name, group, and the name cuGetProcAddress is asked for.
  cuhook help | --help | -h
      This text. Every subcommand also takes --help.

Environment (also honoured by libcuhook.so under LD_PRELOAD):
  CUHOOK_DISABLE=1          do not install
  CUHOOK_LOG=LEVEL          error|warn|info|debug|trace (default warn), on stderr
  CUHOOK_REPORT=stderr|PATH exit report (%p in PATH becomes the process id)
  CUHOOK_TRACE=PATH         one JSON line per event
  CUHOOK_EXCLUDE=A,B        never patch objects whose path contains A or B
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
