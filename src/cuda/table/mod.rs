//! The CUDA hook table: every allocation, free, teardown and entry-point-lookup function of the
//! driver and runtime APIs, each exported variant its own hook with its own original. One macro
//! generates every hook function from one line of this table, and the same lines are the data
//! `cuhook symbols` prints.
//!
//! # Safety
//! Each generated hook has exactly the C signature of the function it replaces (checked against
//! CUDA's headers by the fake driver's tests and on the real driver), reads its arguments only
//! where the C API promises them valid (output pointers after success), and calls the original
//! through the address the engine resolved for that very symbol.
#![allow(unsafe_code)]
#![allow(non_snake_case)]

mod row;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

use super::abi::*;
use super::capture;
use super::emit::{self, Announce, Global, Pending};
use super::graph;
use super::imported;
use super::loaded;
use super::procaddress;
use super::resolve;
use crate::events::{flags, HookGuard, MemType};

pub use row::{Group, HookInfo, CHAINS};

/// Read an output pointer the real call has just filled.
///
/// # Safety
/// `p` is NULL or points to a `T` written by a successful call.
unsafe fn out<T: Copy + Into<u64>>(p: *const T) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: non-null output of a successful call (caller).
        (unsafe { *p }).into() as usize
    }
}

/// Read an output `void *`.
///
/// # Safety
/// `p` is NULL or points to a pointer written by a successful call.
unsafe fn out_ptr(p: *const *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: non-null output of a successful call (caller).
        (unsafe { *p }) as usize
    }
}

macro_rules! cuda_hooks {
    // Where a hook's original is published: its own static, or one a lower module owns.
    (@original) => {
        /// The real function, published by the engine before any slot points here.
        pub static ORIGINAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    };
    (@original $($store:ident)::+) => {
        pub use super::$($store)::+ as ORIGINAL;
    };
    // What a hook must finish after the real call: its `before` expression, or nothing.
    (@before) => { Pending::Nothing };
    (@before $before:expr) => { $before };
    ($(
        $(#[$doc:meta])*
        $sym:ident [$group:ident, $base:literal $(, original: $($store:ident)::+)?] ($($arg:ident: $ty:ty),*) -> $ret:ty
            $(, before => $before:expr)? $(, after => $after:expr)? $(, finally => $finally:path)? ;
    )*) => {
        $(
            $(#[$doc])*
            pub mod $sym {
                #[allow(unused_imports)]
                use super::*;
                use std::sync::atomic::Ordering;

                cuda_hooks!(@original $($($store)::+)?);
                const API: &CStr = match CStr::from_bytes_with_nul(concat!(stringify!($sym), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("symbol names contain no NUL"),
                };

                /// Where chain `k` of this hook finds the definition it calls.
                pub static CHAIN: [std::sync::atomic::AtomicUsize; CHAINS] =
                    [const { std::sync::atomic::AtomicUsize::new(0) }; CHAINS];

                /// The hook. Only the outermost hooked call of a thread dispatches.
                ///
                /// # Safety
                /// Called by C code with the C function's arguments.
                pub unsafe extern "C" fn hook($($arg: $ty),*) -> $ret {
                    // SAFETY: forwarded (the caller's own arguments).
                    unsafe { through::<0>($($arg),*) }
                }

                /// The hook's first chain: the same, calling the definition `CHAIN[0]` holds.
                ///
                /// # Safety
                /// As [`hook`].
                pub unsafe extern "C" fn chain0($($arg: $ty),*) -> $ret {
                    // SAFETY: forwarded.
                    unsafe { through::<1>($($arg),*) }
                }

                /// The hook's second chain.
                ///
                /// # Safety
                /// As [`hook`].
                pub unsafe extern "C" fn chain1($($arg: $ty),*) -> $ret {
                    // SAFETY: forwarded.
                    unsafe { through::<2>($($arg),*) }
                }

                /// The body of the hook (`C` = 0) and of its chain `C - 1`, which differ only in
                /// the store their original is published in. Generic so that each has its own
                /// copy of the work (one copy shared by three callers was left out of line: 70
                /// more instructions per pair), private and called only from the plain functions
                /// above so that no other crate can instantiate it (a public generic hook reached
                /// every static it touches through the GOT: 16 more). `benches/callgrind.sh`.
                ///
                /// # Safety
                /// As [`hook`].
                #[inline(always)]
                #[allow(unused_variables, unused_mut, unused_assignments)]
                #[allow(clippy::too_many_arguments)] // the C function's own arguments
                unsafe fn through<const C: usize>($($arg: $ty),*) -> $ret {
                    #[cfg(cuhook_diag = "timing")]
                    let mut ticks = [crate::diag::now(), 0, 0, 0];
                    let store = if C == 0 { &ORIGINAL } else { &CHAIN[C.saturating_sub(1)] };
                    let real = store.load(Ordering::Acquire);
                    if real == 0 {
                        return <$ret as Status>::NO_ORIGINAL;
                    }
                    // SAFETY: ORIGINAL holds the address of the real `$sym`, same signature.
                    let real = unsafe { crate::sys::func::fn_at::<unsafe extern "C" fn($($ty),*) -> $ret>(real) };
                    // Lookups are mapped at every depth (the runtime resolves the driver from
                    // inside hooked calls), captures counted, stream destructions noted and
                    // loaded code read at every depth (the runtime loads its libraries inside
                    // the hooked call that starts it); only memory hooks need the
                    // outermost-call guard.
                    let guard = if matches!(Group::$group, Group::Resolution | Group::DriverCapture | Group::DriverLoad | Group::DriverStream) { None } else {
                        match HookGuard::enter(API) {
                            Some(g) => Some(g),
                            // SAFETY: the caller's own arguments, to the real function.
                            None => return unsafe { real($($arg),*) },
                        }
                    };
                    // One unwind guard around all of the hook's own work. The real call runs
                    // inside it; should the work before it panic, it runs after the guard.
                    let mut rc: Option<$ret> = None;
                    // A bug in the event code can never unwind into the C caller.
                    crate::sys::boundary::guarded(|| {
                        // The hook's own place for what it must finish: a free hook's record is
                        // copied out of the registry straight into it (`FreeBefore::prepare`).
                        let mut pending = Pending::Nothing;
                        let quiet = cuda_hooks!(@before $($before)?).prepare(&mut pending);
                        #[cfg(cuhook_diag = "timing")]
                        { ticks[1] = crate::diag::now(); }
                        // SAFETY: the caller's own arguments, to the real function.
                        let r = unsafe { real($($arg),*) };
                        #[cfg(cuhook_diag = "timing")]
                        { ticks[2] = crate::diag::now(); }
                        rc = Some(r);
                        let ok = <$ret as Status>::ok(r);
                        // SAFETY: `after` expressions only read the output pointers the real
                        // call has just filled (it succeeded), as the C API promises.
                        $( if ok { #[allow(unused_unsafe)] unsafe { $after; } } )?
                        emit::settle(&mut pending, quiet, ok);
                        // `finally` sees the result whether the call succeeded or not.
                        $( $finally(r); )?
                    }, || ());
                    #[cfg(cuhook_diag = "timing")]
                    if guard.is_some() {
                        ticks[3] = crate::diag::now();
                        crate::diag::record(API, ticks);
                    }
                    drop(guard);
                    match rc {
                        Some(rc) => rc,
                        // SAFETY: the caller's own arguments, to the real function.
                        None => unsafe { real($($arg),*) },
                    }
                }

                pub fn address() -> usize {
                    hook as *const () as usize
                }

                /// The chains' replacements and stores.
                pub fn chains() -> [(usize, &'static std::sync::atomic::AtomicUsize); CHAINS] {
                    [(chain0 as *const () as usize, &CHAIN[0]), (chain1 as *const () as usize, &CHAIN[1])]
                }

                /// Where the engine publishes the original (not inlinable: see
                /// [`HookInfo::original`]).
                #[inline(never)]
                pub fn original() -> &'static std::sync::atomic::AtomicUsize {
                    &ORIGINAL
                }
            }
        )*

        /// Every row of the table.
        pub static HOOKS: &[HookInfo] = &[
            $( HookInfo { symbol: stringify!($sym), base: $base, group: Group::$group, replacement: $sym::address, original: $sym::original, chains: $sym::chains }, )*
        ];
    };
}

// In `before`/`after`/`finally`, `API` is the hook's own symbol name as a C string; `finally`
// (a function) is called after every real call with its result.
cuda_hooks! {
    // ---- driver, synchronous --------------------------------------------------------------
    /// Its original is the anchor `resolve` finds the driver object by.
    cuMemAlloc_v2 [DriverSync, "cuMemAlloc", original: resolve::MEM_ALLOC_ORIGINAL] (dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize, 0, 0, 0);
    /// The pre-3.2 ABI: 32-bit pointer and size.
    cuMemAlloc [DriverSync, "cuMemAlloc"] (dptr: *mut c_uint, bytesize: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize as usize, 0, 0, 0);
    cuMemAllocPitch_v2 [DriverSync, "cuMemAllocPitch"] (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), out(pitch.cast::<u64>()) * height, 0, 0, 0);
    cuMemAllocPitch [DriverSync, "cuMemAllocPitch"] (dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), out(pitch) * height as usize, 0, 0, 0);
    cuMemAllocManaged [DriverSync, "cuMemAllocManaged"] (dptr: *mut CUdeviceptr, bytesize: usize, attach: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::CudaManaged, out(dptr), bytesize, 0, 0, 0);
    cuMemFree_v2 [DriverSync, "cuMemFree"] (dptr: CUdeviceptr) -> CUresult,
        before => emit::free_before(API, dptr as usize, 0, 0);
    cuMemFree [DriverSync, "cuMemFree"] (dptr: c_uint) -> CUresult,
        before => emit::free_before(API, dptr as usize, 0, 0);

    // ---- driver, stream-ordered -----------------------------------------------------------
    cuMemAllocAsync [DriverStreamOrdered, "cuMemAllocAsync"] (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize, flags::STREAM_ORDERED | capture::flag(stream as usize, false), stream as usize, 0);
    cuMemAllocAsync_ptsz [DriverStreamOrdered, "cuMemAllocAsync"] (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize, flags::STREAM_ORDERED | capture::flag(stream as usize, true), stream as usize, 0);
    cuMemAllocFromPoolAsync [DriverStreamOrdered, "cuMemAllocFromPoolAsync"] (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize, flags::STREAM_ORDERED | flags::POOL | capture::flag(stream as usize, false), stream as usize, pool as usize);
    cuMemAllocFromPoolAsync_ptsz [DriverStreamOrdered, "cuMemAllocFromPoolAsync"] (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, out(dptr), bytesize, flags::STREAM_ORDERED | flags::POOL | capture::flag(stream as usize, true), stream as usize, pool as usize);
    cuMemFreeAsync [DriverStreamOrdered, "cuMemFreeAsync"] (dptr: CUdeviceptr, stream: CUstream) -> CUresult,
        before => emit::free_before(API, dptr as usize, flags::STREAM_ORDERED | capture::flag(stream as usize, false), stream as usize);
    cuMemFreeAsync_ptsz [DriverStreamOrdered, "cuMemFreeAsync"] (dptr: CUdeviceptr, stream: CUstream) -> CUresult,
        before => emit::free_before(API, dptr as usize, flags::STREAM_ORDERED | capture::flag(stream as usize, true), stream as usize);

    // ---- driver, virtual memory management ------------------------------------------------
    /// A mapping of a handle from `cuMemImportFromShareableHandle` is flagged IMPORTED.
    cuMemMap [DriverVmm, "cuMemMap"] (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, map_flags: c_ulonglong) -> CUresult,
        after => emit::alloc(API, MemType::Cuda, ptr as usize, size, flags::VMM | imported::flag_of(handle), 0, 0);
    /// Forgets an imported handle (its value may be reused by a later `cuMemCreate`).
    cuMemRelease [DriverVmm, "cuMemRelease"] (handle: CUmemGenericAllocationHandle) -> CUresult,
        after => imported::released(handle);
    cuMemUnmap [DriverVmm, "cuMemUnmap"] (ptr: CUdeviceptr, size: usize) -> CUresult,
        before => emit::unmap_before(API, ptr as usize, size);

    // ---- driver, pinned host --------------------------------------------------------------
    cuMemAllocHost_v2 [DriverHost, "cuMemAllocHost"] (pp: *mut *mut c_void, bytesize: usize) -> CUresult,
        after => emit::alloc(API, MemType::Host, out_ptr(pp), bytesize, flags::PINNED_HOST, 0, 0);
    cuMemAllocHost [DriverHost, "cuMemAllocHost"] (pp: *mut *mut c_void, bytesize: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Host, out_ptr(pp), bytesize as usize, flags::PINNED_HOST, 0, 0);
    cuMemHostAlloc [DriverHost, "cuMemHostAlloc"] (pp: *mut *mut c_void, bytesize: usize, host_flags: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Host, out_ptr(pp), bytesize, flags::PINNED_HOST, 0, 0);
    cuMemFreeHost [DriverHost, "cuMemFreeHost"] (p: *mut c_void) -> CUresult,
        before => emit::free_before(API, p as usize, 0, 0);
    cuMemHostRegister_v2 [DriverHost, "cuMemHostRegister"] (p: *mut c_void, bytesize: usize, host_flags: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Host, p as usize, bytesize, flags::PINNED_HOST | flags::REGISTERED, 0, 0);
    cuMemHostRegister [DriverHost, "cuMemHostRegister"] (p: *mut c_void, bytesize: usize, host_flags: c_uint) -> CUresult,
        after => emit::alloc(API, MemType::Host, p as usize, bytesize, flags::PINNED_HOST | flags::REGISTERED, 0, 0);
    cuMemHostUnregister [DriverHost, "cuMemHostUnregister"] (p: *mut c_void) -> CUresult,
        before => emit::free_before(API, p as usize, 0, 0);

    // ---- driver, teardown -----------------------------------------------------------------
    /// A NULL context is refused by the driver; ranges of no known context are not its.
    cuCtxDestroy_v2 [DriverTeardown, "cuCtxDestroy"] (ctx: CUcontext) -> CUresult,
        before => emit::purge_before(API, |a| !ctx.is_null() && a.context == ctx as usize);
    cuCtxDestroy [DriverTeardown, "cuCtxDestroy"] (ctx: CUcontext) -> CUresult,
        before => emit::purge_before(API, |a| !ctx.is_null() && a.context == ctx as usize);
    cuDevicePrimaryCtxReset_v2 [DriverTeardown, "cuDevicePrimaryCtxReset"] (dev: CUdevice) -> CUresult,
        before => emit::purge_before(API, |a| dev >= 0 && a.device == dev);
    cuDevicePrimaryCtxReset [DriverTeardown, "cuDevicePrimaryCtxReset"] (dev: CUdevice) -> CUresult,
        before => emit::purge_before(API, |a| dev >= 0 && a.device == dev);

    // ---- driver, module and library globals ------------------------------------------------
    cuModuleGetGlobal_v2 [DriverModule, "cuModuleGetGlobal"] (dptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char) -> CUresult,
        after => emit::global(API, out(dptr), out(bytes.cast::<u64>()), module as usize, Global::InContext, Announce::Dispatch);
    /// The pre-3.2 ABI: 32-bit pointer and size.
    cuModuleGetGlobal [DriverModule, "cuModuleGetGlobal"] (dptr: *mut c_uint, bytes: *mut c_uint, module: CUmodule, name: *const c_char) -> CUresult,
        after => emit::global(API, out(dptr), out(bytes), module as usize, Global::InContext, Announce::Dispatch);
    cuLibraryGetGlobal [DriverModule, "cuLibraryGetGlobal"] (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) -> CUresult,
        after => emit::global(API, out(dptr), out(bytes.cast::<u64>()), library as usize, Global::InContext, Announce::Dispatch);
    cuLibraryGetManaged [DriverModule, "cuLibraryGetManaged"] (dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) -> CUresult,
        after => emit::global(API, out(dptr), out(bytes.cast::<u64>()), library as usize, Global::LibraryManaged, Announce::Dispatch);
    cuLibraryLoadData [DriverLoad, "cuLibraryLoadData"] (library: *mut CUlibrary, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, jit_count: c_uint, options: *mut c_int, values: *mut *mut c_void, count: c_uint) -> CUresult,
        after => loaded::library_loaded(API, out_ptr(library.cast()), code);
    cuModuleLoadData [DriverLoad, "cuModuleLoadData"] (module: *mut CUmodule, image: *const c_void) -> CUresult,
        after => loaded::module_loaded(API, out_ptr(module.cast()), image);
    cuModuleLoadDataEx [DriverLoad, "cuModuleLoadDataEx"] (module: *mut CUmodule, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) -> CUresult,
        after => loaded::module_loaded(API, out_ptr(module.cast()), image);
    cuModuleLoadFatBinary [DriverLoad, "cuModuleLoadFatBinary"] (module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult,
        after => loaded::module_loaded(API, out_ptr(module.cast()), fat_cubin);
    cuModuleUnload [DriverModule, "cuModuleUnload"] (module: CUmodule) -> CUresult,
        before => emit::unload_before(API, module as usize);
    cuLibraryUnload [DriverModule, "cuLibraryUnload"] (library: CUlibrary) -> CUresult,
        before => emit::unload_before(API, library as usize);

    // ---- driver, memory of another process ---------------------------------------------------
    cuIpcOpenMemHandle_v2 [DriverImport, "cuIpcOpenMemHandle"] (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, ipc_flags: c_uint) -> CUresult,
        after => emit::imported(API, out(pdptr), 0, 0);
    /// The pre-11.0 export, same ABI.
    cuIpcOpenMemHandle [DriverImport, "cuIpcOpenMemHandle"] (pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, ipc_flags: c_uint) -> CUresult,
        after => emit::imported(API, out(pdptr), 0, 0);
    cuIpcCloseMemHandle [DriverImport, "cuIpcCloseMemHandle"] (dptr: CUdeviceptr) -> CUresult,
        before => emit::free_before(API, dptr as usize, 0, 0);
    /// Freed like any pool block, with `cuMemFree` or `cuMemFreeAsync`.
    cuMemPoolImportPointer [DriverImport, "cuMemPoolImportPointer"] (ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, share: *mut CUmemPoolPtrExportData) -> CUresult,
        after => emit::imported(API, out(ptr_out), flags::POOL, pool as usize);
    /// No memory yet: the handle is remembered so that its `cuMemMap` is flagged IMPORTED.
    cuMemImportFromShareableHandle [DriverImport, "cuMemImportFromShareableHandle"] (handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: c_uint) -> CUresult,
        after => imported::imported(out(handle));

    // ---- driver, stream capture ------------------------------------------------------------
    /// The CUDA 10.0 ABI, without a mode.
    cuStreamBeginCapture [DriverCapture, "cuStreamBeginCapture"] (stream: CUstream) -> CUresult,
        finally => capture::began;
    cuStreamBeginCapture_ptsz [DriverCapture, "cuStreamBeginCapture"] (stream: CUstream) -> CUresult,
        finally => capture::began;
    cuStreamBeginCapture_v2 [DriverCapture, "cuStreamBeginCapture"] (stream: CUstream, mode: c_uint) -> CUresult,
        finally => capture::began;
    cuStreamBeginCapture_v2_ptsz [DriverCapture, "cuStreamBeginCapture"] (stream: CUstream, mode: c_uint) -> CUresult,
        finally => capture::began;
    cuStreamBeginCaptureToGraph [DriverCapture, "cuStreamBeginCaptureToGraph"] (stream: CUstream, graph: CUgraph, deps: *const c_void, edges: *const c_void, n: usize, mode: c_uint) -> CUresult,
        finally => capture::began;
    cuStreamBeginCaptureToGraph_ptsz [DriverCapture, "cuStreamBeginCaptureToGraph"] (stream: CUstream, graph: CUgraph, deps: *const c_void, edges: *const c_void, n: usize, mode: c_uint) -> CUresult,
        finally => capture::began;
    cuStreamEndCapture [DriverCapture, "cuStreamEndCapture"] (stream: CUstream, graph: *mut CUgraph) -> CUresult,
        finally => capture::ended;
    cuStreamEndCapture_ptsz [DriverCapture, "cuStreamEndCapture"] (stream: CUstream, graph: *mut CUgraph) -> CUresult,
        finally => capture::ended;

    // ---- driver, stream lifetime: noted when the call returns, so that no context a thread
    // cached for the stream outlives it (`query::context_of_stream`) --------------------------
    cuStreamDestroy_v2 [DriverStream, "cuStreamDestroy"] (stream: CUstream) -> CUresult,
        finally => super::super::query::stream_destroyed;
    /// The pre-4.0 export, same ABI.
    cuStreamDestroy [DriverStream, "cuStreamDestroy"] (stream: CUstream) -> CUresult,
        finally => super::super::query::stream_destroyed;

    // ---- driver, graph memory nodes added explicitly ------------------------------------------
    cuGraphAddMemAllocNode [DriverGraph, "cuGraphAddMemAllocNode"] (node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut MemAllocNodeParams) -> CUresult,
        after => graph::alloc_node(API, params);
    cuGraphAddMemFreeNode [DriverGraph, "cuGraphAddMemFreeNode"] (node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, dptr: CUdeviceptr) -> CUresult,
        before => emit::free_before(API, dptr as usize, flags::GRAPH, 0);
    /// The generic entry point (CUDA 12.2): memory nodes as above, other node types untouched.
    cuGraphAddNode [DriverGraph, "cuGraphAddNode"] (node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize, params: *mut GraphNodeParams) -> CUresult,
        // SAFETY: `params` is the caller's node description, valid for the call (the C API).
        before => unsafe { graph::node_before(API, params) }, after => graph::node_after(API, params);
    /// CUDA 12.3: with edge data.
    cuGraphAddNode_v2 [DriverGraph, "cuGraphAddNode"] (node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, params: *mut GraphNodeParams) -> CUresult,
        // SAFETY: `params` is the caller's node description, valid for the call (the C API).
        before => unsafe { graph::node_before(API, params) }, after => graph::node_after(API, params);

    // ---- runtime --------------------------------------------------------------------------
    cudaMalloc [Runtime, "cudaMalloc"] (p: *mut *mut c_void, size: usize) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), size, 0, 0, 0);
    cudaMallocPitch [Runtime, "cudaMallocPitch"] (p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), out(pitch.cast::<u64>()) * height, 0, 0, 0);
    cudaMallocManaged [Runtime, "cudaMallocManaged"] (p: *mut *mut c_void, size: usize, attach: c_uint) -> CudaError,
        after => emit::alloc(API, MemType::CudaManaged, out_ptr(p), size, 0, 0, 0);
    cudaFree [Runtime, "cudaFree"] (p: *mut c_void) -> CudaError,
        before => emit::free_before(API, p as usize, 0, 0);
    cudaMallocAsync [Runtime, "cudaMallocAsync"] (p: *mut *mut c_void, size: usize, stream: cudaStream_t) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), size, flags::STREAM_ORDERED | capture::flag(stream as usize, false), stream as usize, 0);
    cudaMallocAsync_ptsz [Runtime, "cudaMallocAsync"] (p: *mut *mut c_void, size: usize, stream: cudaStream_t) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), size, flags::STREAM_ORDERED | capture::flag(stream as usize, true), stream as usize, 0);
    cudaMallocFromPoolAsync [Runtime, "cudaMallocFromPoolAsync"] (p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, stream: cudaStream_t) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), size, flags::STREAM_ORDERED | flags::POOL | capture::flag(stream as usize, false), stream as usize, pool as usize);
    cudaMallocFromPoolAsync_ptsz [Runtime, "cudaMallocFromPoolAsync"] (p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, stream: cudaStream_t) -> CudaError,
        after => emit::alloc(API, MemType::Cuda, out_ptr(p), size, flags::STREAM_ORDERED | flags::POOL | capture::flag(stream as usize, true), stream as usize, pool as usize);
    cudaFreeAsync [Runtime, "cudaFreeAsync"] (p: *mut c_void, stream: cudaStream_t) -> CudaError,
        before => emit::free_before(API, p as usize, flags::STREAM_ORDERED | capture::flag(stream as usize, false), stream as usize);
    cudaFreeAsync_ptsz [Runtime, "cudaFreeAsync"] (p: *mut c_void, stream: cudaStream_t) -> CudaError,
        before => emit::free_before(API, p as usize, flags::STREAM_ORDERED | capture::flag(stream as usize, true), stream as usize);
    cudaMallocHost [Runtime, "cudaMallocHost"] (p: *mut *mut c_void, size: usize) -> CudaError,
        after => emit::alloc(API, MemType::Host, out_ptr(p), size, flags::PINNED_HOST, 0, 0);
    cudaHostAlloc [Runtime, "cudaHostAlloc"] (p: *mut *mut c_void, size: usize, host_flags: c_uint) -> CudaError,
        after => emit::alloc(API, MemType::Host, out_ptr(p), size, flags::PINNED_HOST, 0, 0);
    cudaFreeHost [Runtime, "cudaFreeHost"] (p: *mut c_void) -> CudaError,
        before => emit::free_before(API, p as usize, 0, 0);
    cudaHostRegister [Runtime, "cudaHostRegister"] (p: *mut c_void, size: usize, host_flags: c_uint) -> CudaError,
        after => emit::alloc(API, MemType::Host, p as usize, size, flags::PINNED_HOST | flags::REGISTERED, 0, 0);
    cudaHostUnregister [Runtime, "cudaHostUnregister"] (p: *mut c_void) -> CudaError,
        before => emit::free_before(API, p as usize, 0, 0);
    cudaIpcOpenMemHandle [Runtime, "cudaIpcOpenMemHandle"] (p: *mut *mut c_void, handle: cudaIpcMemHandle_t, ipc_flags: c_uint) -> CudaError,
        after => emit::imported(API, out_ptr(p), 0, 0);
    cudaIpcCloseMemHandle [Runtime, "cudaIpcCloseMemHandle"] (p: *mut c_void) -> CudaError,
        before => emit::free_before(API, p as usize, 0, 0);
    /// Through the runtime: noted at the call too, for a runtime that resolved the driver before
    /// install (its own call of `cuStreamDestroy` then reaches no hook).
    cudaStreamDestroy [Runtime, "cudaStreamDestroy"] (stream: cudaStream_t) -> CudaError,
        finally => super::super::query::stream_destroyed;
    cudaDeviceReset [Runtime, "cudaDeviceReset"] () -> CudaError,
        before => { let dev = super::super::query::current_device(); emit::purge_before(API, |a| dev >= 0 && a.device == dev) };

    // ---- entry-point lookup: every pointer handed out is mapped to its hook ------------------
    cuGetProcAddress [Resolution, "cuGetProcAddress"] (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, proc_flags: c_ulonglong) -> CUresult,
        after => procaddress::map_output(pfn);
    cuGetProcAddress_v2 [Resolution, "cuGetProcAddress"] (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, proc_flags: c_ulonglong, status: *mut c_int) -> CUresult,
        after => procaddress::map_output(pfn);
    cudaGetDriverEntryPoint [Resolution, "cudaGetDriverEntryPoint"] (symbol: *const c_char, pfn: *mut *mut c_void, proc_flags: c_ulonglong, status: *mut c_int) -> CudaError,
        after => procaddress::map_output(pfn);
    cudaGetDriverEntryPointByVersion [Resolution, "cudaGetDriverEntryPointByVersion"] (symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, proc_flags: c_ulonglong, status: *mut c_int) -> CudaError,
        after => procaddress::map_output(pfn);
    cudaGetDriverEntryPoint_ptsz [Resolution, "cudaGetDriverEntryPoint"] (symbol: *const c_char, pfn: *mut *mut c_void, proc_flags: c_ulonglong, status: *mut c_int) -> CudaError,
        after => procaddress::map_output(pfn);
    cudaGetDriverEntryPointByVersion_ptsz [Resolution, "cudaGetDriverEntryPointByVersion"] (symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, proc_flags: c_ulonglong, status: *mut c_int) -> CudaError,
        after => procaddress::map_output(pfn);
}
