//! The loader's list of objects walked (`dl_iterate_phdr`) with a closure that never unwinds
//! into glibc, and the auxiliary vector's vDSO and interpreter addresses.
//!
//! # Safety
//! The walk's callback receives the loader's own `dl_phdr_info`, valid for the call; a panic
//! inside it is caught there and ends the walk.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::mem::offset_of;
use std::ops::ControlFlow;

use libc::{dl_phdr_info, Elf64_Phdr};

/// Longest object name read from a `dl_phdr_info`; longer ones are truncated (PATH_MAX).
const MAX_NAME: usize = 4096;

/// One object as [`iterate`] shows it.
pub(crate) struct Listed<'a> {
    pub info: &'a dl_phdr_info,
    /// The loader's add/remove counters are present (`dlpi_adds`/`dlpi_subs`).
    pub has_counters: bool,
}

impl Listed<'_> {
    /// The object's name as the loader recorded it ("" for the main program), bounded.
    pub(crate) fn name(&self) -> &[u8] {
        let name = self.info.dlpi_name;
        if name.is_null() {
            return &[];
        }
        // SAFETY: a NUL-terminated string of the loader's; `strnlen` stops at the NUL or after
        // MAX_NAME bytes (its wide reads never cross a page the string does not reach).
        let len = unsafe { libc::strnlen(name, MAX_NAME) };
        // SAFETY: the first `len` bytes precede the NUL (or the bound).
        unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) }
    }

    /// Its program headers.
    pub(crate) fn program_headers(&self) -> &[Elf64_Phdr] {
        let n = self.info.dlpi_phnum as usize;
        if n == 0 || self.info.dlpi_phdr.is_null() {
            return &[];
        }
        // SAFETY: the loader's program headers array has `dlpi_phnum` entries.
        unsafe { std::slice::from_raw_parts(self.info.dlpi_phdr, n) }
    }
}

/// Walk the loader's list of objects (`dl_iterate_phdr`), in load order, under the loader's
/// list lock: `visit` must not allocate, lock or call the loader. It returns `Break` to stop.
/// A panic in `visit` stops the walk and is reported as `Err` (it never unwinds into glibc).
pub(crate) fn iterate<F>(visit: &mut F) -> Result<(), ()>
where
    F: FnMut(&Listed<'_>) -> ControlFlow<()>,
{
    struct State<'f, F> {
        visit: &'f mut F,
        panicked: bool,
    }
    unsafe extern "C" fn step<F>(info: *mut dl_phdr_info, size: usize, data: *mut c_void) -> c_int
    where
        F: FnMut(&Listed<'_>) -> ControlFlow<()>,
    {
        // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut State`.
        let (info, state) = unsafe { (&*info, &mut *data.cast::<State<F>>()) };
        let listed = Listed {
            info,
            has_counters: size >= offset_of!(dl_phdr_info, dlpi_subs) + size_of::<u64>(),
        };
        let visit = &mut *state.visit;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(&listed))) {
            Ok(ControlFlow::Continue(())) => 0,
            Ok(ControlFlow::Break(())) => 1,
            Err(_) => {
                state.panicked = true;
                1
            }
        }
    }
    let mut state = State {
        visit,
        panicked: false,
    };
    // SAFETY: the callback matches dl_iterate_phdr's contract and `state` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(step::<F>), (&mut state as *mut State<F>).cast()) };
    if state.panicked {
        Err(())
    } else {
        Ok(())
    }
}

/// `getauxval`, for locating the vDSO and the dynamic loader.
fn auxv(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}

/// The vDSO's and the program interpreter's load addresses (`AT_SYSINFO_EHDR`, `AT_BASE`; 0
/// when absent), read from the auxiliary vector once: they never change, and `getauxval` walks
/// the vector on every call (≈ 100 instructions, twice for each object admitted).
pub(crate) fn vdso_and_interpreter() -> (usize, usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const UNREAD: usize = usize::MAX;
    static VDSO: AtomicUsize = AtomicUsize::new(UNREAD);
    static INTERP: AtomicUsize = AtomicUsize::new(UNREAD);
    let (v, i) = (VDSO.load(Ordering::Relaxed), INTERP.load(Ordering::Relaxed));
    if v != UNREAD && i != UNREAD {
        return (v, i);
    }
    let (v, i) = (auxv(libc::AT_SYSINFO_EHDR), auxv(libc::AT_BASE));
    VDSO.store(v, Ordering::Relaxed);
    INTERP.store(i, Ordering::Relaxed);
    (v, i)
}
