//! The event ring (full, drained, woken, interrupted, many producers) and argument checks.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use super::super::cuda_api::{c_event, EVENT_ALLOC};
use super::queue::*;
use super::*;
use crate::events::{Allocation, MemType};

fn event(address: usize) -> CQueuedEvent {
    let mut ev = MemEvent::alloc(Allocation::new(address, 64, c"cudaMalloc"));
    ev.range.mem_type = MemType::Cuda;
    CQueuedEvent {
        ev: c_event(&ev),
        event: EVENT_ALLOC,
        tid: 1,
        time_ns: 2,
    }
}

fn take(ring: &Ring, n: usize, timeout_ms: c_int) -> Vec<usize> {
    let mut out: Vec<MaybeUninit<CQueuedEvent>> = (0..n).map(|_| MaybeUninit::uninit()).collect();
    let got = ring.pop(&mut out, timeout_ms);
    out[..got]
        .iter()
        .map(|e| {
            // SAFETY: `pop` wrote the first `got` entries.
            let e = unsafe { e.assume_init_ref() };
            e.ev.address as usize
        })
        .collect()
}

#[test]
fn a_full_ring_drops_and_counts_then_takes_events_again() {
    let ring = Ring::new(3); // rounded up to 4
    for a in 1..=6 {
        ring.push(event(a));
    }
    assert_eq!(ring.queued.load(Ordering::Relaxed), 4);
    assert_eq!(ring.dropped.load(Ordering::Relaxed), 2);
    assert_eq!(take(&ring, 3, 0), vec![1, 2, 3]);
    ring.push(event(7));
    assert_eq!(take(&ring, 8, 0), vec![4, 7]);
    assert_eq!(take(&ring, 8, 0), Vec::<usize>::new());
    assert_eq!(ring.popped.load(Ordering::Relaxed), 5);
}

#[test]
fn a_sleeping_pop_wakes_for_an_event_and_for_an_interrupt() {
    let ring = Arc::new(Ring::new(16));
    let producer = ring.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        producer.push(event(9));
        std::thread::sleep(std::time::Duration::from_millis(50));
        producer.interrupt();
    });
    assert_eq!(take(&ring, 4, -1), vec![9]);
    assert_eq!(take(&ring, 4, -1), Vec::<usize>::new()); // the interrupt
    t.join().unwrap();
    let start = std::time::Instant::now();
    assert_eq!(take(&ring, 4, 30), Vec::<usize>::new());
    assert!(start.elapsed() >= std::time::Duration::from_millis(30));
}

#[test]
fn many_producers_lose_nothing_that_fits() {
    let ring = Arc::new(Ring::new(1 << 14));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let r = ring.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    r.push(event(t * 10_000 + i + 1));
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    while seen.len() < 8000 {
        seen.extend(take(&ring, 256, 1000));
    }
    for t in threads {
        t.join().unwrap();
    }
    // Each producer's events come out in its order.
    for t in 0..4 {
        let mine: Vec<_> = seen
            .iter()
            .filter(|&&a| (a - 1) / 10_000 == t)
            .copied()
            .collect();
        assert_eq!(
            mine,
            (0..2000).map(|i| t * 10_000 + i + 1).collect::<Vec<_>>()
        );
    }
    assert_eq!(ring.dropped.load(Ordering::Relaxed), 0);
}

#[test]
fn bad_arguments_are_refused() {
    let mut q: *mut CQueue = std::ptr::null_mut();
    // SAFETY: valid out-parameter; the calls must refuse before using anything else.
    unsafe {
        assert_eq!(cuhook_queue_open(0, 16, &mut q), -1);
        assert_eq!(cuhook_queue_open(EVENT_ALLOC | 4, 16, &mut q), -1);
        assert_eq!(cuhook_queue_open(EVENT_ALLOC, 0, &mut q), -1);
        assert_eq!(cuhook_queue_open(EVENT_ALLOC, MOST_QUEUED + 1, &mut q), -1);
        assert_eq!(cuhook_queue_open(EVENT_ALLOC, 16, std::ptr::null_mut()), -1);
        assert_eq!(
            cuhook_queue_pop(std::ptr::null_mut(), std::ptr::null_mut(), 1, 0),
            -1
        );
        assert_eq!(cuhook_queue_close(std::ptr::null_mut()), -1);
        assert_eq!(cuhook_trace_close(std::ptr::null_mut()), -1);
        assert_eq!(cuhook_live(std::ptr::null_mut(), 1), -1);
        assert_eq!(cuhook_report(std::ptr::null_mut(), 1), -1);
        assert_eq!(cuhook_installation_open(std::ptr::null_mut()), -1);
    }
    assert!(q.is_null());
}
