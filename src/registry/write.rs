//! The writer's state, and the entry points of inserts and removals: a shared edit first
//! (`shared.rs`), the exclusive way when it cannot (`exclusive.rs`). One copy of the page table
//! is edited in place (`edit.rs` says why readers can stay lock-free); records and tables are
//! recycled through type-stable slabs.
#![allow(unsafe_code)]

use crate::atomics::Ordering;
use core::ptr::NonNull;

use super::level::Level;
use super::record::{Record, RemovedRecord};
use super::slab::{Ptr, Slab};
use super::table::{slot_of, target, Bucket, Table, Top, BUCKET_CAP, LEVELS, REC};
use super::{Allocation, InsertOutcome, Registry};

/// Writer state, under the lock.
///
/// `repr(C)` with the fields an exclusive edit's pool case touches first (`link_fast`,
/// `unlink_fast`): they share the cache line of the lock word that precedes them, so a hook
/// running after the driver has evicted it from the first-level cache misses on two lines of
/// writer state instead of five (`benches/footprint.sh`).
#[repr(C)]
pub(super) struct Writer {
    /// The leaf table last descended to, and its block's first address: consecutive edits in one
    /// 2 MiB block (a pool's) skip the descent. Forgotten when that table is freed.
    pub(super) leaf: Option<(usize, Ptr<Table>)>,
    /// Ranges linked less ranges unlinked by exclusive edits (wrapping: a range linked in a
    /// lane may be unlinked here); the lanes keep their own (`Registry::len` sums them).
    pub(super) count: usize,
    /// Their bytes, wrapping like `count`.
    pub(super) live: usize,
    pub(super) recs: Slab<Record>,
    /// Whether inserts are taken. Cleared together with the table by [`Registry::close`], under
    /// this lock, so that an insert racing with it (a hook that saw the registry attached just
    /// before the uninstall) cannot land after the clear and stay for good.
    pub(super) open: bool,
    /// A table was freed since the gate closed: the lanes' cached leaves are forgotten when it
    /// opens again.
    pub(super) freed_tables: bool,
    /// True while a table is being built aside (not yet linked): tables linked into it then get
    /// no `base` and become no hint (`edit.rs`, `link_table`).
    pub(super) aside: bool,
    // The rest is for the general paths.
    /// The top table (also published in `Registry::read`), owned here.
    top: Option<NonNull<Top>>,
    pub(super) tables: Slab<Table>,
    pub(super) buckets: Slab<Bucket>,
    pub(super) missed: u64,
    /// A shared granule's ranges being rebuilt (scratch).
    pub(super) granule: Vec<Ptr<Record>>,
    /// The most ranges a shared granule has listed: bounds the chain an edit may build, so that
    /// an edit can ask for its room before it changes anything. Never below one bucket's worth,
    /// the most a shared edit's chain lists (`held.rs`), which no exclusive edit sees built.
    pub(super) widest: usize,
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

/// A top table with every slot empty, or `None` when its memory cannot be had. Zeroed memory
/// rather than a 512 KiB value on the stack.
#[cfg(not(loom))]
fn new_top() -> Option<NonNull<Top>> {
    if super::slab::starving() {
        return None;
    }
    // SAFETY: `Top` is all `AtomicUsize`, for which all-zero bytes are valid (EMPTY).
    let p = unsafe { std::alloc::alloc_zeroed(std::alloc::Layout::new::<Top>()) };
    NonNull::new(p.cast::<Top>())
}

/// Loom's atomics are not plain integers: build the (small) table as a value.
#[cfg(loom)]
fn new_top() -> Option<NonNull<Top>> {
    use super::table::{EMPTY, TOP_SLOTS};
    use crate::atomics::{atomic_array, AtomicUsize};
    Some(NonNull::from(Box::leak(Box::new(Top {
        slots: atomic_array![AtomicUsize::new(EMPTY); TOP_SLOTS],
    }))))
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
            count: 0,
            live: 0,
            missed: 0,
            granule: Vec::new(),
            widest: BUCKET_CAP,
            leaf: None,
            hint: None,
            near: None,
            aside: false,
            freed_tables: false,
            open: true,
        }
    }

    /// Whether an edit that links `recs` new records can take everything it needs without
    /// allocating: the records, tables down both edges of each span it links (its own, and the
    /// pieces of a range it cuts: four edges), and a new chain at each of those edges. Without
    /// it the edit does less instead of aborting the host: an insert leaves its range untracked,
    /// a trim drops the whole range (`cut_one`).
    pub(super) fn room_for_edit(&mut self, recs: usize) -> bool {
        let edges = 2 * recs.min(2);
        self.recs.spare(recs)
            && self.tables.spare(edges * LEVELS)
            && self.room_for_chain()
            && self
                .buckets
                .spare(edges * (self.widest + 2).div_ceil(BUCKET_CAP))
    }

    /// Ranges this writer booked, and live records, tables and buckets (for the tests' leak
    /// checks: `Registry::counts`).
    #[cfg(all(test, not(loom)))]
    pub(super) fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.count,
            self.recs.live(),
            self.tables.live(),
            self.buckets.live(),
        )
    }

    /// The top table, allocated (zeroed: every slot empty) and published on first use; `None`
    /// when its memory cannot be had.
    pub(super) fn top<'a>(&mut self, reg: &'a Registry) -> Option<Level<'a>> {
        let top = match self.top {
            Some(t) => t,
            None => {
                let t = new_top()?;
                self.top = Some(t);
                reg.read.top.store(t.as_ptr(), Ordering::Release);
                t
            }
        };
        // SAFETY: owned by this writer, freed only when the registry drops (after `'a`).
        let top: &'a Top = unsafe { top.as_ref() };
        Some(Level::top(top))
    }

    /// The top table if there is one (reads need not create it).
    pub(super) fn top_if_any<'a>(&mut self, reg: &'a Registry) -> Option<Level<'a>> {
        self.top.and_then(|_| self.top(reg))
    }

    /// A new record holding `a`, not yet linked.
    pub(super) fn new_record(&mut self, a: &Allocation) -> Ptr<Record> {
        let p = self.recs.alloc();
        rec(p).store(a);
        p
    }

    /// Unlinks and frees the whole range of record `p`.
    pub(super) fn drop_range(&mut self, top: Level<'_>, p: Ptr<Record>) -> Allocation {
        self.unlink_range(top, p);
        self.retire(p)
    }

    /// Unlinks the whole range of record `p` (the record stays allocated).
    pub(super) fn unlink_range(&mut self, top: Level<'_>, p: Ptr<Record>) {
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
    pub(super) fn free_record(&mut self, p: Ptr<Record>) {
        let size = rec(p).span_size();
        self.recs.free(p);
        self.count = self.count.wrapping_sub(1);
        self.live = self.live.wrapping_sub(size);
    }
}

/// Borrows a record handle (writer side).
pub(super) fn rec<'a>(p: Ptr<Record>) -> &'a Record {
    target::<Record>(slot_of(p, REC))
}

impl Registry {
    /// Registers `a` (its `seq` is ignored and assigned). Parts of live ranges it overlaps are
    /// dropped (a trimmed range keeps the rest; a range it falls inside is split), and each range
    /// overlapped counts as a missed free: a pool may hand an address out again without the free
    /// having been seen. Size 0 registers nothing.
    ///
    /// The common case is a shared edit (`shared.rs`), whose pool case is inlined into the
    /// caller, the allocation hooks: the record is filled straight from the hook's registers.
    #[inline(always)]
    pub fn insert(&self, a: Allocation) -> InsertOutcome {
        if a.size == 0 {
            return InsertOutcome::default();
        }
        match self.insert_shared(&a) {
            Ok(seq) => InsertOutcome {
                seq: Some(seq),
                overwritten: 0,
                size: a.size,
            },
            Err(filled) => self.insert_exclusive(a, filled),
        }
    }

    /// [`Self::insert`] for the allocation hooks, which keep only the sequence number (0 when
    /// nothing was inserted). A number in a register: the outcome, merged from the exclusive
    /// ways through memory, cost 7 instructions per allocation.
    #[inline(always)]
    pub fn insert_seq(&self, a: Allocation) -> u64 {
        if a.size == 0 {
            return 0;
        }
        match self.insert_shared(&a) {
            Ok(seq) => seq,
            Err(filled) => self.insert_exclusive(a, filled).seq.unwrap_or(0),
        }
    }

    /// The next sequence number: one counter for all writers, so that a range inserted after
    /// another (a reused address) always gets a larger one.
    #[inline(always)]
    pub(super) fn next_seq(&self) -> u64 {
        self.seq.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Removes the range that starts exactly at `start` (what `cuMemFree(ptr)` means) and returns
    /// it; its size is the size to report for the free. A pointer inside a range finds nothing.
    ///
    /// The common case is a shared edit, whose pool case (the range alone in one granule of the
    /// lane's leaf) is inlined into the caller, the free hooks.
    #[inline(always)]
    pub fn remove_allocation(&self, start: usize) -> Option<Allocation> {
        self.remove_record(start).map(|r| r.allocation())
    }

    /// [`Self::remove_allocation`], the record returned as it was stored (the free hooks' way:
    /// most frees never need it decoded).
    #[inline(always)]
    pub(crate) fn remove_record(&self, start: usize) -> Option<RemovedRecord> {
        let mut removed = None;
        self.remove_record_into(start, &mut removed);
        removed
    }

    /// [`Self::remove_record`] written into `out` (left as it was when nothing starts there);
    /// whether a range was removed. The free hooks pass the place they keep the record in until
    /// the real call returns, so the common (shared) removal copies it out of the registry once.
    #[inline(always)]
    pub(crate) fn remove_record_into(&self, start: usize, out: &mut Option<RemovedRecord>) -> bool {
        match self.remove_shared(start, out) {
            Some(found) => found,
            None => match self.remove_exclusive(start) {
                Some(record) => {
                    *out = Some(record);
                    true
                }
                None => false,
            },
        }
    }

    /// Publishes the exclusive edits' counts after an edit that linked and freed no table (the
    /// hints are unchanged, and so is the count of missed frees).
    #[inline(always)]
    pub(super) fn publish_len(&self, w: &Writer) {
        self.stats.len.store(w.count, Ordering::Release);
        self.stats.live_bytes.store(w.live, Ordering::Relaxed);
    }

    /// Publishes the hints and counters after an edit.
    pub(super) fn publish(&self, w: &Writer) {
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
