//! All per-thread state of the events module, in one const-initialised thread-local.
//!
//! One variable, not one per concern: in the cdylib (general-dynamic TLS model) every distinct
//! thread-local costs a `__tls_get_addr` call, and a dispatch touches both the slot bookkeeping
//! and the hook guard. Plain `Cell`s of `Copy` values: no destructor is registered, so it works
//! before `main`, during thread exit and without allocating.

use std::cell::Cell;
use std::ffi::c_char;

use super::announce::{Announcement, MAX_DEPTH};

pub(crate) struct ThreadState {
    /// Announcement in use: the owned one, or the borrowed one during a dispatch.
    pub(crate) slot: Cell<Option<&'static Announcement>>,
    /// Whether this thread has tried to claim a slot of its own (after a failure it borrows one
    /// per outermost dispatch).
    pub(crate) tried_to_claim: Cell<bool>,
    /// Dispatch nesting level (0 = not dispatching).
    pub(crate) depth: Cell<u32>,
    /// Bit `d` is set while an outermost hooked call runs at dispatch level `d`.
    pub(crate) hook_levels: Cell<u32>,
    /// API name of the outermost hooked call at each dispatch level (valid where the bit is set),
    /// as the pointer of a `&'static CStr`. Written on hook entry, read only by
    /// `HookGuard::outermost_api`. A thin pointer (one store per hook instead of two) in a
    /// power-of-two array (indexed by a mask instead of a bounds check).
    pub(crate) hook_api: [Cell<*const c_char>; HOOK_API_SLOTS],
    /// The registry's lane for this thread (past the lanes: none given yet). Here, beside the
    /// hook guard, so that the hooks reach it through the address they already computed.
    /// (Loom's models give every thread lane 0.)
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) lane: Cell<u8>,
}

/// Entries of [`ThreadState::hook_api`]: one per dispatch level, rounded up to a power of two.
pub(crate) const HOOK_API_SLOTS: usize = (MAX_DEPTH + 1).next_power_of_two();

#[cfg(not(loom))]
thread_local! {
    pub(crate) static THREAD: ThreadState = const {
        ThreadState {
            slot: Cell::new(None),
            tried_to_claim: Cell::new(false),
            depth: Cell::new(0),
            hook_levels: Cell::new(0),
            hook_api: [const { Cell::new(core::ptr::null()) }; HOOK_API_SLOTS],
            lane: Cell::new(u8::MAX),
        }
    };
}

// Loom's threads share one OS thread: a std thread-local would be shared between them.
#[cfg(loom)]
loom::thread_local! {
    pub(crate) static THREAD: ThreadState = ThreadState {
        slot: Cell::new(None),
        tried_to_claim: Cell::new(false),
        depth: Cell::new(0),
        hook_levels: Cell::new(0),
        hook_api: [const { Cell::new(core::ptr::null()) }; HOOK_API_SLOTS],
        lane: Cell::new(u8::MAX),
    };
}
