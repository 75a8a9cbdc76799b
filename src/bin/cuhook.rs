//! `cuhook`: run a program under the hooks and report what it allocated (`run`), show it on a
//! bundled demo (`demo`, what `cargo run --release` does), list the hook table (`symbols`).

mod cli;

fn main() {
    std::process::exit(cli::main(std::env::args_os().skip(1).collect()));
}
