//! All per-thread state of the events module, in one const-initialised thread-local.
//!
//! One variable, not one per concern: in the cdylib (general-dynamic TLS model) every distinct
//! thread-local costs a `__tls_get_addr` call, and a dispatch touches both the slot bookkeeping
//! and the hook guard. Plain `Cell`s of `Copy` values: no destructor is registered, so it works
//! before `main`, during thread exit and without allocating.

use std::cell::Cell;
use std::ffi::CStr;

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
    /// API name of the outermost hooked call at each dispatch level (valid where the bit is set).
    /// Written on hook entry, read only by `HookGuard::outermost_api`.
    pub(crate) hook_api: [Cell<Option<&'static CStr>>; MAX_DEPTH + 1],
}

#[cfg(not(loom))]
thread_local! {
    pub(crate) static THREAD: ThreadState = const {
        ThreadState {
            slot: Cell::new(None),
            tried_to_claim: Cell::new(false),
            depth: Cell::new(0),
            hook_levels: Cell::new(0),
            hook_api: [const { Cell::new(None) }; MAX_DEPTH + 1],
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
        hook_api: [const { Cell::new(None) }; MAX_DEPTH + 1],
    };
}
