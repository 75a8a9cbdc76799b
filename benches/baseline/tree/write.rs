//! Everything done under the writer lock: building an edit, applying it to both copies around
//! the latch flip, recycling records, and the consistent snapshots that reports need.

use core::sync::atomic::Ordering;

use super::node::{Node, Record};
use super::slab::{Ptr, Slab};
use super::tree::{self, Tree};
use super::{Allocation, InsertOutcome, Registry, Removed};

/// Lock waiters yield: with few cores, spinning against a preempted holder wastes its slice.
pub(super) struct Yield;

impl spin::RelaxStrategy for Yield {
    fn relax() {
        std::thread::yield_now();
    }
}

/// Writer state, under the lock.
pub(super) struct Writer {
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

impl Writer {
    /// Registered ranges, live records, live nodes (for the leak checks of the tests).
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        (self.count, self.recs.live(), self.nodes.live())
    }

    pub(super) const fn new() -> Self {
        Writer {
            nodes: Slab::new(),
            recs: Slab::new(),
            next_seq: 0,
            count: 0,
            live: 0,
            missed: 0,
            edits: Vec::new(),
            hits: Vec::new(),
        }
    }
}

impl Registry {
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
