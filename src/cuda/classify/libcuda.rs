//! [`DriverApi`] over the process's own `libcuda.so.1` (the real driver, or the fake one in tests).
//!
//! Every function comes from the driver table (`cuda::driver`), shared with the hooks' own
//! queries: looked up in the driver object `cuda::resolve` finds for cuhook's own calls (pinned,
//! so the addresses never dangle; found with `dlsym`, so they are the driver's real functions),
//! and kept with its C signature (CUDA 13 ABI, also the fake's `fake_cuda.h`). cudarc's dynamic
//! loader is never used (it panics when no driver is installed).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use super::interface::{
    DriverApi, DriverResult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS,
};
use crate::cuda::abi::CUresult;
use crate::cuda::driver::{self, Resolvable};

/// Without the first three there is nothing to classify with; the others are optional (an old
/// driver without VMM simply never reports VMM memory).
const REQUIRED: usize = 3;

/// The driver functions classification calls, resolved together (the required ones first).
fn functions() -> [&'static dyn Resolvable; 8] {
    [
        &driver::POINTER_GET_ATTRIBUTES,
        &driver::DEVICE_GET_COUNT,
        &driver::DEVICE_GET_ATTRIBUTE,
        &driver::MEM_RETAIN_ALLOCATION_HANDLE,
        &driver::MEM_RELEASE,
        &driver::CTX_GET_CURRENT,
        &driver::CTX_SET_CURRENT,
        &driver::DEVICE_PRIMARY_CTX_RETAIN,
    ]
}

/// The most attributes one [`DriverApi::pointer_attributes`] call passes.
const MAX_ATTRIBUTES: usize = 8;

/// The process's libcuda: the driver table's functions. `const`-constructible so it can live in
/// a `static`.
pub struct LibCuda {
    _table: (),
}

impl Default for LibCuda {
    fn default() -> Self {
        Self::new()
    }
}

impl LibCuda {
    /// Nothing resolved yet; functions are looked up in the driver on first use.
    pub const fn new() -> Self {
        LibCuda { _table: () }
    }
}

impl DriverApi for LibCuda {
    fn resolve(&self) -> bool {
        let functions = functions();
        if functions[..REQUIRED].iter().all(|f| f.address() != 0) {
            return true;
        }
        driver::resolve_together(functions, REQUIRED)
    }

    fn load_generation(&self) -> u64 {
        crate::elf::counters().adds
    }

    fn device_count(&self) -> DriverResult<i32> {
        let f = driver::DEVICE_GET_COUNT
            .found()
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut n: c_int = 0;
        // SAFETY: the driver's `cuDeviceGetCount` (the table's type), with an out-pointer to a
        // local.
        let rc = unsafe { f(&mut n) };
        ok(rc, n)
    }

    fn device_attribute(&self, attribute: i32, device: i32) -> DriverResult<i32> {
        let f = driver::DEVICE_GET_ATTRIBUTE
            .found()
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut v: c_int = 0;
        // SAFETY: the driver's `cuDeviceGetAttribute` (the table's type), with an out-pointer
        // to a local; the driver checks the attribute and device.
        let rc = unsafe { f(&mut v, attribute, device) };
        ok(rc, v)
    }

    fn pointer_attributes(&self, ptr: usize, attributes: &[u32], values: &mut [u64]) -> CUresult {
        let Some(f) = driver::POINTER_GET_ATTRIBUTES.found() else {
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
        // SAFETY: `n` attributes and `n` data pointers, each to an 8-byte slot, at least the
        // size of any attribute requested.
        unsafe { crate::cuda::query::pointer_get_attributes(f, attributes, &mut data[..n], ptr) }
    }

    fn retain_allocation_handle(&self, ptr: usize) -> DriverResult<u64> {
        let f = driver::MEM_RETAIN_ALLOCATION_HANDLE
            .found()
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut handle = 0u64;
        // SAFETY: the driver's `cuMemRetainAllocationHandle` (the table's type), with an
        // out-pointer to a local; the driver only looks the address up, it never dereferences it.
        let rc = unsafe { f(&mut handle, ptr as *mut c_void) };
        ok(rc, handle)
    }

    fn release(&self, handle: u64) -> CUresult {
        let Some(f) = driver::MEM_RELEASE.found() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: the driver's `cuMemRelease` (the table's type), with a handle it handed out.
        unsafe { f(handle) }
    }

    fn ctx_get_current(&self) -> DriverResult<usize> {
        let f = driver::CTX_GET_CURRENT
            .found()
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        crate::cuda::query::ctx_get_current(f).map(|ctx| ctx as usize)
    }

    fn ctx_set_current(&self, ctx: usize) -> CUresult {
        let Some(f) = driver::CTX_SET_CURRENT.found() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        // SAFETY: a context the driver gave us.
        unsafe { crate::cuda::query::ctx_set_current(f, ctx as *mut c_void as _) }
    }

    fn primary_ctx_retain(&self, device: i32) -> DriverResult<usize> {
        let f = driver::DEVICE_PRIMARY_CTX_RETAIN
            .found()
            .ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: the driver's `cuDevicePrimaryCtxRetain` (the table's type), with an
        // out-pointer to a local; the driver checks the device.
        let rc = unsafe { f(&mut ctx, device) };
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
