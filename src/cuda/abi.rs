//! The C ABI of the hooked functions: cudarc's type definitions for handles, raw integers for
//! status codes (a Rust enum must never receive a value it does not list, and drivers add codes).

use std::ffi::{c_int, c_uint};

pub use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUgraph, CUipcMemHandle, CUlibrary,
    CUmemGenericAllocationHandle, CUmemPoolPtrExportData, CUmemoryPool, CUmodule, CUstream,
};
pub use cudarc::runtime::sys::{cudaIpcMemHandle_t, cudaMemPool_t, cudaStream_t};

/// `CUresult` as the integer the driver returns.
pub type CUresult = c_uint;
/// `cudaError_t` as the integer the runtime returns.
pub type CudaError = c_int;

pub const CUDA_SUCCESS: CUresult = cudarc::driver::sys::CUresult::CUDA_SUCCESS as CUresult;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult =
    cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_INITIALIZED as CUresult;
pub const CUDA_SUCCESS_RT: CudaError = cudarc::runtime::sys::cudaError::cudaSuccess as CudaError;
pub const CUDA_ERROR_INITIALIZATION_RT: CudaError =
    cudarc::runtime::sys::cudaError::cudaErrorInitializationError as CudaError;

/// How a hooked function reports success, so generated code can test any of them.
pub trait Status: Copy {
    /// Returned when the hook has no original to call (cannot happen once installed).
    const NO_ORIGINAL: Self;
    fn ok(self) -> bool;
}

impl Status for CUresult {
    const NO_ORIGINAL: Self = CUDA_ERROR_NOT_INITIALIZED;
    fn ok(self) -> bool {
        self == CUDA_SUCCESS
    }
}

impl Status for CudaError {
    const NO_ORIGINAL: Self = CUDA_ERROR_INITIALIZATION_RT;
    fn ok(self) -> bool {
        self == CUDA_SUCCESS_RT
    }
}
