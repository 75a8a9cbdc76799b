//! Events: what one allocation or free looks like, the subscriber list that dispatches it, and
//! the hooks' reentrancy guard.
//!
//! ucm-style: [`subscribe`] a callback with an event mask and a priority, [`dispatch()`] calls every
//! matching subscriber (lowest priority first), [`unsubscribe`] returns only when the callback can
//! no longer run on another thread (so its context may be freed).
//!
//! How, in short: writers publish immutable snapshots of the list (copy-on-write under a mutex);
//! a dispatching thread announces itself in its own cache-line-sized slot (`announcements.rs`) — the
//! epoch it entered at, and the call it is making — and re-checks before each call that the
//! subscription is still live; writers wait on those announcements (`grace.rs`), never readers on
//! writers. Dispatch is lock-free, allocation-free and writes no shared cache line. On Linux the
//! reader's store-load barrier is only a compiler fence, paid for by a `membarrier` system call
//! in subscribe/unsubscribe; `CUHOOK_NO_MEMBARRIER=1` selects plain fences instead.
//!
//! The free functions work on one process-wide [`SubscriberList`]; the type itself can be
//! instantiated for tests and embedding.

mod announce;
pub(crate) mod announcements;
mod callback;
pub(crate) mod closure;
mod dispatch;
mod grace;
mod guard;
#[cfg(all(test, loom))]
#[path = "tests/loom.rs"]
mod loom_tests;
mod subscribers;
#[cfg(all(test, not(loom)))]
mod tests;
pub(crate) mod thread;
mod types;

pub use announcements::MAX_DEPTH;
pub use callback::{Callback, SubscriptionId};
pub use grace::asymmetric_barriers;
pub use guard::HookGuard;
pub use subscribers::{DispatchStats, SubscriberList, CAPACITY};
pub use types::{flags, mask, Allocation, EventKind, EventMask, MemEvent, MemType};

use crate::Result;

#[cfg(not(loom))]
static SUBSCRIBERS: SubscriberList = SubscriberList::new();
/// Loom builds only run the models, which use their own lists (loom's atomics cannot live in a
/// plain static).
#[cfg(loom)]
static SUBSCRIBERS: std::sync::LazyLock<SubscriberList> =
    std::sync::LazyLock::new(SubscriberList::new);

/// The process-wide subscriber list that the CUDA hooks dispatch to.
///
/// Not inlinable into other crates, and every public function here goes through it: a static
/// that another crate's code could name gets a GOT entry, and the hooks would then load its
/// address from there, one more cache line per hooked call (`benches/footprint.sh`). The hooks
/// use the crate-internal `list` instead.
#[inline(never)]
pub fn subscribers() -> &'static SubscriberList {
    list()
}

/// [`subscribers`] for the hooks (inlined, the static addressed directly).
#[inline(always)]
pub(crate) fn list() -> &'static SubscriberList {
    &SUBSCRIBERS
}

/// [`SubscriberList::subscribe`] on the process-wide list: the crate's C API and report, and
/// a test of the list's fork handler. Hidden: users subscribe with `cuhook::subscribe`, whose
/// [`Subscription`](crate::Subscription) unsubscribes on drop.
#[doc(hidden)]
pub fn subscribe(
    mask: impl Into<u32>,
    priority: i32,
    callback: Callback,
    context: usize,
) -> Result<SubscriptionId> {
    subscribers().subscribe(mask.into(), priority, callback, context)
}

/// [`SubscriberList::subscribe_with_replay`] on the process-wide list.
pub fn subscribe_with_replay<F>(
    mask: impl Into<u32>,
    priority: i32,
    callback: Callback,
    context: usize,
    replay: F,
) -> Result<SubscriptionId>
where
    F: FnOnce(&mut dyn FnMut(&MemEvent)),
{
    subscribers().subscribe_with_replay(mask.into(), priority, callback, context, replay)
}

/// [`SubscriberList::unsubscribe`] on the process-wide list. Matching by `(callback, context)`
/// is the C API's convention (`cuhook_unset_event_handler`, like ucm's); Rust code should keep
/// the [`SubscriptionId`] (or the crate's `Subscription`) instead, because a function's address
/// does not identify it: the linker may merge identical functions into one.
pub fn unsubscribe(mask: impl Into<u32>, callback: Callback, context: usize) -> Result<()> {
    subscribers().unsubscribe(mask.into(), callback, context)
}

/// [`SubscriberList::unsubscribe_id`] on the process-wide list.
pub fn unsubscribe_id(id: SubscriptionId) -> Result<()> {
    subscribers().unsubscribe_id(id)
}

/// [`SubscriberList::dispatch`] on the process-wide list.
pub fn dispatch(ev: &MemEvent) {
    subscribers().dispatch(ev)
}

/// Whether anyone is subscribed to the process-wide list (one load): hooks skip building events
/// nobody receives.
pub fn has_subscribers() -> bool {
    subscribers().has_subscribers()
}

/// [`SubscriberList::stats`] of the process-wide list.
pub fn stats() -> DispatchStats {
    subscribers().stats()
}
