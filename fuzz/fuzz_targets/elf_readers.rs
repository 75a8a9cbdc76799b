//! `cargo +nightly fuzz run elf_readers`: the ELF readers of `cuhook::elf` over arbitrary bytes
//! under coverage guidance. The harness (hook-tests/elf_fuzz/image.rs) maps the input as a
//! loaded object with nothing readable around it; a panic or a fault is a finding.
#![no_main]

#[path = "../../hook-tests/elf_fuzz/image.rs"]
mod image;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    image::check(data);
});
