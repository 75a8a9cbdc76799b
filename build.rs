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
    // The hooks' thread-local access is two instructions through a TLS descriptor and about
    // fifteen through `__tls_get_addr`; .cargo/config.toml asks for descriptors, which a
    // RUSTFLAGS variable (or a workspace of another project) silently replaces.
    let target = std::env::var("TARGET").unwrap_or_default();
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if target.starts_with("x86_64-") && !flags.contains("enable-tlsdesc") {
        println!(
            "cargo:warning=built without TLS descriptors: every hooked CUDA call pays a \
             __tls_get_addr call; add `-C llvm-args=-enable-tlsdesc` to RUSTFLAGS \
             (see docs/performance.md)"
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
}
