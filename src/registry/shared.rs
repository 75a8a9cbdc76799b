//! The shared edits (`lanes.rs` says when they run): an insert whose slots all lie empty in a
//! table that exists, and a removal whose slots all name the range alone and leave their table
//! in use. Several threads run them at once, each in its own lane: every slot changes by one
//! compare-and-swap (so two new ranges meeting in a granule cannot both take it: the loser goes
//! the exclusive way, which builds the granule's chain), and a table's count by an atomic add.
//! Tables are neither made nor freed here, so every table seen stays linked until the lane is
//! left. Anything else returns [`Shared::Exclusive`], having changed nothing readers can see.
//!
//! Readers need nothing new: as under the writer lock, each change they can see is one slot
//! store of a complete record, and a record is only rewritten once no slot links it (a lane
//! recycles only records it unlinked itself).
#![deny(unsafe_code)]

use crate::atomics::Ordering::{Acquire, Relaxed, Release};

use super::edit::locate_from;
use super::lanes::Lane;
use super::level::{all_hold, Level};
use super::record::{Record, RemovedRecord};
use super::slab::Ptr;
use super::table::{index, ptr_of, slot_of, tag, target, Table, EMPTY, LEAF, REC, SHIFT, TAB};
use super::write::rec;
use super::{Allocation, Registry};

/// How a shared removal's search ended.
enum Shared {
    /// This record's range starts there and is unlinked.
    Done(Ptr<Record>),
    /// Nothing to do: no range starts there.
    Absent,
    /// The edit needs the exclusive way.
    Exclusive,
}

impl Registry {
    /// Links `a` (size > 0) as a shared edit and returns its sequence number; otherwise the
    /// record it filled, if any (holding `a` and its number), for the exclusive way to link,
    /// so that numbers follow the order in which inserts began, with none skipped. The pool
    /// case (one free granule of the lane's leaf) is inlined into the allocation hooks, the
    /// record filled from their registers.
    #[inline(always)]
    pub(super) fn insert_shared(&self, a: &Allocation) -> Result<u64, Option<Ptr<Record>>> {
        let Some(lane) = self.lanes.enter() else {
            return Err(None);
        };
        let seq = self.link_in(lane, a);
        lane.leave();
        seq
    }

    #[inline(always)]
    fn link_in(&self, lane: &Lane, a: &Allocation) -> Result<u64, Option<Ptr<Record>>> {
        let hi = a.start.checked_add(a.size - 1).ok_or(None)?;
        let p = lane.pop().ok_or(None)?;
        let seq = self.next_seq();
        rec(p).store(&Allocation { seq, ..*a });
        let v = slot_of(p, REC);
        let linked = match lane.leaf_granule(a.start, hi) {
            Some(leaf) if leaf.claim(index(LEAF, a.start), v) => {
                leaf.count_in(1);
                true
            }
            Some(_) => false,
            None => self.link_span(lane, a.start, hi, v),
        };
        if !linked {
            return Err(Some(p));
        }
        lane.book(1, a.size);
        Ok(seq)
    }

    /// Beyond the pool case: the table holding `[lo, hi]`'s slots, each claimed in turn for the
    /// slot value `v` (the claims made are undone when one fails).
    #[inline(never)]
    fn link_span(&self, lane: &Lane, lo: usize, hi: usize, v: usize) -> bool {
        let Some(at) = self.slots_of(lo, hi) else {
            return false;
        };
        let span = at.span(lo, hi);
        // Above the leaves a slot holds a record only for a block the range covers whole.
        let (first, last) = (at.block(*span.start()).0, at.block(*span.end()).1);
        if at.level != LEAF && (first < lo || last > hi) {
            return false;
        }
        let slots = &at.slots[span];
        if !all_hold(slots, EMPTY) {
            return false;
        }
        for (k, slot) in slots.iter().enumerate() {
            // Release: the record is complete before a reader can load it.
            if slot.compare_exchange(EMPTY, v, Release, Relaxed).is_err() {
                slots[..k].iter().for_each(|s| s.store(EMPTY, Release));
                return false;
            }
        }
        at.count_in(slots.len());
        lane.remember(&at);
        true
    }

    /// Unlinks the range starting exactly at `start` as a shared edit, and returns it; sets
    /// `exclusive` (returning `None`) when the exclusive way must run instead.
    #[inline(always)]
    pub(super) fn remove_shared(
        &self,
        start: usize,
        exclusive: &mut bool,
    ) -> Option<RemovedRecord> {
        let Some(lane) = self.lanes.enter() else {
            *exclusive = true;
            return None;
        };
        let found = if lane.has_room() {
            self.unlink_in(lane, start)
        } else {
            Shared::Exclusive
        };
        let p = match found {
            Shared::Done(p) => p,
            Shared::Absent => {
                lane.leave();
                return None;
            }
            Shared::Exclusive => {
                *exclusive = true;
                lane.leave();
                return None;
            }
        };
        lane.book(usize::MAX, rec(p).span_size().wrapping_neg());
        lane.push(p);
        // Copied last, straight into the caller's value, before the lane (which may reuse the
        // record: no one else can, no slot links it) is left.
        let a = Some(rec(p).take());
        lane.leave();
        a
    }

    #[inline(always)]
    fn unlink_in(&self, lane: &Lane, start: usize) -> Shared {
        let Some(leaf) = lane.leaf_granule(start, start) else {
            return self.unlink_span(lane, start);
        };
        // The pool case: the range alone in its granule of the lane's leaf.
        let i = index(LEAF, start);
        let cur = leaf.slots[i].load(Acquire);
        if tag(cur) != REC {
            return self.unlink_span(lane, start);
        }
        let (lo, hi) = target::<Record>(cur).span();
        if lo != start || (hi ^ lo) >> SHIFT[LEAF] != 0 {
            return self.unlink_span(lane, start);
        }
        if !leaf.count_out(1) && !self.count_out_last(lane, leaf, 1) {
            return Shared::Exclusive;
        }
        if leaf.slots[i]
            .compare_exchange(cur, EMPTY, Release, Relaxed)
            .is_err()
        {
            leaf.count_in(1);
            return Shared::Exclusive;
        }
        Shared::Done(ptr_of(cur))
    }

    /// Beyond the pool case: finds the range starting at `start`, then unlinks each of its slots
    /// (all in one table).
    #[inline(never)]
    fn unlink_span(&self, lane: &Lane, start: usize) -> Shared {
        // Tables and chains stay as they are while a lane is held: the exclusive writer's walk.
        let found = self.top_level().and_then(|top| locate_from(top, start));
        let Some(p) = found.filter(|&p| rec(p).span().0 == start) else {
            return Shared::Absent;
        };
        let (lo, hi) = rec(p).span();
        let Some(at) = self.slots_of(lo, hi) else {
            return Shared::Exclusive;
        };
        let mine = slot_of(p, REC);
        let slots = &at.slots[at.span(lo, hi)];
        let n = slots.len();
        if !all_hold(slots, mine) || !(at.count_out(n) || self.count_out_last(lane, at, n)) {
            return Shared::Exclusive;
        }
        for (k, slot) in slots.iter().enumerate() {
            if slot
                .compare_exchange(mine, EMPTY, Release, Relaxed)
                .is_err()
            {
                // Only a second free of the same range, racing this one, gets here.
                slots[..k].iter().for_each(|s| s.store(mine, Release));
                at.count_in(n);
                return Shared::Exclusive;
            }
        }
        lane.remember(&at);
        Shared::Done(p)
    }

    /// A removal of `at`'s last `n` used slots: allowed once per lane until an exclusive edit
    /// frees the table (or finds a range back in it), so that a thread allocating and freeing
    /// alone in a 2 MiB block does not take the exclusive way twice per pair.
    #[cold]
    #[inline(never)]
    fn count_out_last(&self, lane: &Lane, at: Level<'_>, n: usize) -> bool {
        // By value: a borrowed level kept the pool case's copy on the stack on every removal.
        if !lane.may_empty(&at) || !at.count_out_last(n) {
            return false;
        }
        self.lanes.note_emptied(lane, &at);
        true
    }

    /// The table where `[lo, hi]`'s slots lie (the way down while one slot holds all of it, and
    /// not whole), if every table on the way exists.
    fn slots_of(&self, lo: usize, hi: usize) -> Option<Level<'_>> {
        let mut at = self.top_level()?;
        while at.level < LEAF {
            let Some((i, blo)) = at.way_down(lo, hi) else {
                break;
            };
            let cur = at.slots[i].load(Acquire);
            if tag(cur) != TAB {
                return None;
            }
            at = Level::child(target::<Table>(cur), at.level + 1, blo);
        }
        Some(at)
    }

    /// The top table as a level, once there is one.
    fn top_level(&self) -> Option<Level<'_>> {
        super::table::deref(self.read.top.load(Acquire)).map(Level::top)
    }
}
