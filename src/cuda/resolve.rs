//! Finding the driver cuhook calls itself: the libcuda object (the one the hooks' originals come
//! from) and its functions, looked up with `dlsym` so they are never our hooks (the table of
//! them is `driver.rs`).
//!
//! The loader calls are `crate::sys::dl`'s; the driver object's handle is kept open for good, so
//! lookups in it stay valid.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sys::dl;

/// The original of the hooked `cuMemAlloc_v2`: the hook table's row for it publishes here, so
/// finding the driver object needs nothing from the table.
pub static MEM_ALLOC_ORIGINAL: AtomicUsize = AtomicUsize::new(0);

/// The object every driver function cuhook calls comes from, pinned so that addresses taken
/// from it never dangle; null while no driver is loaded. It is the one that defines
/// `cuPointerGetAttributes` in the global scope, else the one that defines the original of the
/// hooked `cuMemAlloc_v2` (a libcuda loaded `RTLD_LOCAL`, e.g. by the static CUDA runtime),
/// else an already loaded `libcuda.so.1`. Lookups in it with `dlsym` give the real functions:
/// GOT patching never changes what `dlsym` returns to cuhook's own object.
fn libcuda_object() -> *mut c_void {
    let global = dl::lookup_global(c"cuPointerGetAttributes", None);
    if global != 0 {
        // Should dladdr fail, the global scope itself still finds the same functions.
        return dl::open_containing(global).unwrap_or(libc::RTLD_DEFAULT);
    }
    let anchor = MEM_ALLOC_ORIGINAL.load(Ordering::Acquire);
    if anchor != 0 {
        if let Some(h) = dl::open_containing(anchor) {
            return h;
        }
    }
    dl::open_loaded(Some(c"libcuda.so.1")).unwrap_or(std::ptr::null_mut())
}

/// Look `names` up in the driver object into `out` (0 where missing). Returns false when no
/// driver is loaded. Only failed lookups leave a `dlerror` message, and those are cleared, so
/// the application's own dlerror state is never clobbered by a successful resolution.
pub(super) fn resolve_all(names: &[&CStr], out: &mut [usize]) -> bool {
    let object = libcuda_object();
    let mut failed = object.is_null();
    if !failed {
        for (slot, name) in out.iter_mut().zip(names) {
            // SAFETY: `object` is a pinned handle (never closed) or RTLD_DEFAULT.
            *slot = unsafe { dl::lookup(object, name, None) };
            failed |= *slot == 0;
        }
    }
    if failed {
        dl::clear_error();
    }
    !object.is_null()
}
