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

/// Replace the function pointer the real lookup stored in `*pfn` by its hook, if it has one.
pub fn map_output(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: a successful lookup wrote a function pointer (or NULL) to the non-null `pfn`.
    unsafe {
        let found = *pfn as usize;
        if found != 0 {
            *pfn = crate::hooks::substitute(found) as *mut c_void;
        }
    }
}
