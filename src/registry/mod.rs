//! The address-range registry: which live allocation, if any, contains a pointer.
//!
//! Communication libraries ask this on every transfer, from many threads, so lookups must cost
//! nanoseconds and never wait for the (rarer) inserts and removes that CUDA hooks make.
//!
//! # Design
//!
//! - The map is a B+tree keyed by range start (`tree.rs`); the range containing `p` is the one with
//!   the largest start `<= p`, if it reaches `p`. Ranges never overlap, so that is the only
//!   candidate. Metadata lives in 64-byte immutable records (`node.rs`) that leaves point to.
//! - There are **two copies** of the tree behind a sequence latch (`latch.rs`). Readers use the
//!   copy the latch names; a writer edits the other copy, flips the latch, and replays the edit on
//!   the first. A reader never waits for a writer (a writer preempted mid-edit stalls nobody, which
//!   a plain seqlock cannot promise) and retries only if a flip happened during its walk.
//! - Nodes and records come from type-stable slabs (`slab.rs`): memory is reused, never unmapped,
//!   so a reader racing a writer reads stale but valid memory. Every shared field is an atomic
//!   (Relaxed loads for data, Acquire for pointers); the walk is bounded by `MAX_HEIGHT` and clamps
//!   every index, so garbage from a node being rewritten ends the walk and is discarded by the
//!   latch check.
//! - Writers serialise on a spin lock that yields (cores are few, the holder may be preempted).
//!   Each edit is `O(log n)` per copy; records freed by an edit are reused only by a later edit,
//!   after readers of the older copy have been sent away.
//! - Closures handed to [`Registry::purge`], [`Registry::remove_with`] and
//!   [`Registry::for_each`] run after the lock is released, so they may call back into the
//!   registry. (Only a signal handler that interrupts a write on the same thread and then writes
//!   itself can deadlock.)
//!
//! An RCU tree with epoch reclamation would also work, but it needs readers to announce
//! themselves (a shared write per lookup, or per-thread state with destructors); the latch needs
//! neither and costs a second copy of the (small) tree nodes.
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
//! the registry borrow (`slab.rs`); pointer fields only ever hold slab elements of their own type
//! (`node.rs`); a record copy is only turned into an [`Allocation`] once it is known consistent —
//! by the latch check on the read path (this file), or because the writer lock is held
//! (`write.rs`).
#![allow(unsafe_code)]

mod global;
mod latch;
mod node;
mod slab;
mod tree;
mod write;

#[cfg(test)]
mod tests;

use core::ffi::CStr;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::events::{MemEvent, MemType};
pub use global::{
    attach, global, note_failed_free, note_unknown_free, replay_existing, stats, RegistryStats,
    PRIORITY,
};
use latch::Latch;
use node::Root;
use write::{Writer, Yield};

/// One registered address range and what is known about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// First byte of the range.
    pub start: usize,
    /// At least 1 for any registered range.
    pub size: usize,
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for host or unknown.
    pub device: i32,
    /// [`crate::events::flags`] bits.
    pub flags: u32,
    /// `CUmemoryPool` handle, else 0.
    pub pool: usize,
    /// Stream of a stream-ordered allocation, else 0.
    pub stream: usize,
    /// `CUcontext` where known, else 0.
    pub context: usize,
    /// The API that allocated it.
    pub api: &'static CStr,
    /// Assigned by [`Registry::insert`], increasing from 1; pieces of a split range keep it.
    pub seq: u64,
}

impl Allocation {
    /// A range with every optional field empty.
    pub const fn new(start: usize, size: usize, api: &'static CStr) -> Self {
        Allocation {
            start,
            size,
            mem_type: MemType::Unknown,
            device: -1,
            flags: 0,
            pool: 0,
            stream: 0,
            context: 0,
            api,
            seq: 0,
        }
    }

    /// The range an alloc event describes.
    pub const fn from_event(e: &MemEvent) -> Self {
        Allocation {
            start: e.address,
            size: e.size,
            mem_type: e.mem_type,
            device: e.device,
            flags: e.flags,
            pool: e.pool,
            stream: e.stream,
            context: e.context,
            api: e.api,
            seq: 0,
        }
    }

    /// Last byte of the range (inclusive, so a range may end at `usize::MAX`).
    pub const fn last(&self) -> usize {
        self.start.saturating_add(self.size.saturating_sub(1))
    }

    /// This allocation as an alloc event (replays to new subscribers).
    pub fn to_event(&self) -> MemEvent {
        let mut ev = MemEvent::new(
            crate::events::EventKind::Alloc,
            self.start,
            self.size,
            self.api,
        );
        ev.mem_type = self.mem_type;
        ev.device = self.device;
        ev.flags = self.flags;
        ev.stream = self.stream;
        ev.pool = self.pool;
        ev.context = self.context;
        ev
    }

    /// Whether `ptr` lies in the range.
    pub const fn contains(&self, ptr: usize) -> bool {
        self.size != 0 && ptr >= self.start && ptr - self.start < self.size
    }
}

/// What an insert did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertOutcome {
    /// The new range's sequence number; `None` when nothing was inserted (size 0).
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
pub struct Registry {
    /// Read by every lookup; written once per write. Kept apart from the writer's lock word and
    /// counters so that locking does not invalidate the readers' line.
    read: ReadSide,
    stats: Stats,
    writer: spin::mutex::Mutex<Writer, Yield>,
}

#[repr(align(128))]
struct ReadSide {
    latch: Latch,
    roots: [Root; 2],
}

#[repr(align(128))]
struct Stats {
    len: AtomicUsize,
    live_bytes: AtomicUsize,
    missed: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry.
    pub const fn new() -> Self {
        Registry {
            read: ReadSide {
                latch: Latch::new(),
                roots: [Root::new(), Root::new()],
            },
            stats: Stats {
                len: AtomicUsize::new(0),
                live_bytes: AtomicUsize::new(0),
                missed: AtomicU64::new(0),
            },
            writer: spin::mutex::Mutex::new(Writer::new()),
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
    #[inline]
    pub fn lookup_span(&self, ptr: usize, len: usize) -> Option<Allocation> {
        let last = ptr.checked_add(len.saturating_sub(1))?;
        let read = &self.read;
        let (start, raw) = read
            .latch
            .read(|copy| tree::floor(&read.roots[copy], ptr).map(|(k, r)| (k, r.load())))?;
        // Validated: `(start, raw)` is one entry of a complete copy, so `raw.size >= 1` and
        // `start <= ptr <= last`. (Wrapping ops anyway: nothing on this path may panic.)
        if last.wrapping_sub(start) > raw.size.wrapping_sub(1) {
            return None;
        }
        // SAFETY: the latch read returned, so the copy was consistent (module doc, Safety).
        Some(unsafe { raw.into_allocation(start) })
    }

    /// True when no range is registered: one load, for hooks that want to skip the lookup.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.stats.len.load(Ordering::Acquire) == 0
    }

    /// Number of registered ranges.
    pub fn len(&self) -> usize {
        self.stats.len.load(Ordering::Relaxed)
    }

    /// Bytes in registered ranges (saturates at `usize::MAX`, reachable only when the whole
    /// address space is registered).
    pub fn live_bytes(&self) -> usize {
        self.stats.live_bytes.load(Ordering::Relaxed)
    }

    /// Ranges overwritten by an insert without having been freed first.
    pub fn missed_frees(&self) -> u64 {
        self.stats.missed.load(Ordering::Relaxed)
    }
}
