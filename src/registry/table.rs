//! The page table over the address space, and the lock-free lookup that walks it.
//!
//! Five levels of slots. A slot of level `l` stands for the aligned block of `1 << SHIFT[l]`
//! bytes it covers: the top table (65,536 slots) covers 256 TiB per slot, then 512 GiB, 1 GiB,
//! 2 MiB and, at the leaves, 4 KiB granules. A range is stored as the maximal aligned blocks it
//! covers, each at the level of its size (a 2 MiB-aligned 2 MiB range is one slot of level 3, a
//! 4 KiB pool block one slot of level 4), and in the granules it covers only in part. A lookup is
//! at most five dependent slot loads and one record copy.
//!
//! A slot holds nothing, a record (the one range covering the whole block, or the only range
//! touching a granule), a child table, or — in a granule shared by several ranges — a bucket
//! chain listing them.
//!
//! # Safety
//!
//! The *pointer invariant*: a non-null slot value, or a bucket's record pointer or `next`, points
//! (tag bits aside) at an element of a slab of the type its tag names, owned by the same
//! registry; slab memory lives until the registry drops. Slab elements are all atomics, so any
//! contents are valid to read; readers validate what they read (record and bucket versions) and
//! otherwise start again. Only writers store slot values: the exclusive writer (`edit.rs`, under
//! the writer lock) or a shared edit holding the slot's table (`shared.rs`, `held.rs`).
#![allow(unsafe_code)]

use crate::atomics::{
    atomic_array, fence, spin_loop, AtomicPtr, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use core::ptr;

use super::record::{RawRecord, Record};
use super::slab::{Fresh, Ptr};

/// Block size of a slot of each level (log2 bytes).
#[cfg(not(any(loom, miri)))]
pub(super) const SHIFT: [u32; LEVELS] = [48, 39, 30, 21, 12];
/// Under Miri, still 4 KiB granules (the tests' ranges exercise the same slots, blocks and
/// chains), but a 4,096-slot top and 1,024-slot tables: Miri interprets every slot a test
/// creates or walks, and the 65,536-slot top made each invariant check take a minute.
#[cfg(all(miri, not(loom)))]
pub(super) const SHIFT: [u32; LEVELS] = [52, 42, 32, 22, 12];
/// Under loom, the same five levels scaled down to a 16-slot top and 4-slot tables (granules of
/// 2^52 bytes), so that a model creates tens of atomics, not hundreds of thousands.
#[cfg(loom)]
pub(super) const SHIFT: [u32; LEVELS] = [60, 58, 56, 54, 52];
pub(super) const LEVELS: usize = 5;
/// The level whose slots are granules (a range may cover them in part).
pub(super) const LEAF: usize = LEVELS - 1;
/// The level of the readers' near hint: tables whose slots are leaf tables' blocks (1 GiB).
pub(super) const NEAR: usize = LEAF - 1;
pub(super) const TOP_SLOTS: usize = 1 << (usize::BITS - SHIFT[0]);
pub(super) const FAN: usize = 1 << (SHIFT[0] - SHIFT[1]);

const _: () = {
    // The lookup walk is unrolled for exactly these levels.
    assert!(LEVELS == 5);
    let mut l = 1;
    while l < LEVELS {
        assert!(SHIFT[l - 1] - SHIFT[l] == SHIFT[0] - SHIFT[1]);
        l += 1;
    }
};

/// Slot tags (low two bits; every slab element is at least 16-byte aligned).
pub(super) const EMPTY: usize = 0;
pub(super) const REC: usize = 1;
pub(super) const TAB: usize = 2;
pub(super) const BUCKET: usize = 3;
const TAG: usize = 3;

/// Index of the slot holding `addr` in a table of level `l`.
#[inline(always)]
pub(super) const fn index(l: usize, addr: usize) -> usize {
    if l == 0 {
        addr >> SHIFT[0]
    } else {
        (addr >> SHIFT[l]) & (FAN - 1)
    }
}

/// A table of levels 1 to 4. `used` counts non-empty slots (writer only), so an empty table can
/// be unlinked and recycled.
#[repr(C, align(64))]
pub(super) struct Table {
    pub(super) used: AtomicUsize,
    /// First address of the block the table stands for, `| level` (lets a reader check that a
    /// table it reached through the hint still stands for its pointer's region).
    pub(super) base: AtomicUsize,
    pub(super) slots: [AtomicUsize; FAN],
}

impl Fresh for Table {
    fn fresh() -> Self {
        Table {
            used: AtomicUsize::new(0),
            base: AtomicUsize::new(0),
            slots: atomic_array![AtomicUsize::new(EMPTY); FAN],
        }
    }
}

/// The top table, allocated on the first insert and kept until the registry drops.
pub(super) struct Top {
    pub(super) slots: [AtomicUsize; TOP_SLOTS],
}

/// Records per bucket: 128 bytes with the header.
pub(super) const BUCKET_CAP: usize = 13;

/// The ranges touching one shared granule: a chain of immutable buckets. The writer replaces a
/// granule's whole chain to change it and recycles the old one, bumping each bucket's version.
#[repr(C, align(128))]
pub(super) struct Bucket {
    pub(super) version: AtomicU64,
    pub(super) len: AtomicUsize,
    pub(super) next: AtomicPtr<Bucket>,
    pub(super) recs: [AtomicPtr<Record>; BUCKET_CAP],
}

impl Fresh for Bucket {
    fn fresh() -> Self {
        Bucket {
            version: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            next: AtomicPtr::new(ptr::null_mut()),
            recs: atomic_array![AtomicPtr::new(ptr::null_mut()); BUCKET_CAP],
        }
    }
}

impl Bucket {
    /// Writer: fills a bucket no slot links.
    pub(super) fn store(&self, recs: &[Ptr<Record>], next: Option<Ptr<Bucket>>) {
        let v = self.version.load(Relaxed);
        self.version.store(v.wrapping_add(1), Relaxed);
        fence(Release);
        self.len.store(recs.len(), Relaxed);
        for (slot, r) in self.recs.iter().zip(recs) {
            slot.store(r.as_mut_ptr(), Release);
        }
        self.next
            .store(next.map_or(ptr::null_mut(), |p| p.as_mut_ptr()), Release);
        self.version.store(v.wrapping_add(2), Release);
    }

    /// Writer: when this chain lists exactly two records and `r` is one of them, the other.
    pub(super) fn other_of_pair(&self, r: Ptr<Record>) -> Option<Ptr<Record>> {
        if self.len.load(Relaxed) != 2 || !self.next.load(Relaxed).is_null() {
            return None;
        }
        let (a, b) = (self.recs[0].load(Relaxed), self.recs[1].load(Relaxed));
        let r = r.as_mut_ptr();
        match (a == r, b == r) {
            (true, false) => Ptr::new(b),
            (false, true) => Ptr::new(a),
            _ => None,
        }
    }

    /// Writer: takes `r` out of this linked bucket in place (its entry becomes null, which
    /// readers skip), inside a version bump, so that a reader of the bucket meanwhile retries.
    /// For a removal that cannot have the memory for a new chain: the chain keeps its length.
    pub(super) fn forget(&self, r: Ptr<Record>) {
        let v = self.version.load(Relaxed);
        self.version.store(v.wrapping_add(1), Relaxed);
        fence(Release);
        let n = self.len.load(Relaxed).min(BUCKET_CAP);
        for slot in &self.recs[..n] {
            if slot.load(Relaxed) == r.as_mut_ptr() {
                slot.store(ptr::null_mut(), Relaxed);
            }
        }
        self.version.store(v.wrapping_add(2), Release);
    }

    /// Writer: the records of a chain (read under the writer lock).
    pub(super) fn collect(&self, out: &mut Vec<Ptr<Record>>) {
        let mut b = self;
        loop {
            let n = b.len.load(Relaxed).min(BUCKET_CAP);
            out.extend(b.recs[..n].iter().filter_map(|r| Ptr::new(r.load(Relaxed))));
            match deref(b.next.load(Acquire)) {
                Some(next) => b = next,
                None => return,
            }
        }
    }
}

/// A slot value for `p` with tag `tag`.
#[inline(always)]
pub(super) fn slot_of<T>(p: Ptr<T>, tag: usize) -> usize {
    // Exposed: the pointer is rebuilt from the integer (what `as` does, said explicitly).
    p.as_mut_ptr().expose_provenance() | tag
}

#[inline(always)]
pub(super) const fn tag(slot: usize) -> usize {
    slot & TAG
}

/// The element a slot value points at, as a handle.
#[inline(always)]
pub(super) fn ptr_of<T>(slot: usize) -> Ptr<T> {
    Ptr::new(ptr::with_exposed_provenance_mut(slot & !TAG)).expect("non-empty slot")
}

/// Borrows the element a slot value or field points at.
#[inline(always)]
pub(super) fn deref<'a, T>(p: *mut T) -> Option<&'a T> {
    // SAFETY: pointer invariant (module doc): null or a slab element of type `T` that lives as
    // long as the registry, whose borrow bounds every use of the result; elements are all
    // atomics, so any contents are valid.
    unsafe { p.as_ref() }
}

#[inline(always)]
pub(super) fn target<'a, T>(slot: usize) -> &'a T {
    // SAFETY: the callers have checked the tag, and the writer stores a tag only with a non-null
    // slab element (pointer invariant, module doc), which lives as long as the registry whose
    // borrow bounds every use; elements are all atomics, so any contents are valid. (No null
    // check here: it cost two instructions per level on every lookup.)
    unsafe { &*ptr::with_exposed_provenance::<T>(slot & !TAG) }
}

/// Why a walk stopped.
pub(super) enum Found {
    Hit(RawRecord),
    Miss,
    /// A concurrent rewrite was seen: start again.
    Retry,
}

/// The range containing `ptr`, lock-free. Retries only when the writer made progress. `hints`
/// are the level-1 and level-3 ([`NEAR`]) tables the writer last linked: a pointer in the
/// region of one skips the levels above it.
#[inline(always)]
pub(super) fn find(top: &AtomicPtr<Top>, hints: Hints<'_>, ptr: usize) -> Option<RawRecord> {
    // The first walk inline, the retries out of line: a loop here would keep the walk's
    // indices live across it, and the spills cost the common case more than the walk itself.
    match walk(top, hints, ptr) {
        Found::Hit(r) => Some(r),
        Found::Miss => None,
        Found::Retry => find_again(top, hints, ptr),
    }
}

/// The readers' hints: a level-1 table and a level-[`NEAR`] table, or null.
pub(super) type Hints<'a> = [&'a AtomicPtr<Table>; 2];

/// [`find`] after a walk saw a concurrent rewrite.
#[cold]
#[inline(never)]
fn find_again(top: &AtomicPtr<Top>, hints: Hints<'_>, ptr: usize) -> Option<RawRecord> {
    loop {
        spin_loop();
        match walk(top, hints, ptr) {
            Found::Hit(r) => return Some(r),
            Found::Miss => return None,
            Found::Retry => {}
        }
    }
}

/// The table of level `l` reached through a hint, if it (still) stands for `ptr`'s block.
/// A stale hint (its table freed, or reused elsewhere) is like a stale table on the walk: what
/// it yields is validated as any other read.
#[inline(always)]
fn hinted<'a>(hint: &AtomicPtr<Table>, l: usize, ptr: usize) -> Option<&'a Table> {
    let block = ptr & !((1usize << SHIFT[l - 1]) - 1);
    // Acquire: a table built aside gets its base after it is filled; seeing that base must mean
    // seeing the fill (the hint pointer's own Acquire may have paired with an older store).
    deref::<Table>(hint.load(Acquire)).filter(|t| t.base.load(Acquire) == block | l)
}

#[inline(always)]
fn walk(top: &AtomicPtr<Top>, hints: Hints<'_>, ptr: usize) -> Found {
    let (mut at, mut slot);
    // The levels below the top, unrolled: constant shifts, no bounds checks.
    macro_rules! step {
        ($l:expr) => {
            if tag(slot) == TAB {
                at = &target::<Table>(slot).slots[(ptr >> SHIFT[$l]) & (FAN - 1)];
                slot = at.load(Acquire);
            }
        };
    }
    if let Some(near) = hinted(hints[1], NEAR, ptr) {
        at = &near.slots[index(NEAR, ptr)];
        slot = at.load(Acquire);
    } else {
        if let Some(h) = hinted(hints[0], 1, ptr) {
            at = &h.slots[index(1, ptr)];
            slot = at.load(Acquire);
        } else {
            let Some(top) = deref(top.load(Acquire)) else {
                return Found::Miss;
            };
            at = &top.slots[index(0, ptr)];
            slot = at.load(Acquire);
            if tag(slot) == TAB {
                at = &target::<Table>(slot).slots[index(1, ptr)];
                slot = at.load(Acquire);
            }
        }
        step!(2);
        step!(3);
    }
    step!(4);
    if tag(slot) == TAB {
        // A table where none can be: the path was rebuilt under us.
        return Found::Retry;
    }
    // One record read for both kinds of granule, so the copy is made once, straight into what
    // the caller returns (two read sites made the compiler stage it and copy it again).
    let rec = match tag(slot) {
        REC => target::<Record>(slot),
        BUCKET => {
            let head = target::<Bucket>(slot);
            match scan(head, ptr) {
                Scan::Holds(rec) => rec,
                Scan::Miss(v) => return still_linked(at, slot, &head.version, v),
                Scan::Retry => return Found::Retry,
            }
        }
        _ => return Found::Miss,
    };
    match rec.read() {
        // A consistent copy containing `ptr` was live when the slot was loaded (a chain's
        // record read again here: if it was recycled since, it no longer holds `ptr`, or it
        // holds it as a newer range, which is as good an answer).
        Some(r) if r.contains(ptr) => Found::Hit(r),
        Some(r) if tag(slot) == REC => still_linked(at, slot, &rec.version, r.version),
        _ => Found::Retry,
    }
}

/// A miss read in a granule is an answer only if the granule still holds what was read: the same
/// slot value, naming an element not rewritten since. (A record or chain is immutable while
/// linked, so what was read was then the granule's content throughout.) Otherwise the element
/// may have been recycled under the reader while the range it described lives on elsewhere.
#[inline(always)]
fn still_linked(at: &AtomicUsize, slot: usize, version: &AtomicU64, seen: u64) -> Found {
    // Acquire fence: the reloads below happen after every load of the walk.
    fence(Acquire);
    if at.load(Relaxed) == slot && version.load(Relaxed) == seen {
        Found::Miss
    } else {
        Found::Retry
    }
}

/// What a shared granule's chain says about `ptr`.
enum Scan<'a> {
    /// This record held `ptr` in a consistent read.
    Holds(&'a Record),
    /// No record holds it; the head's version when the chain was read.
    Miss(u64),
    Retry,
}

/// Looks for `ptr` in a shared granule's chain.
#[cold]
fn scan(head: &Bucket, ptr: usize) -> Scan<'_> {
    let mut b = head;
    let mut head_version = None;
    loop {
        let v = b.version.load(Acquire);
        if v & 1 != 0 {
            return Scan::Retry;
        }
        let n = b.len.load(Relaxed).min(BUCKET_CAP);
        for r in &b.recs[..n] {
            let Some(rec) = deref(r.load(Acquire)) else {
                continue;
            };
            match rec.read() {
                // A consistent copy containing `ptr` was live when the chain was linked.
                Some(raw) if raw.contains(ptr) => return Scan::Holds(rec),
                Some(_) => {}
                None => return Scan::Retry,
            }
        }
        let next = b.next.load(Acquire);
        fence(Acquire);
        if b.version.load(Relaxed) != v {
            return Scan::Retry;
        }
        let hv = *head_version.get_or_insert(v);
        match deref(next) {
            Some(n) => b = n,
            None => return Scan::Miss(hv),
        }
    }
}
