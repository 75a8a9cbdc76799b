//! The writer's side of the page table: linking a range's slots, rewriting the slots of a range
//! that is trimmed, split or removed, and finding the ranges in a span. Exclusive edits only
//! (the writer lock, the lanes drained: `lanes.rs`).
//!
//! Every change a reader can see is one slot store, made after everything it points to is
//! complete: a record is filled before its first slot links it, a shared granule gets a new
//! chain (the old one is recycled), and a block whose content changes from one range to
//! pieces of it gets a child table built aside and then swapped in. So a lookup of a byte that
//! stays allocated through a trim or split always finds it.
#![deny(unsafe_code)]

use crate::atomics::{Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use super::level::{Level, Piece};
use super::record::Record;
use super::slab::{room, Ptr};
use super::table::{
    ptr_of, slot_of, tag, target, Bucket, Table, BUCKET, BUCKET_CAP, EMPTY, LEAF, NEAR, REC, SHIFT,
    TAB,
};
use super::write::Writer;

/// Which of `pieces` covers all of `[lo, hi]`, if one does, and whether any touches it.
fn cover(pieces: &[Piece], lo: usize, hi: usize) -> (Option<Ptr<Record>>, bool) {
    let whole = pieces.iter().find(|p| p.1 <= lo && hi <= p.2).map(|p| p.0);
    (whole, pieces.iter().any(|p| p.1 <= hi && p.2 >= lo))
}

impl Writer {
    /// Recycles an emptied, unlinked table (and forgets it as the cached leaf).
    pub(super) fn free_table(&mut self, t: Ptr<Table>) {
        self.freed_tables = true;
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
    pub(super) fn cached_leaf<'a>(&self, lo: usize, hi: usize) -> Option<Level<'a>> {
        let (base, t) = self.leaf?;
        let sh = SHIFT[LEAF - 1];
        let whole = (lo << (usize::BITS - sh)) == 0 && hi - lo == (1 << sh) - 1;
        (lo >> sh == base >> sh && hi >> sh == base >> sh && !whole)
            .then(|| Level::child(target::<Table>(slot_of(t, TAB)), LEAF, base))
    }

    /// A new empty table. Recycled tables were freed empty (every slot EMPTY, count 0, base 0);
    /// fresh ones are empty.
    pub(super) fn new_table(&mut self) -> Ptr<Table> {
        self.tables.alloc()
    }

    /// Links table `t` (made by `new_table`, filled or not) into slot `i` of `at`, naming the
    /// block it stands for; a level-1 table becomes the readers' hint, a level-3 one their near
    /// hint (published with the edit).
    pub(super) fn link_table(&mut self, at: Level<'_>, i: usize, t: Ptr<Table>) -> &'static Table {
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
    pub(super) fn granule_edit(
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
        locate_from(self.cached_leaf(addr, addr).unwrap_or(top), addr)
    }
}

/// The record linked for `addr`, if a range contains it, looked for from `at` down (tables and
/// chains only change in exclusive mode, so a shared edit may walk them too).
pub(super) fn locate_from(mut at: Level<'_>, addr: usize) -> Option<Ptr<Record>> {
    loop {
        let i = *at.span(addr, addr).start();
        // Acquire: in a shared edit another lane may have just linked a record here.
        let cur = at.slots[i].load(Acquire);
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

/// Whether any record of a chain satisfies `f` (writer side).
pub(super) fn chain_any(head: &Bucket, f: impl FnMut(Ptr<Record>) -> bool) -> bool {
    chain_find(head, f).is_some()
}

/// The first record of a chain that satisfies `f` (writer side).
pub(super) fn chain_find(
    head: &Bucket,
    mut f: impl FnMut(Ptr<Record>) -> bool,
) -> Option<Ptr<Record>> {
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
