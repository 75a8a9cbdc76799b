//! The subscriber list: writers build immutable snapshots under a mutex and publish them with
//! one pointer swap; readers ([`SubscriberList::dispatch`]) never lock.
//!
//! A subscription has a stable `index` into the `live` table and a `token` (unique in the
//! process). `live[index]` holds `token << 8 | mask` while the subscription receives those
//! events; dispatch re-checks it before every call, after announcing the call (see
//! [`super::grace`]). That check, not the snapshot swap, is what makes `unsubscribe` take effect:
//! a reader may go on iterating an old snapshot, but it skips entries whose token is dead.
//!
//! # Safety
//!
//! `head` and the `retired` list own heap snapshots through raw pointers (made by
//! `Box::into_raw`). A snapshot is freed only when the grace-period check says no thread can still
//! read it ([`grace::oldest_reader_epoch`]), or in `Drop`, which has exclusive access.
#![allow(unsafe_code)]

use crate::atomics::{atomic_array, AtomicPtr, AtomicU64, Ordering};
use crate::locks::{WriterGuard, WriterLock};
use std::num::NonZeroU64;
use std::ptr;

use super::callback::{Callback, SubscriptionId};
use super::grace::{self, Section};
use super::types::mask;
use crate::{Error, Result};

/// Most subscriptions one list holds at once.
#[cfg(not(loom))]
pub const CAPACITY: usize = 64;
/// Under loom: few, so that a model's list has few atomics.
#[cfg(loom)]
pub const CAPACITY: usize = 4;

/// Source of tokens and subscription ids; never reused (2^56 subscriptions is out of reach).
/// Only uniqueness matters, so it stays a `std` atomic under loom too.
static NEXT_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// `live` value of a subscription: token and the event bits it still receives.
#[inline(always)]
pub(crate) fn live_word(token: u64, mask: u32) -> u64 {
    token << 8 | u64::from(mask & 0xff)
}

/// One subscription as dispatch sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subscriber {
    pub(crate) callback: Callback,
    pub(crate) context: usize,
    pub(crate) token: u64,
    pub(crate) mask: u32,
    pub(crate) index: u32,
    pub(crate) priority: i32,
    pub(crate) id: SubscriptionId,
}

/// An immutable, priority-ordered copy of the list. The entries sit inline (not in a `Vec`) so
/// that dispatch reaches them with one dependent load fewer; unused tail entries are padding.
pub(crate) struct PublishedList {
    len: usize,
    entries: [Subscriber; CAPACITY],
    /// Under loom: read by dispatch, written as the snapshot is freed, so the model checker
    /// reports a free that is not ordered after every dispatch that could still read it.
    #[cfg(loom)]
    in_use: loom::cell::UnsafeCell<()>,
}

#[cfg(loom)]
impl PublishedList {
    /// Records a read of the snapshot by this thread (loom models only).
    pub(crate) fn touch(&self) {
        self.in_use.with(|_| ());
    }

    /// Records the write that freeing is (loom models only).
    fn freeing(&self) {
        self.in_use.with_mut(|_| ());
    }
}

impl PublishedList {
    /// `entries` must not be empty (an empty list is a null head).
    fn new(entries: &[Subscriber]) -> Box<PublishedList> {
        let mut s = Box::new(PublishedList {
            len: entries.len(),
            entries: [entries[0]; CAPACITY],
            #[cfg(loom)]
            in_use: loom::cell::UnsafeCell::new(()),
        });
        s.entries[..entries.len()].copy_from_slice(entries);
        s
    }

    #[inline(always)]
    pub(crate) fn entries(&self) -> &[Subscriber] {
        &self.entries[..self.len]
    }
}

struct Retired {
    snapshot: *mut PublishedList,
    epoch: u64,
}

/// The writers' side of the list, under the mutex.
struct ListWriter {
    /// The current list, sorted by priority; equal priorities in subscription order.
    entries: Vec<Subscriber>,
    /// Replaced snapshots that readers may still be iterating.
    retired: Vec<Retired>,
}

// SAFETY: `Retired` only carries the pointer to a snapshot that no thread writes; ownership moves
// with the writer state, which is behind a mutex.
unsafe impl Send for ListWriter {}

/// What a dispatching thread reads, kept apart from the writer mutex and the counters so that
/// writers and counting never invalidate the readers' cache lines.
#[repr(C, align(128))]
struct ReadMostly {
    /// The current snapshot; null when the list is empty (dispatch then returns at once).
    head: AtomicPtr<PublishedList>,
    /// Per subscription index: `live_word(token, mask)`, or 0 when unused.
    live: [AtomicU64; CAPACITY],
}

/// A list of subscribers with lock-free dispatch. The process-wide one is
/// [`super::subscribers()`]; other instances are independent (tests, embedding).
#[repr(C)]
pub struct SubscriberList {
    read: ReadMostly,
    writer: WriterLock<ListWriter>,
    pub(crate) counters: DispatchCounters,
}

/// Rarely written counters, on their own cache line.
#[repr(C, align(128))]
#[derive(Default)]
pub(crate) struct DispatchCounters {
    // Statistics, not part of any protocol: `std` atomics under loom too.
    pub(crate) panics: std::sync::atomic::AtomicU64,
    pub(crate) dropped: std::sync::atomic::AtomicU64,
}

/// Counts of things dispatch had to swallow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Callbacks that panicked (the panic was caught; later subscribers still ran).
    pub panics: u64,
    /// Events not dispatched because the thread was already [`super::MAX_DEPTH`] dispatches deep
    /// (a callback allocating on every event).
    pub dropped_nested: u64,
}

impl Default for SubscriberList {
    fn default() -> Self {
        SubscriberList::new()
    }
}

impl SubscriberList {
    crate::atomics::const_unless_loom! {
    /// An empty list. `const` so the process-wide list is a plain static (no lazy init on the
    /// hook path).
    pub fn new() -> SubscriberList {
        SubscriberList {
            read: ReadMostly {
                head: AtomicPtr::new(ptr::null_mut()),
                live: atomic_array![AtomicU64::new(0); CAPACITY],
            },
            writer: WriterLock::new(ListWriter {
                entries: Vec::new(),
                retired: Vec::new(),
            }),
            counters: DispatchCounters {
                panics: std::sync::atomic::AtomicU64::new(0),
                dropped: std::sync::atomic::AtomicU64::new(0),
            },
        }
    }
    }

    /// Adds `callback` for the events in `mask` ([`mask::ALLOC`], [`mask::FREE`]). Lower
    /// `priority` runs first; equal priorities run in subscription order. The subscriber receives
    /// events dispatched after this returns (events racing with it may or may not be seen).
    pub fn subscribe(
        &self,
        mask: impl Into<u32>,
        priority: i32,
        callback: Callback,
        context: usize,
    ) -> Result<SubscriptionId> {
        self.insert(mask.into(), priority, callback, context)
            .map(|e| e.id)
    }

    /// Inserts and publishes; returns the entry (for replay).
    pub(crate) fn insert(
        &self,
        mask: u32,
        priority: i32,
        callback: Callback,
        context: usize,
    ) -> Result<Subscriber> {
        check_mask(mask)?;
        let mut w = self.lock();
        if w.entries.len() >= CAPACITY {
            return Err(Error::CapacityExceeded {
                what: "event subscribers",
                limit: CAPACITY,
            });
        }
        let index = (0..CAPACITY as u32)
            .find(|i| w.entries.iter().all(|e| e.index != *i))
            .expect("fewer than CAPACITY entries leave an index free");
        let token = next_token();
        let entry = Subscriber {
            callback,
            context,
            token,
            mask,
            index,
            priority,
            id: SubscriptionId(NonZeroU64::new(token).expect("tokens start at 1")),
        };
        let at = w.entries.partition_point(|e| e.priority <= priority);
        w.entries.insert(at, entry);
        // Live before the snapshot is published: a reader that sees the entry sees it live.
        self.read.live[index as usize].store(live_word(token, mask), Ordering::Release);
        self.publish(&mut w);
        Ok(entry)
    }

    /// Stops delivering the events in `mask` to every subscription with this `callback` and
    /// `context` (ucm semantics: a subscription left with no events is removed). When this
    /// returns, those calls run on no other thread and never start again, so the context may be
    /// freed. Called from inside a callback, it cannot wait for calls in progress on its own
    /// thread (they finish after it returns). Unsubscribing oneself from inside is fine on any
    /// number of threads at once; but two callbacks that each remove what the other is running
    /// (from two threads at once) wait for each other forever, as with any grace period.
    pub fn unsubscribe(
        &self,
        mask: impl Into<u32>,
        callback: Callback,
        context: usize,
    ) -> Result<()> {
        let mask = mask.into();
        check_mask(mask)?;
        self.remove(|e| e.callback == callback && e.context == context, mask)
    }

    /// Removes one subscription entirely; same guarantee as [`SubscriberList::unsubscribe`].
    pub fn unsubscribe_id(&self, id: SubscriptionId) -> Result<()> {
        self.remove(|e| e.id == id, mask::ALL.bits())
    }

    fn remove(&self, matches: impl Fn(&Subscriber) -> bool, mask: u32) -> Result<()> {
        let mut dead = Vec::new();
        {
            let mut w = self.lock();
            for e in w
                .entries
                .iter_mut()
                .filter(|e| matches(e) && e.mask & mask != 0)
            {
                dead.push((e.token, e.mask & mask));
                e.mask &= !mask;
                // Relaxed: the writer barrier in wait_for_calls orders it before the slot scan.
                self.read.live[e.index as usize].store(
                    if e.mask == 0 {
                        0
                    } else {
                        live_word(e.token, e.mask)
                    },
                    Ordering::Relaxed,
                );
            }
            if dead.is_empty() {
                return Err(Error::NoSuchSubscriber);
            }
            w.entries.retain(|e| e.mask != 0);
            self.publish(&mut w);
        }
        // Outside the mutex: a callback blocked on it must not be what we wait for.
        grace::wait_for_calls(&dead);
        self.reclaim(&mut self.lock());
        Ok(())
    }

    /// Counters of swallowed panics and dropped nested events.
    pub fn stats(&self) -> DispatchStats {
        DispatchStats {
            panics: self.counters.panics.load(Ordering::Relaxed),
            dropped_nested: self.counters.dropped.load(Ordering::Relaxed),
        }
    }

    /// How many subscriptions the list holds now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the list has no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.read.head.load(Ordering::Relaxed).is_null()
    }

    /// The current snapshot, valid while `_section` (an outermost or nested dispatch level on
    /// this thread) lives.
    #[inline(always)]
    pub(crate) fn snapshot<'s>(&self, _section: &'s Section) -> Option<&'s PublishedList> {
        let p = self.read.head.load(Ordering::Acquire);
        // SAFETY: non-null heads come from Box::into_raw in publish. The section announced this
        // thread's epoch before this load (grace.rs), so reclaim cannot free the snapshot until
        // the outermost section of this thread ends, which outlives `_section`.
        unsafe { p.as_ref() }
    }

    /// Whether the list is empty, without entering a section (the dispatch fast path).
    #[inline(always)]
    pub(crate) fn has_subscribers(&self) -> bool {
        !self.read.head.load(Ordering::Relaxed).is_null()
    }

    /// The `live` word of subscription index `i`.
    #[inline(always)]
    pub(crate) fn live(&self, i: u32) -> u64 {
        // Relaxed: ordered after the caller's call announcement by Section::begin_call's barrier;
        // publication order is given by the Acquire load of the head.
        self.read.live[i as usize % CAPACITY].load(Ordering::Relaxed)
    }

    fn lock(&self) -> WriterGuard<'_, ListWriter> {
        grace::init_writer();
        #[cfg(not(loom))]
        protect_fork();
        self.writer.lock()
    }

    /// Publishes `w.entries` as the new snapshot and retires the old one.
    fn publish(&self, w: &mut ListWriter) {
        let new = if w.entries.is_empty() {
            ptr::null_mut()
        } else {
            Box::into_raw(PublishedList::new(&w.entries))
        };
        let old = self.read.head.swap(new, Ordering::AcqRel);
        let epoch = grace::advance_epoch();
        if !old.is_null() {
            w.retired.push(Retired {
                snapshot: old,
                epoch,
            });
        }
        self.reclaim(w);
    }

    /// Frees the retired snapshots that no thread can still read. Never blocks: what is still in
    /// use waits for the next write.
    fn reclaim(&self, w: &mut ListWriter) {
        if w.retired.is_empty() {
            return;
        }
        let oldest = grace::oldest_reader_epoch();
        w.retired.retain(|r| {
            if r.epoch > oldest {
                return true;
            }
            // SAFETY: from Box::into_raw in publish, no longer reachable from `head`, and every
            // thread now dispatching entered after the head swap that retired it.
            let snapshot = unsafe { Box::from_raw(r.snapshot) };
            #[cfg(loom)]
            let snapshot = {
                // A report unwinds from here: leak rather than free what `retired` still owns.
                let s = std::mem::ManuallyDrop::new(snapshot);
                s.freeing();
                std::mem::ManuallyDrop::into_inner(s)
            };
            drop(snapshot);
            false
        });
    }
}

impl Drop for SubscriberList {
    fn drop(&mut self) {
        let SubscriberList { read, writer, .. } = self;
        let mut w = writer.lock();
        #[cfg(not(loom))]
        let head = *read.head.get_mut();
        #[cfg(loom)]
        let head = read.head.with_mut(|p| *p);
        for p in w.retired.drain(..).map(|r| r.snapshot).chain(Some(head)) {
            if !p.is_null() {
                // SAFETY: `&mut self` means no dispatch is in progress on this list; each
                // pointer came from Box::into_raw and is owned by exactly one of head/retired.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

/// The fork handlers' registration (fork-safe, see `sys::once`).
#[cfg(not(loom))]
static FORK_HANDLERS: crate::sys::once::ForkSafeOnce = crate::sys::once::ForkSafeOnce::new();

/// Hold the process-wide list's writer lock across every `fork`, so that a child forked while
/// another thread subscribes or unsubscribes does not inherit it held by a thread it does not
/// have (its own subscribes then waited for ever). Safe to wait for: a writer holds the lock
/// only for list edits, allocation and `membarrier`, never while waiting for a callback (grace
/// periods are waited for outside it), so even a thread forking from inside a callback gets it.
#[cfg(not(loom))]
fn protect_fork() {
    FORK_HANDLERS.register_fork_handlers(
        Some(hold_for_fork),
        Some(release_after_fork),
        Some(release_after_fork),
        "a fork during a subscribe may leave the child unable to subscribe",
    );
}

#[cfg(not(loom))]
extern "C" fn hold_for_fork() {
    // The handlers run, so they are registered: a child must not register them again.
    FORK_HANDLERS.mark_done();
    std::mem::forget(super::subscribers().writer.lock());
}

#[cfg(not(loom))]
extern "C" fn release_after_fork() {
    // SAFETY: `hold_for_fork` took the lock on this thread just before the fork and forgot the
    // guard; in the child no other thread exists to hold it.
    #[allow(unsafe_code)]
    unsafe {
        super::subscribers().writer.force_unlock()
    };
}

fn check_mask(m: u32) -> Result<()> {
    if m == 0 || m & !mask::ALL.bits() != 0 {
        return Err(Error::InvalidArgument {
            what: "event mask must be a non-empty combination of mask::ALLOC and mask::FREE",
        });
    }
    Ok(())
}
