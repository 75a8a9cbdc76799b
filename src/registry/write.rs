//! Everything done under the writer lock: inserts, removals, purges and the consistent snapshots
//! that reports need. One copy of the page table is edited in place (`edit.rs` says why readers
//! can stay lock-free); records and tables are recycled through type-stable slabs.
#![allow(unsafe_code)]

use crate::atomics::Ordering;
use crate::locks::WriterGuard;
use core::ptr::NonNull;

use super::level::{Level, Piece};
use super::record::Record;
use super::slab::{Ptr, Slab};
use super::table::{index, slot_of, target, Bucket, Table, Top, EMPTY, LEAF, LEVELS, REC};
use super::{Allocation, InsertOutcome, Registry, Removed};

/// Writer state, under the lock.
///
/// `repr(C)` with the fields an allocation hook's pool case touches first (`insert_pool`,
/// `unlink_single`): they share the cache line of the lock word that precedes them, so a hook
/// running after the driver has evicted it from the first-level cache misses on two lines of
/// writer state instead of five (`benches/footprint.sh`).
#[repr(C)]
pub(super) struct Writer {
    /// The leaf table last descended to, and its block's first address: consecutive edits in one
    /// 2 MiB block (a pool's) skip the descent. Forgotten when that table is freed.
    pub(super) leaf: Option<(usize, Ptr<Table>)>,
    next_seq: u64,
    count: usize,
    /// Bytes in live ranges, modulo 2^64: the ranges are disjoint, so the true total is at most
    /// 2^64, and the one value that wraps (exactly 2^64, read as 0 with ranges live) is
    /// published as `usize::MAX` ([`Writer::live_bytes`]).
    live: usize,
    pub(super) recs: Slab<Record>,
    /// Whether inserts are taken. Cleared together with the table by [`Registry::close`], under
    /// this lock, so that an insert racing with it (a hook that saw the registry attached just
    /// before the uninstall) cannot land after the clear and stay for good.
    open: bool,
    /// True while a table is being built aside (not yet linked): tables linked into it then get
    /// no `base` and become no hint (`edit.rs`, `link_table`).
    pub(super) aside: bool,
    // The rest is for the general paths.
    /// The top table (also published in `Registry::read`), owned here.
    top: Option<NonNull<Top>>,
    pub(super) tables: Slab<Table>,
    pub(super) buckets: Slab<Bucket>,
    missed: u64,
    /// Ranges an edit touches (scratch).
    hits: Vec<Ptr<Record>>,
    /// A shared granule's ranges being rebuilt (scratch).
    pub(super) granule: Vec<Ptr<Record>>,
    /// The level-1 table readers may start from (`ReadSide::hint`), set when one is linked.
    pub(super) hint: Option<Ptr<Table>>,
    /// The level-3 table readers may start from (`ReadSide::near`), set when one is linked.
    pub(super) near: Option<Ptr<Table>>,
}

// SAFETY: the writer owns its top table and slabs like a `Box` and `Vec`s of `Sync` elements; it
// only moves between threads inside the registry's mutex.
unsafe impl Send for Writer {}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(top) = self.top.take() {
            // SAFETY: made by `new_top` and freed once; the registry is being dropped, so no
            // reader borrows it.
            unsafe { free_top(top) };
        }
    }
}

/// A top table with every slot empty. Zeroed memory rather than a 512 KiB value on the stack.
#[cfg(not(loom))]
fn new_top() -> NonNull<Top> {
    let layout = std::alloc::Layout::new::<Top>();
    // SAFETY: `Top` is all `AtomicUsize`, for which all-zero bytes are valid (EMPTY).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<Top>();
    match NonNull::new(p) {
        Some(t) => t,
        None => std::alloc::handle_alloc_error(layout),
    }
}

/// Loom's atomics are not plain integers: build the (small) table as a value.
#[cfg(loom)]
fn new_top() -> NonNull<Top> {
    use super::table::{EMPTY, TOP_SLOTS};
    use crate::atomics::{atomic_array, AtomicUsize};
    NonNull::from(Box::leak(Box::new(Top {
        slots: atomic_array![AtomicUsize::new(EMPTY); TOP_SLOTS],
    })))
}

/// Frees a table made by [`new_top`].
///
/// # Safety
///
/// `top` came from `new_top`, is freed once, and nothing borrows it any more.
unsafe fn free_top(top: NonNull<Top>) {
    #[cfg(not(loom))]
    // SAFETY: allocated by `new_top` with this layout (caller's contract).
    unsafe {
        std::alloc::dealloc(top.as_ptr().cast(), std::alloc::Layout::new::<Top>())
    };
    #[cfg(loom)]
    // SAFETY: leaked from a `Box` by `new_top` (caller's contract).
    drop(unsafe { Box::from_raw(top.as_ptr()) });
}

impl Writer {
    pub(super) const fn new() -> Self {
        Writer {
            top: None,
            tables: Slab::new(),
            buckets: Slab::new(),
            recs: Slab::new(),
            next_seq: 0,
            count: 0,
            live: 0,
            missed: 0,
            hits: Vec::new(),
            granule: Vec::new(),
            leaf: None,
            hint: None,
            near: None,
            aside: false,
            open: true,
        }
    }

    /// Whether an insert's edit can take what it needs without allocating: records for the
    /// range and the pieces of the ones it cuts, tables down both edges of its span, a few
    /// buckets, and room in the lists it fills. An edit that needs more (a granule shared by
    /// many ranges) still allocates as it goes.
    fn spare_for_insert(&mut self) -> bool {
        self.recs.spare(3)
            && self.tables.spare(2 * LEVELS + 1)
            && self.buckets.spare(4)
            && self.hits.try_reserve(16).is_ok()
            && self.granule.try_reserve(16).is_ok()
    }

    /// Bytes in live ranges, saturated at `usize::MAX`.
    #[inline(always)]
    fn live_bytes(&self) -> usize {
        if self.live == 0 && self.count != 0 {
            usize::MAX
        } else {
            self.live
        }
    }

    /// Registered ranges and live records, tables and buckets (for the tests' leak checks).
    #[cfg(all(test, not(loom)))]
    pub(super) fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.count,
            self.recs.live(),
            self.tables.live(),
            self.buckets.live(),
        )
    }

    /// The top table, allocated (zeroed: every slot empty) and published on first use.
    fn top<'a>(&mut self, reg: &'a Registry) -> Level<'a> {
        let top = match self.top {
            Some(t) => t,
            None => {
                let t = new_top();
                self.top = Some(t);
                reg.read.top.store(t.as_ptr(), Ordering::Release);
                t
            }
        };
        // SAFETY: owned by this writer, freed only when the registry drops (after `'a`).
        let top: &'a Top = unsafe { top.as_ref() };
        Level {
            slots: &top.slots,
            used: None,
            level: 0,
            base: 0,
        }
    }

    /// The top table if there is one (reads need not create it).
    fn top_if_any<'a>(&mut self, reg: &'a Registry) -> Option<Level<'a>> {
        self.top.is_some().then(|| self.top(reg))
    }

    /// The pool case of an insert: `a` (size > 0) lies in one granule of the cached leaf, and
    /// that granule is free. Links a new record for it in one store and returns its sequence
    /// number; `None`, changing nothing, when the general path must run.
    #[inline(always)]
    fn insert_pool(&mut self, a: &Allocation) -> Option<u64> {
        if !self.open {
            return None;
        }
        let hi = a.start.checked_add(a.size - 1)?;
        let leaf = self.pool_granule(a.start, hi)?;
        // No memory for a record: the general path, which asks first, counts it untracked.
        let p = self.recs.try_alloc()?;
        self.next_seq += 1;
        let seq = self.next_seq;
        rec(p).store(&Allocation { seq, ..*a });
        leaf.replace(index(LEAF, a.start), EMPTY, slot_of(p, REC));
        self.count += 1;
        self.live = self.live.wrapping_add(a.size);
        Some(seq)
    }

    /// A new record holding `a`, not yet linked.
    fn new_record(&mut self, a: &Allocation) -> Ptr<Record> {
        let p = self.recs.alloc();
        rec(p).store(a);
        p
    }

    /// Fills `self.hits` with the ranges meeting `[lo, hi]`, in address order.
    fn find_hits(&mut self, top: Level<'_>, lo: usize, hi: usize) {
        self.hits.clear();
        Self::collect(top, lo, hi, &mut self.hits);
        self.hits.retain(|&p| {
            let (s, l) = rec(p).span();
            s <= hi && l >= lo
        });
        self.hits.sort_unstable_by_key(|&p| rec(p).span().0);
        self.hits.dedup();
    }

    /// Clears `[lo, hi]`: each range meeting it loses those bytes (its outer parts become new
    /// records, same metadata and seq). Returns (bytes cleared, ranges hit, ranges hit whole);
    /// pushes the cleared pieces to `gone` when asked. Expects `find_hits` to have run.
    fn cut(
        &mut self,
        top: Level<'_>,
        lo: usize,
        hi: usize,
        gone: &mut dyn FnMut(Allocation),
    ) -> (usize, usize, usize) {
        let hits = core::mem::take(&mut self.hits);
        let mut bytes = 0;
        let mut whole = 0;
        for &h in &hits {
            let old = rec(h).get();
            let last = old.last();
            let mut buf: [Piece; 2] = [(h, 0, 0); 2];
            let mut n = 0;
            if old.start < lo {
                let left = Allocation {
                    size: lo - old.start,
                    ..old
                };
                buf[n] = (self.new_record(&left), left.start, lo - 1);
                n += 1;
            }
            if last > hi {
                let right = Allocation {
                    start: hi + 1,
                    size: last - hi,
                    ..old
                };
                buf[n] = (self.new_record(&right), hi + 1, last);
                n += 1;
            }
            let pieces = &buf[..n];
            self.rewrite(top, old.start, last, h, pieces);
            self.recs.free(h);
            self.count = self.count + pieces.len() - 1;
            whole += usize::from(pieces.is_empty());
            let (from, to) = (old.start.max(lo), last.min(hi));
            bytes += to - from + 1;
            gone(Allocation {
                start: from,
                size: to - from + 1,
                ..old
            });
        }
        self.hits = hits;
        (bytes, self.hits.len(), whole)
    }

    /// Unlinks and frees the whole range of record `p`.
    fn drop_range(&mut self, top: Level<'_>, p: Ptr<Record>) -> Allocation {
        self.unlink_range(top, p);
        self.retire(p)
    }

    /// Unlinks the whole range of record `p` (the record stays allocated).
    fn unlink_range(&mut self, top: Level<'_>, p: Ptr<Record>) {
        let (lo, hi) = rec(p).span();
        if !self.unlink_fast(top, lo, hi, p) {
            self.rewrite(top, lo, hi, p, &[]);
        }
    }

    /// Frees the record of a range no slot links any more; returns the range.
    fn retire(&mut self, p: Ptr<Record>) -> Allocation {
        let a = rec(p).get();
        self.free_record(p);
        a
    }

    /// Frees the record of a range no slot links any more. Its fields stay as they are until
    /// an edit under this lock reuses it, so the lock's holder may still read them.
    #[inline(always)]
    fn free_record(&mut self, p: Ptr<Record>) {
        let size = rec(p).span_size();
        self.recs.free(p);
        self.count -= 1;
        self.live = self.live.wrapping_sub(size);
    }
}

/// Borrows a record handle (writer side).
fn rec<'a>(p: Ptr<Record>) -> &'a Record {
    target::<Record>(slot_of(p, REC))
}

impl Registry {
    /// Registers `a` (its `seq` is ignored and assigned). Parts of live ranges it overlaps are
    /// dropped (a trimmed range keeps the rest; a range it falls inside is split), and each range
    /// overlapped counts as a missed free: a pool may hand an address out again without the free
    /// having been seen. Size 0 registers nothing.
    ///
    /// The pool case (a free granule of the leaf table the writer used last) is inlined into the
    /// caller, the allocation hooks: the record is filled straight from the hook's registers,
    /// with no 80-byte copy through a call and no second look at the hints.
    #[inline(always)]
    pub fn insert(&self, a: Allocation) -> InsertOutcome {
        if a.size == 0 {
            return InsertOutcome::default();
        }
        let mut guard = self.writer.lock();
        if let Some(seq) = guard.insert_pool(&a) {
            self.publish_len(&guard);
            return InsertOutcome {
                seq: Some(seq),
                overwritten: 0,
                size: a.size,
            };
        }
        self.insert_locked(guard, a)
    }

    /// Everything [`Self::insert`] does beyond the pool case, under the lock it took.
    #[inline(never)]
    fn insert_locked(
        &self,
        mut guard: WriterGuard<'_, Writer>,
        mut a: Allocation,
    ) -> InsertOutcome {
        let last = a.start.saturating_add(a.size - 1);
        a.size = last - a.start + 1;
        let w = &mut *guard;
        if !w.open {
            return InsertOutcome::default();
        }
        // Everything the edit may take, asked for before anything changes: without the memory
        // for it the range goes untracked (counted; lookups do not find it, the driver is asked
        // instead) rather than the host being aborted, and the next insert tries again.
        if !w.spare_for_insert() {
            drop(guard);
            self.stats.untracked.fetch_add(1, Ordering::Relaxed);
            return InsertOutcome::default();
        }
        w.next_seq += 1;
        a.seq = w.next_seq;
        let top = w.top(self);
        let rec = w.new_record(&a);
        let (lost, overwritten) = if w.link_fast(top, a.start, last, rec) {
            (0, 0)
        } else {
            w.find_hits(top, a.start, last);
            let (bytes, hits, _) = if w.hits.is_empty() {
                (0, 0, 0)
            } else {
                w.cut(top, a.start, last, &mut |_| {})
            };
            w.link(top, a.start, last, rec);
            (bytes, hits)
        };
        w.count += 1;
        w.live = w.live.wrapping_sub(lost).wrapping_add(a.size);
        w.missed += overwritten as u64;
        self.publish(w);
        InsertOutcome {
            seq: Some(a.seq),
            overwritten,
            size: a.size,
        }
    }

    /// Unregisters `[start, start + len)` (clipped at `usize::MAX`), trimming or splitting the
    /// ranges it covers in part (a VMM unmap of a sub-range).
    pub fn remove(&self, start: usize, len: usize) -> Removed {
        self.remove_span(start, len, &mut |_| {})
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
        let r = self.remove_span(start, len, &mut |a| gone.push(a));
        gone.into_iter().for_each(&mut out);
        r
    }

    fn remove_span(&self, start: usize, len: usize, gone: &mut dyn FnMut(Allocation)) -> Removed {
        if len == 0 {
            return Removed::default();
        }
        let last = start.saturating_add(len - 1);
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let Some(top) = w.top_if_any(self) else {
            return Removed::default();
        };
        w.find_hits(top, start, last);
        let (bytes, hits, whole) = w.cut(top, start, last, gone);
        w.live = w.live.wrapping_sub(bytes);
        self.publish(w);
        Removed {
            whole,
            partial: hits - whole,
            bytes,
        }
    }

    /// Removes the range that starts exactly at `start` (what `cuMemFree(ptr)` means) and returns
    /// it; its size is the size to report for the free. A pointer inside a range finds nothing.
    ///
    /// The pool case (the range alone in one granule of the leaf table the writer used last) is
    /// inlined into the caller, the free hooks: the record is copied once, into the caller's
    /// value.
    #[inline(always)]
    pub fn remove_allocation(&self, start: usize) -> Option<Allocation> {
        let mut guard = self.writer.lock();
        let p = match guard.unlink_single(start) {
            Some(p) => p,
            None => self.unlink_allocation(&mut guard, start)?,
        };
        guard.free_record(p);
        self.publish_len(&guard);
        // Copied last, straight into the caller's value (the record is not reused before the
        // lock is released).
        let a = rec(p).get();
        drop(guard);
        Some(a)
    }

    /// Beyond the pool case: unlinks the range starting exactly at `start`, publishes the hints
    /// (tables may have been freed) and returns its record, still to be retired.
    #[inline(never)]
    fn unlink_allocation(&self, w: &mut Writer, start: usize) -> Option<Ptr<Record>> {
        let top = w.top_if_any(self)?;
        let p = w.locate(top, start).filter(|&p| rec(p).span().0 == start)?;
        w.unlink_range(top, p);
        self.publish(w);
        Some(p)
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
            if let Some(top) = w.top_if_any(self) {
                for (start, seq) in wanted {
                    let found = w.locate(top, start).filter(|&p| {
                        let a = rec(p).get();
                        a.start == start && a.seq == seq
                    });
                    if let Some(p) = found {
                        gone.push(w.drop_range(top, p));
                    }
                }
            }
            self.publish(w);
        }
        let n = gone.len();
        gone.into_iter().for_each(&mut out);
        n
    }

    /// Opens (takes inserts) or closes (drops every range and refuses inserts) the registry,
    /// storing `open` into `flag` in the same step under the writer lock, and returns the flag's
    /// previous value. The process-wide registry's attached flag goes through here, so that an
    /// insert racing with a detach cannot land after the clear (it would stay for good, its free
    /// unseen), and an attach racing with a detach cannot leave it attached but closed.
    pub fn set_open(&self, flag: &core::sync::atomic::AtomicBool, open: bool) -> bool {
        let mut guard = self.writer.lock();
        let was = flag.swap(open, core::sync::atomic::Ordering::AcqRel);
        guard.open = open;
        if !open {
            self.clear_locked(&mut guard);
        }
        was
    }

    /// Drops every range at once, without events (what the registry knows stopped being true:
    /// the hooks that keep it current were removed). Returns how many were dropped.
    pub fn clear(&self) -> usize {
        let mut guard = self.writer.lock();
        self.clear_locked(&mut guard)
    }

    fn clear_locked(&self, w: &mut Writer) -> usize {
        let Some(top) = w.top_if_any(self) else {
            return 0;
        };
        w.find_hits(top, 0, usize::MAX);
        let hits = core::mem::take(&mut w.hits);
        for &p in &hits {
            w.drop_range(top, p);
        }
        let n = hits.len();
        w.hits = hits;
        self.publish(w);
        n
    }

    /// Every range, in address order (taken under the writer lock, so it is one consistent state).
    pub fn snapshot(&self) -> Vec<Allocation> {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let Some(top) = w.top_if_any(self) else {
            return Vec::new();
        };
        w.find_hits(top, 0, usize::MAX);
        w.hits.iter().map(|&p| rec(p).get()).collect()
    }

    /// Calls `f` for every range of a [`Self::snapshot`], in address order, without the lock.
    pub fn for_each(&self, f: impl FnMut(Allocation)) {
        self.snapshot().into_iter().for_each(f);
    }

    /// Publishes the counters after an edit that linked and freed no table (the hints are
    /// unchanged, and so is the count of missed frees).
    #[inline(always)]
    fn publish_len(&self, w: &Writer) {
        self.stats.len.store(w.count, Ordering::Release);
        self.stats
            .live_bytes
            .store(w.live_bytes(), Ordering::Relaxed);
    }

    /// Publishes the hints and counters after an edit.
    fn publish(&self, w: &Writer) {
        for (published, table) in [(&self.read.hint, w.hint), (&self.read.near, w.near)] {
            let table = table.map_or(core::ptr::null_mut(), |t| t.as_mut_ptr());
            if published.load(Ordering::Relaxed) != table {
                // Release: the table is linked and its base written before a reader can use it.
                published.store(table, Ordering::Release);
            }
        }
        self.publish_len(w);
        self.stats.missed.store(w.missed, Ordering::Relaxed);
    }
}

/// Loom builds never fork (and loom's lock has no `force_unlock`).
#[cfg(not(loom))]
impl Registry {
    /// Takes the writer lock and keeps it (the `fork` prepare handler).
    pub(super) fn hold_for_fork(&self) {
        core::mem::forget(self.writer.lock());
    }

    /// Releases the lock [`Self::hold_for_fork`] took.
    ///
    /// # Safety
    ///
    /// Only after `hold_for_fork` on this thread (or, in a child, in its parent's forking thread).
    pub(super) unsafe fn release_after_fork(&self) {
        // SAFETY: the caller took the lock with `hold_for_fork` and forgot the guard.
        unsafe { self.writer.force_unlock() };
    }
}
