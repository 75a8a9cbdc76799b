//! Call the real `dlsym`/`dlvsym` *as the caller*: glibc reads the meaning of `RTLD_NEXT` (the
//! scope to search and the objects to skip) and the object its `dlerror` text names from the
//! return address of the `dlsym` call. Our interposer sits in between, so that address is ours.
//! Emulating glibc's scopes from outside cannot be exact (a library opened `RTLD_LOCAL` searches
//! its own dependency list, which is not public ABI), so instead the real function is entered
//! with a return address inside the caller's object: a `ret` instruction found in the caller's
//! own code page, which hands control straight back to us.
//!
//! # Safety
//! The trampoline pushes our continuation and the `ret` address, then jumps to the real
//! function with the C arguments untouched: the real function returns onto the `ret`, which
//! returns to the continuation with the stack exactly as it was. The `ret` byte is searched in
//! the page that holds the caller's return address, which is mapped and executable (the caller
//! is running it) and checked readable before it is scanned. Not used while a shadow stack is
//! active (the returns would not match it): then the caller gets the emulation in `caller.rs`.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};

/// `real(handle, symbol, version)` entered with return address `ret_at`, a `ret` (0xC3) byte.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn call_through(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
    real: usize,
    ret_at: usize,
) -> *mut c_void {
    core::arch::naked_asm!(
        "endbr64",
        "lea rax, [rip + 2f]",
        "push rax",
        "push r8",
        "jmp rcx",
        "2:",
        "ret",
    );
}

/// A `ret` instruction inside the caller's object, on the page of its return address.
#[cfg(target_arch = "x86_64")]
fn ret_in_caller(caller: usize) -> Option<usize> {
    use crate::patch::ProtectionMap;
    let page = region::page::size().max(4096);
    let start = caller & !(page - 1);
    let map = ProtectionMap::for_addresses(std::iter::once(start)).ok()?;
    if !map
        .at(start)
        .ok()?
        .contains(region::Protection::READ_EXECUTE)
    {
        return None;
    }
    // SAFETY: the whole page is mapped readable (checked just above; the caller runs in it and
    // cannot be unmapped while it waits for us).
    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, page) };
    let own = super::caller::object_of(caller)?;
    memchr::memchr_iter(0xC3, bytes)
        .map(|i| start + i)
        .find(|&at| super::caller::object_of(at) == Some(own))
}

/// The real lookup as glibc would answer it for `caller`; `None` when it cannot be entered that
/// way (not x86_64, a shadow stack, no usable `ret` in the caller's page).
pub fn lookup(
    real: usize,
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
    caller: usize,
) -> Option<*mut c_void> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::sys::thread::shadow_stack_active() {
            return None;
        }
        let ret_at = ret_in_caller(caller)?;
        // SAFETY: `real` is the real dlsym or dlvsym (extra argument registers are ignored);
        // `ret_at` is a `ret` byte in the caller's mapped code (see the module doc).
        Some(unsafe { call_through(handle, symbol, version, real, ret_at) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (real, handle, symbol, version, caller);
        None
    }
}
