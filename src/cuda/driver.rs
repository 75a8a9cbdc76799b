//! The few driver functions cuhook itself calls (current context and device, pointer
//! attributes), resolved from the same libcuda the hooks' originals come from and never through
//! our hooks.
//!
//! # Safety
//! Each pointer is the address `dlsym` returned for the named driver function and is called
//! with that function's C signature.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::abi::{CUcontext, CUdevice, CUresult, CUDA_SUCCESS};

/// One lazily resolved driver entry point.
pub struct Entry {
    name: &'static CStr,
    address: AtomicUsize,
}

impl Entry {
    const fn new(name: &'static CStr) -> Entry {
        Entry {
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

/// Find a driver symbol: in the global scope, else in the object that defines the hooked
/// `cuMemAlloc_v2` (a libcuda loaded `RTLD_LOCAL`).
fn resolve(name: &CStr) -> usize {
    // SAFETY: dlsym with a NUL-terminated name; dlerror is cleared so the application never
    // sees our failed lookups.
    unsafe {
        let mut p = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize;
        if p == 0 {
            let anchor = super::table::original_of("cuMemAlloc_v2");
            let mut info: libc::Dl_info = std::mem::zeroed();
            if anchor != 0
                && libc::dladdr(anchor as *const c_void, &mut info) != 0
                && !info.dli_fname.is_null()
            {
                let h = libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
                if !h.is_null() {
                    p = libc::dlsym(h, name.as_ptr()) as usize;
                    libc::dlclose(h);
                }
            }
        }
        if p == 0 {
            // Only failed lookups leave a message; never touch the application's dlerror
            // state otherwise.
            libc::dlerror();
        }
        p
    }
}

pub static CU_CTX_GET_CURRENT: Entry = Entry::new(c"cuCtxGetCurrent");
pub static CU_CTX_GET_DEVICE: Entry = Entry::new(c"cuCtxGetDevice");

/// The calling thread's current context, or null.
pub fn current_context() -> CUcontext {
    let f = CU_CTX_GET_CURRENT.get();
    if f == 0 {
        return std::ptr::null_mut();
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `cuCtxGetCurrent(CUcontext *pctx)`.
    let rc = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut CUcontext) -> CUresult>(f)(&mut ctx)
    };
    if rc == CUDA_SUCCESS {
        ctx
    } else {
        std::ptr::null_mut()
    }
}

thread_local! {
    /// The last (context, device, generation) this thread asked the driver about: a context's
    /// device never changes, so an allocation in the same context needs no driver call.
    static DEVICE_OF_CONTEXT: std::cell::Cell<(usize, c_int, u64)> = const { std::cell::Cell::new((0, -1, 0)) };
}

/// Bumped when a context is destroyed or reset: its handle may be reused for another device.
static CONTEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Forget every thread's cached context → device pairs.
pub fn contexts_changed() {
    CONTEXT_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The device of context `ctx` (the current one), cached per thread.
pub fn device_of(ctx: CUcontext) -> c_int {
    let key = ctx as usize;
    let generation = CONTEXT_GENERATION.load(Ordering::Acquire);
    if key != 0 {
        let (cached_ctx, dev, cached_gen) = DEVICE_OF_CONTEXT.with(|c| c.get());
        if cached_ctx == key && cached_gen == generation {
            return dev;
        }
    }
    let dev = current_device();
    if key != 0 && dev >= 0 {
        DEVICE_OF_CONTEXT.with(|c| c.set((key, dev, generation)));
    }
    dev
}

/// The device of the calling thread's current context, or -1.
pub fn current_device() -> c_int {
    let f = CU_CTX_GET_DEVICE.get();
    if f == 0 {
        return -1;
    }
    let mut dev: CUdevice = -1;
    // SAFETY: `cuCtxGetDevice(CUdevice *device)`.
    let rc = unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(*mut CUdevice) -> CUresult>(f)(&mut dev)
    };
    if rc == CUDA_SUCCESS {
        dev
    } else {
        -1
    }
}
