//! The driver functions cuhook calls itself, in one typed table (the statics below) shared by the
//! hooks' queries (`query.rs`, `capture.rs`, `loaded.rs`) and the classifier
//! (`classify/libcuda.rs`). Each entry is looked up by name in the driver object `resolve.rs`
//! finds (so it is the driver's real function, never one of our hooks) and kept with its C
//! signature (CUDA 13 ABI, also the fake's `fake_cuda.h`): no caller spells a signature out or
//! turns an address into a function itself.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use super::abi::{CUcontext, CUdevice, CUresult};
use super::resolve;
use crate::sys::func::TypedFn;

/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`.
pub(crate) type CtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `CUresult cuCtxSetCurrent(CUcontext ctx)`.
pub(crate) type CtxSetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `CUresult cuCtxGetDevice(CUdevice *device)`.
pub(crate) type CtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
/// `CUresult cuCtxPushCurrent(CUcontext ctx)`.
pub(crate) type CtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
/// `CUresult cuCtxPopCurrent(CUcontext *pctx)`.
pub(crate) type CtxPopCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
/// `CUresult cuStreamGetCtx(CUstream stream, CUcontext *pctx)`.
pub(crate) type StreamGetCtx = unsafe extern "C" fn(usize, *mut CUcontext) -> CUresult;
/// `CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attributes, void **data,
/// CUdeviceptr ptr)` (a C enum is 4 bytes).
pub(crate) type PointerGetAttributes =
    unsafe extern "C" fn(u32, *const u32, *mut *mut c_void, u64) -> CUresult;
/// `CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)`.
pub(crate) type MemGetAddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> CUresult;
/// `CUresult cuDeviceGetCount(int *count)`.
pub(crate) type DeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
pub(crate) type DeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CUresult;
/// `CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)`.
pub(crate) type MemRetainAllocationHandle = unsafe extern "C" fn(*mut u64, *mut c_void) -> CUresult;
/// `CUresult cuMemRelease(CUmemGenericAllocationHandle handle)`.
pub(crate) type MemRelease = unsafe extern "C" fn(u64) -> CUresult;
/// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
pub(crate) type DevicePrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
/// `CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status)` (and its
/// `_ptsz` variant; the status enum is 4 bytes).
pub(crate) type StreamIsCapturing = unsafe extern "C" fn(usize, *mut u32) -> CUresult;
/// `CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
/// const char *name)`; `cuModuleGetGlobal_v2` has the same shape with a `CUmodule`.
pub(crate) type GetGlobal =
    unsafe extern "C" fn(*mut u64, *mut usize, *mut c_void, *const c_char) -> CUresult;

/// One driver function: its name and, once found, its address with its signature `F`.
pub(crate) struct DriverFn<F> {
    name: &'static CStr,
    function: TypedFn<F>,
    /// The driver was asked and has no such function: not asked again (a hook that calls an
    /// optional function would otherwise look it up on every call).
    missing: AtomicBool,
}

impl<F: Copy> DriverFn<F> {
    const fn new(name: &'static CStr) -> DriverFn<F> {
        DriverFn {
            name,
            function: TypedFn::unknown(),
            missing: AtomicBool::new(false),
        }
    }

    /// The function, looked up on first use (`None` while no libcuda is loaded).
    #[inline]
    pub(crate) fn get(&self) -> Option<F> {
        let address = match self.function.address() {
            0 if self.missing.load(Ordering::Relaxed) => return None,
            0 => look_up(self.name, &self.function, &self.missing),
            a => a,
        };
        // SAFETY: `address` is 0 or was published for this entry, whose signature is `F`.
        (address != 0).then(|| unsafe { crate::sys::func::fn_at::<F>(address) })
    }

    /// The function if it was found already; never looks it up (the classifier resolves its
    /// functions together, see [`Resolvable`]).
    #[inline]
    pub(crate) fn found(&self) -> Option<F> {
        self.function.get()
    }
}

/// Looks `name` up in the driver object and keeps what was found in `function`, or notes in
/// `missing` that a loaded driver has no such function.
#[cold]
fn look_up<F: Copy>(name: &CStr, function: &TypedFn<F>, missing: &AtomicBool) -> usize {
    let mut found = [0usize];
    let loaded = resolve::resolve_all(&[name], &mut found);
    let address = found[0];
    if loaded && address == 0 {
        missing.store(true, Ordering::Relaxed);
    }
    if address != 0 {
        // SAFETY: what `dlsym` returned for this function's name in the pinned driver object;
        // the table below pairs each name with its signature `F`.
        unsafe { function.set(address) };
    }
    address
}

/// A table entry with its signature erased, for resolving several entries in one pass.
pub(crate) trait Resolvable: Sync {
    /// The driver's name for the function.
    fn name(&self) -> &'static CStr;
    /// Its address (0: not found yet).
    fn address(&self) -> usize;
    /// Publish `address`, found for [`Resolvable::name`] in the driver object.
    ///
    /// # Safety
    /// `address` is what the driver object's `dlsym` returned for this entry's name.
    unsafe fn publish(&self, address: usize);
}

impl<F: Copy + Sync> Resolvable for DriverFn<F> {
    fn name(&self) -> &'static CStr {
        self.name
    }

    fn address(&self) -> usize {
        self.function.address()
    }

    unsafe fn publish(&self, address: usize) {
        // SAFETY: the caller's promise: the driver's function of this name, signature `F`.
        unsafe { self.function.set(address) };
    }
}

// The table: every driver function cuhook calls, one static each (a hook that reads one
// addresses it directly).

pub(crate) static CTX_GET_CURRENT: DriverFn<CtxGetCurrent> = DriverFn::new(c"cuCtxGetCurrent");
pub(crate) static CTX_SET_CURRENT: DriverFn<CtxSetCurrent> = DriverFn::new(c"cuCtxSetCurrent");
pub(crate) static CTX_GET_DEVICE: DriverFn<CtxGetDevice> = DriverFn::new(c"cuCtxGetDevice");
pub(crate) static CTX_PUSH_CURRENT: DriverFn<CtxPushCurrent> =
    DriverFn::new(c"cuCtxPushCurrent_v2");
pub(crate) static CTX_POP_CURRENT: DriverFn<CtxPopCurrent> = DriverFn::new(c"cuCtxPopCurrent_v2");
pub(crate) static STREAM_GET_CTX: DriverFn<StreamGetCtx> = DriverFn::new(c"cuStreamGetCtx");
pub(crate) static POINTER_GET_ATTRIBUTES: DriverFn<PointerGetAttributes> =
    DriverFn::new(c"cuPointerGetAttributes");
pub(crate) static MEM_GET_ADDRESS_RANGE: DriverFn<MemGetAddressRange> =
    DriverFn::new(c"cuMemGetAddressRange_v2");
pub(crate) static DEVICE_GET_COUNT: DriverFn<DeviceGetCount> = DriverFn::new(c"cuDeviceGetCount");
pub(crate) static DEVICE_GET_ATTRIBUTE: DriverFn<DeviceGetAttribute> =
    DriverFn::new(c"cuDeviceGetAttribute");
pub(crate) static MEM_RETAIN_ALLOCATION_HANDLE: DriverFn<MemRetainAllocationHandle> =
    DriverFn::new(c"cuMemRetainAllocationHandle");
pub(crate) static MEM_RELEASE: DriverFn<MemRelease> = DriverFn::new(c"cuMemRelease");
pub(crate) static DEVICE_PRIMARY_CTX_RETAIN: DriverFn<DevicePrimaryCtxRetain> =
    DriverFn::new(c"cuDevicePrimaryCtxRetain");
pub(crate) static STREAM_IS_CAPTURING: DriverFn<StreamIsCapturing> =
    DriverFn::new(c"cuStreamIsCapturing");
pub(crate) static STREAM_IS_CAPTURING_PTSZ: DriverFn<StreamIsCapturing> =
    DriverFn::new(c"cuStreamIsCapturing_ptsz");
pub(crate) static LIBRARY_GET_MANAGED: DriverFn<GetGlobal> = DriverFn::new(c"cuLibraryGetManaged");
pub(crate) static MODULE_GET_GLOBAL: DriverFn<GetGlobal> = DriverFn::new(c"cuModuleGetGlobal_v2");

/// Look `entries` up in one pass, all or nothing for the first `required`: returns false (and
/// publishes nothing) when no driver is loaded or one of those is missing. Found addresses are
/// published last entry first, so a reader that sees the required ones sees the others; an
/// entry not found keeps what it had.
pub(crate) fn resolve_together<const N: usize>(
    entries: [&dyn Resolvable; N],
    required: usize,
) -> bool {
    let names = entries.map(Resolvable::name);
    let mut found = [0usize; N];
    if !resolve::resolve_all(&names, &mut found) || found[..required].contains(&0) {
        return false;
    }
    for (entry, &address) in entries.iter().zip(&found).rev() {
        if address != 0 {
            // SAFETY: `resolve_all` looked `entry.name()` up in the driver object.
            unsafe { entry.publish(address) };
        }
    }
    true
}
