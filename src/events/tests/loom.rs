//! Loom models of dispatch against `unsubscribe` and snapshot reclamation, on the real
//! [`SubscriberList`], grace periods and announcement slots (`.ci/proofs.sh`).
//!
//! Under `--cfg loom` the events module uses loom's atomics and fences (`crate::atomics`), a loom
//! thread-local for the per-thread state, lazily built statics for the epoch and the slots, and
//! smaller sizes (4 slots, 2 nesting levels, 4 subscriptions), and the writer mutex is loom's
//! (`crate::locks`), so two writers can race. Not modelled: the `membarrier` scheme (loom cannot;
//! readers use their `fence(SeqCst)` branch, which `CUHOOK_NO_MEMBARRIER=1` selects in real
//! builds), reclaiming slots of dead threads (thread ids are not modelled) and spare-slot
//! borrowing.
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

use super::{mask, Allocation, Callback, MemEvent, SubscriberList};

loom::lazy_static! {
    /// State the removed subscriber's callback writes, and `unsubscribe`'s caller then writes
    /// without any lock, as a caller freeing the callback's context would.
    static ref CONTEXT: UnsafeCell<u64> = UnsafeCell::new(0);
    /// The same for a second removed subscriber, unsubscribed by another writer thread.
    static ref OTHER_CONTEXT: UnsafeCell<u64> = UnsafeCell::new(0);
    /// Calls of the subscriber that stays.
    static ref KEPT_CALLS: AtomicUsize = AtomicUsize::new(0);
    /// Calls of a subscriber added while the dispatch runs.
    static ref ADDED_CALLS: AtomicUsize = AtomicUsize::new(0);
}

fn removed_cb(_: &MemEvent, _: usize) {
    // SAFETY: loom checks this access against the test thread's; a race fails the model.
    CONTEXT.with_mut(|n| unsafe { *n += 1 });
}

fn other_removed_cb(_: &MemEvent, _: usize) {
    // SAFETY: as in `removed_cb`.
    OTHER_CONTEXT.with_mut(|n| unsafe { *n += 1 });
}

fn kept_cb(_: &MemEvent, _: usize) {
    KEPT_CALLS.fetch_add(1, Ordering::Relaxed);
}

fn added_cb(_: &MemEvent, _: usize) {
    ADDED_CALLS.fetch_add(1, Ordering::Relaxed);
}

fn event() -> MemEvent {
    MemEvent::free(
        c"cuMemFree_v2",
        Allocation::new(0x1000, 64, c"cuMemFree_v2"),
    )
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

/// Two writers at once while a dispatch runs (on the model's main thread): one thread
/// unsubscribes a subscriber; the other subscribes a new one (which may take the index just
/// freed, so that the dispatch, iterating the older snapshot, meets the new token there) and then
/// unsubscribes a second old one. Neither removed callback runs after its `unsubscribe` returned
/// (each writer then writes the callback's state unsynchronised), the subscriber that stays gets
/// the event once, the new one at most once, and the snapshots both writers retire are freed
/// only after the dispatch is done with them (`PublishedList`'s loom-only cell).
#[test]
fn loom_two_writers_under_dispatch() {
    loom::model(|| {
        let list = Arc::new(SubscriberList::new());
        let first = list
            .subscribe(mask::ALL, 0, Callback::Rust(removed_cb), 1)
            .unwrap();
        list.subscribe(mask::ALL, 1, Callback::Rust(kept_cb), 2)
            .unwrap();
        let second = list
            .subscribe(mask::ALL, 2, Callback::Rust(other_removed_cb), 3)
            .unwrap();
        let l = list.clone();
        let unsubscriber = thread::spawn(move || {
            l.unsubscribe_id(first).unwrap();
            // SAFETY: checked by loom (module doc).
            CONTEXT.with_mut(|n| unsafe {
                *n += 100;
                *n
            })
        });
        let l = list.clone();
        let subscriber = thread::spawn(move || {
            l.subscribe(mask::ALL, 3, Callback::Rust(added_cb), 4)
                .unwrap();
            l.unsubscribe_id(second).unwrap();
            // SAFETY: checked by loom (module doc).
            OTHER_CONTEXT.with_mut(|n| unsafe {
                *n += 100;
                *n
            })
        });
        list.dispatch(&event());
        let calls = unsubscriber.join().unwrap();
        let other_calls = subscriber.join().unwrap();
        assert_eq!(
            list.stats().panics,
            0,
            "a callback panicked (a race loom reported?)"
        );
        assert!(calls == 100 || calls == 101, "{calls}");
        assert!(other_calls == 100 || other_calls == 101, "{other_calls}");
        assert_eq!(KEPT_CALLS.load(Ordering::Relaxed), 1);
        assert!(ADDED_CALLS.load(Ordering::Relaxed) <= 1);
        assert_eq!(list.len(), 2);
    });
}
