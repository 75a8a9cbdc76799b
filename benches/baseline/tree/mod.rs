//! The registry as it was before the page table (B+tree, two copies behind a sequence latch),
//! kept verbatim apart from its imports as the baseline `benches/registry.rs` compares against.
//! Only the operations the benchmark uses are reached.
#![allow(unsafe_code, dead_code, clippy::module_inception)]

mod latch;
mod node;
mod slab;
mod tree;
mod write;

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub use cuhook::registry::{Allocation, InsertOutcome, Removed};
use latch::Latch;
use node::Root;
use write::{Writer, Yield};

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
