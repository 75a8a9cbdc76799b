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
//!   read with Relaxed loads; the walk is bounded by `MAX_HEIGHT` and clamps every index, so
//!   garbage from a node being rewritten ends the walk and is discarded by the latch check.
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
//! by the latch check on the read path, or because the writer lock is held (this file).
#![allow(unsafe_code)]

mod latch;
mod node;
mod slab;
mod tree;

#[cfg(test)]
mod tests;

use core::ffi::CStr;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::events::{MemEvent, MemType};
use latch::Latch;
use node::{Node, Record, Root};
use slab::{Ptr, Slab};
use tree::Tree;

/// One registered address range and what is known about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub start: usize,
    /// At least 1 for any registered range.
    pub size: usize,
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

/// Lock waiters yield: with few cores, spinning against a preempted holder wastes its slice.
struct Yield;

impl spin::RelaxStrategy for Yield {
    fn relax() {
        std::thread::yield_now();
    }
}

/// Writer state, under the lock.
struct Writer {
    nodes: Slab<Node>,
    recs: Slab<Record>,
    next_seq: u64,
    count: usize,
    live: u128,
    missed: u64,
    /// The edit being built: applied to one copy, published, applied to the other.
    edits: Vec<Edit>,
    /// Ranges the edit retires (their records are freed after it).
    hits: Vec<Hit>,
}

#[derive(Clone, Copy)]
enum Edit {
    Put(usize, Ptr<Record>),
    Del(usize),
}

struct Hit {
    a: Allocation,
    rec: Ptr<Record>,
}

/// Converts a record read under the writer lock.
fn locked_alloc(start: usize, r: &Record) -> Allocation {
    // SAFETY: only called with the writer lock held: records reachable from either copy were
    // completely written before they were linked, and nothing writes them while linked.
    unsafe { r.load().into_allocation(start) }
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
            writer: spin::mutex::Mutex::new(Writer {
                nodes: Slab::new(),
                recs: Slab::new(),
                next_seq: 0,
                count: 0,
                live: 0,
                missed: 0,
                edits: Vec::new(),
                hits: Vec::new(),
            }),
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
        // `start <= ptr <= last`.
        if last - start > raw.size.wrapping_sub(1) {
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

    // ---------------------------------------------------------------- write path

    /// Registers `a` (its `seq` is ignored and assigned). Parts of live ranges it overlaps are
    /// dropped (a trimmed range keeps the rest; a range it falls inside is split), and each range
    /// overlapped counts as a missed free: a pool may hand an address out again without the free
    /// having been seen. Size 0 registers nothing.
    pub fn insert(&self, mut a: Allocation) -> InsertOutcome {
        if a.size == 0 {
            return InsertOutcome::default();
        }
        let last = a.start.saturating_add(a.size - 1);
        a.size = last - a.start + 1;
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        w.next_seq += 1;
        a.seq = w.next_seq;
        let rec = new_record(w, &a);
        let spare = &self.read.roots[self.read.latch.spare()];
        if Tree::new(spare, &mut w.nodes).insert_if_clear(a.start, last, rec) {
            w.edits.push(Edit::Put(a.start, rec));
            w.count += 1;
            w.live += a.size as u128;
            self.commit(w, true);
            return InsertOutcome {
                seq: Some(a.seq),
                overwritten: 0,
                size: a.size,
            };
        }
        let lost = self.cut(w, a.start, last, None);
        let overwritten = w.hits.len();
        // A range that started at the same address is replaced in place rather than deleted and
        // re-inserted (the common pool-reuse case).
        match w
            .edits
            .iter_mut()
            .find(|e| matches!(e, Edit::Del(k) if k == &a.start))
        {
            Some(e) => *e = Edit::Put(a.start, rec),
            None => w.edits.push(Edit::Put(a.start, rec)),
        }
        w.count += 1;
        w.live = w.live - lost as u128 + a.size as u128;
        w.missed += overwritten as u64;
        self.commit(w, false);
        InsertOutcome {
            seq: Some(a.seq),
            overwritten,
            size: a.size,
        }
    }

    /// Unregisters `[start, start + len)` (clipped at `usize::MAX`), trimming or splitting the
    /// ranges it covers in part (a VMM unmap of a sub-range).
    pub fn remove(&self, start: usize, len: usize) -> Removed {
        self.remove_span(start, len, None)
    }

    /// Like [`Self::remove`], and hands each removed piece (clipped to the span, with its range's
    /// metadata) to `out`, in address order, after the lock is released.
    pub fn remove_with(
        &self,
        start: usize,
        len: usize,
        mut out: impl FnMut(Allocation),
    ) -> Removed {
        let mut gone = Vec::new();
        let r = self.remove_span(start, len, Some(&mut gone));
        gone.into_iter().for_each(&mut out);
        r
    }

    fn remove_span(&self, start: usize, len: usize, gone: Option<&mut Vec<Allocation>>) -> Removed {
        if len == 0 {
            return Removed::default();
        }
        let last = start.saturating_add(len - 1);
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let bytes = self.cut(w, start, last, gone);
        let whole = w
            .hits
            .iter()
            .filter(|h| h.a.start >= start && h.a.last() <= last)
            .count();
        let partial = w.hits.len() - whole;
        w.live -= bytes as u128;
        self.commit(w, false);
        Removed {
            whole,
            partial,
            bytes,
        }
    }

    /// Removes the range that starts exactly at `start` (what `cuMemFree(ptr)` means) and returns
    /// it; its size is the size to report for the free. A pointer inside a range finds nothing.
    pub fn remove_allocation(&self, start: usize) -> Option<Allocation> {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        // The hot free path: remove from the spare copy directly (its descent doubles as the
        // lookup), then publish and replay.
        let spare = &self.read.roots[self.read.latch.spare()];
        let (rec, r) = Tree::new(spare, &mut w.nodes).remove(start)?;
        let a = locked_alloc(start, r);
        self.retire(w, a, rec);
        self.commit(w, true);
        Some(a)
    }

    /// Removes every range for which `pred` is true (e.g. those of a destroyed context) and hands
    /// each to `out`; returns how many. `pred` and `out` run without the lock. A range inserted
    /// while `pred` runs is not considered; a matched range that was replaced meanwhile (new
    /// `seq`) is kept.
    pub fn purge(
        &self,
        mut pred: impl FnMut(&Allocation) -> bool,
        mut out: impl FnMut(Allocation),
    ) -> usize {
        let wanted: Vec<(usize, u64)> = self
            .snapshot()
            .into_iter()
            .filter(|a| pred(a))
            .map(|a| (a.start, a.seq))
            .collect();
        if wanted.is_empty() {
            return 0;
        }
        let mut gone = Vec::with_capacity(wanted.len());
        {
            let mut guard = self.writer.lock();
            let w = &mut *guard;
            let root = &self.read.roots[self.read.latch.spare()];
            for (start, seq) in wanted {
                if let Some((key, r, rec)) = tree::floor_entry(root, start) {
                    let a = locked_alloc(key, r);
                    if key == start && a.seq == seq {
                        self.retire(w, a, rec);
                        gone.push(a);
                    }
                }
            }
            self.commit(w, false);
        }
        let n = gone.len();
        gone.into_iter().for_each(&mut out);
        n
    }

    /// Every range, in address order (taken under the writer lock, so it is one consistent state).
    pub fn snapshot(&self) -> Vec<Allocation> {
        let guard = self.writer.lock();
        let mut v = Vec::with_capacity(guard.count);
        let root = &self.read.roots[self.read.latch.spare()];
        tree::collect(root, 0, usize::MAX, &mut |k, r, _| {
            v.push(locked_alloc(k, r))
        });
        v
    }

    /// Calls `f` for every range of a [`Self::snapshot`], in address order, without the lock.
    pub fn for_each(&self, f: impl FnMut(Allocation)) {
        self.snapshot().into_iter().for_each(f);
    }

    // ---------------------------------------------------------------- writer internals

    /// Builds the edits that clear `[lo, hi]`: ranges overlapping it go to `w.hits`, the parts
    /// of them outside the span are re-registered. Returns the bytes cleared; pushes the cleared
    /// pieces to `gone` when asked.
    fn cut(
        &self,
        w: &mut Writer,
        lo: usize,
        hi: usize,
        mut gone: Option<&mut Vec<Allocation>>,
    ) -> usize {
        // Between writes both copies are equal; read the spare one.
        let root = &self.read.roots[self.read.latch.spare()];
        w.hits.clear();
        match tree::floor_entry(root, hi) {
            None => {}
            // No range starts inside the span: only this one (the floor of `lo` too) can reach
            // into it. One descent for the common, non-overlapping case.
            Some((k, r, rec)) if k < lo => {
                let a = locked_alloc(k, r);
                if a.last() >= lo {
                    w.hits.push(Hit { a, rec });
                }
            }
            Some(_) => {
                if let Some((k, r, rec)) = tree::floor_entry(root, lo) {
                    let a = locked_alloc(k, r);
                    if k < lo && a.last() >= lo {
                        w.hits.push(Hit { a, rec });
                    }
                }
                let hits = &mut w.hits;
                tree::collect(root, lo, hi, &mut |k, r, rec| {
                    hits.push(Hit {
                        a: locked_alloc(k, r),
                        rec,
                    })
                });
            }
        }
        let mut bytes = 0usize;
        for i in 0..w.hits.len() {
            let old = w.hits[i].a;
            let old_last = old.last();
            if old.start < lo {
                let left = Allocation {
                    size: lo - old.start,
                    ..old
                };
                let rec = new_record(w, &left);
                w.edits.push(Edit::Put(old.start, rec));
            } else {
                w.edits.push(Edit::Del(old.start));
                w.count -= 1;
            }
            if old_last > hi {
                let right = Allocation {
                    start: hi + 1,
                    size: old_last - hi,
                    ..old
                };
                let rec = new_record(w, &right);
                w.edits.push(Edit::Put(right.start, rec));
                w.count += 1;
            }
            let from = old.start.max(lo);
            let to = old_last.min(hi);
            bytes += to - from + 1;
            if let Some(g) = gone.as_deref_mut() {
                g.push(Allocation {
                    start: from,
                    size: to - from + 1,
                    ..old
                });
            }
        }
        bytes
    }

    /// Queues the removal of the whole range `a`.
    fn retire(&self, w: &mut Writer, a: Allocation, rec: Ptr<Record>) {
        w.hits.push(Hit { a, rec });
        w.edits.push(Edit::Del(a.start));
        w.count -= 1;
        w.live -= a.size as u128;
    }

    /// Applies the queued edits to one copy.
    fn apply(&self, copy: usize, w: &mut Writer) {
        let mut t = Tree::new(&self.read.roots[copy], &mut w.nodes);
        for e in &w.edits {
            match *e {
                Edit::Put(k, r) => {
                    t.put(k, r);
                }
                Edit::Del(k) => {
                    t.remove(k);
                }
            }
        }
    }

    /// Applies the queued edits to both copies (spare, flip, other) and frees retired records.
    /// With `spare_done`, the caller already applied them to the spare copy.
    fn commit(&self, w: &mut Writer, spare_done: bool) {
        if !w.edits.is_empty() {
            let spare = self.read.latch.spare();
            if !spare_done {
                self.apply(spare, w);
            }
            self.read.latch.publish();
            self.apply(spare ^ 1, w);
            w.edits.clear();
        }
        for h in w.hits.drain(..) {
            w.recs.free(h.rec);
        }
        self.stats.len.store(w.count, Ordering::Release);
        let live = usize::try_from(w.live).unwrap_or(usize::MAX);
        self.stats.live_bytes.store(live, Ordering::Relaxed);
        self.stats.missed.store(w.missed, Ordering::Relaxed);
    }
}

/// A new record holding `a`, not yet reachable by readers.
fn new_record(w: &mut Writer, a: &Allocation) -> Ptr<Record> {
    let mut recs = &mut w.recs;
    let (p, r) = Slab::alloc_ref(&mut recs);
    r.store(a);
    p
}
