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
//! is running it), and only in the part the caller's own segment covers when the loader mapped
//! that segment readable (its program header; the kernel is asked where glibc cannot say). Not
//! used while a shadow stack is active (the returns would not match it): then the caller gets
//! the emulation in `caller.rs`.
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
    let page = region::page::size().max(4096);
    let Some(code) = code_around(caller, page) else {
        return ret_in_page_asked(caller, page);
    };
    let (lo, hi) = code?;
    // SAFETY: `[lo, hi)` lies in the caller's segment, mapped readable (checked by
    // `code_around`; the caller runs in it and cannot be unmapped while it waits for us).
    let bytes = unsafe { std::slice::from_raw_parts(lo as *const u8, hi - lo) };
    memchr::memchr(0xC3, bytes).map(|i| lo + i)
}

/// The part of `caller`'s page inside the caller's own loaded segment, when the loader mapped
/// that segment readable and executable (its program header says so, which costs no system
/// call: asking the kernel made every `dlsym` that needs this ≈ 5 µs, 37 µs without
/// `PROCMAP_QUERY`). `Some(None)`: the segment is not both; `None`: the loader cannot say
/// (glibc before 2.36).
#[cfg(target_arch = "x86_64")]
fn code_around(caller: usize, page: usize) -> Option<Option<(usize, usize)>> {
    use crate::sys::dl;
    let map = dl::link_map_containing(caller)?;
    // SAFETY: the caller runs code of this object, so its link map and program headers stay
    // live while they are read here.
    let (base, phdrs) = unsafe { ((*map).l_addr, dl::program_headers(map.cast())?) };
    let segment = phdrs.iter().find(|p| {
        let start = base.wrapping_add(p.p_vaddr as usize);
        p.p_type == libc::PT_LOAD && caller >= start && caller - start < p.p_filesz as usize
    });
    let wanted = libc::PF_R | libc::PF_X;
    Some(segment.filter(|p| p.p_flags & wanted == wanted).map(|p| {
        let start = base.wrapping_add(p.p_vaddr as usize);
        let page_start = caller & !(page - 1);
        (
            page_start.max(start),
            (page_start + page).min(start + p.p_filesz as usize),
        )
    }))
}

/// A `ret` in `caller`'s page, when the kernel says the page is readable and executable, checked
/// to lie in the caller's object (where [`code_around`] cannot tell).
#[cfg(target_arch = "x86_64")]
fn ret_in_page_asked(caller: usize, page: usize) -> Option<usize> {
    use crate::patch::ProtectionMap;
    let start = caller & !(page - 1);
    let map = ProtectionMap::for_addresses(std::iter::once(start)).ok()?;
    if !map
        .at(start)
        .ok()?
        .contains(region::Protection::READ_EXECUTE)
    {
        return None;
    }
    // SAFETY: the whole page is mapped readable (checked just above).
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
