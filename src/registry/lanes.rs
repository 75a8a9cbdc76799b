//! Lanes: the common edits of many threads at once, and the exclusive mode for the rest.
//!
//! With one writer lock, 16 threads allocating at once spent the whole of their overhead waiting
//! for it (issue 36, measured on the H200: the hooks without the registry write ran as plain).
//! But the common edits touch little: a range linked into a table that exists, or unlinked from
//! one without emptying it, all its slots in that one table. Two such edits of different tables
//! can run side by side, and two of one table take turns holding it for a few stores
//! (`shared.rs`, `held.rs`), which lets them rebuild a granule's chain too. Every other edit
//! (making or freeing a table, overlaps, trims, purges, snapshots, the fork handlers) is
//! *exclusive*: it takes the writer lock and waits until no shared edit runs.
//!
//! A shared edit holds one of [`LANES`] lanes: a flag on a cache line of its own, the one
//! handed to the thread at its first edit (`pick`; a taken lane sends it to the next few),
//! with what the lane's owner keeps between its edits: a few spare records, chain buckets and
//! tables (so that taking one needs no slab, which is the exclusive writer's), its counts, the
//! leaf table it last edited, and a few it left empty.
//!
//! The exclusive side is a biased reader-writer lock: it closes the `gate`, then waits for every
//! lane to be free; a shared edit takes its lane, then checks the gate. Both pairs of accesses
//! are sequentially consistent, so either the edit sees the gate closed (and goes the exclusive
//! way instead) or the exclusive side sees the lane held (and waits). The shared side thus pays
//! one compare-and-swap on its own line and one load of a line that only exclusive edits write;
//! the exclusive side a load per lane.
//!
//! While the gate is closed the exclusive holder may also edit every lane's owned state (refill
//! spares, forget a cached table): a thread that takes a lane then only looks at the gate and
//! leaves.
#![deny(unsafe_code)]

use crate::atomics::{atomic_array, AtomicPtr, AtomicUsize, Ordering};

use super::level::Level;
use super::record::Record;
use super::slab::Ptr;
use super::table::{deref, Bucket, Table, LEAF, SHIFT};

/// Lanes: more than the threads that usually allocate at once on the hosts measured (16 cores).
#[cfg(not(loom))]
pub(super) const LANES: usize = 16;
#[cfg(loom)]
pub(super) const LANES: usize = 2;
/// Lanes a thread tries before it takes the exclusive way.
const PROBES: usize = if LANES < 4 { LANES } else { 4 };
/// Spare records a lane keeps, and spare buckets: a shared edit changes at most two granule
/// chains, each one bucket long, but a thread's live ranges packed by a pool hold a chain
/// between each two (half the stock covers `torch_threads.py`'s eight tensors). 512 bytes a
/// lane with its header and spare tables.
#[cfg(not(loom))]
pub(super) const SPARE: usize = 26;
#[cfg(not(loom))]
pub(super) const SPARE_BUCKETS: usize = 19;
#[cfg(loom)]
pub(super) const SPARE: usize = 2;
#[cfg(loom)]
pub(super) const SPARE_BUCKETS: usize = 3;
/// Emptied leaf tables a lane notes before an exclusive edit must free them: a pool's blocks
/// move between a few 2 MiB blocks, emptying each leaf and coming back to it.
#[cfg(not(loom))]
const NOTES: usize = 4;
#[cfg(loom)]
const NOTES: usize = 1;
/// Spare tables a lane keeps, for leaf tables its inserts make (a pool's blocks move between
/// 2 MiB blocks, whose leaf tables are freed once empty and needed again when the pool comes
/// back): refilled to two by the thread's exclusive edits.
#[cfg(not(loom))]
pub(super) const SPARE_TABLES: usize = 3;
#[cfg(loom)]
pub(super) const SPARE_TABLES: usize = 1;

/// Gate bits: an exclusive edit runs (or waits for the lanes), and the registry takes no
/// inserts (closed by `Registry::set_open`).
const EXCLUSIVE: usize = 1;
const SHUT: usize = 2;

/// One lane. Its fields past `held` belong to the thread holding it (or to the exclusive holder
/// while the gate is closed); they are atomics only so that any thread may read the counts.
#[repr(C, align(128))]
pub(super) struct Lane {
    held: AtomicUsize,
    /// Ranges linked through this lane less those unlinked through it (wrapping).
    pub(super) count: AtomicUsize,
    /// Their bytes (wrapping).
    pub(super) live: AtomicUsize,
    /// The leaf table this lane last edited (null: none), and its block's first address.
    leaf: AtomicPtr<Table>,
    leaf_base: AtomicUsize,
    /// Leaf tables shared removals through this lane left empty (null: none), and their
    /// blocks' first addresses: still linked, for the next exclusive edit to free those no
    /// range came back to (freeing is exclusive; this way a thread allocating and freeing in a
    /// few 2 MiB blocks, as a pool does, stays on shared edits).
    emptied: [AtomicPtr<Table>; NOTES],
    emptied_base: [AtomicUsize; NOTES],
    /// Records the lane's inserts fill, and those its removals unlinked (no slot links them).
    pub(super) recs: Spares<Record, SPARE>,
    /// Buckets for the granule chains its edits build, and the chains they replaced.
    pub(super) buckets: Spares<Bucket, SPARE_BUCKETS>,
    /// Tables for the leaf tables its inserts make (all slots empty, linked nowhere).
    pub(super) tables: Spares<Table, SPARE_TABLES>,
}

#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Lane>() == 512);

/// A lane's stack of spare slab elements, linked nowhere: taken and given by its owner alone,
/// handed out and taken back by the exclusive holder (`exclusive.rs`).
pub(super) struct Spares<T, const N: usize> {
    n: AtomicUsize,
    items: [AtomicPtr<T>; N],
}

impl<T, const N: usize> Spares<T, N> {
    crate::atomics::const_unless_loom! {
    fn new() -> Self {
        Spares {
            n: AtomicUsize::new(0),
            items: atomic_array![AtomicPtr::new(core::ptr::null_mut()); N],
        }
    }
    }

    /// A spare, if there is one.
    #[inline(always)]
    pub(super) fn pop(&self) -> Option<Ptr<T>> {
        // One comparison for both ends: none kept wraps `n` past the array.
        let n = self.n.load(Ordering::Relaxed).wrapping_sub(1);
        let item = self.items.get(n)?;
        self.n.store(n, Ordering::Relaxed);
        Ptr::new(item.load(Ordering::Relaxed))
    }

    /// Keeps `p` (the caller checked [`Self::room`]).
    #[inline(always)]
    pub(super) fn push(&self, p: Ptr<T>) {
        let n = self.n.load(Ordering::Relaxed);
        self.items[n].store(p.as_mut_ptr(), Ordering::Relaxed);
        self.n.store(n + 1, Ordering::Relaxed);
    }

    /// How many are kept.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.n.load(Ordering::Relaxed)
    }

    /// How many more can be kept.
    #[inline(always)]
    pub(super) fn room(&self) -> usize {
        N - self.len()
    }
}

/// The lanes and their gate.
#[repr(C, align(128))]
pub(super) struct Lanes {
    gate: AtomicUsize,
    /// Whether some lane noted a table it left empty (`Lane::note_emptied`).
    emptied: AtomicUsize,
    lanes: [Lane; LANES],
}

impl Lane {
    crate::atomics::const_unless_loom! {
    fn new() -> Self {
        Lane {
            held: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            leaf: AtomicPtr::new(core::ptr::null_mut()),
            leaf_base: AtomicUsize::new(0),
            emptied: atomic_array![AtomicPtr::new(core::ptr::null_mut()); NOTES],
            emptied_base: atomic_array![AtomicUsize::new(0); NOTES],
            recs: Spares::new(),
            buckets: Spares::new(),
            tables: Spares::new(),
        }
    }
    }

    /// Leaves the lane.
    #[inline(always)]
    pub(super) fn leave(&self) {
        self.held.store(0, Ordering::Release);
    }

    /// Books a range linked (`bytes` > 0) or unlinked (`bytes` negated) through this lane.
    #[inline(always)]
    pub(super) fn book(&self, ranges: usize, bytes: usize) {
        let (c, l) = (&self.count, &self.live);
        c.store(
            c.load(Ordering::Relaxed).wrapping_add(ranges),
            Ordering::Relaxed,
        );
        l.store(
            l.load(Ordering::Relaxed).wrapping_add(bytes),
            Ordering::Relaxed,
        );
    }

    /// The leaf table last edited through this lane, if `[lo, hi]` lies in one granule of it.
    #[inline(always)]
    pub(super) fn leaf_granule<'a>(&self, lo: usize, hi: usize) -> Option<Level<'a>> {
        let base = self.leaf_base.load(Ordering::Relaxed);
        // Two branches, the pointer tested last: tested together, the compiler combined them
        // with flag arithmetic (five more instructions per edit).
        if (lo ^ hi) >> SHIFT[LEAF] != 0 || (lo ^ base) >> SHIFT[LEAF - 1] != 0 {
            return None;
        }
        // Borrowed straight from the checked pointer (not through a slot value): the compiler
        // then knows the table's count is there, and tests no pointer again when it counts.
        let t = deref::<Table>(self.leaf.load(Ordering::Relaxed))?;
        Some(Level::child(t, LEAF, base))
    }

    /// Whether a shared removal through this lane may leave leaf table `at` empty: the note it
    /// takes (the lane notes [`NOTES`] such tables until an exclusive edit frees them: this
    /// one again, or a free note).
    #[inline]
    pub(super) fn may_empty(&self, at: &Level<'_>) -> Option<usize> {
        let t = at.table().filter(|_| at.level == LEAF)?;
        let noted = |k: usize| self.emptied[k].load(Ordering::Relaxed).cast_const();
        (0..NOTES)
            .find(|&k| noted(k) == t)
            .or_else(|| (0..NOTES).find(|&k| noted(k).is_null()))
    }

    /// How many more leaf tables the lane can note before an exclusive edit frees them.
    #[inline]
    pub(super) fn free_notes(&self) -> usize {
        self.emptied
            .iter()
            .filter(|e| e.load(Ordering::Relaxed).is_null())
            .count()
    }

    /// Notes leaf table `at`, just left empty, for the next exclusive edit (in note `k`, which
    /// [`Self::may_empty`] gave).
    #[inline]
    pub(super) fn note_emptied(&self, k: usize, at: &Level<'_>) {
        if let Some(t) = at.table() {
            self.emptied[k].store(t.cast_mut(), Ordering::Relaxed);
            self.emptied_base[k].store(at.base, Ordering::Relaxed);
        }
    }

    /// The leaf tables noted as left empty, each with its block's first address; forgotten
    /// here (exclusive holder only).
    pub(super) fn take_emptied(&self, mut f: impl FnMut(Ptr<Table>, usize)) {
        for k in 0..NOTES {
            if let Some(t) =
                Ptr::new(self.emptied[k].swap(core::ptr::null_mut(), Ordering::Relaxed))
            {
                f(t, self.emptied_base[k].load(Ordering::Relaxed));
            }
        }
    }

    /// Remembers `at` (a leaf table) as the one last edited.
    #[inline(always)]
    pub(super) fn remember(&self, at: &Level<'_>) {
        if at.level == LEAF {
            if let Some(t) = at.table() {
                self.leaf.store(t.cast_mut(), Ordering::Relaxed);
            }
            self.leaf_base.store(at.base, Ordering::Relaxed);
        }
    }
}

/// The lane a thread tries first: the one handed to it at its first edit, kept in the thread's
/// state beside the hook guard (the hooks already hold its address, so this is one load). Lanes
/// are handed round in turn, so threads that edit at once have lanes of their own up to
/// [`LANES`] of them. Picked before from the thread pointer by a hash, two of eight Python
/// threads met on one lane in about half the processes (two of sixteen nearly always) and took
/// turns with its spares and cached leaf; and from the stack's address before that, one
/// thread's allocations and frees at depths either side of a 64 KiB line took two lanes.
/// Threads past [`LANES`] (or a thread pool's short-lived ones) share lanes: the second of
/// two at once takes the next lane, or the exclusive way. (A dynamic thread-local must not be
/// touched inside a walk of the loader's list, `docs/architecture.md`, Known limits: registry
/// edits come from hooked calls and the API, never from inside such a walk, and the hooks read
/// this same thread-local for their guard anyway.)
#[inline(always)]
fn pick() -> usize {
    #[cfg(not(loom))]
    {
        let lane = usize::from(crate::events::thread::THREAD.with(|t| t.lane.get()));
        if lane >= LANES {
            return first_pick();
        }
        lane
    }
    #[cfg(loom)]
    0
}

/// Lanes handed out so far (each thread's is this count at its first edit, round the lanes).
#[cfg(not(loom))]
static HANDED: AtomicUsize = AtomicUsize::new(0);

/// A thread's first edit: the next lane in turn, kept as the thread's.
#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn first_pick() -> usize {
    let lane = HANDED.fetch_add(1, Ordering::Relaxed) % LANES;
    // LANES < u8::MAX (asserted below), so the kept value never reads as "none given".
    crate::events::thread::THREAD.with(|t| t.lane.set(lane as u8));
    lane
}

#[cfg(not(loom))]
const _: () = assert!(LANES < u8::MAX as usize);

impl Lanes {
    crate::atomics::const_unless_loom! {
    pub(super) fn new() -> Self {
        Lanes {
            gate: AtomicUsize::new(0),
            emptied: AtomicUsize::new(0),
            #[cfg(not(loom))]
            lanes: [const { Lane::new() }; LANES],
            #[cfg(loom)]
            lanes: core::array::from_fn(|_| Lane::new()),
        }
    }
    }

    /// A lane for a shared edit, held; `None` when the edit must go the exclusive way (the gate
    /// is closed, or the thread's two lanes are taken).
    #[inline(always)]
    pub(super) fn enter(&self) -> Option<&Lane> {
        let i = pick();
        let lane = &self.lanes[i];
        if !lane.take() {
            return self.enter_next(i);
        }
        self.admitted(lane)
    }

    /// [`Self::enter`] when the first lane was taken: the next few (more threads than lanes
    /// then share them before any goes the exclusive way).
    #[cold]
    #[inline(never)]
    fn enter_next(&self, i: usize) -> Option<&Lane> {
        let lane = (1..PROBES)
            .map(|k| &self.lanes[(i + k) % LANES])
            .find(|lane| lane.take())?;
        self.admitted(lane)
    }

    /// A lane just taken, if the gate is open; otherwise left again.
    #[inline(always)]
    fn admitted<'a>(&self, lane: &'a Lane) -> Option<&'a Lane> {
        // Sequentially consistent after the take (module doc): an exclusive edit that closed
        // the gate before this load waits for the lane; one that closes it after sees the lane.
        #[cfg(loom)]
        crate::atomics::fence(Ordering::SeqCst);
        if self.gate.load(Ordering::SeqCst) == 0 {
            return Some(lane);
        }
        lane.leave();
        None
    }

    /// Closes the gate and waits until no lane is held (under the writer lock).
    pub(super) fn close(&self) {
        self.gate.fetch_or(EXCLUSIVE, Ordering::SeqCst);
        #[cfg(loom)]
        crate::atomics::fence(Ordering::SeqCst);
        for lane in &self.lanes {
            let mut spins = 0u32;
            while lane.held.load(Ordering::SeqCst) != 0 {
                // A shared edit is a few hundred instructions; its thread may be preempted.
                if spins < 64 {
                    crate::atomics::spin_loop();
                    spins += 1;
                } else {
                    crate::atomics::yield_now();
                }
            }
        }
    }

    /// Opens the gate again, publishing what the exclusive holder changed in the lanes.
    pub(super) fn reopen(&self) {
        self.gate.fetch_and(!EXCLUSIVE, Ordering::Release);
    }

    /// Refuses shared edits even with the gate open (`shut`: the registry takes no inserts),
    /// or takes them again (exclusive holder only).
    pub(super) fn shut(&self, shut: bool) {
        if shut {
            self.gate.fetch_or(SHUT, Ordering::Relaxed);
        } else {
            self.gate.fetch_and(!SHUT, Ordering::Relaxed);
        }
    }

    /// Every lane (tests: to prime them all).
    #[cfg(test)]
    pub(super) fn each(&self) -> &[Lane] {
        &self.lanes
    }

    /// The index of the lane this thread tries first (tests).
    #[cfg(all(test, not(loom)))]
    pub(super) fn own_index(&self) -> usize {
        pick()
    }

    /// The lane this thread would try first (the exclusive holder refills or drains it).
    pub(super) fn own(&self) -> &Lane {
        &self.lanes[pick()]
    }

    /// Notes that `lane` left leaf table `at` empty (shared edit).
    #[cold]
    pub(super) fn note_emptied(&self, lane: &Lane, k: usize, at: &Level<'_>) {
        lane.note_emptied(k, at);
        if self.emptied.load(Ordering::Relaxed) == 0 {
            self.emptied.store(1, Ordering::Relaxed);
        }
    }

    /// Takes every table the lanes noted as left empty (exclusive holder only).
    pub(super) fn take_emptied(&self, mut f: impl FnMut(Ptr<Table>, usize)) {
        // Read before it is written: every exclusive edit asks, few find one.
        if self.emptied.load(Ordering::Relaxed) == 0 || self.emptied.swap(0, Ordering::Relaxed) == 0
        {
            return;
        }
        for lane in &self.lanes {
            lane.take_emptied(&mut f);
        }
    }

    /// Frees every lane (a child just forked, whose only thread holds none: a lane taken in the
    /// parent for a moment while the gate was closed stays taken in the copy, by no one).
    #[cfg(not(loom))]
    pub(super) fn free_all(&self) {
        for lane in &self.lanes {
            lane.leave();
        }
    }

    /// Forgets every lane's cached leaf (a table was freed; exclusive holder only).
    pub(super) fn forget_leaves(&self) {
        for lane in &self.lanes {
            lane.leaf.store(core::ptr::null_mut(), Ordering::Relaxed);
        }
    }

    /// The ranges and bytes booked through all lanes (wrapping sums).
    pub(super) fn booked(&self) -> (usize, usize) {
        self.lanes.iter().fold((0, 0), |(c, l), lane| {
            (
                c.wrapping_add(lane.count.load(Ordering::Relaxed)),
                l.wrapping_add(lane.live.load(Ordering::Relaxed)),
            )
        })
    }

    /// Whether some lane noted `t` as left empty (the tests' structure check).
    #[cfg(all(test, not(loom)))]
    pub(super) fn noted_empty(&self, t: &Table) -> bool {
        self.lanes
            .iter()
            .flat_map(|l| &l.emptied)
            .any(|e| core::ptr::eq(e.load(Ordering::Relaxed), t))
    }

    /// Spare records, buckets and tables held by all lanes (exclusive holder: the tests' leak
    /// checks).
    #[cfg(all(test, not(loom)))]
    pub(super) fn spares(&self) -> (usize, usize, usize) {
        self.lanes.iter().fold((0, 0, 0), |(r, b, t), l| {
            (r + l.recs.len(), b + l.buckets.len(), t + l.tables.len())
        })
    }
}

impl Lane {
    #[inline(always)]
    pub(super) fn take(&self) -> bool {
        #[cfg(not(loom))]
        let order = Ordering::SeqCst;
        #[cfg(loom)]
        let order = Ordering::AcqRel;
        self.held
            .compare_exchange(0, 1, order, Ordering::Relaxed)
            .is_ok()
    }
}
