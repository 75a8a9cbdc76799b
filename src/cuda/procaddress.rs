//! `cuGetProcAddress` and friends: the statically linked CUDA runtime (nvcc's default) reaches
//! every driver function through pointers these return, never through a GOT slot. Each pointer
//! handed out is looked up among the originals of the installed hooks; a match is replaced by
//! the hook of exactly that variant (`cuMemAlloc_v2`, `cuMemAllocAsync_ptsz`, ...). Asking for
//! `cuGetProcAddress` itself therefore returns our wrapper. Unknown names, errors and NULL
//! outputs pass through untouched.
//!
//! # Safety
//! `pfn` is the caller's output pointer, read and written only after the real call succeeded.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

static CALLS: AtomicU64 = AtomicU64::new(0);
static MAPPED: AtomicU64 = AtomicU64::new(0);

/// How many entry-point lookups were seen, and how many handed out a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LookupCounts {
    /// Entry-point lookups seen (`cuGetProcAddress`, `dlsym` of the driver, ...).
    pub calls: u64,
    /// Of those, how many were answered with a hook.
    pub mapped: u64,
}

pub fn counts() -> LookupCounts {
    LookupCounts {
        calls: CALLS.load(Ordering::Relaxed),
        mapped: MAPPED.load(Ordering::Relaxed),
    }
}

/// Replace the function pointer the real lookup stored in `*pfn` by its hook, if it has one.
pub fn map_output(pfn: *mut *mut c_void) {
    CALLS.fetch_add(1, Ordering::Relaxed);
    if pfn.is_null() {
        return;
    }
    // SAFETY: a successful lookup wrote a function pointer (or NULL) to the non-null `pfn`.
    unsafe {
        let found = *pfn as usize;
        if found != 0 {
            let hook = crate::hooks::substitute(found);
            if hook != found {
                MAPPED.fetch_add(1, Ordering::Relaxed);
            }
            *pfn = hook as *mut c_void;
        }
    }
}
