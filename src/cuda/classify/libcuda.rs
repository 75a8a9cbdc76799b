//! [`DriverApi`] over the process's own `libcuda.so.1` (the real driver, or the fake one in tests).
//!
//! Every function comes from the driver object `cuda::resolve` finds for cuhook's own calls
//! (pinned, so the addresses kept here never dangle; looked up with `dlsym`, so they are the
//! driver's real functions). cudarc's dynamic loader is never used (it panics when no driver is
//! installed).
//!
//! # Safety
//! Each address is what `dlsym` returned for the named driver function, and it is only ever
//! called with that function's C signature (CUDA 13 ABI, also the fake's `fake_cuda.h`).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::interface::{
    DriverApi, DriverResult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS,
};
use crate::cuda::abi::CUresult;

/// The driver functions classification calls, in the order of [`NAMES`] (an index into
/// `LibCuda::fns`).
#[derive(Clone, Copy)]
enum DriverFn {
    PointerGetAttributes,
    DeviceGetCount,
    DeviceGetAttribute,
    MemRetainAllocationHandle,
    MemRelease,
    CtxGetCurrent,
    CtxSetCurrent,
    DevicePrimaryCtxRetain,
}

const NAMES: [&CStr; 8] = [
    c"cuPointerGetAttributes",
    c"cuDeviceGetCount",
    c"cuDeviceGetAttribute",
    c"cuMemRetainAllocationHandle",
    c"cuMemRelease",
    c"cuCtxGetCurrent",
    c"cuCtxSetCurrent",
    c"cuDevicePrimaryCtxRetain",
];

/// Without these three there is nothing to classify with; the others are optional (an old
/// driver without VMM simply never reports VMM memory).
const REQUIRED: [DriverFn; 3] = [
    DriverFn::PointerGetAttributes,
    DriverFn::DeviceGetCount,
    DriverFn::DeviceGetAttribute,
];

/// The most attributes one [`DriverApi::pointer_attributes`] call passes.
const MAX_ATTRIBUTES: usize = 8;

/// The process's libcuda. `const`-constructible so it can live in a `static`.
pub struct LibCuda {
    fns: [AtomicUsize; NAMES.len()],
}

impl Default for LibCuda {
    fn default() -> Self {
        Self::new()
    }
}

impl LibCuda {
    /// Nothing resolved yet; functions are looked up in the driver on first use.
    pub const fn new() -> Self {
        LibCuda {
            fns: [const { AtomicUsize::new(0) }; NAMES.len()],
        }
    }

    fn get(&self, f: DriverFn) -> Option<usize> {
        match self.fns[f as usize].load(Ordering::Acquire) {
            0 => None,
            a => Some(a),
        }
    }
}

impl DriverApi for LibCuda {
    fn resolve(&self) -> bool {
        if REQUIRED.iter().all(|&f| self.get(f).is_some()) {
            return true;
        }
        let mut found = [0usize; NAMES.len()];
        if !crate::cuda::resolve::resolve_all(&NAMES, &mut found) {
            return false;
        }
        if REQUIRED.iter().any(|&f| found[f as usize] == 0) {
            return false;
        }
        // Optional functions first, so a reader that sees the required ones sees all.
        for (i, &a) in found.iter().enumerate().rev() {
            self.fns[i].store(a, Ordering::Release);
        }
        true
    }

    fn load_generation(&self) -> u64 {
        crate::elf::counters().adds
    }

    fn device_count(&self) -> DriverResult<i32> {
        let f = self
            .get(DriverFn::DeviceGetCount)
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut n: c_int = 0;
        // SAFETY: `CUresult cuDeviceGetCount(int *count)`.
        let rc = unsafe {
            crate::sys::func::fn_at::<unsafe extern "C" fn(*mut c_int) -> CUresult>(f)(&mut n)
        };
        ok(rc, n)
    }

    fn device_attribute(&self, attribute: i32, device: i32) -> DriverResult<i32> {
        let f = self
            .get(DriverFn::DeviceGetAttribute)
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut v: c_int = 0;
        type F = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult;
        // SAFETY: `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice dev)`.
        let rc = unsafe { crate::sys::func::fn_at::<F>(f)(&mut v, attribute, device) };
        ok(rc, v)
    }

    fn pointer_attributes(&self, ptr: usize, attributes: &[u32], values: &mut [u64]) -> CUresult {
        let Some(f) = self.get(DriverFn::PointerGetAttributes) else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        let n = attributes.len();
        if n != values.len() || n == 0 || n > MAX_ATTRIBUTES {
            return CUDA_ERROR_INVALID_VALUE;
        }
        values.fill(0);
        let mut data = [std::ptr::null_mut::<c_void>(); MAX_ATTRIBUTES];
        for (d, v) in data.iter_mut().zip(values.iter_mut()) {
            *d = (v as *mut u64).cast();
        }
        // SAFETY: the driver's `cuPointerGetAttributes`: `n` attributes and `n` data pointers,
        // each to an 8-byte slot, at least the size of any attribute requested.
        unsafe { crate::cuda::query::pointer_get_attributes(f, attributes, &mut data[..n], ptr) }
    }

    fn retain_allocation_handle(&self, ptr: usize) -> DriverResult<u64> {
        let f = self
            .get(DriverFn::MemRetainAllocationHandle)
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut handle = 0u64;
        type F = unsafe extern "C" fn(*mut u64, *mut c_void) -> CUresult;
        // SAFETY: `cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)`;
        // the driver only looks the address up, it never dereferences it.
        let rc = unsafe { crate::sys::func::fn_at::<F>(f)(&mut handle, ptr as *mut c_void) };
        ok(rc, handle)
    }

    fn release(&self, handle: u64) -> CUresult {
        let Some(f) = self.get(DriverFn::MemRelease) else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: `CUresult cuMemRelease(CUmemGenericAllocationHandle handle)`.
        unsafe { crate::sys::func::fn_at::<unsafe extern "C" fn(u64) -> CUresult>(f)(handle) }
    }

    fn ctx_get_current(&self) -> DriverResult<usize> {
        let f = self
            .get(DriverFn::CtxGetCurrent)
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        // SAFETY: `f` is what `dlsym` returned for `cuCtxGetCurrent`.
        unsafe { crate::cuda::query::ctx_get_current(f) }.map(|ctx| ctx as usize)
    }

    fn ctx_set_current(&self, ctx: usize) -> CUresult {
        let Some(f) = self.get(DriverFn::CtxSetCurrent) else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the driver's `cuCtxSetCurrent`, with a context the driver gave us.
        unsafe { crate::cuda::query::ctx_set_current(f, ctx as *mut c_void as _) }
    }

    fn primary_ctx_retain(&self, device: i32) -> DriverResult<usize> {
        let f = self
            .get(DriverFn::DevicePrimaryCtxRetain)
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        type F = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
        // SAFETY: `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
        let rc = unsafe { crate::sys::func::fn_at::<F>(f)(&mut ctx, device) };
        ok(rc, ctx as usize)
    }
}

fn ok<T>(rc: CUresult, v: T) -> DriverResult<T> {
    if rc == CUDA_SUCCESS {
        Ok(v)
    } else {
        Err(rc)
    }
}
