//! The exclusive writer's fast paths through the page table: the common insert (`link_fast`) and
//! free (`unlink_fast`) that a shared edit (`shared.rs`) could not make, each in one descent,
//! falling back to the general edits of `edit.rs` when they cannot. Exclusive edits only
//! (`lanes.rs`); the same rule as `edit.rs`: every change a reader can see is one slot store of
//! something complete.
#![deny(unsafe_code)]

use crate::atomics::{AtomicUsize, Ordering::Relaxed, Ordering::Release};

use super::edit::chain_any;
use super::level::{all_hold, between, ends, Level};
use super::record::Record;
use super::slab::Ptr;
use super::table::{
    index, ptr_of, slot_of, tag, target, Bucket, Table, BUCKET, EMPTY, LEAF, REC, SHIFT, TAB,
};
use super::write::Writer;

/// The slot that links a table, and the count of used slots of the table holding that slot.
type Parent<'a> = (&'a AtomicUsize, Option<&'a AtomicUsize>);

impl Writer {
    /// Descends towards `[lo, hi]` while one slot holds all of it in part, to the table where
    /// the range's slots begin. With `create`, missing tables on the way are made (the range is
    /// clear there); otherwise `None` when the way ends early. `None` too when a slot on the way
    /// holds a record (a range overlaps). `path` receives the slot linking each table passed.
    #[inline(always)]
    fn split<'a>(
        &mut self,
        top: Level<'a>,
        lo: usize,
        hi: usize,
        create: bool,
        mut path: Option<&mut [Option<Parent<'a>>; LEAF]>,
    ) -> Option<Level<'a>> {
        if path.is_none() {
            if let Some(leaf) = self.cached_leaf(lo, hi) {
                return Some(leaf);
            }
        }
        let mut at = top;
        while at.level < LEAF {
            let Some((i, blo)) = at.way_down(lo, hi) else {
                break;
            };
            let cur = at.slots[i].load(Relaxed);
            let child = match tag(cur) {
                TAB => target::<Table>(cur),
                EMPTY if create => {
                    let t = self.new_table();
                    self.link_table(at, i, t)
                }
                _ => return None,
            };
            if let Some(p) = path.as_deref_mut() {
                p[at.level] = Some((&at.slots[i], at.used));
            }
            if at.level + 1 == LEAF {
                self.leaf = Some((blo, ptr_of(at.slots[i].load(Relaxed))));
            }
            at = Level::child(child, at.level + 1, blo);
        }
        Some(at)
    }

    /// Links `rec` over `[lo, hi]` in one descent when all its slots lie in one table and the
    /// range is clear there (a granule it covers in part may hold ranges it does not meet): the
    /// common insert. Returns false, having changed nothing readers can see but empty tables,
    /// when the general path must run. Always inlined into the insert (its one caller): left to
    /// the compiler it was sometimes a call, 30 instructions more per hooked allocation.
    #[inline(always)]
    pub(super) fn link_fast(
        &mut self,
        top: Level<'_>,
        lo: usize,
        hi: usize,
        rec: Ptr<Record>,
    ) -> bool {
        // The pool case first: one free granule of the cached leaf.
        if let Some(leaf) = self.pool_granule(lo, hi) {
            leaf.set(index(LEAF, lo), slot_of(rec, REC));
            return true;
        }
        let at = match self.cached_leaf(lo, hi) {
            Some(leaf) => leaf,
            None => match self.split(top, lo, hi, true, None) {
                Some(at) => at,
                None => return false,
            },
        };
        let span = at.span(lo, hi);
        let (first, last) = (*span.start(), *span.end());
        // Only the end slots can be covered in part; the ones between must be empty.
        let end_clear = |i: usize| {
            let (blo, bhi) = at.block(i);
            let cur = at.slots[i].load(Relaxed);
            if lo <= blo && bhi <= hi {
                cur == EMPTY
            } else {
                at.level == LEAF && clear_of(cur, lo, hi)
            }
        };
        if !end_clear(first)
            || !end_clear(last)
            || !all_hold(&at.slots[between(first, last)], EMPTY)
        {
            return false;
        }
        let v = slot_of(rec, REC);
        at.fill(between(first, last), v);
        for i in ends(first, last) {
            if at.slots[i].load(Relaxed) == EMPTY {
                at.set(i, v);
            } else {
                self.granule_edit(at, i, None, &[rec]);
            }
        }
        true
    }

    /// The pool case of an insert: `[lo, hi]` lies in one granule of the cached leaf, and that
    /// granule links nothing. Returns the leaf.
    #[inline(always)]
    pub(super) fn pool_granule<'a>(&self, lo: usize, hi: usize) -> Option<Level<'a>> {
        let leaf = self.cached_leaf_granule(lo, hi)?;
        (leaf.slots[index(LEAF, lo)].load(Relaxed) == EMPTY).then_some(leaf)
    }

    /// [`Self::cached_leaf`] for a range inside one granule (which never covers the leaf's
    /// whole block): two comparisons.
    #[inline(always)]
    fn cached_leaf_granule<'a>(&self, lo: usize, hi: usize) -> Option<Level<'a>> {
        let (base, t) = self.leaf?;
        ((lo ^ hi) >> SHIFT[LEAF] == 0 && (lo ^ base) >> SHIFT[LEAF - 1] == 0)
            .then(|| Level::child(target::<Table>(slot_of(t, TAB)), LEAF, base))
    }

    /// Unlinks `rec` (linked over `[lo, hi]`) in one descent when all its slots lie in one
    /// table: the common free. Returns false, changing nothing, when the general path must run.
    pub(super) fn unlink_fast(
        &mut self,
        top: Level<'_>,
        lo: usize,
        hi: usize,
        rec: Ptr<Record>,
    ) -> bool {
        let cached = self.cached_leaf(lo, hi);
        let mine = slot_of(rec, REC);
        // The pool case first: the range's one granule of the cached leaf, not the last one used.
        if let Some(leaf) = cached {
            let i = index(LEAF, lo);
            if i == index(LEAF, hi)
                && leaf.slots[i].load(Relaxed) == mine
                && leaf.used.is_some_and(|u| u.load(Relaxed) > 1)
            {
                leaf.set(i, EMPTY);
                return true;
            }
        }
        let mut path = [None; LEAF];
        let at = match cached {
            Some(leaf) => leaf,
            None => match self.split(top, lo, hi, false, Some(&mut path)) {
                Some(at) => at,
                None => return false,
            },
        };
        let span = at.span(lo, hi);
        let (first, last) = (*span.start(), *span.end());
        let listed = |i: usize| {
            let cur = at.slots[i].load(Relaxed);
            cur == mine || (at.level == LEAF && lists(cur, rec))
        };
        // The slots between the ends name the range alone (it covers them whole); only the
        // ends may be granules it shares. Cleared in one pass, counted once.
        if !listed(first) || !listed(last) || !all_hold(&at.slots[between(first, last)], mine) {
            return false;
        }
        at.fill(between(first, last), EMPTY);
        for i in ends(first, last) {
            if at.slots[i].load(Relaxed) == mine {
                at.set(i, EMPTY);
            } else {
                self.granule_edit(at, i, Some(rec), &[]);
            }
        }
        if at.used.is_some_and(|u| u.load(Relaxed) != 0) {
            return true;
        }
        if cached.is_some() {
            // The cached leaf emptied: the way down is needed to free it and what it empties.
            match self.split(top, lo, hi, false, Some(&mut path)) {
                Some(at) => self.free_empty(at, &path),
                None => return true,
            }
        } else {
            self.free_empty(at, &path);
        }
        true
    }

    /// Frees leaf table `t` of the block starting at `base` if it is still linked there and
    /// empty, with the tables above it that this leaves empty; whether it did.
    pub(super) fn free_if_empty(&mut self, top: Level<'_>, t: Ptr<Table>, base: usize) -> bool {
        let mut path = [None; LEAF];
        let Some(at) = self.split(top, base, base, false, Some(&mut path)) else {
            return false;
        };
        let linked = at.level == LEAF && at.table() == Some(t.as_mut_ptr().cast_const());
        if !linked || at.used.is_none_or(|u| u.load(Relaxed) != 0) {
            return false;
        }
        self.free_empty(at, &path);
        true
    }

    /// Frees `at` and the tables above it on `path` that are left empty, innermost first.
    fn free_empty(&mut self, at: Level<'_>, path: &[Option<Parent<'_>>; LEAF]) {
        let mut used = at.used;
        for level in (0..at.level).rev() {
            let (Some(u), Some((slot, parent_used))) = (used, path[level]) else {
                break;
            };
            if u.load(Relaxed) != 0 {
                break;
            }
            let cur = slot.load(Relaxed);
            slot.store(EMPTY, Release);
            if let Some(pu) = parent_used {
                pu.store(pu.load(Relaxed) - 1, Relaxed);
            }
            self.free_table(ptr_of(cur));
            used = parent_used;
        }
    }
}

/// Whether granule slot value `cur` names no range meeting `[lo, hi]` (also a shared edit's
/// check before it joins a granule: `held.rs`).
pub(super) fn clear_of(cur: usize, lo: usize, hi: usize) -> bool {
    let meets = |p: Ptr<Record>| {
        let (s, l) = target::<Record>(slot_of(p, REC)).span();
        s <= hi && l >= lo
    };
    match tag(cur) {
        EMPTY => true,
        REC => !meets(ptr_of(cur)),
        BUCKET => !chain_any(target::<Bucket>(cur), meets),
        _ => false,
    }
}

/// Whether granule slot value `cur` is a chain listing `rec`.
fn lists(cur: usize, rec: Ptr<Record>) -> bool {
    tag(cur) == BUCKET && chain_any(target::<Bucket>(cur), |p| p == rec)
}
