//! Link arguments of the C library (`libcuhook.so`); nothing else. The C test fixtures are
//! built by the `cuhook-fixtures` dev-dependency (fixtures/build), for the tests only.

fn main() {
    // Hooks point into libcuhook.so: it must never be unloaded while any slot does.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    // The ABI version C programs record (`NEEDED libcuhook.so.0`); see docs/api.md.
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuhook.so.{}",
        std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR")
    );
    println!("cargo:rerun-if-changed=build.rs");
}
