//! Delivering an event: the hot path, and the replay of existing allocations to a new subscriber.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::callback::{Callback, SubscriptionId};
use super::grace::Section;
use super::subscribers::{live_word, Subscriber, SubscriberList};
use super::types::{flags, MemEvent};
use crate::Result;

impl SubscriberList {
    /// Calls every subscriber whose mask has `ev.kind`, lowest priority first.
    ///
    /// Lock-free and allocation-free: it writes only this thread's own announcement slot. CUDA
    /// calls a callback makes count as outermost for the hook guard and are dispatched too, up
    /// to [`super::MAX_DEPTH`] nested levels (deeper events are dropped and counted). A
    /// panicking Rust callback is caught and counted, and the next subscriber still runs.
    #[inline]
    pub fn dispatch(&self, ev: &MemEvent) {
        // Empty list: nothing to announce. A subscribe racing with this may miss the event,
        // which no ordering could prevent anyway.
        if self.has_subscribers() {
            self.dispatch_to_snapshot(ev);
        }
    }

    /// Not inlinable (into other crates, through the inlinable [`Self::dispatch`]): what it
    /// reaches — the grace period's epoch and barrier mode — would otherwise become statics
    /// other crates can name, and every hooked call that dispatches would load their
    /// addresses from the GOT (`docs/architecture.md`, "The path of one intercepted call").
    #[inline(never)]
    fn dispatch_to_snapshot(&self, ev: &MemEvent) {
        let Some(section) = Section::enter() else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Some(snapshot) = self.snapshot(&section) else {
            return;
        };
        let bit = ev.kind.mask();
        #[cfg(loom)]
        snapshot.touch();
        for e in snapshot.entries().iter().filter(|e| e.mask & bit != 0) {
            self.invoke(&section, e, ev, bit);
        }
        // The last read of the snapshot, as far as the loom models are concerned.
        #[cfg(loom)]
        snapshot.touch();
    }

    /// Calls one subscriber if it is still live for `bit`, announced so that `unsubscribe` can
    /// wait for it.
    #[inline(always)]
    fn invoke(&self, section: &Section, e: &Subscriber, ev: &MemEvent, bit: u32) {
        // The announcement names the event kind too, so that unsubscribing one kind waits only
        // for calls of that kind.
        section.begin_call(live_word(e.token, bit));
        let live = self.live(e.index);
        if live >> 8 == e.token && live & u64::from(bit) != 0 {
            // Hooked calls made by the callback see a deeper dispatch level, so the hook guard
            // treats them as outermost and they are dispatched too.
            if catch_unwind(AssertUnwindSafe(|| e.callback.call(ev, e.context))).is_err() {
                self.counters.panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        section.end_call();
    }

    /// [`SubscriberList::subscribe`], then feeds the new subscriber the allocations that already
    /// exist: `replay` is called once, on this thread, with an `emit` function; every event passed
    /// to it reaches only the new subscriber, with [`flags::EXISTING`] added, before this returns.
    ///
    /// Ordering: the subscriber is live *before* the replay, so no event is lost between the two;
    /// but live events dispatched on other threads meanwhile interleave with the replay. A range
    /// allocated concurrently may be announced twice (replayed and live, either order); a range
    /// freed concurrently may be replayed after its free was delivered, unless `replay` holds,
    /// while emitting a range, the lock its source takes to remove that range (the registry
    /// subscriber runs before others, so the live free then waits for the replayed alloc).
    /// Subscribers should treat an alloc of a known range as a replacement.
    pub fn subscribe_with_replay<F>(
        &self,
        mask: impl Into<u32>,
        priority: i32,
        callback: Callback,
        context: usize,
        replay: F,
    ) -> Result<SubscriptionId>
    where
        F: FnOnce(&mut dyn FnMut(&MemEvent)),
    {
        let entry = self.insert(mask.into(), priority, callback, context)?;
        let mut emit = |ev: &MemEvent| {
            let bit = ev.kind.mask();
            if entry.mask & bit == 0 {
                return;
            }
            let mut ev = *ev;
            ev.range.flags |= flags::EXISTING;
            self.replay_one(&entry, &ev, bit);
        };
        replay(&mut emit);
        Ok(entry.id)
    }

    /// One replayed event to one new subscriber. Out of line for the reason
    /// [`Self::dispatch_to_snapshot`] gives: the generic caller is inlinable into other crates.
    #[inline(never)]
    fn replay_one(&self, entry: &Subscriber, ev: &MemEvent, bit: u32) {
        match Section::enter() {
            Some(section) => self.invoke(&section, entry, ev, bit),
            None => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
