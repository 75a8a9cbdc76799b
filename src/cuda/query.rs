//! The driver queries cuhook's hooks make themselves: current context and device (the device
//! cached per context), and what the driver knows of a pointer cuhook never saw allocated. The
//! functions come from the driver table ([`super::driver`]), never through our hooks.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use super::abi::{CUcontext, CUdevice, CUresult, CUDA_SUCCESS};
use super::driver;

/// The calling thread's current context, or null. Inlined: the default stream's allocations
/// ask it on every call.
#[inline(always)]
pub fn current_context() -> CUcontext {
    let Some(f) = driver::CTX_GET_CURRENT.get() else {
        return std::ptr::null_mut();
    };
    ctx_get_current(f).unwrap_or(std::ptr::null_mut())
}

/// Calls `cuCtxGetCurrent`: the current context (null: none), or the driver's error.
/// The one place it is called, for the hooks and for classification.
#[inline]
pub(super) fn ctx_get_current(f: driver::CtxGetCurrent) -> Result<CUcontext, CUresult> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's `cuCtxGetCurrent` (the table's type), with an out-pointer to a local.
    let rc = unsafe { f(&mut ctx) };
    if rc == CUDA_SUCCESS {
        Ok(ctx)
    } else {
        Err(rc)
    }
}

/// Calls `cuCtxSetCurrent(ctx)`. The one place it is called.
///
/// # Safety
/// `ctx` is null or a context the driver handed out.
pub(super) unsafe fn ctx_set_current(f: driver::CtxSetCurrent, ctx: CUcontext) -> CUresult {
    // SAFETY: the driver's `cuCtxSetCurrent` (the table's type), with a context it handed out
    // (the caller's promise).
    unsafe { f(ctx) }
}

/// Calls `cuPointerGetAttributes(n, attributes, data, ptr)`, `n` being the length of both
/// slices. The one place it is called.
///
/// # Safety
/// Each `data[i]` points to writable storage at least as large as attribute `attributes[i]`'s
/// value.
pub(super) unsafe fn pointer_get_attributes(
    f: driver::PointerGetAttributes,
    attributes: &[u32],
    data: &mut [*mut c_void],
    ptr: usize,
) -> CUresult {
    debug_assert_eq!(attributes.len(), data.len());
    // SAFETY: the driver's `cuPointerGetAttributes` (the table's type), with `n` attributes and
    // `n` data pointers (the caller's promise about their sizes).
    unsafe {
        f(
            attributes.len().min(data.len()) as u32,
            attributes.as_ptr(),
            data.as_mut_ptr(),
            ptr as u64,
        )
    }
}

/// Bumped when a context is destroyed or reset: its handle may be reused for another device.
static CONTEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// Context → device answers, shared by all threads (a context's device never changes, so a hit
/// needs no driver call; a global table costs the hook no thread-local access). Direct-mapped:
/// entry = `context << 16 | generation as u8 << 8 | device as u8`; written only on a miss.
static DEVICE_OF_CONTEXT: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Forget every cached context → device pair. The table is cleared too, so only an answer
/// stored by a thread that raced with this very teardown carries the (8-bit) old generation.
/// A context's streams die with it: what threads cached about streams goes too.
pub fn contexts_changed() {
    CONTEXT_GENERATION.fetch_add(1, Ordering::AcqRel);
    for e in &DEVICE_OF_CONTEXT {
        e.store(0, Ordering::Relaxed);
    }
    streams_changed();
}

/// Bumped when a stream destruction the hooks see returns, and with every context teardown: a
/// destroyed stream's handle may come back for a stream of another context. A thread reads it
/// before it asks the driver, so whatever it cached before the bump carries an older value.
static STREAM_GENERATION: AtomicU64 = AtomicU64::new(1);

/// What a thread last learnt about a stream: its context and that context's device, asked at
/// stream generation `generation`.
#[derive(Clone, Copy)]
struct StreamContext {
    stream: usize,
    context: CUcontext,
    device: c_int,
    generation: u64,
}

thread_local! {
    /// This thread's last stream-ordered allocation's stream. Threads allocate on their own
    /// stream again and again (a framework's worker on its stream), and `cuStreamGetCtx` is a
    /// driver call that waits behind other threads' driver calls: on the H200, 16 threads'
    /// allocation pairs took ×1.32 with it on every allocation. Per thread, not shared: each
    /// thread's answer stays on its own core's cache line.
    static LAST_STREAM: Cell<StreamContext> = const {
        Cell::new(StreamContext {
            stream: 0,
            context: std::ptr::null_mut(),
            device: -1,
            generation: 0,
        })
    };
}

/// Forget what every thread cached about streams.
pub fn streams_changed() {
    STREAM_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// After a stream destruction (driver or runtime), whatever its result.
pub fn stream_destroyed<R>(_rc: R) {
    streams_changed();
}

/// The context and device of a stream-ordered allocation made on `stream`: the stream's own
/// (its memory comes from the pool of the stream's device, whichever context is current; and
/// CUDA 13's runtime leaves no context current on the threads it serves, where asking the
/// current context's device failed on every allocation, a few microseconds each on the H200
/// since the driver formats a log line for each failure), or for the default streams (0,
/// `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) the current context's.
#[inline(always)]
pub fn context_of_stream(stream: usize) -> (CUcontext, c_int) {
    if stream > CU_STREAM_PER_THREAD {
        // Read before the driver is asked: an answer about a stream destroyed meanwhile carries
        // a generation already passed.
        let generation = STREAM_GENERATION.load(Ordering::Acquire);
        let last = LAST_STREAM.with(Cell::get);
        if last.stream == stream && last.generation == generation {
            return (last.context, last.device);
        }
        if let Some(found) = stream_context_asked(stream, generation) {
            return found;
        }
    }
    let ctx = current_context();
    (ctx, device_of(ctx))
}

/// Asks the driver for `stream`'s context and its device, and keeps the answer for this thread
/// (out of line: a thread asks once per stream it allocates on).
#[cold]
#[inline(never)]
fn stream_context_asked(stream: usize, generation: u64) -> Option<(CUcontext, c_int)> {
    let context = stream_context(stream);
    if context.is_null() {
        return None;
    }
    let device = device_of(context);
    LAST_STREAM.with(|c| {
        c.set(StreamContext {
            stream,
            context,
            device,
            generation,
        })
    });
    Some((context, device))
}

/// The context `stream` belongs to (null: the driver could not say).
#[inline]
fn stream_context(stream: usize) -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    if let Some(f) = driver::STREAM_GET_CTX.get() {
        // SAFETY: the driver's `cuStreamGetCtx` (the table's type), with the stream the
        // allocation just succeeded on and an out-pointer to a local.
        if unsafe { f(stream, &mut ctx) } != CUDA_SUCCESS {
            ctx = std::ptr::null_mut();
        }
    }
    ctx
}

/// The largest special stream handle (`CU_STREAM_LEGACY` is 1): the default streams, which
/// stand for the current context's.
const CU_STREAM_PER_THREAD: usize = 2;

/// The device of context `ctx` (current or not; null: -1), cached.
#[inline]
pub fn device_of(ctx: CUcontext) -> c_int {
    let key = ctx as u64;
    let generation = CONTEXT_GENERATION.load(Ordering::Acquire) & 0xff;
    let slot = &DEVICE_OF_CONTEXT[((key >> 4 ^ key >> 12) & 63) as usize];
    let e = slot.load(Ordering::Relaxed);
    // A zero key never matches: entries are stored only for non-null contexts.
    if key != 0 && e >> 16 == key && (e >> 8) & 0xff == generation {
        return (e & 0xff) as c_int;
    }
    device_miss(key, generation, slot)
}

/// Asks the driver, and caches the answer. Contexts are user-space pointers (below 2^48) and
/// devices small; anything else is not cached.
#[cold]
fn device_miss(key: u64, generation: u64, slot: &AtomicU64) -> c_int {
    let dev = device_asked(key as CUcontext);
    if key != 0 && key >> 48 == 0 && (0..=0xff).contains(&dev) {
        slot.store(key << 16 | generation << 8 | dev as u64, Ordering::Relaxed);
    }
    dev
}

/// The device of context `ctx`, asked from the driver: -1 for no context (asking could only fail),
/// and for a context that is not current, asked with it pushed for the moment.
fn device_asked(ctx: CUcontext) -> c_int {
    if ctx.is_null() {
        return -1;
    }
    if current_context() == ctx {
        return current_device();
    }
    let (Some(push), Some(pop)) = (
        driver::CTX_PUSH_CURRENT.get(),
        driver::CTX_POP_CURRENT.get(),
    ) else {
        return -1;
    };
    // SAFETY: the driver's `cuCtxPushCurrent` with a context it handed out (a stream's, or the
    // current one), popped again below.
    if unsafe { push(ctx) } != CUDA_SUCCESS {
        return -1;
    }
    let dev = current_device();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: the driver's `cuCtxPopCurrent` with an out-pointer to a local; it pops what was
    // pushed just above.
    unsafe { pop(&mut popped) };
    dev
}

/// The device of the calling thread's current context, or -1.
pub fn current_device() -> c_int {
    let Some(f) = driver::CTX_GET_DEVICE.get() else {
        return -1;
    };
    let mut dev: CUdevice = -1;
    // SAFETY: the driver's `cuCtxGetDevice` (the table's type), with an out-pointer to a local.
    let rc = unsafe { f(&mut dev) };
    if rc == CUDA_SUCCESS {
        dev
    } else {
        -1
    }
}

/// What the driver says about an allocation it holds and cuhook never saw allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Described {
    pub base: usize,
    pub size: usize,
    pub mem_type: crate::events::MemType,
    pub device: c_int,
    pub context: usize,
}

/// The allocation that starts at `ptr`, as the driver reports it: memory type, device and
/// owning context from the pointer's attributes, base and size from `cuMemGetAddressRange_v2`
/// asked with the pointer's own context current (restored after). `None` when the driver does
/// not know the pointer, or `ptr` is not the start of its allocation (a free the driver will
/// refuse anyway). Only called for frees of pointers the registry does not know.
#[cold]
pub fn describe(ptr: usize) -> Option<Described> {
    use crate::events::MemType;
    const CONTEXT: u32 = 1;
    const MEMORY_TYPE: u32 = 2;
    const IS_MANAGED: u32 = 8;
    const DEVICE_ORDINAL: u32 = 9;
    let attrs = driver::POINTER_GET_ATTRIBUTES.get()?;
    let range = driver::MEM_GET_ADDRESS_RANGE.get()?;
    let kinds = [CONTEXT, MEMORY_TYPE, IS_MANAGED, DEVICE_ORDINAL];
    let (mut ctx, mut mem, mut managed, mut dev) = (0u64, 0u32, 0u32, -1i32);
    let mut data: [*mut c_void; 4] = [
        (&mut ctx as *mut u64).cast(),
        (&mut mem as *mut u32).cast(),
        (&mut managed as *mut u32).cast(),
        (&mut dev as *mut i32).cast(),
    ];
    // SAFETY: four attributes, each data pointer to a slot of the
    // attribute's size (CONTEXT 8 bytes, the others 4).
    let rc = unsafe { pointer_get_attributes(attrs, &kinds, &mut data, ptr) };
    // Memory type 0: the driver does not know the pointer.
    if rc != CUDA_SUCCESS || mem == 0 {
        return None;
    }
    let mem_type = match (mem, managed) {
        (_, m) if m != 0 => MemType::CudaManaged,
        (1, _) => MemType::Host,
        _ => MemType::Cuda,
    };
    let current = current_context();
    let owner = ctx as usize as CUcontext;
    let switch = !owner.is_null() && owner != current;
    if switch && !set_current(owner) {
        return None;
    }
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: the driver's `cuMemGetAddressRange_v2` (the table's type), with out-pointers to
    // locals.
    let rc = unsafe { range(&mut base, &mut size, ptr as u64) };
    if switch {
        set_current(current);
    }
    (rc == CUDA_SUCCESS && base as usize == ptr && size != 0).then_some(Described {
        base: ptr,
        size,
        mem_type,
        device: if mem_type == MemType::Host { -1 } else { dev },
        context: ctx as usize,
    })
}

fn set_current(ctx: CUcontext) -> bool {
    let Some(f) = driver::CTX_SET_CURRENT.get() else {
        return false;
    };
    // SAFETY: a context the driver handed out (or null).
    let rc = unsafe { ctx_set_current(f, ctx) };
    rc == CUDA_SUCCESS
}

/// Whether the driver reports `ptr` as managed memory (false when it cannot tell).
#[cold]
pub fn is_managed(ptr: usize) -> bool {
    const IS_MANAGED: u32 = 8;
    let Some(f) = driver::POINTER_GET_ATTRIBUTES.get() else {
        return false;
    };
    let mut managed = 0u32;
    let mut data: [*mut c_void; 1] = [(&mut managed as *mut u32).cast()];
    // SAFETY: one 4-byte attribute and its 4-byte slot.
    let rc = unsafe { pointer_get_attributes(f, &[IS_MANAGED], &mut data, ptr) };
    rc == CUDA_SUCCESS && managed != 0
}
