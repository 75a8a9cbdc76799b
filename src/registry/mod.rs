//! The address-range registry: which live allocation, if any, contains a pointer.
//!
//! Communication libraries ask this on every transfer, from many threads, so lookups must cost
//! nanoseconds and never wait for the (rarer) inserts and removes that CUDA hooks make.
//!
//! # Design
//!
//! - A **page table over the address** (`table.rs`): five levels of slots (a 65,536-slot top,
//!   then 512-slot tables down to 4 KiB granules). A range is linked as the maximal aligned
//!   blocks it covers, each in one slot of the level of that size, plus the granules it covers in
//!   part. A lookup is at most five dependent loads and one record copy, whatever the number of
//!   ranges (four in the region of the level-1 table the writer last linked, which readers are
//!   pointed to directly); a pointer in no range usually stops at the first or second load. A granule several
//!   ranges share holds a small immutable chain listing them (rare for device memory: pools hand
//!   out 512-byte-aligned blocks, and a granule is only shared when two ranges meet inside it).
//! - **Records** (`record.rs`) hold a range and its metadata behind a per-record sequence count.
//!   Readers copy a record and validate the count; they never wait for a writer: the writer
//!   only rewrites records, chains and tables that no slot links any more, so a reader that sees
//!   a rewrite restarts and finds the current state (`table.rs` argues each case).
//! - **One copy, edited in place** (`edit.rs`): each change readers can see is a single slot
//!   store made after what it points to is complete, so an insert or removal costs one descent
//!   and a few stores. A trim or split rewrites the slots of the old range in place (a block
//!   going from one range to pieces of it gets its child table built aside, then swapped in), so
//!   bytes that stay allocated are found throughout.
//! - A free is found by its exact start with the same descent as a lookup (the slot of the
//!   start's granule names the range), so no separate hash is needed. Each writer also keeps
//!   the leaf table it last used: consecutive edits in one 2 MiB block (a pool's) need no
//!   descent.
//! - Records, tables and chains come from type-stable slabs (`slab.rs`): memory is reused,
//!   never unmapped, so a reader racing a writer reads stale but valid memory.
//! - **Writers side by side** (`lanes.rs`, `shared.rs`, `held.rs`): the common edits — a range
//!   linked into a table that exists, or unlinked from one it leaves in use, its slots all in
//!   that table, its end granules possibly shared with neighbours — run at once from many
//!   threads, each holding one of 16 lanes (its spare records and buckets, counts and cached
//!   leaf) and, for a few stores, the table it edits (a lock bit in the table's count). Every
//!   other edit is *exclusive*: it
//!   takes a spin lock that yields (`crate::locks`; loom's mutex in the models), closes the
//!   lanes' gate and waits for them to drain. (One writer lock for everything cost 16 threads
//!   allocating at once ×1.3–1.4 on the H200; alone the registry's writes then took 12.7 µs
//!   per thread.) Closures handed to [`Registry::purge`], [`Registry::remove_with`] and
//!   [`Registry::for_each`] run after the lock is released, so they may call back into the
//!   registry. (Only a signal handler that interrupts a write on the same thread and then writes
//!   itself can deadlock.) The process-wide registry is held exclusively around `fork()`
//!   (`global.rs`), so a child never inherits the lock or a lane held.
//! - **No abort when memory runs out.** Every edit asks for what it will take before it changes
//!   anything (slab chunks and list room, allocated fallibly), and every walk goes from range to
//!   range without a list (`Writer::first_meeting`). Without the memory, an insert leaves its
//!   range untracked, a trim drops the whole range instead of keeping its outer pieces, and a
//!   removal from a shared granule edits its chain in place (`Bucket::forget`): what is left is
//!   always true, what is lost is counted ([`Registry::untracked`]), and the next edit tries
//!   again. `tests/model.rs` runs the model test with a third of its operations starved.
//!
//! The B+tree with two latched copies this replaced, and a `RwLock<BTreeMap>`, live on as
//! baselines in `benches/registry.rs`; `docs/performance.md` has the comparison.
//!
//! # Address-space edges
//!
//! Ranges are handled as `[start, last]` with an inclusive `last`, so a range may end at
//! `usize::MAX` and start at 0. A range whose end would pass `usize::MAX` is **clipped** to end
//! there ([`InsertOutcome::size`] reports the size kept); a remove is clipped the same way. A
//! [`Registry::lookup_span`] whose end would overflow finds nothing.
//!
//! # Safety
//!
//! Unsafe code is confined to three invariants, each stated where it lives: slab memory outlives
//! the registry borrow (`slab.rs`); slot values only ever point at slab elements of the type
//! their tag names (`table.rs`); a record copy is only turned into an [`Allocation`] once it is
//! known consistent (`record.rs`).
#![allow(unsafe_code)]

mod cut;
mod edit;
mod exclusive;
mod fast;
mod global;
mod held;
mod lanes;
mod level;
mod record;
mod shared;
mod slab;
mod table;
mod whole;
mod write;

#[cfg(all(test, loom))]
#[path = "tests/loom.rs"]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::atomics::{const_unless_loom, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

pub use crate::events::Allocation;
use crate::locks::WriterLock;
pub use global::{attach, attached, detach, global, own_stats, Global, RegistryStats};
pub(crate) use global::{attached_hot, hot, note_untracked};
use lanes::Lanes;
pub(crate) use record::RemovedRecord;
use table::{Table, Top};
use write::Writer;

/// What an insert did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// The new range's sequence number; `None` when nothing was inserted (size 0, the registry
    /// closed, or no memory to record it: then counted untracked).
    pub seq: Option<u64>,
    /// Live ranges the new one overlapped, each counted as a missed free.
    pub overwritten: usize,
    /// Size registered: the size asked for, clipped so the range ends at `usize::MAX` at most.
    pub size: usize,
}

/// What a span remove did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Ranges removed entirely.
    pub whole: usize,
    /// Ranges that lost part of their bytes (trimmed, or split in two).
    pub partial: usize,
    /// Bytes no longer registered.
    pub bytes: usize,
}

/// The address-range registry. `const`-constructible, so it can be a `static`.
///
/// `repr(C)`: the writer lock starts a cache line of its own (checked below), so that the lock
/// word and the writer fields that follow it (`write.rs`, `Writer`) share one line; the lanes
/// and the sequence counter have lines of their own.
#[repr(C)]
pub struct Registry {
    /// Read by every lookup; written once per write. Kept apart from the writer's lock word and
    /// counters so that locking does not invalidate the readers' line.
    read: ReadSide,
    stats: Stats,
    writer: WriterLock<Writer>,
    lanes: Lanes,
    seq: SeqCounter,
}

/// The sequence numbers' counter, on a line of its own: every insert adds to it.
#[repr(align(128))]
struct SeqCounter {
    next: AtomicU64,
}

#[repr(align(128))]
struct ReadSide {
    /// The page table's top level; null until the first insert.
    top: AtomicPtr<Top>,
    /// A level-1 table (slots of 512 GiB): lookups in its block skip the top level.
    hint: AtomicPtr<Table>,
    /// A level-3 table (a 1 GiB block, slots of 2 MiB): lookups in its block start two levels
    /// lower still. Both are the tables of their level the writer linked last.
    near: AtomicPtr<Table>,
}

/// Counters of the exclusive edits (the lanes keep their own; `len` and `live_bytes` are
/// wrapping sums with theirs).
#[repr(align(128))]
struct Stats {
    len: AtomicUsize,
    live_bytes: AtomicUsize,
    missed: AtomicU64,
    /// Ranges (or pieces of ranges) left out for lack of memory.
    untracked: AtomicU64,
}

// The writer lock begins a cache line (the two blocks before it are 128-byte aligned and sized).
#[cfg(not(loom))]
const _: () = assert!(core::mem::offset_of!(Registry, writer) % 64 == 0);

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    const_unless_loom! {
    /// An empty registry.
    pub fn new() -> Self {
        Registry {
            read: ReadSide {
                top: AtomicPtr::new(core::ptr::null_mut()),
                hint: AtomicPtr::new(core::ptr::null_mut()),
                near: AtomicPtr::new(core::ptr::null_mut()),
            },
            stats: Stats {
                len: AtomicUsize::new(0),
                live_bytes: AtomicUsize::new(0),
                missed: AtomicU64::new(0),
                untracked: AtomicU64::new(0),
            },
            writer: WriterLock::new(Writer::new()),
            lanes: Lanes::new(),
            seq: SeqCounter {
                next: AtomicU64::new(0),
            },
        }
    }
    }

    // ---------------------------------------------------------------- read path

    /// The range containing `ptr`. Lock-free; writes no shared memory.
    #[inline]
    pub fn lookup(&self, ptr: usize) -> Option<Allocation> {
        self.lookup_span(ptr, 0)
    }

    /// The range containing all of `[ptr, ptr + len)` (`len` 0 behaves like [`Self::lookup`]).
    /// A span that crosses from one range into the next is not found.
    #[inline(always)]
    pub fn lookup_span(&self, ptr: usize, len: usize) -> Option<Allocation> {
        let last = ptr.checked_add(len.saturating_sub(1))?;
        let raw = table::find(&self.read.top, [&self.read.hint, &self.read.near], ptr)?;
        // `raw` contains `ptr`, so `raw.start <= ptr <= last`. (Wrapping ops anyway: nothing on
        // this path may panic.)
        if last.wrapping_sub(raw.start) > raw.size.wrapping_sub(1) {
            return None;
        }
        // SAFETY: `find` returns only copies validated by the record's sequence count.
        Some(unsafe { raw.into_allocation() })
    }

    /// True when no range is registered (while edits run, as of some moment during the call).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of registered ranges: the exclusive edits' count and each lane's, summed. Exact
    /// when no edit runs; while edits run, a sum that may be off by the edits in flight.
    pub fn len(&self) -> usize {
        let (ranges, _) = self.lanes.booked();
        let n = ranges.wrapping_add(self.stats.len.load(Ordering::Acquire));
        // A sum read while a range moved between two counts may dip below zero.
        if n > isize::MAX as usize {
            0
        } else {
            n
        }
    }

    /// Bytes in registered ranges (saturates at `usize::MAX`, reachable only when the whole
    /// address space is registered; summed like [`Self::len`]).
    pub fn live_bytes(&self) -> usize {
        let (ranges, bytes) = self.lanes.booked();
        let n = ranges.wrapping_add(self.stats.len.load(Ordering::Acquire));
        let live = bytes.wrapping_add(self.stats.live_bytes.load(Ordering::Relaxed));
        // The ranges are disjoint, so the true total is at most 2^64; the one value that wraps
        // (exactly 2^64, read as 0 with ranges live) reads as `usize::MAX`.
        if live == 0 && n != 0 {
            usize::MAX
        } else {
            live
        }
    }

    /// Ranges overwritten by an insert without having been freed first.
    pub fn missed_frees(&self) -> u64 {
        self.stats.missed.load(Ordering::Relaxed)
    }

    /// Ranges not registered because the memory to record them could not be had.
    pub fn untracked(&self) -> u64 {
        self.stats.untracked.load(Ordering::Relaxed)
    }
}
