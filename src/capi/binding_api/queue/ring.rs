//! The queue's ring: Vyukov's bounded multi-producer, single-consumer queue of events, filled
//! inside hooks (no allocation, no lock, never waits) and drained by one consumer that sleeps
//! on a futex; and the clocks and thread id a queued event is stamped with.
//!
//! # Safety
//! Each cell is written only by the producer whose compare-and-swap claimed it, and read only
//! by the single consumer once its sequence says it is complete (see `unsafe impl Sync`).
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::CQueuedEvent;

/// One slot of the ring: Vyukov's bounded queue, whose per-cell sequence tells producers the
/// cell is free (`seq == position`) and the consumer that it is written (`seq == position+1`).
struct Cell {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<CQueuedEvent>>,
}

/// Bounded multi-producer, single-consumer ring, and the futex word a sleeping consumer waits
/// on.
pub(crate) struct Ring {
    cells: Box<[Cell]>,
    mask: usize,
    /// Next position producers claim.
    head: AtomicUsize,
    /// Next position the consumer reads (only the consumer, under `consuming`, changes it).
    tail: AtomicUsize,
    /// Bumped after each write and each interrupt; the consumer sleeps on it.
    signal: AtomicU32,
    /// The consumer is (about to be) asleep on `signal`.
    sleeping: AtomicU32,
    /// `cuhook_queue_interrupt` was called and no pop has returned for it yet.
    interrupted: AtomicBool,
    /// One consumer at a time: the process whose thread is popping (0: none). A forked child
    /// finds its parent's here when the parent's consumer was waiting at the fork: that thread
    /// does not exist in the child, so the child's consumer takes over.
    consuming: AtomicU32,
    pub(crate) queued: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) popped: AtomicU64,
}

// SAFETY: a cell's value is written only by the producer that claimed its position (the
// head's compare-and-swap) and read only by the single consumer after the cell's sequence says
// it is complete; the raw pointers in it are plain addresses and static API names.
unsafe impl Sync for Ring {}
// SAFETY: as above; nothing in the ring belongs to a thread.
unsafe impl Send for Ring {}

/// The most events one queue may hold.
pub(crate) const MOST_QUEUED: usize = 1 << 24;

impl Ring {
    pub(crate) fn new(capacity: usize) -> Ring {
        let size = capacity.next_power_of_two().max(2);
        Ring {
            cells: (0..size)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: size - 1,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            signal: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
            interrupted: AtomicBool::new(false),
            consuming: AtomicU32::new(0),
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            popped: AtomicU64::new(0),
        }
    }

    /// Producer side (inside a hook): no allocation, no lock, never waits.
    pub(crate) fn push(&self, value: CQueuedEvent) {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            match seq.wrapping_sub(pos) as isize {
                0 => match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the compare-and-swap gave this thread the cell's position:
                        // no other producer writes it, and the consumer reads it only after
                        // the sequence store below.
                        unsafe { (*cell.value.get()).write(value) };
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        self.queued.fetch_add(1, Ordering::Relaxed);
                        self.wake();
                        return;
                    }
                    Err(now) => pos = now,
                },
                d if d < 0 => {
                    // The cell still holds an event of the previous lap: full.
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ => pos = self.head.load(Ordering::Relaxed),
            }
        }
    }

    /// Bump the signal; wake the consumer if it sleeps (one system call, only then).
    fn wake(&self) {
        self.signal.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.signal);
        }
    }

    /// Whether the next event is written (consumer side).
    fn ready(&self) -> bool {
        let pos = self.tail.load(Ordering::Relaxed);
        self.cells[pos & self.mask].seq.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Take up to `out.len()` written events (consumer side, under `consuming`).
    fn drain(&self, out: &mut [MaybeUninit<CQueuedEvent>]) -> usize {
        let mut n = 0;
        let mut pos = self.tail.load(Ordering::Relaxed);
        while n < out.len() {
            let cell = &self.cells[pos & self.mask];
            if cell.seq.load(Ordering::Acquire) != pos.wrapping_add(1) {
                break;
            }
            // SAFETY: the sequence says the producer finished writing this cell, and no
            // producer touches it again until the store below hands it back.
            out[n].write(unsafe { (*cell.value.get()).assume_init_read() });
            cell.seq
                .store(pos.wrapping_add(self.mask + 1), Ordering::Release);
            pos = pos.wrapping_add(1);
            n += 1;
        }
        self.tail.store(pos, Ordering::Relaxed);
        self.popped.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Pop with waiting: returns at once when events are there, else sleeps until one comes,
    /// an interrupt, or `timeout_ms` (negative: no limit) passes.
    pub(crate) fn pop(&self, out: &mut [MaybeUninit<CQueuedEvent>], timeout_ms: c_int) -> usize {
        let deadline = (timeout_ms >= 0).then(|| now_monotonic_ns() + timeout_ms as u64 * MS);
        loop {
            let n = self.drain(out);
            if n > 0 || self.interrupted.swap(false, Ordering::AcqRel) {
                return n;
            }
            let left = match deadline {
                Some(d) => match d.checked_sub(now_monotonic_ns()) {
                    Some(left) if left > 0 => Some(left),
                    _ => return 0,
                },
                None => None,
            };
            self.sleeping.store(1, Ordering::SeqCst);
            let seen = self.signal.load(Ordering::SeqCst);
            if !self.ready() && !self.interrupted.load(Ordering::SeqCst) {
                futex_wait(&self.signal, seen, left);
            }
            self.sleeping.store(0, Ordering::SeqCst);
        }
    }

    pub(crate) fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Become the consumer: false when another thread of this process is popping.
    pub(super) fn enter(&self) -> bool {
        let me = std::process::id();
        let now = self.consuming.load(Ordering::Relaxed);
        if now == me {
            return false;
        }
        // Free, or held by the parent's consumer (this is a forked child): take it.
        self.consuming
            .compare_exchange(now, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub(super) fn leave(&self) {
        self.consuming.store(0, Ordering::Release);
    }
}

const MS: u64 = 1_000_000;

fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a live, aligned u32 of ours with a valid (or NULL) relative
    // timeout; it returns on a wake, a changed value, the timeout or a signal, all handled by
    // the caller's loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32 of ours; wakes at most every waiter.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

pub(crate) fn thread_id() -> c_int {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; both clocks used here always exist (vDSO, no lock).
    unsafe { libc::clock_gettime(clock, &mut now) };
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

pub(crate) fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn now_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}
