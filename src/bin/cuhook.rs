//! `cuhook`: run a program under the hooks and report what it allocated (`run`), show it on a
//! bundled demo (`demo`, what `cargo run --release` does), list the hook table (`symbols`),
//! and render a run's traces and reports as one page (`view`).

mod cli;

fn main() {
    // Like other command-line tools, end quietly when the reader of our output goes away
    // (`cuhook demo | head`) instead of panicking on a broken pipe.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(cli::main(std::env::args_os().skip(1).collect()));
}
