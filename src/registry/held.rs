//! A table held by one shared edit, and the granule chains such an edit may rebuild.
//!
//! Shared edits (`shared.rs`) once claimed each slot by compare-and-swap, so they could only
//! fill empty slots or empty full ones: a granule a neighbouring range shares needs its chain
//! rebuilt from what it lists, which no compare-and-swap makes safe against another lane doing
//! the same (a record it read could be unlinked and reused meanwhile). A pool packs small blocks
//! at sub-granule steps, so most of PyTorch's edits went the exclusive way, each closing the
//! lanes of every thread (issue 36: 61–88 % of them on the H200).
//!
//! So every shared edit now *holds* the table its slots lie in: a high bit of the table's count
//! of used slots ([`HELD`]) is a lock, taken with one atomic bit-set on the line the edit writes
//! anyway (the count's), and released by the store of the new count. Holding it, a lane edits the slots as the
//! exclusive writer does — plain stores, the count kept exactly — and may replace a granule's
//! chain, taking its buckets from the lane's spares and giving the old ones back to them. Edits
//! of different tables still run side by side; two of one table take turns for a few stores.
//!
//! The exclusive writer never finds a table held: it runs with the lanes drained, and a shared
//! edit releases its table before it leaves its lane. Readers need nothing new: each change they
//! can see is one slot store of something complete, and a replaced chain's buckets are rewritten
//! only inside a version bump (`Bucket::store`), as when the exclusive writer recycles them.
#![deny(unsafe_code)]

use core::cell::Cell;

#[cfg(not(loom))]
use crate::atomics::spin_loop;
use crate::atomics::Ordering::Release;
use crate::atomics::{yield_now, AtomicUsize, Ordering::Acquire, Ordering::Relaxed};

use super::fast::clear_of;
use super::lanes::Lane;
use super::level::{changes_use, Level};
use super::record::Record;
use super::slab::Ptr;
use super::table::{ptr_of, slot_of, tag, target, Bucket, BUCKET, BUCKET_CAP, EMPTY, REC};

/// The bit of a table's count that says a shared edit holds the table. Not the top bit: x86
/// then takes it with one `lock bts` (a sign test made the compiler loop on a compare-and-swap).
const HELD: usize = 1 << (usize::BITS - 2);

/// A table a shared edit holds: its slots change only through the holder until it is dropped.
/// The holder keeps the table's count of used slots itself, read once when it takes the table,
/// and stores it once, with the [`HELD`] bit cleared, on release (a load and a store per slot
/// change, and two on release, before).
pub(super) struct Held<'a> {
    at: Level<'a>,
    used: &'a AtomicUsize,
    /// The table's count of used slots as this edit leaves it so far.
    count: Cell<usize>,
}

impl<'a> Level<'a> {
    /// Holds this table for a shared edit, waiting while another lane holds it (for a few
    /// stores); `None` for the top table, which has no count (its edits are exclusive).
    #[inline(always)]
    pub(super) fn hold(self) -> Option<Held<'a>> {
        let used = self.used?;
        // Acquire: the previous holder's slots and chains are seen as it left them.
        // The bit alone (one `lock bts`: asking for the whole value made it a compare-and-swap
        // loop), then the count, on the line just taken.
        if used.fetch_or(HELD, Acquire) & HELD != 0 {
            wait_for(used);
        }
        Some(Held {
            at: self,
            used,
            count: Cell::new(used.load(Relaxed) & !HELD),
        })
    }
}

/// [`Level::hold`] when another lane holds the table: reads until it is released, then tries
/// again (a waiting lane writes the line only when it may win).
#[cold]
#[inline(never)]
fn wait_for(used: &AtomicUsize) {
    #[cfg(not(loom))]
    let mut spins = 0u32;
    loop {
        // Under loom every try is the atomic OR: a plain load there may be answered with the
        // old count indefinitely, a read-modify-write always sees the latest.
        #[cfg(not(loom))]
        while used.load(Relaxed) & HELD != 0 {
            // A holder runs a few stores, but its thread may be preempted.
            if spins < 64 {
                spin_loop();
                spins += 1;
            } else {
                yield_now();
            }
        }
        #[cfg(loom)]
        yield_now();
        if used.fetch_or(HELD, Acquire) & HELD == 0 {
            return;
        }
    }
}

impl<'a> core::ops::Deref for Held<'a> {
    type Target = Level<'a>;
    fn deref(&self) -> &Level<'a> {
        &self.at
    }
}

impl Held<'_> {
    /// Whether the table uses exactly `n` slots.
    #[inline(always)]
    pub(super) fn uses(&self, n: usize) -> bool {
        self.count.get() == n
    }

    /// [`Level::replace`] for the holder: the slot's value `old` was loaded holding the table,
    /// so it is still there.
    #[inline(always)]
    pub(super) fn replace(&self, i: usize, old: usize, v: usize) {
        if let Some(less) = changes_use(old, v) {
            self.add(1, less);
        }
        self.at.put(i, v);
    }

    /// [`Level::fill`] for the holder.
    #[inline]
    pub(super) fn fill(&self, range: core::ops::Range<usize>, v: usize) {
        if range.is_empty() {
            return;
        }
        self.add(range.len(), v == EMPTY);
        self.at.put_all(range, v);
    }

    /// Counts `n` slots more, or fewer (`less`).
    #[inline(always)]
    fn add(&self, n: usize, less: bool) {
        let c = self.count.get();
        self.count.set(if less { c - n } else { c + n });
    }
}

impl Drop for Held<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: the next holder sees this edit's slots and chains. The count as left, which
        // clears the bit: while held, the others' atomic ORs only set the bit already set, so
        // a plain store loses nothing. (Loom's modification order is partial: a plain store
        // need not follow a waiter's ORs there, which could then read the held count forever;
        // a read-modify-write always follows them.)
        #[cfg(not(loom))]
        self.used.store(self.count.get(), Release);
        #[cfg(loom)]
        self.used.swap(self.count.get(), Release);
    }
}

/// What a granule will list once a shared edit has added or removed a range there: at most one
/// bucket's worth (a longer chain is left to the exclusive writer), built on the stack.
pub(super) struct Granule {
    /// The slot's value when read (the table held, so still there when stored).
    cur: usize,
    recs: [Ptr<Record>; BUCKET_CAP],
    n: usize,
    /// The bucket the new chain is built in, taken from the lane by [`stock`].
    bucket: Option<Ptr<Bucket>>,
}

impl Granule {
    /// A granule listing nothing, to [`read`](Self::read) one into. Edits fill granules in
    /// place (in their `Part`): built and returned by value, each was copied three or four times
    /// per end (`memcpy`, a tenth of a large edit's instructions).
    pub(super) const BLANK: Granule = Granule {
        cur: EMPTY,
        recs: [Ptr::dangling(); BUCKET_CAP],
        n: 0,
        bucket: None,
    };

    /// Reads the ranges granule slot value `cur` lists; false for a chain of more than one
    /// bucket, or a table.
    pub(super) fn read(&mut self, cur: usize) -> bool {
        self.cur = cur;
        self.n = 0;
        self.bucket = None;
        match tag(cur) {
            EMPTY => {}
            REC => {
                self.recs[0] = ptr_of(cur);
                self.n = 1;
            }
            BUCKET => {
                let b = target::<Bucket>(cur);
                if !b.next.load(Relaxed).is_null() {
                    return false;
                }
                let len = b.len.load(Relaxed).min(BUCKET_CAP);
                // Entries a removal short of memory forgot in place are null.
                for p in b.recs[..len]
                    .iter()
                    .filter_map(|r| Ptr::new(r.load(Relaxed)))
                {
                    self.recs[self.n] = p;
                    self.n += 1;
                }
            }
            _ => return false,
        }
        true
    }

    /// Adds `p` (over `[lo, hi]`), if no range listed meets it and one bucket holds all.
    pub(super) fn join(&mut self, p: Ptr<Record>, lo: usize, hi: usize) -> bool {
        if self.n == BUCKET_CAP || !clear_of(self.cur, lo, hi) {
            return false;
        }
        self.recs[self.n] = p;
        self.n += 1;
        true
    }

    /// Takes `p` out, if it is listed.
    pub(super) fn leave(&mut self, p: Ptr<Record>) -> bool {
        let Some(k) = self.recs[..self.n].iter().position(|&q| q == p) else {
            return false;
        };
        self.recs.copy_within(k + 1..self.n, k);
        self.n -= 1;
        true
    }

    /// The first range listed that satisfies `f`.
    pub(super) fn find(&self, f: impl Fn(Ptr<Record>) -> bool) -> Option<Ptr<Record>> {
        self.recs[..self.n].iter().copied().find(|&q| f(q))
    }

    /// Whether the granule ends empty.
    pub(super) fn empties(&self) -> bool {
        self.n == 0
    }

    /// Stores what the granule now lists into slot `i` of `at`: nothing, the one range, or the
    /// chain built in the bucket [`stock`] took; the chain replaced goes to the lane's spares.
    pub(super) fn store(&self, at: &Held<'_>, i: usize, lane: &Lane) {
        let v = match (self.n, self.bucket) {
            (0, _) => EMPTY,
            (1, _) => slot_of(self.recs[0], REC),
            (n, Some(b)) => {
                target::<Bucket>(slot_of(b, BUCKET)).store(&self.recs[..n], None);
                slot_of(b, BUCKET)
            }
            // `stock` took a bucket for every chain of two or more.
            (_, None) => return,
        };
        at.replace(i, self.cur, v);
        if tag(self.cur) == BUCKET {
            lane.buckets.push(ptr_of(self.cur));
        }
    }
}

/// Takes from `lane` a bucket for each granule of `edges` (one edit's end granules, in one table
/// or two) that ends as a chain, if the lane has them and room for the chains they replace;
/// otherwise gives back what it took and says false (nothing changed: the edit goes the
/// exclusive way, which restocks the lane).
pub(super) fn stock(edges: &mut [&mut [Option<(usize, Granule)>]], lane: &Lane) -> bool {
    let mut given = 0;
    let mut ok = true;
    for g in granules(edges) {
        given += usize::from(tag(g.cur) == BUCKET);
        if g.n >= 2 {
            g.bucket = lane.buckets.pop();
            ok &= g.bucket.is_some();
        }
    }
    if ok && lane.buckets.room() >= given {
        return true;
    }
    for g in granules(edges) {
        if let Some(b) = g.bucket.take() {
            lane.buckets.push(b);
        }
    }
    false
}

/// The granules of [`stock`]'s edges.
fn granules<'a, 'b: 'a>(
    edges: &'a mut [&'b mut [Option<(usize, Granule)>]],
) -> impl Iterator<Item = &'a mut Granule> + use<'a, 'b> {
    edges
        .iter_mut()
        .flat_map(|e| e.iter_mut())
        .flatten()
        .map(|(_, g)| g)
}
