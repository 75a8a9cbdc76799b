//! The loader's entry points as cuhook calls them for itself, captured before any slot is
//! patched.
//!
//! When the crate is linked into a program (or into a library of the user's), cuhook's code
//! and its host are one ELF object, and that object is patched like any other: its `dlopen`,
//! `dlsym`, … slots then lead to cuhook's own interposers. cuhook's own loader calls must never
//! take that road (a `dlsym` of a driver function would answer with our hook; a `dlopen` from
//! inside an engine operation would start another), nor pass through another interposer of the
//! process (a profiler's `dlopen` wrapper would count our bookkeeping; a quota shim's `dlsym`
//! would hand us its wrappers). So they go through the addresses captured here, before the
//! first patch: the C library's own definitions (by their glibc 2.34 version; `libdl.so.2`'s
//! before), asked with the `dlvsym` this object links; where neither is found, the address this
//! object's GOT held.
//!
//! # Safety
//! Only the real functions of these names and C signatures are stored, from objects that are
//! never unloaded (the C library, `libdl`, the dynamic loader).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_long, c_void, CStr};

use super::func::TypedFn;
use super::once::ForkSafeOnce;

/// `dlopen`.
pub(crate) type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
/// `dlmopen`.
pub(crate) type DlmopenFn = unsafe extern "C" fn(c_long, *const c_char, c_int) -> *mut c_void;
/// `dlclose`.
pub(crate) type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `dlsym`.
pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
/// `dlvsym`.
pub(crate) type DlvsymFn =
    unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

static DLOPEN: TypedFn<DlopenFn> = TypedFn::unknown();
static DLMOPEN: TypedFn<DlmopenFn> = TypedFn::unknown();
static DLCLOSE: TypedFn<DlcloseFn> = TypedFn::unknown();
static DLSYM: TypedFn<DlsymFn> = TypedFn::unknown();
static DLVSYM: TypedFn<DlvsymFn> = TypedFn::unknown();
static CAPTURED: ForkSafeOnce = ForkSafeOnce::new();

/// Take the addresses now. Every engine operation calls this before it patches anything, so
/// the addresses are read from slots no cuhook has written (idempotent; cheap after the first).
pub(crate) fn capture() {
    CAPTURED.call_once(|| {
        // Address-taking loads each function from this object's GOT (its GLOB_DAT slot, bound
        // at start-up even under lazy binding); in a non-PIE object it is the canonical entry.
        let linked = [
            libc::dlopen as DlopenFn as usize,
            libc::dlmopen as DlmopenFn as usize,
            libc::dlclose as DlcloseFn as usize,
            libc::dlsym as DlsymFn as usize,
            libc::dlvsym as DlvsymFn as usize,
        ];
        let names: [&CStr; 5] = [c"dlopen", c"dlmopen", c"dlclose", c"dlsym", c"dlvsym"];
        // The C library's own definitions first: our bookkeeping calls (a `dlopen` with
        // RTLD_NOLOAD to pin an object, a `dlsym` of a driver function) must not pass through
        // another interposer (a profiler's `dlopen` wrapper would count them; a quota shim's
        // `dlsym` would hand us its wrappers). The linked address where the C library has none.
        let mut found = linked;
        for (slot, name) in found.iter_mut().zip(names) {
            let address = defined_by_libc(name);
            if address != 0 {
                *slot = address;
            }
        }
        // SAFETY: each address is the loader's function of that name and signature.
        unsafe {
            DLOPEN.set(found[0]);
            DLMOPEN.set(found[1]);
            DLCLOSE.set(found[2]);
            DLSYM.set(found[3]);
            DLVSYM.set(found[4]);
        }
    });
}

/// `name` as the C library defines it: the version glibc 2.34 gave the loader functions when
/// it moved them into libc, which a preloaded unversioned wrapper cannot stand in for (and
/// asking costs no `dlopen` another interposer could count); before 2.34, `libdl.so.2`'s. 0 when
/// neither is found. Called only before anything is patched.
fn defined_by_libc(name: &CStr) -> usize {
    // SAFETY: RTLD_DEFAULT and NUL-terminated strings.
    let mut address =
        unsafe { libc::dlvsym(libc::RTLD_DEFAULT, name.as_ptr(), c"GLIBC_2.34".as_ptr()) } as usize;
    if address == 0 {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD never loads anything.
        let handle =
            unsafe { libc::dlopen(c"libdl.so.2".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if !handle.is_null() {
            // SAFETY: a live handle (our own reference, given back once; the process links the
            // library, so it stays) and a NUL-terminated name.
            unsafe {
                address = libc::dlsym(handle, name.as_ptr()) as usize;
                libc::dlclose(handle);
            }
        }
    }
    // SAFETY: only resets the thread's pending loader message (a failed lookup above).
    unsafe { libc::dlerror() };
    address
}

/// The function of `slot`, capturing first if nothing has yet.
fn get<F: Copy>(slot: &TypedFn<F>) -> F {
    if let Some(f) = slot.get() {
        return f;
    }
    capture();
    slot.get().expect("capture stores every loader entry point")
}

/// The real `dlopen`.
pub(crate) fn dlopen() -> DlopenFn {
    get(&DLOPEN)
}
/// The real `dlmopen`.
pub(crate) fn dlmopen() -> DlmopenFn {
    get(&DLMOPEN)
}
/// The real `dlclose`.
pub(crate) fn dlclose() -> DlcloseFn {
    get(&DLCLOSE)
}
/// The real `dlsym`.
pub(crate) fn dlsym() -> DlsymFn {
    get(&DLSYM)
}
/// The real `dlvsym`.
pub(crate) fn dlvsym() -> DlvsymFn {
    get(&DLVSYM)
}

#[cfg(test)]
mod tests {
    /// The captured functions are the C library's (or libdl's) own, whatever this test
    /// program's slots hold: the same answers as a lookup in libc's scope.
    #[test]
    fn the_captured_functions_are_the_loaders() {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing.
        let libc = unsafe {
            (super::dlopen())(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        };
        assert!(!libc.is_null());
        // SAFETY: a live handle and NUL-terminated names.
        let (dlsym_there, libm) = unsafe {
            (
                (super::dlsym())(libc, c"dlsym".as_ptr()) as usize,
                (super::dlopen())(c"libm.so.6".as_ptr(), libc::RTLD_NOW),
            )
        };
        assert!(!libm.is_null());
        assert_eq!(super::dlsym() as usize, dlsym_there);
        // SAFETY: our references, given back once.
        unsafe {
            assert_eq!((super::dlclose())(libm), 0);
            assert_eq!((super::dlclose())(libc), 0);
        }
    }
}
