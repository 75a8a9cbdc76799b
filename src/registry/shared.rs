//! The shared edits (`lanes.rs` says when they run): an insert whose slots lie in one table that
//! exists (or in a leaf table it makes: `make_leaf`), empty but for the granules at its ends,
//! which may list ranges it does not meet; and a removal of a range whose slots lie in one
//! table, leaving that table in use (or, a few per lane, a leaf table empty:
//! `Lane::note_emptied`). Several threads run them at once, each in its own lane, each holding
//! the one table it edits (`held.rs`), so that a granule a neighbour shares gets its chain
//! rebuilt here too. Tables are never freed here, and a leaf table is only added (from the
//! lane's spares, holding the table above it), so every table seen stays linked until the lane
//! is left; a way down that found a slot empty meanwhile just goes the exclusive way or finds
//! nothing, as it would have a moment earlier. Anything else returns [`Shared::Exclusive`],
//! having changed nothing.
//!
//! Readers need nothing new: as under the writer lock, each change they can see is one slot
//! store of something complete, and a record or bucket is only rewritten once no slot links it
//! (a lane recycles only records it unlinked and buckets it replaced itself).
#![deny(unsafe_code)]

use crate::atomics::Ordering::{Acquire, Relaxed, Release};

use super::held::{stock, Granule, Held};
use super::lanes::Lane;
use super::level::{all_hold, between, ends, Level};
use super::record::{Record, RemovedRecord};
use super::slab::Ptr;
use super::table::{index, slot_of, tag, target, Table, EMPTY, FAN, LEAF, NEAR, REC, SHIFT, TAB};
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

/// The granules at a span's ends as a shared edit will leave them (slot index and content).
type Ends = [Option<(usize, Granule)>; 2];

impl Registry {
    /// Links `a` (size > 0) as a shared edit and returns its sequence number; otherwise the
    /// record it filled, if any (holding `a` and its number), for the exclusive way to link,
    /// so that numbers follow the order in which inserts began, with none skipped. The pool
    /// case (one granule of the lane's leaf) is inlined into the allocation hooks, the record
    /// filled from their registers.
    #[inline(always)]
    pub(super) fn insert_shared(&self, a: &Allocation) -> Result<u64, Option<Ptr<Record>>> {
        let Some(lane) = self.lanes.enter() else {
            return Err(refused(c"insert: no lane"));
        };
        let seq = self.link_in(lane, a);
        lane.leave();
        seq
    }

    #[inline(always)]
    fn link_in(&self, lane: &Lane, a: &Allocation) -> Result<u64, Option<Ptr<Record>>> {
        let hi = a.start.checked_add(a.size - 1).ok_or(None)?;
        let Some(p) = lane.recs.pop() else {
            return Err(refused(c"insert: no spare record"));
        };
        let seq = self.next_seq();
        rec(p).store(&Allocation { seq, ..*a });
        let mut linked = false;
        if let Some(leaf) = lane.leaf_granule(a.start, hi).and_then(Level::hold) {
            // The pool case: an empty granule of the lane's leaf.
            let i = index(LEAF, a.start);
            if leaf.slots[i].load(Relaxed) == EMPTY {
                leaf.replace(i, EMPTY, slot_of(p, REC));
                linked = true;
            }
        }
        // Otherwise held again there, out of line: the held table kept across a call cost the
        // pool case its copy on the stack.
        if !linked && !self.link_span(lane, a.start, hi, p) {
            return Err(Some(p));
        }
        lane.book(1, a.size);
        Ok(seq)
    }

    /// Beyond the pool case (or a granule of the lane's leaf that a neighbour shares): the table
    /// holding `[lo, hi]`'s slots, held while they are checked and written; or the two leaf
    /// tables a range crossing a 2 MiB boundary lies in.
    #[inline(never)]
    fn link_span(&self, lane: &Lane, lo: usize, hi: usize, p: Ptr<Record>) -> bool {
        let at = match self.slots_of(lo, hi) {
            Ok(at) => at,
            Err(near) if near.level == NEAR => {
                let made = near
                    .way_down(lo, hi)
                    .and_then(|(i, _)| self.make_leaf(lane, near, i));
                match made {
                    Some(leaf) => leaf,
                    None => return false,
                }
            }
            Err(_) => return refused(c"insert: a table on the way missing"),
        };
        let span = at.span(lo, hi);
        let (first, last) = (*span.start(), *span.end());
        let partial = at.block(first).0 < lo || at.block(last).1 > hi;
        if at.level != LEAF && partial {
            // Above the leaves a slot holds a record only for a block the range covers whole;
            // but two leaves side by side hold a range that crosses between them.
            return self.link_across(lane, at, first, last, lo, hi, p);
        }
        let Some(at) = at.hold() else {
            return refused(c"insert: top-level slots");
        };
        let mut part = Part::new();
        if !part.link(&at, lo, hi, p) {
            return refused(c"insert: slots taken (overlap, chain past a bucket)");
        }
        if !stock(&mut [&mut part.edges], lane) {
            return refused(c"insert: no spare bucket");
        }
        part.make(&at, slot_of(p, REC), lane);
        lane.remember(&at);
        true
    }

    /// The leaf table of slot `i` of level-[`NEAR`] table `near`, whose slot was empty: the
    /// lane's spare table, linked holding `near` (or the one another lane linked meanwhile). A
    /// pool's blocks move between a few 2 MiB blocks, and a leaf table freed once its last range
    /// left was made again by an exclusive edit each time the pool came back (PyTorch: most of
    /// its exclusive edits).
    #[cold]
    #[inline(never)]
    fn make_leaf<'a>(&'a self, lane: &Lane, near: Level<'a>, i: usize) -> Option<Level<'a>> {
        let blo = near.block(i).0;
        let Some(held) = near.hold() else {
            return refused(c"insert: top-level slots");
        };
        let cur = held.slots[i].load(Relaxed);
        let t = match tag(cur) {
            TAB => target::<Table>(cur),
            EMPTY => {
                let Some(spare) = lane.tables.pop() else {
                    return refused(c"insert: no spare table");
                };
                let v = slot_of(spare, TAB);
                let t = target::<Table>(v);
                // Its block, before the link (as `Writer::link_table`): a reader holding a
                // stale hint to this recycled table must not take it for another block.
                t.base.store(blo | LEAF, Release);
                held.replace(i, EMPTY, v);
                t
            }
            // A range covers the whole block: an overlap, for the exclusive way.
            _ => return refused(c"insert: slots taken (overlap, chain past a bucket)"),
        };
        Some(Level::child(t, LEAF, blo))
    }

    /// A range crossing from one leaf table into the next, covering neither whole (slots
    /// `first` and `last` of level-[`NEAR`] table `at`): both leaves held, the lower first (no
    /// edit holds two tables the other way round, so none waits for the other).
    #[allow(clippy::too_many_arguments)]
    fn link_across(
        &self,
        lane: &Lane,
        at: Level<'_>,
        first: usize,
        last: usize,
        lo: usize,
        hi: usize,
        p: Ptr<Record>,
    ) -> bool {
        if at.level != NEAR
            || last != first + 1
            || at.block(first).0 >= lo
            || at.block(last).1 <= hi
        {
            return refused(c"insert: slots in tables other than two leaves");
        }
        let (la, lb) = (leaf_of(at, first), leaf_of(at, last));
        let made = [la.is_none(), lb.is_none()];
        // A leaf made here must not stay linked, empty and unnoted, if the edit then fails: made
        // only when the lane has a free note for each, and noted then.
        if made.iter().filter(|&&m| m).count() > lane.free_notes() {
            return refused(c"insert: a table on the way missing");
        }
        let a = la.or_else(|| self.make_leaf(lane, at, first));
        let b = a.and(lb.or_else(|| self.make_leaf(lane, at, last)));
        let linked = match (a, b) {
            (Some(a), Some(b)) => self.link_pair(lane, a, b, lo, hi, p),
            _ => false,
        };
        if !linked {
            for leaf in made
                .iter()
                .zip([a, b])
                .filter_map(|(&m, l)| l.filter(|_| m))
            {
                // A note is free for it (checked above).
                self.may_empty(lane, leaf);
            }
        }
        linked
    }

    /// [`Self::link_across`] once both leaf tables exist: both held, the lower first.
    fn link_pair(
        &self,
        lane: &Lane,
        a: Level<'_>,
        b: Level<'_>,
        lo: usize,
        hi: usize,
        p: Ptr<Record>,
    ) -> bool {
        let (Some(a), Some(b)) = (a.hold(), b.hold()) else {
            return refused(c"insert: top-level slots");
        };
        let (mut pa, mut pb) = (Part::new(), Part::new());
        if !(pa.link(&a, lo, hi, p) && pb.link(&b, lo, hi, p)) {
            return refused(c"insert: slots taken (overlap, chain past a bucket)");
        }
        if !stock(&mut [&mut pa.edges, &mut pb.edges], lane) {
            return refused(c"insert: no spare bucket");
        }
        let v = slot_of(p, REC);
        pa.make(&a, v, lane);
        pb.make(&b, v, lane);
        lane.remember(&b);
        true
    }

    /// Unlinks the range starting exactly at `start` as a shared edit, its record copied into
    /// `out`: whether there was one, or `None` (`out` untouched) when the exclusive way must run
    /// instead.
    #[inline(always)]
    pub(super) fn remove_shared(
        &self,
        start: usize,
        out: &mut Option<RemovedRecord>,
    ) -> Option<bool> {
        let Some(lane) = self.lanes.enter() else {
            note(c"removal: no lane");
            return None;
        };
        let found = if lane.recs.room() != 0 {
            self.unlink_in(lane, start)
        } else {
            refused(c"removal: no room for a spare record")
        };
        let p = match found {
            Shared::Done(p) => p,
            Shared::Absent => {
                lane.leave();
                return Some(false);
            }
            Shared::Exclusive => {
                lane.leave();
                return None;
            }
        };
        lane.book(usize::MAX, rec(p).span_size().wrapping_neg());
        lane.recs.push(p);
        // Copied last, straight into the caller's value, before the lane (which may reuse the
        // record: no one else can, no slot links it) is left.
        *out = Some(rec(p).take());
        lane.leave();
        Some(true)
    }

    #[inline(always)]
    fn unlink_in(&self, lane: &Lane, start: usize) -> Shared {
        if let Some(leaf) = lane.leaf_granule(start, start).and_then(Level::hold) {
            // The pool case: the range alone in its one granule of the lane's leaf.
            let i = index(LEAF, start);
            let cur = leaf.slots[i].load(Relaxed);
            if tag(cur) == REC {
                let record = target::<Record>(cur);
                let (lo, hi) = record.span();
                if lo == start && (hi ^ lo) >> SHIFT[LEAF] == 0 {
                    if leaf.uses(1) && !self.may_empty(lane, *leaf) {
                        return refused(c"removal: would empty a leaf");
                    }
                    leaf.replace(i, cur, EMPTY);
                    // From the reference (`ptr_of` would test the slot's pointer for null again).
                    return Shared::Done(Ptr::of(record));
                }
            }
        }
        // Otherwise held again there, out of line (as for inserts).
        self.unlink_span(lane, start)
    }

    /// Beyond the pool case of a removal: the table holding `start`'s slot, held; the range
    /// starting there, alone in the slot or in its chain, unlinked from every slot when they all
    /// lie in that table.
    #[inline(never)]
    fn unlink_span(&self, lane: &Lane, start: usize) -> Shared {
        let Some((at, i)) = self.slot_for(start) else {
            return Shared::Absent;
        };
        let Some(at) = at.hold() else {
            return refused(c"removal: top-level slots");
        };
        let mut listed = Granule::BLANK;
        if !listed.read(at.slots[i].load(Relaxed)) {
            // A chain longer than a bucket: searched by the exclusive writer.
            return refused(c"removal: chain past a bucket");
        }
        let Some(p) = listed.find(|q| rec(q).span().0 == start) else {
            return Shared::Absent;
        };
        let (lo, hi) = rec(p).span();
        // Its slots lie here when the range lies in the table's block without covering it whole.
        let (tlo, thi) = (at.block(0).0, at.block(FAN - 1).1);
        if lo < tlo || (lo == tlo && hi == thi) {
            return refused(c"removal: slots in tables other than two leaves");
        }
        if hi > thi {
            return self.unlink_across(lane, at, lo, hi, p);
        }
        let mut part = Part::new();
        if !part.unlink(&at, lo, hi, p) {
            return refused(c"removal: slots not as linked");
        }
        // (A table noted as emptied by an edit that then goes the exclusive way is harmless:
        // the exclusive writer frees only a table it finds empty.)
        if (at.uses(part.emptied) && !self.may_empty(lane, *at))
            || !stock(&mut [&mut part.edges], lane)
        {
            return refused(c"removal: would empty a leaf, or no spare bucket");
        }
        part.make(&at, EMPTY, lane);
        lane.remember(&at);
        Shared::Done(p)
    }

    /// A removal of `p` (over `[lo, hi]`), which starts in held leaf table `a` and ends in the
    /// next one, covering neither whole: the next one held too (the lower first, as
    /// [`Self::link_across`]); a leaf it leaves empty is noted (`may_empty`).
    #[cold]
    #[inline(never)]
    fn unlink_across(
        &self,
        lane: &Lane,
        a: Held<'_>,
        lo: usize,
        hi: usize,
        p: Ptr<Record>,
    ) -> Shared {
        let Ok(at) = self.slots_of(lo, hi) else {
            return refused(c"removal: slots in tables other than two leaves");
        };
        let span = at.span(lo, hi);
        let (first, last) = (*span.start(), *span.end());
        if a.level != LEAF
            || at.level != NEAR
            || last != first + 1
            || at.block(first).0 != a.base
            || at.block(last).1 <= hi
        {
            return refused(c"removal: slots in tables other than two leaves");
        }
        let Some(b) = leaf_of(at, last).and_then(Level::hold) else {
            return refused(c"removal: slots in tables other than two leaves");
        };
        let (mut pa, mut pb) = (Part::new(), Part::new());
        if !(pa.unlink(&a, lo, hi, p) && pb.unlink(&b, lo, hi, p)) {
            return refused(c"removal: slots not as linked");
        }
        // A leaf this leaves empty is noted, as for any shared removal (both may be).
        if (a.uses(pa.emptied) && !self.may_empty(lane, *a))
            || (b.uses(pb.emptied) && !self.may_empty(lane, *b))
        {
            return refused(c"removal: would empty a leaf");
        }
        if !stock(&mut [&mut pa.edges, &mut pb.edges], lane) {
            return refused(c"removal: would empty a leaf, or no spare bucket");
        }
        pa.make(&a, EMPTY, lane);
        pb.make(&b, EMPTY, lane);
        lane.remember(&a);
        Shared::Done(p)
    }

    /// Whether a shared removal through `lane` may leave table `at` empty: a leaf, a few per
    /// lane until an exclusive edit frees them (or finds a range back in them), so that a
    /// thread allocating and freeing in a few 2 MiB blocks does not take the exclusive way
    /// each time one empties. Noted for the next exclusive edit when it may (the caller then
    /// empties it).
    #[cold]
    #[inline(never)]
    fn may_empty(&self, lane: &Lane, at: Level<'_>) -> bool {
        // By value: a borrowed level kept the pool case's copy on the stack on every removal.
        let Some(k) = lane.may_empty(&at) else {
            return false;
        };
        self.lanes.note_emptied(lane, k, &at);
        true
    }

    /// The table holding the slot for `addr` (the first slot on the way down that links no
    /// table) and its index; `None` when that slot is empty (no range holds `addr`). Tables stay
    /// as they are while a lane is held, so the way down needs no table held.
    fn slot_for(&self, addr: usize) -> Option<(Level<'_>, usize)> {
        let mut at = self.top_level()?;
        loop {
            let i = *at.span(addr, addr).start();
            let cur = at.slots[i].load(Acquire);
            match tag(cur) {
                TAB => at = Level::child(target::<Table>(cur), at.level + 1, at.block(i).0),
                EMPTY => return None,
                _ => return Some((at, i)),
            }
        }
    }

    /// The table where `[lo, hi]`'s slots lie (the way down while one slot holds all of it, and
    /// not whole), if every table on the way exists; otherwise the table whose slot on the way
    /// links none (or the top table's level, `NO_TOP`, before there is one).
    fn slots_of(&self, lo: usize, hi: usize) -> Result<Level<'_>, Level<'_>> {
        let Some(mut at) = self.top_level() else {
            return Err(NO_TOP);
        };
        while at.level < LEAF {
            let Some((i, blo)) = at.way_down(lo, hi) else {
                break;
            };
            let cur = at.slots[i].load(Acquire);
            if tag(cur) != TAB {
                return Err(at);
            }
            at = Level::child(target::<Table>(cur), at.level + 1, blo);
        }
        Ok(at)
    }

    /// The top table as a level, once there is one.
    fn top_level(&self) -> Option<Level<'_>> {
        super::table::deref(self.read.top.load(Acquire)).map(Level::top)
    }
}

/// [`Registry::slots_of`]'s answer before there is a top table: no slots, level 0.
const NO_TOP: Level<'static> = Level {
    slots: &[],
    used: None,
    level: 0,
    base: 0,
};

impl Registry {}

/// One table's share of a shared edit, checked and not yet made: the slots strictly between
/// its ends, and its end granules as they will be.
struct Part {
    inner: core::ops::Range<usize>,
    edges: Ends,
    /// Slots the edit empties (removals).
    emptied: usize,
}

impl Part {
    /// An edit not yet planned: [`Self::link`] or [`Self::unlink`] plans it in place.
    fn new() -> Part {
        Part {
            inner: 0..0,
            edges: [None, None],
            emptied: 0,
        }
    }

    /// Plans linking `p` over `[lo, hi]` in held table `at` (the slots of it that lie there):
    /// false unless the slots between its ends are empty and the ends empty or granules it
    /// covers in part listing ranges it does not meet.
    fn link(&mut self, at: &Held<'_>, lo: usize, hi: usize, p: Ptr<Record>) -> bool {
        self.plan(at, lo, hi, EMPTY, |g| g.join(p, lo, hi))
    }

    /// Plans unlinking `p` (over `[lo, hi]`) from held table `at`: false unless the slots
    /// between its ends name it alone and its end granules list it.
    fn unlink(&mut self, at: &Held<'_>, lo: usize, hi: usize, p: Ptr<Record>) -> bool {
        self.plan(at, lo, hi, slot_of(p, REC), |g| g.leave(p))
    }

    /// Plans the part of an edit over `[lo, hi]` in `at`, if the slots between its ends all
    /// hold `inner` and `end` can change each end granule (each read into its place here).
    fn plan(
        &mut self,
        at: &Held<'_>,
        lo: usize,
        hi: usize,
        inner: usize,
        end: impl Fn(&mut Granule) -> bool,
    ) -> bool {
        let span = at.span(lo, hi);
        let (first, last) = (*span.start(), *span.end());
        let between = between(first, last);
        if !all_hold(&at.slots[between.clone()], inner) {
            return false;
        }
        // Slots a removal empties (a link empties none: the slots between hold EMPTY already).
        self.emptied = if inner == EMPTY { 0 } else { between.len() };
        self.inner = between;
        for (k, i) in ends(first, last).enumerate() {
            let (_, g) = self.edges[k].insert((i, Granule::BLANK));
            if !(g.read(at.slots[i].load(Relaxed)) && end(g)) {
                return false;
            }
            self.emptied += usize::from(inner != EMPTY && g.empties());
        }
        true
    }

    /// Makes the edit in `at`: `v` (the record, or EMPTY) between the ends, the ends as
    /// planned (the lane stocked for them: [`stock`]).
    fn make(&self, at: &Held<'_>, v: usize, lane: &Lane) {
        at.fill(self.inner.clone(), v);
        for (i, g) in self.edges.iter().flatten() {
            g.store(at, *i, lane);
        }
    }
}

/// The leaf table slot `i` of level-[`NEAR`] table `at` links, if it links one.
fn leaf_of<'a>(at: Level<'a>, i: usize) -> Option<Level<'a>> {
    let cur = at.slots[i].load(Acquire);
    (tag(cur) == TAB).then(|| Level::child(target::<Table>(cur), LEAF, at.block(i).0))
}

/// What a shared edit answers when it must go the exclusive way.
trait Refusal {
    const REFUSED: Self;
}

impl Refusal for bool {
    /// The span ways' "not linked".
    const REFUSED: bool = false;
}

impl Refusal for Shared {
    const REFUSED: Shared = Shared::Exclusive;
}

impl<T> Refusal for Option<T> {
    const REFUSED: Self = None;
}

/// A shared edit refused for reason `why`: counted in the timing build's report
/// (`crate::diag`, issue 36: which of a host's edits still go the exclusive way), nothing
/// otherwise.
#[inline(always)]
fn refused<T: Refusal>(why: &'static core::ffi::CStr) -> T {
    note(why);
    T::REFUSED
}

/// Counts a refusal (timing build only: [`refused`]).
#[inline(always)]
fn note(why: &'static core::ffi::CStr) {
    #[cfg(cuhook_diag = "timing")]
    crate::diag::count(why);
    let _ = why;
}
