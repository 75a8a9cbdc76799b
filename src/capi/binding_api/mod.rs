//! C API for language bindings (the Python package, `python/cuhook`): counted installations,
//! event queues that a consumer thread drains outside the hooks, the live allocations, the
//! counters, the exit report as text, and traces scoped to a block of code.
//!
//! Bindings cannot run their own code inside a hook: a Python callback needs the interpreter's
//! lock, which the allocating thread may already hold — or be waiting for — and a garbage
//! collection or a lock taken by the callback could deadlock the host. So events reach them
//! through a queue: the subscriber that runs in the hook only copies the event into a bounded
//! lock-free ring (no allocation, no lock; one `futex` wake when the consumer sleeps), and the
//! binding's own thread pops the events and runs its callbacks. A full ring drops the event
//! and counts it: the allocating thread never waits.
//!
//! # Safety
//! Pointers from C are checked for NULL; beyond that the caller promises what the header says
//! (out-parameters writable, handles from the matching `_open` and not yet closed). Panics are
//! caught by [`ffi_call`].
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, CStr, OsStr};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::cuda_api::{c_event, c_range, CMemEvent, CMemInfo, EVENT_ALLOC, EVENT_FREE};
use super::status::{ffi_call, CUHOOK_OK};
use crate::events::{EventKind, EventMask, MemEvent};
use crate::instance::{self, Route};
use crate::log::StackBuf;
use crate::output::{Mode, OutputFile};
use crate::{Error, Result};

// ------------------------------------------------------------------------ installations

/// Install the CUDA hooks and the registry once more, counted: the hooks stay until every
/// installation (this one, the constructor's, `cuhook_install`'s, a Rust guard's) is gone.
/// Also starts the exit report's counters (per API, live and peak bytes), which
/// `cuhook_report` and `cuhook_usage` read. When another copy of cuhook serves the process,
/// the installation is made there.
///
/// # Safety
/// `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_installation_open(id: *mut u64) -> c_int {
    ffi_call(|| {
        if id.is_null() {
            return Err(Error::InvalidArgument { what: "id is NULL" });
        }
        let installation = crate::install()?;
        if !installation.is_forwarded() {
            crate::report::enable_stats()?;
        }
        // SAFETY: non-null and writable (header contract).
        unsafe { id.write(installation.leak()) };
        Ok(CUHOOK_OK)
    })
}

/// Undo one `cuhook_installation_open`; the last installation puts every slot back and empties
/// the registry. `CUHOOK_ERR_NOT_INSTALLED` for an id with no installation left.
#[no_mangle]
pub extern "C" fn cuhook_installation_close(id: u64) -> c_int {
    ffi_call(|| crate::api::uninstall_forwarded(instance::route(), id).map(|_| CUHOOK_OK))
}

/// 1 when the CUDA hooks of the copy of cuhook that serves the process are installed (by
/// anyone: the constructor, the C or Rust API), else 0.
#[no_mangle]
pub extern "C" fn cuhook_installed() -> c_int {
    ffi_call(|| {
        Ok(match instance::route() {
            Route::Own => crate::registry::attached() as c_int,
            Route::Other(_) => 1,
        })
    })
}

/// The registry this copy may read whole: its own, when it serves the process. Another copy's
/// registry is reached only through its lookup and statistics entries, so enumerating it (and
/// its report counters) is refused.
fn own_engine(what: &'static str) -> Result<()> {
    match instance::route() {
        Route::Own => Ok(()),
        Route::Other(_) => Err(Error::NotInstalled).inspect_err(|_| {
            crate::log!(
                crate::log::Level::Warn,
                "{what}: another copy of cuhook serves this process; ask that copy"
            )
        }),
    }
}

// ------------------------------------------------------------------------ registry contents

/// Copy up to `capacity` live allocations, in address order, into `out`; returns how many
/// there are (call again with more room when that is larger than `capacity`).
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` records.
#[no_mangle]
pub unsafe extern "C" fn cuhook_live(out: *mut CMemInfo, capacity: usize) -> isize {
    ffi_call(|| {
        if out.is_null() && capacity > 0 {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        own_engine("cuhook_live")?;
        let mut live = crate::registry::global().snapshot();
        live.sort_unstable_by_key(|a| a.start);
        for (i, a) in live.iter().take(capacity).enumerate() {
            // SAFETY: `i < capacity`, and `out` has room for `capacity` records (contract).
            unsafe {
                out.add(i).write(CMemInfo {
                    event: c_range(a, a.api),
                    seq: a.seq,
                })
            };
        }
        Ok(live.len().min(i32::MAX as usize) as i32)
    }) as isize
}

/// `cuhook_stats_t`: the registry's counters (the Rust struct has the C layout).
pub type CStats = crate::registry::RegistryStats;

/// The registry's counters (of the copy that serves the process).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_stats(out: *mut CStats) -> c_int {
    ffi_call(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(crate::stats()) };
        Ok(CUHOOK_OK)
    })
}

/// `cuhook_usage_t`: live and peak bytes of one memory type on one device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUsage {
    pub mem_type: c_int,
    pub device: c_int,
    pub live: u64,
    pub peak: u64,
}

/// Copy up to `capacity` rows of live and peak bytes per memory type and device (every pair
/// that ever held memory since the counters started) into `out`; returns how many there are.
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` rows.
#[no_mangle]
pub unsafe extern "C" fn cuhook_usage(out: *mut CUsage, capacity: usize) -> isize {
    ffi_call(|| {
        if out.is_null() && capacity > 0 {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        own_engine("cuhook_usage")?;
        let rows = crate::report::stats::usage();
        for (i, u) in rows.iter().take(capacity).enumerate() {
            // SAFETY: `i < capacity` rows of room (contract).
            unsafe {
                out.add(i).write(CUsage {
                    mem_type: u.mem_type as c_int,
                    device: u.device,
                    live: u.live,
                    peak: u.peak,
                })
            };
        }
        Ok(rows.len() as i32)
    }) as isize
}

/// The exit report as it would be written now, NUL-terminated in `buf` (at most `len` bytes,
/// truncated to fit); returns the full length without the NUL.
///
/// # Safety
/// `buf` is NULL (with `len` 0) or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuhook_report(buf: *mut c_char, len: usize) -> isize {
    ffi_call(|| {
        if buf.is_null() && len > 0 {
            return Err(Error::InvalidArgument {
                what: "buf is NULL",
            });
        }
        own_engine("cuhook_report")?;
        let text = crate::report::render();
        if len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `buf` has `len > n` writable bytes (contract).
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        Ok(text.len().min(i32::MAX as usize) as i32)
    }) as isize
}

// ------------------------------------------------------------------------ scoped traces

/// An open trace: the file and the subscription that writes its lines.
pub struct CTrace {
    subscription: crate::Subscription,
    file: Arc<OutputFile>,
}

/// Start writing the JSON-lines trace (the format of `CUHOOK_TRACE`) of every event to `path`
/// (`%p` the process id, `%r` the MPI rank; appended; never through a symbolic link), until
/// `cuhook_trace_close`. Does not install the hooks.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_trace_open(path: *const c_char, out: *mut *mut CTrace) -> c_int {
    ffi_call(|| {
        if path.is_null() || out.is_null() {
            return Err(Error::InvalidArgument {
                what: "path or out is NULL",
            });
        }
        // SAFETY: non-null and NUL-terminated (contract).
        let path = OsStr::from_bytes(unsafe { CStr::from_ptr(path) }.to_bytes());
        let path = crate::report::expand_path(path);
        let file = OutputFile::open(&path, Mode::Append).map_err(|e| Error::Io {
            what: "open the trace file",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        if file.ends_mid_line(&path) {
            let _ = file.write(b"\n", 0);
        }
        let file = Arc::new(file);
        let writer = file.clone();
        let subscription = crate::subscribe(EventMask::ALL, 0, move |ev: &MemEvent| {
            write_trace_line(&writer, ev)
        });
        let subscription = match subscription {
            Ok(s) => s,
            Err(e) => {
                if let Ok(f) = Arc::try_unwrap(file) {
                    f.close();
                }
                return Err(e);
            }
        };
        let trace = Box::new(CTrace { subscription, file });
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(Box::into_raw(trace)) };
        Ok(CUHOOK_OK)
    })
}

/// The trace subscriber: one line, formatted on the stack, one write (a line that does not
/// fit a full pipe is dropped).
fn write_trace_line(file: &OutputFile, ev: &MemEvent) {
    let mut line = StackBuf::<512>::new();
    if crate::report::trace::format(ev, thread_id() as i64, now_ns(), &mut line).is_ok() {
        let _ = file.write(line.as_bytes(), 0);
    }
}

/// Stop the trace and close its file; when this returns no line is written any more.
///
/// # Safety
/// `trace` is NULL or from `cuhook_trace_open`, not yet closed.
#[no_mangle]
pub unsafe extern "C" fn cuhook_trace_close(trace: *mut CTrace) -> c_int {
    ffi_call(|| {
        if trace.is_null() {
            return Err(Error::InvalidArgument {
                what: "trace is NULL",
            });
        }
        // SAFETY: made by `Box::into_raw` in `cuhook_trace_open`, closed once (contract).
        let CTrace { subscription, file } = *unsafe { Box::from_raw(trace) };
        subscription.unsubscribe()?;
        // The subscriber's clone went with its closure: the file is ours alone now.
        if let Ok(f) = Arc::try_unwrap(file) {
            f.close();
        }
        Ok(CUHOOK_OK)
    })
}

// ------------------------------------------------------------------------ event queues

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

/// One slot of the ring: Vyukov's bounded queue, whose per-cell sequence tells producers the
/// cell is free (`seq == position`) and the consumer that it is written (`seq == position+1`).
struct Cell {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<CQueuedEvent>>,
}

/// Bounded multi-producer, single-consumer ring, and the futex word a sleeping consumer waits
/// on.
struct Ring {
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
    /// One consumer at a time.
    consuming: AtomicBool,
    queued: AtomicU64,
    dropped: AtomicU64,
    popped: AtomicU64,
}

// SAFETY: a cell's value is written only by the producer that claimed its position (the
// head's compare-and-swap) and read only by the single consumer after the cell's sequence says
// it is complete; the raw pointers in it are plain addresses and static API names.
unsafe impl Sync for Ring {}
// SAFETY: as above; nothing in the ring belongs to a thread.
unsafe impl Send for Ring {}

/// The most events one queue may hold.
const MOST_QUEUED: usize = 1 << 24;

impl Ring {
    fn new(capacity: usize) -> Ring {
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
            consuming: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            popped: AtomicU64::new(0),
        }
    }

    /// Producer side (inside a hook): no allocation, no lock, never waits.
    fn push(&self, value: CQueuedEvent) {
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
    fn pop(&self, out: &mut [MaybeUninit<CQueuedEvent>], timeout_ms: c_int) -> usize {
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

    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Become the consumer: false when another thread is popping.
    fn enter(&self) -> bool {
        self.consuming
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    fn leave(&self) {
        self.consuming.store(false, Ordering::Release);
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

fn thread_id() -> c_int {
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

fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn now_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
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

// The C layouts of the structs above (`include/cuhook.h`).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CStats>() == 48);
    assert!(size_of::<CUsage>() == 24 && offset_of!(CUsage, live) == 8);
    assert!(size_of::<CQueuedEvent>() == 80);
    assert!(offset_of!(CQueuedEvent, event) == 64 && offset_of!(CQueuedEvent, tid) == 68);
    assert!(offset_of!(CQueuedEvent, time_ns) == 72);
    assert!(size_of::<CQueueStats>() == 24);
};

#[cfg(test)]
mod tests;
