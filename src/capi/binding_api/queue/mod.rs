//! Event queues for bindings (`cuhook_queue_*`): a subscriber that copies each event into a
//! bounded lock-free ring inside the hook (no allocation, no lock; one `futex` wake when the
//! consumer sleeps), and the binding's own thread that pops them. See the module above for why.
//! The ring itself, and the stamps an event gets, are in `ring.rs`.
//!
//! # Safety
//! As for the module above: pointers from C are checked for NULL, the rest is the header's
//! contract (out-parameters writable, queues from `cuhook_queue_open` and not yet closed).
#![allow(unsafe_code)]

mod ring;

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::cuda_api::{c_event, CMemEvent, EVENT_ALLOC, EVENT_FREE};
use super::super::status::{ffi_call, CUHOOK_OK};
use crate::events::{EventKind, EventMask, MemEvent};
use crate::{Error, Result};

pub(super) use ring::{now_ns, thread_id, Ring, MOST_QUEUED};

/// `cuhook_queued_event_t`: an event with where and when it happened.
#[repr(C)]
pub struct CQueuedEvent {
    pub ev: CMemEvent,
    /// `CUHOOK_EVENT_MEM_TYPE_ALLOC` or `CUHOOK_EVENT_MEM_TYPE_FREE`.
    pub event: c_int,
    /// The allocating (freeing) thread's id.
    pub tid: c_int,
    /// Wall-clock time, ns since the Unix epoch.
    pub time_ns: u64,
}

/// `cuhook_queue_stats_t`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CQueueStats {
    /// Events put in the queue since it opened.
    pub queued: u64,
    /// Events dropped because the queue was full.
    pub dropped: u64,
    /// Events taken out by `cuhook_queue_pop`.
    pub popped: u64,
}

/// An open queue: the ring and the subscription that fills it.
pub struct CQueue {
    ring: Arc<Ring>,
    subscription: crate::Subscription,
}

fn event_mask(events: c_int) -> Result<EventMask> {
    let bits = events & (EVENT_ALLOC | EVENT_FREE);
    if bits == 0 || bits != events {
        return Err(Error::InvalidArgument {
            what: "events must name ALLOC and/or FREE, and nothing else",
        });
    }
    EventMask::from_bits(bits as u32).ok_or(Error::InvalidArgument {
        what: "events must name ALLOC and/or FREE, and nothing else",
    })
}

/// Subscribe a queue of room for `capacity` events (1 to 2^24; rounded up to a power of two)
/// to the events in `events` (`CUHOOK_EVENT_MEM_TYPE_ALLOC` and/or `_FREE`). Inside the hook,
/// the subscriber copies the event (with the thread id and the time) into the queue, or
/// drops and counts it when the queue is full: it never allocates, locks or waits. Does not
/// install the hooks.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_queue_open(
    events: c_int,
    capacity: usize,
    out: *mut *mut CQueue,
) -> c_int {
    ffi_call(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        if capacity == 0 || capacity > MOST_QUEUED {
            return Err(Error::InvalidArgument {
                what: "capacity must be 1 to 2^24",
            });
        }
        let mask = event_mask(events)?;
        let ring = Arc::new(Ring::new(capacity));
        let producer = ring.clone();
        let subscription = crate::subscribe(mask, 0, move |ev: &MemEvent| {
            producer.push(CQueuedEvent {
                ev: c_event(ev),
                event: match ev.kind {
                    EventKind::Alloc => EVENT_ALLOC,
                    EventKind::Free => EVENT_FREE,
                },
                tid: thread_id(),
                time_ns: now_ns(),
            })
        })?;
        let queue = Box::new(CQueue { ring, subscription });
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(Box::into_raw(queue)) };
        Ok(CUHOOK_OK)
    })
}

/// Take up to `capacity` events, oldest first, into `out`; returns how many (0 when
/// `timeout_ms` passed, or `cuhook_queue_interrupt` was called, with none). Waits at most
/// `timeout_ms` for the first event (0: not at all; negative: until one comes or an
/// interrupt). One consumer at a time: `CUHOOK_ERR_BUSY` while another thread pops.
///
/// # Safety
/// `queue` is open; `out` has room for `capacity` events.
#[no_mangle]
pub unsafe extern "C" fn cuhook_queue_pop(
    queue: *mut CQueue,
    out: *mut CQueuedEvent,
    capacity: usize,
    timeout_ms: c_int,
) -> isize {
    ffi_call(|| {
        if queue.is_null() || out.is_null() || capacity == 0 {
            return Err(Error::InvalidArgument {
                what: "queue or out is NULL, or capacity is 0",
            });
        }
        // SAFETY: an open queue (contract).
        let ring = &unsafe { &*queue }.ring;
        if !ring.enter() {
            return Err(Error::Busy);
        }
        // SAFETY: `out` has room for `capacity` events (contract); MaybeUninit has the layout
        // of the event.
        let out = unsafe {
            std::slice::from_raw_parts_mut(out.cast::<MaybeUninit<CQueuedEvent>>(), capacity)
        };
        let n = ring.pop(out, timeout_ms);
        ring.leave();
        Ok(n.min(i32::MAX as usize) as i32)
    }) as isize
}

/// Make a waiting (or the next) `cuhook_queue_pop` return at once, with the events there are.
/// Safe from any thread, and from a signal handler.
///
/// # Safety
/// `queue` is open.
#[no_mangle]
pub unsafe extern "C" fn cuhook_queue_interrupt(queue: *mut CQueue) -> c_int {
    ffi_call(|| {
        if queue.is_null() {
            return Err(Error::InvalidArgument {
                what: "queue is NULL",
            });
        }
        // SAFETY: an open queue (contract).
        unsafe { &*queue }.ring.interrupt();
        Ok(CUHOOK_OK)
    })
}

/// The queue's counters.
///
/// # Safety
/// `queue` is open; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_queue_stats(queue: *mut CQueue, out: *mut CQueueStats) -> c_int {
    ffi_call(|| {
        if queue.is_null() || out.is_null() {
            return Err(Error::InvalidArgument {
                what: "queue or out is NULL",
            });
        }
        // SAFETY: an open queue (contract).
        let ring = &unsafe { &*queue }.ring;
        let stats = CQueueStats {
            queued: ring.queued.load(Ordering::Relaxed),
            dropped: ring.dropped.load(Ordering::Relaxed),
            popped: ring.popped.load(Ordering::Relaxed),
        };
        // SAFETY: writable (contract).
        unsafe { out.write(stats) };
        Ok(CUHOOK_OK)
    })
}

/// Unsubscribe the queue, make a waiting pop return and wait for it, then free the queue.
/// Events still in it are lost.
///
/// # Safety
/// `queue` is from `cuhook_queue_open`, not yet closed; no pop on it starts after this call.
#[no_mangle]
pub unsafe extern "C" fn cuhook_queue_close(queue: *mut CQueue) -> c_int {
    ffi_call(|| {
        if queue.is_null() {
            return Err(Error::InvalidArgument {
                what: "queue is NULL",
            });
        }
        // SAFETY: made by `Box::into_raw` in `cuhook_queue_open`, closed once (contract).
        let CQueue { ring, subscription } = *unsafe { Box::from_raw(queue) };
        // After this, no hook pushes into the ring (an unsubscribe that fails leaves the
        // closure, and its reference to the ring, alive for good: still safe).
        let unsubscribed = subscription.unsubscribe();
        while !ring.enter() {
            ring.interrupt();
            std::thread::yield_now();
        }
        ring.leave();
        drop(ring);
        unsubscribed.map(|()| CUHOOK_OK)
    })
}
