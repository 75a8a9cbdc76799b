//! Loom models of dispatch against `unsubscribe` and snapshot reclamation, on the real
//! [`SubscriberList`], grace periods and announcement slots (`.ci/proofs.sh`).
//!
//! Under `--cfg loom` the events module uses loom's atomics and fences (`crate::atomics`), a loom
//! thread-local for the per-thread state, lazily built statics for the epoch and the slots, and
//! smaller sizes (4 slots, 2 nesting levels, 4 subscriptions). Not modelled: the `membarrier`
//! scheme (loom cannot; readers use their `fence(SeqCst)` branch, which `CUHOOK_NO_MEMBARRIER=1`
//! selects in real builds), reclaiming slots of dead threads (thread ids are not modelled),
//! spare-slot borrowing, and several writers at once (the writer mutex is `std`'s, which loom
//! does not schedule).
//!
//! # Safety
//!
//! The only unsafe code is access to loom `UnsafeCell`s, whose whole point is that loom checks
//! every access for a race; a reported race fails the model.
#![allow(unsafe_code)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use super::{mask, Callback, EventKind, MemEvent, SubscriberList};

loom::lazy_static! {
    /// State the removed subscriber's callback writes, and `unsubscribe`'s caller then writes
    /// without any lock, as a caller freeing the callback's context would.
    static ref CONTEXT: UnsafeCell<u64> = UnsafeCell::new(0);
    /// Calls of the subscriber that stays.
    static ref KEPT_CALLS: AtomicUsize = AtomicUsize::new(0);
}

fn removed_cb(_: &MemEvent, _: usize) {
    // SAFETY: loom checks this access against the test thread's; a race fails the model.
    CONTEXT.with_mut(|n| unsafe { *n += 1 });
}

fn kept_cb(_: &MemEvent, _: usize) {
    KEPT_CALLS.fetch_add(1, Ordering::Relaxed);
}

fn event() -> MemEvent {
    MemEvent::new(EventKind::Free, 0x1000, 64, c"cuMemFree_v2")
}

/// `unsubscribe` returns only once the callback can no longer run on another thread: the
/// caller's unsynchronised write to the context after it returns never races with a call. The
/// subscriber that stays receives the event.
#[test]
fn loom_unsubscribe_waits_for_the_callback() {
    loom::model(|| {
        let list = Arc::new(SubscriberList::new());
        let gone = list
            .subscribe(mask::ALL, 0, Callback::Rust(removed_cb), 1)
            .unwrap();
        list.subscribe(mask::ALL, 1, Callback::Rust(kept_cb), 2)
            .unwrap();
        let l = list.clone();
        let dispatcher = thread::spawn(move || l.dispatch(&event()));
        list.unsubscribe_id(gone).unwrap();
        // SAFETY: checked by loom (module doc); this is the "free the context" step.
        let calls = CONTEXT.with_mut(|n| unsafe {
            *n += 100;
            *n
        });
        dispatcher.join().unwrap();
        // Dispatch catches panics, loom's race reports included: count them as failures.
        assert_eq!(
            list.stats().panics,
            0,
            "a callback panicked (a race loom reported?)"
        );
        assert!(calls == 100 || calls == 101, "{calls}");
        assert_eq!(KEPT_CALLS.load(Ordering::Relaxed), 1);
    });
}

/// Snapshots replaced while a dispatch iterates them are freed only after it is done with them
/// (`PublishedList`'s loom-only cell reports a free that races a read). Two writes: the second's
/// reclaim is the one that could free the snapshot the dispatcher loaded first.
#[test]
fn loom_snapshot_outlives_its_readers() {
    loom::model(|| {
        let list = Arc::new(SubscriberList::new());
        let first = list
            .subscribe(mask::ALL, 0, Callback::Rust(kept_cb), 1)
            .unwrap();
        let l = list.clone();
        let dispatcher = thread::spawn(move || l.dispatch(&event()));
        list.subscribe(mask::ALL, 0, Callback::Rust(kept_cb), 2)
            .unwrap();
        list.unsubscribe_id(first).unwrap();
        dispatcher.join().unwrap();
        assert_eq!(
            list.stats().panics,
            0,
            "a callback panicked (a race loom reported?)"
        );
        // Either subscriber, both, or (the first removed before its call, the second added after
        // the dispatch loaded its snapshot) neither: both changes race with the dispatch.
        assert!(KEPT_CALLS.load(Ordering::Relaxed) <= 2);
    });
}
