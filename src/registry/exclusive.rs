//! Exclusive mode: the writer lock with the lanes' gate closed and every lane drained
//! (`lanes.rs` says why the common edits do without it). Every edit that is not a shared one
//! runs here, and so do the lanes' upkeep: spare records and buckets given or taken back, and
//! leaf tables a shared removal left empty freed.

use super::lanes::{Lane, Lanes, Spares};
use super::record::{Record, RemovedRecord};
use super::slab::{Fresh, Ptr, Slab};
use super::write::{rec, Writer};
use super::{Allocation, InsertOutcome, Registry};
use crate::atomics::Ordering;
use crate::locks::WriterGuard;

#[cfg(all(test, not(loom)))]
std::thread_local! {
    /// Tests: how many times this thread took the exclusive way.
    pub(super) static EXCLUSIVE_EDITS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

impl Registry {
    /// The writer lock with the lanes closed (`lanes.rs`): every edit that is not shared.
    pub(super) fn exclusive(&self) -> Exclusive<'_> {
        #[cfg(all(test, not(loom)))]
        EXCLUSIVE_EDITS.set(EXCLUSIVE_EDITS.get() + 1);
        let mut guard = self.writer.lock();
        #[cfg(cuhook_diag = "timing")]
        crate::diag::mark(0);
        self.lanes.close();
        self.reclaim_emptied(&mut guard);
        #[cfg(cuhook_diag = "timing")]
        crate::diag::mark(1);
        Exclusive {
            guard,
            lanes: &self.lanes,
        }
    }

    /// Frees the leaf tables shared removals left empty, where no range came back to them
    /// meanwhile (with the tables above them that this empties).
    fn reclaim_emptied(&self, w: &mut Writer) {
        let mut freed = false;
        self.lanes.take_emptied(|t, base| {
            let Some(top) = w.top_if_any(self) else {
                return;
            };
            freed |= w.free_if_empty(top, t, base);
        });
        if freed {
            self.publish(w);
        }
    }

    /// [`Self::insert`] beyond a shared edit, in exclusive mode: with the record that edit
    /// filled (taken from a lane, linked nowhere; its range and sequence number are kept), or,
    /// when none could begin (no lane, or no spare record in it), with `a` from the start after
    /// giving the thread's lane spare records.
    #[inline(never)]
    pub(super) fn insert_exclusive(
        &self,
        a: Allocation,
        filled: Option<Ptr<Record>>,
    ) -> InsertOutcome {
        #[cfg(cuhook_diag = "timing")]
        let start = crate::diag::now();
        let mut guard = self.exclusive();
        guard.tend(&self.lanes);
        let inserted = match filled {
            Some(p) => {
                let a = rec(p).get();
                guard.recs.free(p);
                self.insert_locked(guard, a, Some(a.seq))
            }
            None => self.insert_locked(guard, a, None),
        };
        #[cfg(cuhook_diag = "timing")]
        crate::diag::record_marked(c"registry: exclusive insert", start);
        inserted
    }

    /// Everything [`Self::insert`] does beyond a shared edit, in the exclusive mode it took.
    fn insert_locked(
        &self,
        mut guard: Exclusive<'_>,
        mut a: Allocation,
        seq: Option<u64>,
    ) -> InsertOutcome {
        let last = a.start.saturating_add(a.size - 1);
        a.size = last - a.start + 1;
        let w = &mut *guard;
        if !w.open {
            return InsertOutcome::default();
        }
        a.seq = seq.unwrap_or_else(|| self.next_seq());
        let Some(top) = w.top(self) else {
            // No table yet, so nothing in the way either.
            drop(guard);
            self.stats.untracked.fetch_add(1, Ordering::Relaxed);
            return InsertOutcome::default();
        };
        // What the link may take is asked for before anything changes: without that memory the
        // range goes untracked (counted; lookups do not find it, the driver is asked instead)
        // rather than the host being aborted, and the next insert tries again.
        let mut rec = w.room_for_edit(1).then(|| w.new_record(&a));
        if let Some(r) = rec {
            if w.link_fast(top, a.start, last, r) {
                return self.inserted(w, &a, 0);
            }
        }
        // Ranges in the way were freed unseen: each is cut back, one at a time (its pieces
        // outside the new range stay, or go too when their memory cannot be had), even when the
        // new range cannot be linked: a stale range must not answer for the new memory.
        let mut overwritten = 0;
        while let Some(h) = Writer::first_meeting(top, a.start, last) {
            let cut = w.cut_one(top, a.start, last, h);
            self.account(w, &cut);
            overwritten += 1;
        }
        w.missed += overwritten as u64;
        // What the cuts took from the reserve is asked for again.
        if let Some(r) = rec.filter(|_| !w.room_for_edit(1)) {
            w.recs.free(r);
            rec = None;
        }
        let Some(rec) = rec else {
            self.publish(w);
            drop(guard);
            self.stats.untracked.fetch_add(1, Ordering::Relaxed);
            return InsertOutcome {
                seq: None,
                overwritten,
                size: a.size,
            };
        };
        w.link(top, a.start, last, rec);
        self.inserted(w, &a, overwritten)
    }

    /// Books and publishes a range just linked.
    fn inserted(&self, w: &mut Writer, a: &Allocation, overwritten: usize) -> InsertOutcome {
        w.count = w.count.wrapping_add(1);
        w.live = w.live.wrapping_add(a.size);
        self.publish(w);
        InsertOutcome {
            seq: Some(a.seq),
            overwritten,
            size: a.size,
        }
    }

    /// [`Self::remove_allocation`] beyond a shared edit (the thread's lane restocked first).
    #[inline(never)]
    pub(super) fn remove_exclusive(&self, start: usize) -> Option<RemovedRecord> {
        #[cfg(cuhook_diag = "timing")]
        let begun = crate::diag::now();
        let mut guard = self.exclusive();
        let w = &mut *guard;
        w.tend(&self.lanes);
        let removed = self.unlink_allocation(w, start).map(|p| {
            // Copied before the record is freed (it is not reused before the lock is released).
            let a = rec(p).take();
            w.free_record(p);
            self.publish_len(w);
            a
        });
        #[cfg(cuhook_diag = "timing")]
        crate::diag::record_marked(c"registry: exclusive removal", begun);
        removed
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
}

impl Writer {
    /// Keeps the thread's lane stocked for its next shared edits (an exclusive edit often runs
    /// because the lane ran out of spares, or had no room for what a removal gives back).
    pub(super) fn tend(&mut self, lanes: &Lanes) {
        self.stock(lanes.own());
    }

    /// Spare records for `lane`'s next insert, buckets for its next two chains and a table for
    /// its next leaf, and room for what its removals give back: each stack filled or drained to
    /// half when short.
    fn stock(&mut self, lane: &Lane) {
        restock(&mut self.recs, &lane.recs, 1);
        restock(&mut self.buckets, &lane.buckets, 2);
        restock(&mut self.tables, &lane.tables, 1);
    }
}

/// Fills `spares` to half from `slab` when fewer than `need` are left, or gives back to half
/// when fewer than `need` more fit. None is taken that would have to be allocated for when
/// memory is short (the lane's edits then go the exclusive way, which asks again).
fn restock<T: Fresh, const N: usize>(slab: &mut Slab<T>, spares: &Spares<T, N>, need: usize) {
    let half = N.div_ceil(2);
    if spares.len() < need {
        let n = half - spares.len();
        if slab.spare(n) {
            (0..n).for_each(|_| spares.push(slab.alloc()));
        }
    } else if spares.room() < need {
        while spares.len() > half {
            let Some(p) = spares.pop() else { break };
            slab.free(p);
        }
    }
}

/// The writer lock with the lanes closed: no shared edit runs while it lives, and it may edit
/// the lanes' owned state. Opens the gate again when dropped, before the lock is released.
pub(super) struct Exclusive<'a> {
    guard: WriterGuard<'a, Writer>,
    lanes: &'a Lanes,
}

impl core::ops::Deref for Exclusive<'_> {
    type Target = Writer;
    fn deref(&self) -> &Writer {
        &self.guard
    }
}

impl core::ops::DerefMut for Exclusive<'_> {
    fn deref_mut(&mut self) -> &mut Writer {
        &mut self.guard
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        if core::mem::take(&mut self.guard.freed_tables) {
            self.lanes.forget_leaves();
        }
        self.lanes.reopen();
    }
}

#[cfg(test)]
impl Registry {
    /// Gives every lane spare records (tests: any thread's first edit may then be shared).
    pub(super) fn prime(&self) {
        let mut guard = self.exclusive();
        for lane in self.lanes.each() {
            guard.stock(lane);
        }
    }
}
