//! Finding the driver cuhook calls itself: the libcuda object (the one the hooks' originals come
//! from) and its functions, looked up with `dlsym` so they are never our hooks.
//!
//! # Safety
//! `dladdr`, `dlopen` (`RTLD_NOLOAD`) and `dlsym` are called with NUL-terminated names and
//! valid out-parameters.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One lazily resolved driver entry point.
pub struct DriverSymbol {
    name: &'static CStr,
    address: AtomicUsize,
}

impl DriverSymbol {
    pub(super) const fn new(name: &'static CStr) -> DriverSymbol {
        DriverSymbol {
            name,
            address: AtomicUsize::new(0),
        }
    }

    /// The function's address, looked up on first use (0 while no libcuda is loaded).
    pub fn get(&self) -> usize {
        let a = self.address.load(Ordering::Acquire);
        if a != 0 {
            return a;
        }
        let found = resolve(self.name);
        if found != 0 {
            self.address.store(found, Ordering::Release);
        }
        found
    }
}

/// A handle for the object containing `address`, pinned (`RTLD_NOLOAD`: never loads anything).
fn object_of(address: usize) -> *mut c_void {
    // SAFETY: a zeroed Dl_info is a valid out-parameter; dladdr only reads the loader's tables,
    // and dli_fname is NUL-terminated when set.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(address as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return std::ptr::null_mut();
        }
        libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD)
    }
}

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
    // SAFETY: dlsym/dlopen with NUL-terminated names; RTLD_NOLOAD never loads an object.
    unsafe {
        let global = libc::dlsym(libc::RTLD_DEFAULT, c"cuPointerGetAttributes".as_ptr()) as usize;
        if global != 0 {
            let h = object_of(global);
            // Should dladdr fail, the global scope itself still finds the same functions.
            return if h.is_null() { libc::RTLD_DEFAULT } else { h };
        }
        let anchor = MEM_ALLOC_ORIGINAL.load(Ordering::Acquire);
        if anchor != 0 {
            let h = object_of(anchor);
            if !h.is_null() {
                return h;
            }
        }
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    }
}

/// Look `names` up in the driver object into `out` (0 where missing). Returns false when no
/// driver is loaded. Only failed lookups leave a `dlerror` message, and those are cleared, so
/// the application's own dlerror state is never clobbered by a successful resolution.
pub(super) fn resolve_all(names: &[&CStr], out: &mut [usize]) -> bool {
    let object = libcuda_object();
    let mut failed = object.is_null();
    if !failed {
        for (slot, name) in out.iter_mut().zip(names) {
            // SAFETY: `object` is a pinned handle or RTLD_DEFAULT; the name is a C string.
            *slot = unsafe { libc::dlsym(object, name.as_ptr()) } as usize;
            failed |= *slot == 0;
        }
    }
    if failed {
        // SAFETY: dlerror only reads and resets thread-local loader state.
        unsafe { libc::dlerror() };
    }
    !object.is_null()
}

fn resolve(name: &'static CStr) -> usize {
    let mut out = [0usize];
    resolve_all(&[name], &mut out);
    out[0]
}
