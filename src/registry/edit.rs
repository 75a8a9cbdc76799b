//! The writer's side of the page table: linking a range's slots, rewriting the slots of a range
//! that is trimmed, split or removed, and finding the ranges in a span. Runs under the writer
//! lock only.
//!
//! Every change a reader can see is one slot store, made after everything it points to is
//! complete: a record is filled before its first slot links it, a shared granule gets a new
//! chain (the old one is recycled), and a block whose content changes from one range to
//! pieces of it gets a child table built aside and then swapped in. So a lookup of a byte that
//! stays allocated through a trim or split always finds it.
#![deny(unsafe_code)]

use crate::atomics::{AtomicUsize, Ordering::Relaxed, Ordering::Release};

use super::level::{Level, Piece};
use super::record::Record;
use super::slab::{room, Ptr};
use super::table::{
    index, ptr_of, slot_of, tag, target, Bucket, Table, BUCKET, BUCKET_CAP, EMPTY, LEAF, NEAR, REC,
    SHIFT, TAB,
};
use super::write::Writer;

/// Which of `pieces` covers all of `[lo, hi]`, if one does, and whether any touches it.
fn cover(pieces: &[Piece], lo: usize, hi: usize) -> (Option<Ptr<Record>>, bool) {
    let whole = pieces.iter().find(|p| p.1 <= lo && hi <= p.2).map(|p| p.0);
    (whole, pieces.iter().any(|p| p.1 <= hi && p.2 >= lo))
}

impl Writer {
    /// Recycles an emptied, unlinked table (and forgets it as the cached leaf).
    fn free_table(&mut self, t: Ptr<Table>) {
        if self.leaf.is_some_and(|(_, l)| l == t) {
            self.leaf = None;
        }
        if self.hint == Some(t) {
            self.hint = None;
        }
        if self.near == Some(t) {
            self.near = None;
        }
        // A stale hint to a freed table must not match any pointer's region.
        target::<Table>(slot_of(t, TAB)).base.store(0, Relaxed);
        self.tables.free(t);
    }

    /// The cached leaf table, if it is the one for `[lo, hi]` (which lies inside one leaf block
    /// without covering it whole).
    #[inline(always)]
    fn cached_leaf<'a>(&self, lo: usize, hi: usize) -> Option<Level<'a>> {
        let (base, t) = self.leaf?;
        let sh = SHIFT[LEAF - 1];
        let whole = (lo << (usize::BITS - sh)) == 0 && hi - lo == (1 << sh) - 1;
        (lo >> sh == base >> sh && hi >> sh == base >> sh && !whole)
            .then(|| Level::child(target::<Table>(slot_of(t, TAB)), LEAF, base))
    }

    /// A new empty table. Recycled tables were freed empty (every slot EMPTY, count 0, base 0);
    /// fresh ones are empty.
    fn new_table(&mut self) -> Ptr<Table> {
        self.tables.alloc()
    }

    /// Links table `t` (made by `new_table`, filled or not) into slot `i` of `at`, naming the
    /// block it stands for; a level-1 table becomes the readers' hint, a level-3 one their near
    /// hint (published with the edit).
    fn link_table(&mut self, at: Level<'_>, i: usize, t: Ptr<Table>) -> &'static Table {
        let (blo, _) = at.block(i);
        if !self.aside {
            // Before the link: a reader that reaches the table through a hint checks this.
            // Not for a table linked into one built aside: a stale hint to this (recycled)
            // table must not match before the whole build is linked and filled, or a reader
            // would read its empty slots as a miss of a range that stayed live throughout.
            target::<Table>(slot_of(t, TAB))
                .base
                .store(blo | (at.level + 1), Release);
        }
        at.set(i, slot_of(t, TAB));
        match at.level + 1 {
            _ if self.aside => {}
            1 => self.hint = Some(t),
            NEAR => self.near = Some(t),
            _ => {}
        }
        target::<Table>(slot_of(t, TAB))
    }

    /// Links `rec` into every slot of `[lo, hi]` below `at` (the range is clear there).
    pub(super) fn link(&mut self, at: Level<'_>, lo: usize, hi: usize, rec: Ptr<Record>) {
        for i in at.span(lo, hi) {
            let (blo, bhi) = at.block(i);
            if lo <= blo && bhi <= hi {
                at.set(i, slot_of(rec, REC));
            } else if at.level == LEAF {
                self.granule_edit(at, i, None, &[rec]);
            } else {
                let cur = at.slots[i].load(Relaxed);
                let child = match tag(cur) {
                    TAB => target::<Table>(cur),
                    EMPTY => {
                        let t = self.new_table();
                        self.link_table(at, i, t)
                    }
                    _ => unreachable!("registry: link over a live range"),
                };
                self.link(Level::child(child, at.level + 1, blo), lo, hi, rec);
            }
        }
    }

    /// Replaces `old` (linked over `[olo, ohi]`) by `pieces` (sub-ranges of it, already filled
    /// records) in every slot below `at`; frees tables left empty. `old` itself is not freed.
    pub(super) fn rewrite(
        &mut self,
        at: Level<'_>,
        olo: usize,
        ohi: usize,
        old: Ptr<Record>,
        pieces: &[Piece],
    ) {
        for i in at.span(olo, ohi) {
            let (blo, bhi) = at.block(i);
            if olo <= blo && bhi <= ohi {
                // `old` covered the whole block: one store gives it its new content.
                match cover(pieces, blo, bhi) {
                    (Some(p), _) => at.set(i, slot_of(p, REC)),
                    (None, false) => at.set(i, EMPTY),
                    (None, true) if at.level == LEAF => {
                        let (buf, n) = touching(pieces, blo, bhi);
                        self.granule_edit(at, i, Some(old), &buf[..n])
                    }
                    (None, true) => {
                        // Built aside, then linked in one store: the tables inside it get no
                        // base and become no hint (`link_table`); only its root does, when linked.
                        let t = self.new_table();
                        let tab = target::<Table>(slot_of(t, TAB));
                        let outer = core::mem::replace(&mut self.aside, true);
                        for &(p, lo, hi) in pieces {
                            if lo <= bhi && hi >= blo {
                                let inner = Level::child(tab, at.level + 1, blo);
                                self.link(inner, lo.max(blo), hi.min(bhi), p);
                            }
                        }
                        self.aside = outer;
                        self.link_table(at, i, t);
                    }
                }
            } else if at.level == LEAF {
                let (buf, n) = touching(pieces, blo, bhi);
                self.granule_edit(at, i, Some(old), &buf[..n]);
            } else {
                let cur = at.slots[i].load(Relaxed);
                debug_assert_eq!(tag(cur), TAB, "registry: partial block without a table");
                if tag(cur) != TAB {
                    continue;
                }
                let child = target::<Table>(cur);
                self.rewrite(
                    Level::child(child, at.level + 1, blo),
                    olo,
                    ohi,
                    old,
                    pieces,
                );
                if child.used.load(Relaxed) == 0 {
                    at.set(i, EMPTY);
                    self.free_table(ptr_of(cur));
                }
            }
        }
    }

    /// Gives granule slot `i` its ranges minus `remove` plus `add`, in one store.
    fn granule_edit(
        &mut self,
        at: Level<'_>,
        i: usize,
        remove: Option<Ptr<Record>>,
        add: &[Ptr<Record>],
    ) {
        let cur = at.slots[i].load(Relaxed);
        // The usual shapes without building a list: a second range joins a granule's only one,
        // or one of a granule's two ranges leaves (the same outcome as the general case below:
        // records in the chain's order, then those added).
        match (tag(cur), remove, add) {
            (REC, None, &[r]) => {
                let chain = self.chain(&[ptr_of(cur), r]);
                self.widest = self.widest.max(2);
                at.set(i, slot_of(chain, BUCKET));
                return;
            }
            (BUCKET, Some(r), []) => {
                if let Some(other) = target::<Bucket>(cur).other_of_pair(r) {
                    at.set(i, slot_of(other, REC));
                    self.free_chain(ptr_of(cur));
                    return;
                }
            }
            _ => {}
        }
        // A new chain needs room for the list and its buckets. A removal can do without (the
        // host's memory is exhausted): it edits the chain in place instead. Edits that add
        // ranges had their room reserved by their caller (`Writer::room_for_edit`).
        if let (Some(r), []) = (remove, add) {
            if !self.room_for_chain() {
                self.forget_in_place(at, i, cur, r);
                return;
            }
        }
        let mut list = core::mem::take(&mut self.granule);
        list.clear();
        match tag(cur) {
            REC => list.push(ptr_of(cur)),
            BUCKET => target::<Bucket>(cur).collect(&mut list),
            _ => {}
        }
        if let Some(r) = remove {
            list.retain(|&p| p != r);
        }
        list.extend_from_slice(add);
        self.widest = self.widest.max(list.len());
        let v = match list.len() {
            0 => EMPTY,
            1 => slot_of(list[0], REC),
            _ => slot_of(self.chain(&list), BUCKET),
        };
        at.set(i, v);
        if tag(cur) == BUCKET {
            self.free_chain(ptr_of(cur));
        }
        self.granule = list;
    }

    /// Takes `r` out of granule slot `i` (value `cur`) without allocating: the slot empties or
    /// names the one range left, or the chain loses `r`'s entry in place.
    #[cold]
    fn forget_in_place(&mut self, at: Level<'_>, i: usize, cur: usize, r: Ptr<Record>) {
        #[cfg(all(test, not(loom)))]
        super::slab::IN_PLACE.set(super::slab::IN_PLACE.get() + 1);
        match tag(cur) {
            REC if ptr_of::<Record>(cur) == r => at.set(i, EMPTY),
            BUCKET => {
                let head = target::<Bucket>(cur);
                let mut left = 0;
                let mut one = None;
                chain_any(head, |p| {
                    if p != r {
                        left += 1;
                        one = Some(p);
                    }
                    left > 1
                });
                match (left, one) {
                    (0, _) => at.set(i, EMPTY),
                    (1, Some(p)) => at.set(i, slot_of(p, REC)),
                    _ => {
                        let mut b = Some(head);
                        while let Some(bucket) = b {
                            bucket.forget(r);
                            b = Ptr::new(bucket.next.load(Relaxed))
                                .map(|p| target::<Bucket>(slot_of(p, BUCKET)));
                        }
                        return;
                    }
                }
                self.free_chain(ptr_of(cur));
            }
            _ => {}
        }
    }

    /// Whether a granule's new chain can be built without aborting: room in the list for the
    /// widest granule so far plus the two ranges an edit may add, and buckets for it.
    pub(super) fn room_for_chain(&mut self) -> bool {
        let n = self.widest + 2;
        room(&mut self.granule, n) && self.buckets.spare(n.div_ceil(BUCKET_CAP))
    }

    /// A new chain of buckets listing `recs`.
    fn chain(&mut self, recs: &[Ptr<Record>]) -> Ptr<Bucket> {
        let mut next = None;
        for part in recs.rchunks(BUCKET_CAP) {
            let b = self.buckets.alloc();
            target::<Bucket>(slot_of(b, BUCKET)).store(part, next);
            next = Some(b);
        }
        next.expect("a chain lists at least two records")
    }

    fn free_chain(&mut self, head: Ptr<Bucket>) {
        let mut b = Some(head);
        while let Some(p) = b {
            b = Ptr::new(target::<Bucket>(slot_of(p, BUCKET)).next.load(Relaxed));
            self.buckets.free(p);
        }
    }

    /// The range with the lowest start among those meeting `[lo, hi]` below `at`. Visits slots
    /// in address order and stops at the first that names one: ranges are disjoint, so none in
    /// a later slot starts earlier. Allocates nothing, so every walk of the writer (removals,
    /// purges, clears, snapshots) goes from range to range with it.
    pub(super) fn first_meeting(at: Level<'_>, lo: usize, hi: usize) -> Option<Ptr<Record>> {
        let meets = |p: Ptr<Record>| {
            let (s, l) = target::<Record>(slot_of(p, REC)).span();
            s <= hi && l >= lo
        };
        for i in at.span(lo, hi) {
            let cur = at.slots[i].load(Relaxed);
            let found = match tag(cur) {
                REC => Some(ptr_of(cur)).filter(|&p| meets(p)),
                TAB => {
                    let (blo, _) = at.block(i);
                    let child = Level::child(target::<Table>(cur), at.level + 1, blo);
                    Self::first_meeting(child, lo, hi)
                }
                BUCKET => {
                    let mut best: Option<(usize, Ptr<Record>)> = None;
                    chain_any(target::<Bucket>(cur), |p| {
                        let s = target::<Record>(slot_of(p, REC)).span().0;
                        if meets(p) && best.is_none_or(|(b, _)| s < b) {
                            best = Some((s, p));
                        }
                        false
                    });
                    best.map(|(_, p)| p)
                }
                _ => None,
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The record linked for `addr`, if a range contains it.
    pub(super) fn locate(&self, top: Level<'_>, addr: usize) -> Option<Ptr<Record>> {
        let mut at = self.cached_leaf(addr, addr).unwrap_or(top);
        loop {
            let i = *at.span(addr, addr).start();
            let cur = at.slots[i].load(Relaxed);
            let holds = |p: Ptr<Record>| {
                let (lo, hi) = target::<Record>(slot_of(p, REC)).span();
                lo <= addr && addr <= hi
            };
            match tag(cur) {
                REC => return Some(ptr_of(cur)).filter(|&p| holds(p)),
                BUCKET => return chain_find(target::<Bucket>(cur), holds),
                TAB => {
                    let (blo, _) = at.block(i);
                    at = Level::child(target::<Table>(cur), at.level + 1, blo);
                }
                _ => return None,
            }
        }
    }
}

/// The records of `pieces` (at most two) that touch `[lo, hi]`.
fn touching(pieces: &[Piece], lo: usize, hi: usize) -> ([Ptr<Record>; 2], usize) {
    let mut out = [pieces.first().map_or_else(Ptr::dangling, |p| p.0); 2];
    let mut n = 0;
    for p in pieces.iter().filter(|p| p.1 <= hi && p.2 >= lo).take(2) {
        out[n] = p.0;
        n += 1;
    }
    (out, n)
}

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
            let sh = SHIFT[at.level];
            let i = (lo - at.base) >> sh;
            let (blo, bhi) = at.block(i);
            if (hi - at.base) >> sh != i || (lo == blo && hi >= bhi) {
                break;
            }
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
        for i in span.clone() {
            let (blo, bhi) = at.block(i);
            let cur = at.slots[i].load(Relaxed);
            let ok = if lo <= blo && bhi <= hi {
                cur == EMPTY
            } else {
                at.level == LEAF && clear_of(cur, lo, hi)
            };
            if !ok {
                return false;
            }
        }
        for i in span {
            if at.slots[i].load(Relaxed) == EMPTY {
                at.set(i, slot_of(rec, REC));
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

    /// The pool case of a free: the range starting at `start` lies in one granule of the cached
    /// leaf, alone, and the leaf keeps other ranges. Unlinks it in one store and returns it.
    #[inline(always)]
    pub(super) fn unlink_single(&mut self, start: usize) -> Option<Ptr<Record>> {
        let leaf = self.cached_leaf_granule(start, start)?;
        let i = index(LEAF, start);
        let cur = leaf.slots[i].load(Relaxed);
        if tag(cur) != REC || leaf.used.is_none_or(|u| u.load(Relaxed) < 2) {
            return None;
        }
        let p = ptr_of(cur);
        let (lo, hi) = target::<Record>(cur).span();
        if lo != start || (hi ^ lo) >> SHIFT[LEAF] != 0 {
            return None;
        }
        leaf.replace(i, cur, EMPTY);
        Some(p)
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
        for i in span.clone() {
            let cur = at.slots[i].load(Relaxed);
            if cur != mine && !(at.level == LEAF && lists(cur, rec)) {
                return false;
            }
        }
        for i in span {
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

/// Whether granule slot value `cur` names no range meeting `[lo, hi]`.
fn clear_of(cur: usize, lo: usize, hi: usize) -> bool {
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

/// Whether any record of a chain satisfies `f` (writer side).
fn chain_any(head: &Bucket, f: impl FnMut(Ptr<Record>) -> bool) -> bool {
    chain_find(head, f).is_some()
}

/// The first record of a chain that satisfies `f` (writer side).
fn chain_find(head: &Bucket, mut f: impl FnMut(Ptr<Record>) -> bool) -> Option<Ptr<Record>> {
    let mut b = Some(head);
    while let Some(bucket) = b {
        let n = bucket.len.load(Relaxed).min(BUCKET_CAP);
        let found = bucket.recs[..n]
            .iter()
            .filter_map(|r| Ptr::new(r.load(Relaxed)))
            .find(|&p| f(p));
        if found.is_some() {
            return found;
        }
        b = Ptr::new(bucket.next.load(Relaxed)).map(|p| target::<Bucket>(slot_of(p, BUCKET)));
    }
    None
}
