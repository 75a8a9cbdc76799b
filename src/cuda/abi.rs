//! The C ABI of the hooked functions: cudarc's type definitions for handles, raw integers for
//! status codes (a Rust enum must never receive a value it does not list, and drivers add codes).

use std::ffi::{c_int, c_uint};

pub use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUgraph, CUgraphNode, CUipcMemHandle, CUlibrary,
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

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 share it) as cuhook reads it: cudarc's struct holds
/// Rust enums (the location type) that a newer driver may fill with values they do not list, so
/// the fields cuhook needs are plain integers here. The layout is checked against cudarc's below.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    /// `CUmemPoolProps`: allocation type, handle types, then the location (type, id), ...
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
    pool_props_rest: [u8; 72],
    pub access_descs: *const std::ffi::c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    /// Written by the driver: the address the graph's allocation has on every launch.
    pub dptr: CUdeviceptr,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const MEM_LOCATION_DEVICE: c_uint = 1;

/// `CUgraphNodeParams` (CUDA 12.2+) as cuhook reads it: the node type as the raw integer
/// (drivers add node types), then the union of per-type parameters.
#[repr(C)]
pub struct GraphNodeParams {
    pub node_type: c_uint,
    reserved0: [c_int; 3],
    pub body: GraphNodeBody,
    reserved2: i64,
}

/// The part of `CUgraphNodeParams`' union cuhook reads.
#[repr(C)]
pub union GraphNodeBody {
    pub alloc: MemAllocNodeParams,
    /// `CUDA_MEM_FREE_NODE_PARAMS`: the address freed.
    pub free: CUdeviceptr,
    reserved1: [i64; 29],
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC` and `CU_GRAPH_NODE_TYPE_MEM_FREE`.
pub const GRAPH_NODE_MEM_ALLOC: c_uint = 10;
pub const GRAPH_NODE_MEM_FREE: c_uint = 11;

// The views above must match the driver's layouts (as cudarc's bindings give them).
const _: () = {
    use cudarc::driver::sys;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<MemAllocNodeParams>() == size_of::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>());
    assert!(
        offset_of!(MemAllocNodeParams, bytesize)
            == offset_of!(sys::CUDA_MEM_ALLOC_NODE_PARAMS, bytesize)
    );
    assert!(
        offset_of!(MemAllocNodeParams, dptr) == offset_of!(sys::CUDA_MEM_ALLOC_NODE_PARAMS, dptr)
    );
    assert!(
        offset_of!(MemAllocNodeParams, location_type) == offset_of!(sys::CUmemPoolProps, location)
    );
    assert!(size_of::<GraphNodeParams>() == size_of::<sys::CUgraphNodeParams>());
    assert!(
        offset_of!(GraphNodeParams, body) == offset_of!(sys::CUgraphNodeParams, __bindgen_anon_1)
    );
};
