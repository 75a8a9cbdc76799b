//! Tests of dispatch, subscription and the guard. Each test uses its own [`SubscriberList`], so
//! they run in parallel without sharing subscribers.
//!
//! They also pass under ThreadSanitizer, with either barrier scheme (`CUHOOK_NO_MEMBARRIER=0|1`):
//! `RUSTFLAGS=-Zsanitizer=thread cargo +nightly test -Zbuild-std --target
//! x86_64-unknown-linux-gnu --lib --release events` (with a separate `CARGO_TARGET_DIR`).
//!
//! # Safety
//!
//! Callback contexts are addresses of leaked boxes (valid forever) turned back into references
//! with [`ctx`]; the unsubscribe-guarantee test deliberately frees its contexts, and relies on the
//! very guarantee under test for the dereference to be valid.
#![allow(unsafe_code)]

mod list;
mod nesting;
mod threads;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

/// One delivered event as the tests record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    tag: u32,
    kind: EventKind,
    address: usize,
    flags: u32,
}

/// A context that records into a shared log under a tag.
struct Recorder {
    tag: u32,
    log: &'static Mutex<Vec<Seen>>,
}

fn leak<T>(t: T) -> &'static T {
    Box::leak(Box::new(t))
}

fn addr<T>(t: &'static T) -> usize {
    t as *const T as usize
}

/// The context behind a callback's `usize`.
fn ctx<T>(context: usize) -> &'static T {
    // SAFETY: every context in these tests is the address of a `T` that outlives the
    // subscription (leaked, or freed only after unsubscribe returned).
    unsafe { &*(context as *const T) }
}

fn record(ev: &MemEvent, context: usize) {
    let r: &Recorder = ctx(context);
    r.log.lock().unwrap().push(Seen {
        tag: r.tag,
        kind: ev.kind,
        address: ev.range.start,
        flags: ev.range.flags,
    });
}

fn new_log() -> &'static Mutex<Vec<Seen>> {
    leak(Mutex::new(Vec::new()))
}

fn recorder(tag: u32, log: &'static Mutex<Vec<Seen>>) -> usize {
    addr(leak(Recorder { tag, log }))
}

fn tags(log: &Mutex<Vec<Seen>>) -> Vec<u32> {
    log.lock().unwrap().iter().map(|s| s.tag).collect()
}

fn alloc(address: usize) -> MemEvent {
    MemEvent::alloc(Allocation::new(address, 4096, c"cuMemAlloc_v2"))
}

fn free(address: usize) -> MemEvent {
    MemEvent::free(
        c"cuMemFree_v2",
        Allocation::new(address, 4096, c"cuMemFree_v2"),
    )
}

/// Fails the test run (abort) if it is not dropped within 20 s: a deadlock would otherwise hang
/// the suite forever. It polls, so a test that finishes early does not wait.
struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    fn start(what: &'static str) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        std::thread::spawn(move || {
            for _ in 0..2000 {
                std::thread::sleep(Duration::from_millis(10));
                if flag.load(Ordering::Acquire) {
                    return;
                }
            }
            eprintln!("watchdog: `{what}` still running after 20 s (deadlock)");
            std::process::abort();
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A second callback, distinct from [`record`], that does nothing.
fn record_other(ev: &MemEvent, context: usize) {
    std::hint::black_box((ev, context));
}
