//! A measurement build's clock (`--cfg cuhook_diag="timing"`, never a release): where a hooked
//! call's time goes on the real driver, where no profiler runs. Each outermost memory hook
//! records four time-stamp-counter readings (entry, before the real call, after it, exit), and
//! the registry's exclusive edits four of their own (entry, writer lock taken, lanes drained,
//! done); at exit the sums go to standard error, per API: calls, and mean nanoseconds between
//! the readings (for an exclusive edit: waiting for the lock, draining the lanes, the edit).
//! Shared registry edits that had to go the exclusive way are counted by reason too (rows named
//! `insert: …` and `removal: …`, calls only: `registry/shared.rs`, `refused`).
//!
//! Per thread, not shared: each thread adds into its own row (its own cache lines), so the
//! clock does not itself move lines between cores. Rows are claimed once per thread from a
//! counter; threads past [`THREADS`] are not counted.
//!
//! # Safety
//! `_rdtsc` has no preconditions on x86-64; the exit entry in `.fini_array` is an `extern "C"
//! fn()` that catches every panic and only reads atomics and writes to descriptor 2.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::CStr;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

const THREADS: usize = 256;
/// Distinct APIs counted (hooks and registry counters).
const KEYS: usize = 48;
/// Calls, ticks before the real call, in it, after it.
const PHASES: usize = 4;

#[repr(align(64))]
struct Row([[AtomicU64; PHASES]; KEYS]);

static ROWS: [Row; THREADS] =
    [const { Row([const { [const { AtomicU64::new(0) }; PHASES] }; KEYS]) }; THREADS];
static NAMES: [AtomicPtr<u8>; KEYS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; KEYS];
static NEXT_ROW: AtomicUsize = AtomicUsize::new(0);
/// The first reading, and the clock then: ticks become nanoseconds at exit.
static START: AtomicU64 = AtomicU64::new(0);
static START_TIME: OnceLock<Instant> = OnceLock::new();

thread_local! {
    static ROW: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The time-stamp counter (elsewhere, nanoseconds since the first reading).
#[inline(always)]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` reads a counter; no preconditions.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    return START_TIME.get_or_init(Instant::now).elapsed().as_nanos() as u64;
}

fn key(name: &'static CStr) -> Option<usize> {
    let p = name.as_ptr().cast::<u8>().cast_mut();
    for (k, slot) in NAMES.iter().enumerate() {
        let cur = slot.load(Relaxed);
        if cur == p {
            return Some(k);
        }
        if cur.is_null() {
            match slot.compare_exchange(cur, p, Relaxed, Relaxed) {
                Ok(_) => return Some(k),
                Err(other) if other == p => return Some(k),
                Err(_) => continue,
            }
        }
    }
    None
}

fn row() -> Option<&'static Row> {
    let r = ROW.with(|r| {
        if r.get() == usize::MAX {
            let n = NEXT_ROW.fetch_add(1, Relaxed);
            if n == 0 {
                START_TIME.get_or_init(Instant::now);
                START.store(now(), Relaxed);
            }
            r.set(n);
        }
        r.get()
    });
    ROWS.get(r)
}

/// Counts one event `what` (calls only: a shared registry edit refused, say).
pub fn count(what: &'static CStr) {
    record(what, [0; 4]);
}

/// Adds one call of `api` with its four readings.
pub fn record(api: &'static CStr, t: [u64; 4]) {
    let (Some(row), Some(k)) = (row(), key(api)) else {
        return;
    };
    let cells = &row.0[k];
    let add = |i: usize, v: u64| cells[i].store(cells[i].load(Relaxed).wrapping_add(v), Relaxed);
    add(0, 1);
    add(1, t[1].wrapping_sub(t[0]));
    add(2, t[2].wrapping_sub(t[1]));
    add(3, t[3].wrapping_sub(t[2]));
}

thread_local! {
    /// Two readings taken inside a call by [`mark`], for [`record_marked`].
    static MARKS: Cell<[u64; 2]> = const { Cell::new([0; 2]) };
}

/// Takes reading `i` (0 or 1) of the call in progress on this thread.
pub fn mark(i: usize) {
    MARKS.with(|m| {
        let mut v = m.get();
        v[i & 1] = now();
        m.set(v);
    });
}

/// Adds one call of `what` begun at `start`, with the two readings [`mark`] took inside it as
/// its middle ones (for an exclusive registry edit: the lock taken, the lanes drained).
pub fn record_marked(what: &'static CStr, start: u64) {
    let [a, b] = MARKS.with(Cell::get);
    record(what, [start, a, b, now()]);
}

extern "C" fn print_at_exit() {
    crate::sys::boundary::guarded(print, || ());
}

fn print() {
    let rows = NEXT_ROW.load(Relaxed).min(THREADS);
    if rows == 0 {
        return;
    }
    let ticks = now().wrapping_sub(START.load(Relaxed)).max(1) as f64;
    let ns = START_TIME.get().map_or(0, |t| t.elapsed().as_nanos()) as f64;
    let per_tick = ns / ticks;
    let mut out = format!("cuhook-diag threads={rows} ns_per_tick={per_tick:.4}\n");
    for (k, name) in NAMES.iter().enumerate() {
        let p = name.load(Relaxed);
        if p.is_null() {
            break;
        }
        // SAFETY: a pointer taken from a `&'static CStr`.
        let name = unsafe { CStr::from_ptr(p.cast()) }.to_string_lossy();
        let mut sum = [0u64; PHASES];
        for row in &ROWS[..rows] {
            for (i, s) in sum.iter_mut().enumerate() {
                *s += row.0[k][i].load(Relaxed);
            }
        }
        let calls = sum[0].max(1) as f64;
        let _ = writeln!(
            out,
            "cuhook-diag api={name} calls={} before_ns={:.1} real_ns={:.1} after_ns={:.1}",
            sum[0],
            sum[1] as f64 * per_tick / calls,
            sum[2] as f64 * per_tick / calls,
            sum[3] as f64 * per_tick / calls,
        );
    }
    // SAFETY: writes the bytes of a live string to descriptor 2.
    let _ = unsafe { libc::write(2, out.as_ptr().cast(), out.len()) };
}

// SAFETY: `.fini_array` holds `extern "C" fn()` pointers the loader runs at exit; this is one.
#[used]
#[unsafe(link_section = ".fini_array")]
static AT_EXIT: extern "C" fn() = print_at_exit;
