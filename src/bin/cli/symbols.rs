//! `cuhook symbols`: the hook table.

use std::ffi::OsString;

pub fn main(args: &[OsString]) -> i32 {
    if super::wants_help(args) {
        println!("Usage: cuhook symbols\n\nLists every hooked symbol (each exported variant is its own hook), its group, and\nthe base name callers pass to cuGetProcAddress.");
        return 0;
    }
    if let Some(a) = args.first() {
        eprintln!("cuhook symbols: unexpected argument {a:?}");
        return super::USAGE_ERROR;
    }
    println!("{:<34} {:<24} base name", "symbol", "group");
    for h in cuhook::cuda::HOOKS {
        println!("{:<34} {:<24} {}", h.symbol, h.group.name(), h.base);
    }
    println!("\n{} hooks. Loader interposers (always installed with them): dlopen dlmopen dlclose dlsym dlvsym.", cuhook::cuda::HOOKS.len());
    0
}
