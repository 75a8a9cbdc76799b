//! `cuhook symbols`: the hook table.

use std::ffi::OsString;

const HELP: &str = "\
Usage: cuhook symbols

Lists every hooked symbol (each exported variant is its own hook), its group, and the base
name callers pass to cuGetProcAddress.
";

pub fn main(args: Vec<OsString>) -> i32 {
    match super::args::only_help(args) {
        Ok(true) => {
            print!("{HELP}");
            return 0;
        }
        Ok(false) => {}
        Err(e) => return super::args::usage_error("cuhook", "symbols", e),
    }
    println!("{:<34} {:<24} base name", "symbol", "group");
    for h in cuhook::cuda::HOOKS {
        println!("{:<34} {:<24} {}", h.symbol, h.group.name(), h.base);
    }
    println!("\n{} hooks. Loader interposers (always installed with them): dlopen dlmopen dlclose dlsym dlvsym.", cuhook::cuda::HOOKS.len());
    0
}
