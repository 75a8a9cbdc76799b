//! Entry points of the loader interposers: tiny naked functions that hand the *caller's* return
//! address to the Rust implementation as an extra argument and tail-jump to it.
//!
//! glibc decides the search path of `dlopen` and the meaning of `RTLD_NEXT` from the return
//! address of the `dlopen`/`dlsym` call; once our interposer sits in between, that address is
//! ours. Reading it before any prologue runs is the only reliable way to know the real caller.
//!
//! Each entry begins with the indirect-branch landing pad of its architecture (`endbr64`,
//! `bti c`: a no-op where the feature is off), since callers reach it through a GOT slot or a
//! `dlsym`'d pointer; `x30` is passed on untouched, so a PAC-signed caller authenticates its own
//! return address as usual.
//!
//! # Safety
//! Each entry only loads the return address (at `[rsp]` on x86_64, in `x30` on aarch64) into
//! the first unused argument register and jumps, so the stack and the callee-saved registers are
//! exactly what the C caller set up; the target has the C signature plus that one argument.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_long, c_void};

use super::{
    dlclose_from, dlclose_from_c0, dlclose_from_c1, dlmopen_from, dlmopen_from_c0, dlmopen_from_c1,
    dlopen_from, dlopen_from_c0, dlopen_from_c1, dlsym_from, dlsym_from_c0, dlsym_from_c1,
    dlvsym_from, dlvsym_from_c0, dlvsym_from_c1,
};

macro_rules! entry {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty => $target:ident, $x86_reg:literal, $arm_reg:literal) => {
        $(#[$doc])*
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("endbr64", concat!("mov ", $x86_reg, ", [rsp]"), "jmp {t}", t = sym $target);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("bti c", concat!("mov ", $arm_reg, ", x30"), "b {t}", t = sym $target);
        }
    };
}

entry!(
    /// `dlopen(file, mode)`.
    dlopen_entry(file: *const c_char, mode: c_int) -> *mut c_void => dlopen_from, "rdx", "x2"
);
entry!(
    /// `dlmopen(lmid, file, mode)`.
    dlmopen_entry(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void => dlmopen_from, "rcx", "x3"
);
entry!(
    /// `dlclose(handle)`.
    dlclose_entry(handle: *mut c_void) -> c_int => dlclose_from, "rsi", "x1"
);
entry!(
    /// `dlsym(handle, symbol)`.
    dlsym_entry(handle: *mut c_void, symbol: *const c_char) -> *mut c_void => dlsym_from, "rdx", "x2"
);
entry!(
    /// `dlvsym(handle, symbol, version)`.
    dlvsym_entry(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void => dlvsym_from, "rcx", "x3"
);

// The chained entries (the hook set's `Chain`s): the same, each reaching its own forwarder.
entry!(
    /// `dlopen` through chain 0.
    dlopen_entry_c0(file: *const c_char, mode: c_int) -> *mut c_void => dlopen_from_c0, "rdx", "x2"
);
entry!(
    /// `dlopen` through chain 1.
    dlopen_entry_c1(file: *const c_char, mode: c_int) -> *mut c_void => dlopen_from_c1, "rdx", "x2"
);
entry!(
    /// `dlmopen` through chain 0.
    dlmopen_entry_c0(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void => dlmopen_from_c0, "rcx", "x3"
);
entry!(
    /// `dlmopen` through chain 1.
    dlmopen_entry_c1(lmid: c_long, file: *const c_char, mode: c_int) -> *mut c_void => dlmopen_from_c1, "rcx", "x3"
);
entry!(
    /// `dlclose` through chain 0.
    dlclose_entry_c0(handle: *mut c_void) -> c_int => dlclose_from_c0, "rsi", "x1"
);
entry!(
    /// `dlclose` through chain 1.
    dlclose_entry_c1(handle: *mut c_void) -> c_int => dlclose_from_c1, "rsi", "x1"
);
entry!(
    /// `dlsym` through chain 0.
    dlsym_entry_c0(handle: *mut c_void, symbol: *const c_char) -> *mut c_void => dlsym_from_c0, "rdx", "x2"
);
entry!(
    /// `dlsym` through chain 1.
    dlsym_entry_c1(handle: *mut c_void, symbol: *const c_char) -> *mut c_void => dlsym_from_c1, "rdx", "x2"
);
entry!(
    /// `dlvsym` through chain 0.
    dlvsym_entry_c0(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void => dlvsym_from_c0, "rcx", "x3"
);
entry!(
    /// `dlvsym` through chain 1.
    dlvsym_entry_c1(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void => dlvsym_from_c1, "rcx", "x3"
);
