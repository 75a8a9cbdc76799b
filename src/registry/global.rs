//! The process-wide registry the CUDA hooks keep current, and its `fork()` safety.
//!
//! Only the forking thread survives in the child. Had another thread been inside a registry write
//! (any hooked allocation or free), the child would inherit the writer lock or a lane held by a
//! thread that no longer exists, and its first hooked allocation would spin forever. So the
//! registry is taken exclusively before the fork (the lock, every lane drained: the child gets a
//! table no writer was halfway through) and released on both sides after it.
//!
//! # Safety
//!
//! `pthread_atfork` with three `extern "C"` handlers that never unwind. The release handlers
//! unlock a lock the prepare handler took on the same thread (in the child: the copy of it).
#![allow(unsafe_code)]

use super::{Allocation, Registry};
use crate::Result;
use std::sync::atomic::{AtomicBool, Ordering};

/// The process-wide registry as everyone but its hooks sees it: lookups, counts and snapshots.
/// Its writes are the hooks' alone: a range inserted or removed by anyone else would be a
/// statement about the process the hooks never correct.
#[repr(transparent)]
pub struct Global(Registry);

impl Global {
    /// [`Registry::lookup`].
    pub fn lookup(&self, ptr: usize) -> Option<Allocation> {
        self.0.lookup(ptr)
    }

    /// [`Registry::lookup_span`].
    pub fn lookup_span(&self, ptr: usize, len: usize) -> Option<Allocation> {
        self.0.lookup_span(ptr, len)
    }

    /// [`Registry::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// [`Registry::len`].
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// [`Registry::live_bytes`].
    pub fn live_bytes(&self) -> usize {
        self.0.live_bytes()
    }

    /// [`Registry::missed_frees`].
    pub fn missed_frees(&self) -> u64 {
        self.0.missed_frees()
    }

    /// [`Registry::untracked`].
    pub fn untracked(&self) -> u64 {
        self.0.untracked()
    }

    /// [`Registry::snapshot`].
    pub fn snapshot(&self) -> Vec<Allocation> {
        self.0.snapshot()
    }

    /// [`Registry::for_each`].
    pub fn for_each(&self, f: impl FnMut(Allocation)) {
        self.0.for_each(f)
    }
}

#[cfg(not(loom))]
static GLOBAL: Global = Global(Registry::new());
/// Loom builds only run the models, which never touch the process-wide registry; this keeps the
/// rest of the crate compiling (loom's atomics cannot live in a plain static).
#[cfg(loom)]
static GLOBAL: std::sync::LazyLock<Global> = std::sync::LazyLock::new(|| Global(Registry::new()));
static ATTACHED: AtomicBool = AtomicBool::new(false);

/// The registry the CUDA hooks maintain.
///
/// Not inlinable into other crates (nor is [`attached`]): a static that another crate's code
/// could name gets a GOT entry, and the hooks would then load its address from there, one more
/// cache line per hooked call (`benches/footprint.sh`). Every public function here goes through
/// it or is not inlinable either; the hooks use the crate-internal `hot` instead.
#[inline(never)]
pub fn global() -> &'static Global {
    &GLOBAL
}

/// Whether the hooks keep [`global`] current. Set by [`attach`] (the CUDA install does it).
#[inline(never)]
pub fn attached() -> bool {
    attached_hot()
}

/// [`global`] for the hooks (inlined, the static addressed directly).
#[inline(always)]
pub(crate) fn hot() -> &'static Registry {
    &GLOBAL.0
}

/// [`attached`] for the hooks (inlined, the static addressed directly).
#[inline(always)]
pub(crate) fn attached_hot() -> bool {
    ATTACHED.load(Ordering::Relaxed)
}

/// Make the hooks keep [`global`] current: every successful allocation is inserted and every
/// free removed *before* the event is dispatched, so subscribers can already look an allocated
/// range up, and a free event carries the record's size and metadata (the record removed is the
/// one the event is built from: one registry operation per free). Idempotent.
///
/// The registry is not a subscriber: being updated in the hook itself costs no dispatch, and a
/// process with no other subscriber pays nothing for events at all.
pub fn attach() -> Result<()> {
    if !hot().set_open(&ATTACHED, true) {
        protect_fork();
    }
    Ok(())
}

/// Stop keeping [`global`] current and drop every range it holds, without events: from then on
/// frees are no longer seen, so it could only go stale (report memory freed meanwhile as live).
/// Ranges allocated before a reinstall are then answered by classification (a driver query),
/// like memory allocated before the first install, and their later free is an unknown free.
/// The registry also refuses inserts from then on, under its lock: a hook that saw it attached
/// just before cannot put a range back after the clear (it would have stayed for good, its free
/// unseen).
pub fn detach() {
    hot().set_open(&ATTACHED, false);
}

/// A range left out of the registry for lack of memory outside the registry's own edits (a
/// teardown's list of what to put back if it is refused). Counted with the registry's own.
#[cold]
#[inline(never)]
pub fn note_untracked() {
    hot().stats.untracked.fetch_add(1, Ordering::Relaxed);
}

/// Counters for reports. `repr(C)`: the same struct is `cuhook_stats_t` of the C API and what
/// one copy of cuhook hands another.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Ranges registered now.
    pub live: usize,
    /// Bytes of those ranges.
    pub live_bytes: usize,
    /// Inserts over a live range (a pool handed the address out again without a seen free).
    pub missed_frees: u64,
    /// Frees of pointers the registry never held, counted while the registry is attached or an
    /// event subscriber listens: a free that nobody observes is not looked into.
    pub unknown_frees: u64,
    /// Frees the driver refused after they were announced (frees are announced while the
    /// registry is attached or a subscriber listens).
    pub failed_frees: u64,
    /// Allocations not registered because the memory to record them could not be had (the
    /// host is never aborted for it; lookups of such a range find nothing, classification asks
    /// the driver).
    pub untracked: u64,
}

/// The global registry's own counters now; the free counters (kept where frees are announced,
/// `crate::cuda::emit`) are left 0 here and filled by [`crate::cuda::stats`]. Not inlinable into
/// other crates (see [`global`]).
#[inline(never)]
pub fn own_stats() -> RegistryStats {
    RegistryStats {
        live: global().len(),
        live_bytes: global().live_bytes(),
        missed_frees: global().missed_frees(),
        unknown_frees: 0,
        failed_frees: 0,
        untracked: global().untracked(),
    }
}

/// Fork-safe (a `std::sync::Once` inherited running by a child forked mid-registration would
/// hang its first re-attach).
#[cfg(not(loom))]
static REGISTERED: crate::sys::once::ForkSafeOnce = crate::sys::once::ForkSafeOnce::new();

/// Install the fork handlers (once per process).
#[cfg(not(loom))]
pub(super) fn protect_fork() {
    REGISTERED.register_fork_handlers(
        Some(prepare),
        Some(release),
        Some(release_in_child),
        "a fork during a hooked allocation may hang the child",
    );
}

/// Loom builds never fork (and loom's writer lock cannot be released without its guard).
#[cfg(loom)]
pub(super) fn protect_fork() {}

#[cfg(not(loom))]
extern "C" fn prepare() {
    // The handlers run, so they are registered: a child must not register them again.
    REGISTERED.mark_done();
    hot().hold_for_fork();
}

#[cfg(not(loom))]
extern "C" fn release() {
    // SAFETY: `prepare` took the lock on this thread just before the fork.
    unsafe { hot().release_after_fork() };
}

#[cfg(not(loom))]
extern "C" fn release_in_child() {
    // SAFETY: `prepare` took the lock on this thread just before the fork (the child's copy).
    unsafe { hot().release_in_child() };
}
