//! The Rust API in one place: install the hooks, subscribe to events, ask the registry.
//!
//! ```
//! use cuhook::events::{EventMask, MemEvent};
//!
//! // Patch every loaded object (and every object loaded later) and start the registry.
//! let hooks = cuhook::install()?;
//! // Lower priorities run first; the registry is updated before any subscriber runs.
//! let subscription = cuhook::subscribe(EventMask::ALL, 0, |ev: &MemEvent| {
//!     eprintln!("{:?} {} bytes at {:#x} by {:?}", ev.kind, ev.range.size, ev.range.start, ev.api);
//! })?;
//!
//! // ... CUDA work ...
//! if let Some(a) = cuhook::lookup(0x7f00_0000_0000usize) {
//!     println!("GPU memory of {} bytes from {:?}", a.size, a.api);
//! }
//!
//! drop(subscription); // unsubscribes: the closure runs on no thread after this
//! hooks.uninstall()?; // puts every patched slot back
//! # Ok::<(), cuhook::Error>(())
//! ```
//!
//! Every call here is served by the copy of cuhook that owns the process (`crate::instance`):
//! this one, or `libcuhook.so` when it was preloaded (or another library embedding the crate
//! installed first).

mod address;
mod installation;
mod subscription;

pub use address::Address;
pub(crate) use installation::uninstall_forwarded;
pub use installation::Installation;
pub use subscription::Subscription;

use crate::cuda::HookInfo;
use crate::events::{EventMask, MemEvent};
use crate::instance::{self, Route};
use crate::registry::{self, Allocation, RegistryStats};
use crate::Result;

/// Install the CUDA hook set and the registry. The returned guard uninstalls when dropped
/// (use [`Installation::leak`] to keep the hooks for the life of the process). Each call
/// counts: the hooks stay until every installation is gone.
///
/// When the crate is linked into a program, the program's own object is patched too: its
/// `dlopen`, `dlsym` and CUDA calls (and cudarc's) are seen like any library's. When another
/// copy of cuhook already serves the process, the installation is made there.
pub fn install() -> Result<Installation> {
    Installation::new(instance::route())
}

/// Call `callback` for every event whose kind is in `mask`, on the thread that allocates or
/// frees, inside its CUDA call (it must not call CUDA itself). Lower `priority` runs first,
/// equal priorities in subscription order. A panic in the callback is caught and counted.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use cuhook::events::{EventMask, MemEvent};
///
/// let frees = Arc::new(AtomicUsize::new(0));
/// let seen = frees.clone();
/// let sub = cuhook::subscribe(EventMask::FREE, 0, move |_ev: &MemEvent| {
///     seen.fetch_add(1, Ordering::Relaxed);
/// })?;
/// drop(sub); // the closure is dropped once no thread can run it any more
/// # Ok::<(), cuhook::Error>(())
/// ```
pub fn subscribe<F>(mask: EventMask, priority: i32, callback: F) -> Result<Subscription>
where
    F: Fn(&MemEvent) + Send + Sync + 'static,
{
    Subscription::new(instance::route(), mask, priority, callback, false)
}

/// Like [`subscribe`], but first replay every range the registry already holds as an alloc
/// event flagged [`crate::events::flags::EXISTING`]. (When another copy of cuhook serves the
/// process, its ranges are not replayed: the subscription starts with the next event.)
pub fn subscribe_with_existing<F>(
    mask: EventMask,
    priority: i32,
    callback: F,
) -> Result<Subscription>
where
    F: Fn(&MemEvent) + Send + Sync + 'static,
{
    Subscription::new(instance::route(), mask, priority, callback, true)
}

/// The allocation containing `address` (a `usize`, a raw pointer, a `CUdeviceptr`), from the
/// registry alone (no driver call).
///
/// ```
/// let on_stack = 0u64;
/// assert!(cuhook::lookup(&on_stack as *const u64).is_none());
/// ```
///
/// One call from another crate, and inside it the registry's lookup inlined against its static
/// (see [`registry::global`] for why that static is kept out of other crates' reach).
#[inline]
pub fn lookup(address: impl Address) -> Option<Allocation> {
    lookup_at(address.address(), 0)
}

/// The allocation containing all of `[address, address + len)`, from the registry alone.
#[inline]
pub fn lookup_span(address: impl Address, len: usize) -> Option<Allocation> {
    lookup_at(address.address(), len.max(1))
}

/// `len` 0: the one byte at `address`.
#[inline(never)]
fn lookup_at(address: usize, len: usize) -> Option<Allocation> {
    lookup_in(address, len)
}

/// [`lookup_at`] inlined (the C API's `cuhook_lookup`): the registry's lookup against its
/// static when this copy serves the process.
#[inline(always)]
pub(crate) fn lookup_in(address: usize, len: usize) -> Option<Allocation> {
    match instance::route_quick() {
        Route::Own if len == 0 => registry::hot().lookup(address),
        Route::Own => registry::hot().lookup_span(address, len),
        Route::Other(peer) => {
            let mut out = std::mem::MaybeUninit::<instance::Record>::uninit();
            // SAFETY: the table's contract: a writable record; the record's API name lives in
            // the other copy's pinned object.
            #[allow(unsafe_code)]
            unsafe {
                ((peer.lookup)(address, len, out.as_mut_ptr()) == 1)
                    .then(|| out.assume_init().allocation())
            }
        }
    }
}

/// The registry's counters (of the copy that serves the process).
pub fn stats() -> RegistryStats {
    match instance::route() {
        Route::Own => crate::cuda::stats(),
        Route::Other(peer) => {
            let mut s = RegistryStats::default();
            // SAFETY: the table's contract: a writable out-parameter.
            #[allow(unsafe_code)]
            unsafe {
                (peer.stats)(&mut s)
            };
            s
        }
    }
}

/// Record the call stack of every allocation from now on, `depth` frames of it (at most
/// [`crate::stacks::MAX_FRAMES`]; 0 stops recording): [`Allocation::stack`] then names it, and
/// [`crate::stacks::frames`] gives its return addresses. What `CUHOOK_STACKS=N` does at start.
/// Unique stacks are kept in a table of [`crate::stacks::DEFAULT_CAPACITY`] (allocated on the
/// first call); allocations from stacks beyond it get [`crate::stacks::StackId::OTHER`].
pub fn record_stacks(depth: usize) {
    if depth == 0 {
        crate::stacks::disable();
    } else {
        enable_stacks(depth, crate::stacks::DEFAULT_CAPACITY);
    }
}

/// [`record_stacks`] with a table of `capacity` unique stacks (`CUHOOK_STACKS_MAX`).
pub(crate) fn enable_stacks(depth: usize, capacity: u32) {
    crate::stacks::enable(depth, capacity, crate::hooks::own_code_range());
}

/// Every hooked CUDA symbol.
///
/// ```
/// let table = cuhook::hook_table();
/// // Each exported variant is its own hook; cuGetProcAddress is asked for the base name.
/// let ptsz = table.iter().find(|h| h.symbol == "cuMemAllocAsync_ptsz").unwrap();
/// assert_eq!(ptsz.base, "cuMemAllocAsync");
/// ```
pub fn hook_table() -> &'static [HookInfo] {
    crate::cuda::HOOKS
}
