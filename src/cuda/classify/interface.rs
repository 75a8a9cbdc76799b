//! The handful of driver calls classification makes, behind a trait, so the algorithm can be
//! tested against a scripted driver and run against the real (or fake) `libcuda.so.1`.
//!
//! Handles cross the interface as integers (`CUcontext`, `CUmemoryPool` as `usize`, an
//! allocation handle as `u64`); errors are the driver's raw `CUresult` codes.

use cudarc::driver::sys::{CUdevice_attribute, CUmemorytype, CUpointer_attribute};

use crate::cuda::abi::CUresult;

pub use crate::cuda::abi::{CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};

/// A driver call's outcome: the value, or the driver's error code.
pub type DriverResult<T> = Result<T, CUresult>;

/// `CU_POINTER_ATTRIBUTE_*` values used in the batched query.
pub mod attr {
    use super::CUpointer_attribute as A;
    /// The allocation's `CUcontext`.
    pub const CONTEXT: u32 = A::CU_POINTER_ATTRIBUTE_CONTEXT as u32;
    /// `CUmemorytype`: host, device or unified.
    pub const MEMORY_TYPE: u32 = A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32;
    /// Whether the memory is managed.
    pub const IS_MANAGED: u32 = A::CU_POINTER_ATTRIBUTE_IS_MANAGED as u32;
    /// The owning device's ordinal.
    pub const DEVICE_ORDINAL: u32 = A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32;
    /// The `CUmemoryPool` of pool memory.
    pub const MEMPOOL_HANDLE: u32 = A::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as u32;
}

/// `CU_MEMORYTYPE_HOST`: pinned or registered host memory the driver knows.
pub const MEMORYTYPE_HOST: u32 = CUmemorytype::CU_MEMORYTYPE_HOST as u32;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: u32 = CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
/// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` (115).
pub const DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: i32 =
    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as i32;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CUresult =
    cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE as CUresult;

/// The driver calls classification makes, as a trait (the process's libcuda, or a script in
/// tests). Implementations call the driver's real functions, never cuhook's hooks.
pub trait DriverApi {
    /// Find the driver. `false` when no driver is loaded; nothing else is called then.
    fn resolve(&self) -> bool;

    /// A number that changes whenever the process may have gained a driver (objects were
    /// loaded). Read while the driver is absent, to retry only when that can have changed.
    /// It is not a driver call.
    fn load_generation(&self) -> u64;

    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DriverResult<i32>;

    /// `cuDeviceGetAttribute(attribute, device)`; the device handle is its ordinal.
    fn device_attribute(&self, attribute: i32, device: i32) -> DriverResult<i32>;

    /// `cuPointerGetAttributes` for `attributes`, one slot of `values` each (same length).
    /// Every slot starts at 0 and is 8 bytes wide, so a 4-byte attribute lands in its low half.
    fn pointer_attributes(&self, ptr: usize, attributes: &[u32], values: &mut [u64]) -> CUresult;

    /// `cuMemRetainAllocationHandle`: succeeds only inside a VMM mapping.
    fn retain_allocation_handle(&self, ptr: usize) -> DriverResult<u64>;

    /// `cuMemRelease` of a handle from [`DriverApi::retain_allocation_handle`].
    fn release(&self, handle: u64) -> CUresult;

    /// `cuCtxGetCurrent` (0: none).
    fn ctx_get_current(&self) -> DriverResult<usize>;

    /// `cuCtxSetCurrent`.
    fn ctx_set_current(&self, ctx: usize) -> CUresult;

    /// `cuDevicePrimaryCtxRetain`: one more reference to the device's primary context.
    fn primary_ctx_retain(&self, device: i32) -> DriverResult<usize>;
}
