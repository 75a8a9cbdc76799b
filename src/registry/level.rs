//! A view of one table of the page table while the writer edits it, and the pieces a range
//! is rewritten into: shared by the writer's entry points (`write.rs`) and its slot edits
//! (`edit.rs`).

use crate::atomics::{AtomicUsize, Ordering::Relaxed, Ordering::Release};

use super::record::Record;
use super::slab::Ptr;
use super::table::{Table, Top, EMPTY, FAN, SHIFT, TOP_SLOTS};

/// A piece of a range being rewritten: its new record and `[lo, hi]`.
pub(super) type Piece = (Ptr<Record>, usize, usize);

/// The slots of one table, with its count of non-empty slots (none for the top table).
#[derive(Clone, Copy)]
pub(super) struct Level<'a> {
    pub(super) slots: &'a [AtomicUsize],
    pub(super) used: Option<&'a AtomicUsize>,
    pub(super) level: usize,
    /// First address of slot 0.
    pub(super) base: usize,
}

impl<'a> Level<'a> {
    /// The top table's slots (no count: the top is never freed).
    pub(super) fn top(top: &'a Top) -> Self {
        Level {
            slots: &top.slots,
            used: None,
            level: 0,
            base: 0,
        }
    }

    pub(super) fn child(t: &'a Table, level: usize, base: usize) -> Self {
        Level {
            slots: &t.slots,
            used: Some(&t.used),
            level,
            base,
        }
    }

    /// The table these slots belong to (none for the top table): its count comes first. The
    /// address takes the exposed provenance of the slab element (tables are linked through
    /// exposed pointers, `table.rs`), not the count field's own.
    #[inline(always)]
    pub(super) fn table(&self) -> Option<*const Table> {
        self.used
            .map(|u| core::ptr::with_exposed_provenance::<Table>(core::ptr::from_ref(u).addr()))
    }

    /// Indices of the slots meeting `[lo, hi]` (which meets this table's block).
    pub(super) fn span(&self, lo: usize, hi: usize) -> core::ops::RangeInclusive<usize> {
        let sh = SHIFT[self.level];
        let n = if self.level == 0 { TOP_SLOTS } else { FAN };
        let first = lo.saturating_sub(self.base) >> sh;
        let last = ((hi - self.base) >> sh).min(n - 1);
        first..=last
    }

    /// The slot to go down through towards `[lo, hi]` (which meets this table's block), and
    /// its block's first address: the one slot holding all of the range, when it does not
    /// hold it whole. `None` when the range's slots lie in this table.
    #[inline(always)]
    pub(super) fn way_down(&self, lo: usize, hi: usize) -> Option<(usize, usize)> {
        let sh = SHIFT[self.level];
        let i = (lo - self.base) >> sh;
        let (blo, bhi) = self.block(i);
        ((hi - self.base) >> sh == i && !(lo == blo && hi >= bhi)).then_some((i, blo))
    }

    /// The block of slot `i`, `[lo, hi]`.
    pub(super) fn block(&self, i: usize) -> (usize, usize) {
        let sh = SHIFT[self.level];
        let lo = self.base + (i << sh);
        (lo, lo + ((1usize << sh) - 1))
    }

    /// Stores `v` in slot `i`, keeping the table's count of used slots.
    #[inline]
    pub(super) fn set(&self, i: usize, v: usize) {
        self.replace(i, self.slots[i].load(Relaxed), v);
    }

    /// [`Self::set`] for a caller that has just loaded the slot's value `old` (under the writer
    /// lock, so it is still there): no second load, and the count's update folds away where
    /// `old` and `v` are known. (A held table counts in its holder: `Held::replace`.)
    #[inline(always)]
    pub(super) fn replace(&self, i: usize, old: usize, v: usize) {
        if let (Some(used), Some(less)) = (self.used, changes_use(old, v)) {
            count(used, 1, less);
        }
        self.put(i, v);
    }

    /// Stores `v` in slot `i`, the count left to the caller.
    #[inline(always)]
    pub(super) fn put(&self, i: usize, v: usize) {
        // Release: what `v` points to is complete before a reader can load it.
        self.slots[i].store(v, Release);
    }

    /// Stores `v` in every slot of `range`: a record into slots that are all empty, or EMPTY
    /// into slots that all hold one (the caller checked which: [`all_hold`]). The count of
    /// used slots changes once.
    #[inline]
    pub(super) fn fill(&self, range: core::ops::Range<usize>, v: usize) {
        if range.is_empty() {
            return;
        }
        if let Some(used) = self.used {
            count(used, range.len(), v == EMPTY);
        }
        self.put_all(range, v);
    }

    /// Stores `v` in every slot of `range`, the count left to the caller.
    #[inline]
    pub(super) fn put_all(&self, range: core::ops::Range<usize>, v: usize) {
        // Release: what `v` points to is complete before a reader can load it. Eight stores a
        // step (slot by slot, four instructions a slot).
        let mut eights = self.slots[range].chunks_exact(STRIDE);
        (&mut eights).for_each(|c| c.iter().for_each(|s| s.store(v, Release)));
        eights.remainder().iter().for_each(|s| s.store(v, Release));
    }
}

/// How a slot going from `old` to `v` changes its table's count of used slots: `Some(false)`
/// one more, `Some(true)` one fewer, `None` unchanged.
#[inline(always)]
pub(super) fn changes_use(old: usize, v: usize) -> Option<bool> {
    match (old == EMPTY, v == EMPTY) {
        (true, false) => Some(false),
        (false, true) => Some(true),
        _ => None,
    }
}

/// Adds `n` used slots to a table's count, or takes them away (`less`): a load and a store,
/// since only the exclusive writer changes a count this way, with every lane drained (a shared
/// edit keeps the count of the table it holds itself and stores it on release: `held.rs`).
#[inline(always)]
fn count(used: &AtomicUsize, n: usize, less: bool) {
    let u = used.load(Relaxed);
    used.store(if less { u - n } else { u + n }, Relaxed);
}

// `Level::table` finds the table from its count.
#[cfg(not(loom))]
const _: () = assert!(core::mem::offset_of!(Table, used) == 0);

/// Whether every slot of `slots` holds `v`. The end slots are read first: they are the ones a
/// neighbour shares (a pool packs ranges at sub-granule steps), and a miss there would otherwise
/// be found only after every slot was read, pulling a large range's cache lines in just to fail.
/// Then eight slots at a time with one test (their differences from `v` OR-ed together): a
/// 1 MiB range's 254 inner slots took 8 instructions each slot by slot, 3 this way.
#[inline(always)]
pub(super) fn all_hold(slots: &[AtomicUsize], v: usize) -> bool {
    let holds = |s: &AtomicUsize| s.load(Relaxed) == v;
    if !(slots.first().is_none_or(holds) && slots.last().is_none_or(holds)) {
        return false;
    }
    let mut eights = slots.chunks_exact(STRIDE);
    eights.all(|c| c.iter().fold(0, |d, s| d | (s.load(Relaxed) ^ v)) == 0)
        && eights.remainder().iter().all(holds)
}

/// Slots a large edit reads or writes together ([`all_hold`], [`Level::fill`]): one cache line.
const STRIDE: usize = 8;

/// The slots strictly between a span's first and last.
pub(super) fn between(first: usize, last: usize) -> core::ops::Range<usize> {
    first + 1..last.max(first + 1)
}

/// A span's end slots, each once.
pub(super) fn ends(first: usize, last: usize) -> impl Iterator<Item = usize> {
    [first, last]
        .into_iter()
        .take(if first == last { 1 } else { 2 })
}
