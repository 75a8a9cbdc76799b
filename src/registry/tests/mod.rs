//! Registry tests: edge cases, a model-based random test, reader/writer races, and fork.
#![deny(unsafe_code)]

mod concurrency;
mod edges;
mod fork;
mod model;

use core::sync::atomic::{
    AtomicUsize,
    Ordering::{Acquire, Relaxed},
};

use super::record::Record;
use super::table::{
    deref, index, slot_of, tag, target, Bucket, Table, BUCKET, BUCKET_CAP, EMPTY, LEAF, NEAR, REC,
    SHIFT, TAB,
};
use super::{Allocation, Registry};
use crate::events::MemType;

/// splitmix64: tiny, seedable, good enough to drive random operation sequences.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub(super) const APIS: [&core::ffi::CStr; 4] = [
    c"cuMemAlloc_v2",
    c"cuMemAllocAsync",
    c"cudaMallocHost",
    c"cuMemMap",
];

pub(super) fn mem_type(n: u64) -> MemType {
    [
        MemType::Host,
        MemType::Cuda,
        MemType::CudaManaged,
        MemType::Unknown,
    ][(n % 4) as usize]
}

impl Registry {
    /// Shape of the page table: (tables in use, longest bucket chain), to tell how much of the
    /// structure a test exercised.
    pub(super) fn shape(&self) -> (usize, usize) {
        let w = self.exclusive();
        let (_, _, tables, _) = w.counts();
        drop(w);
        let mut longest = 0;
        self.walk_slots(&mut |_, _, _, v| {
            if tag(v) == BUCKET {
                let mut n = 0;
                let mut b = Some(target::<Bucket>(v));
                while let Some(x) = b {
                    n += 1;
                    b = deref(x.next.load(Relaxed));
                }
                longest = longest.max(n);
            }
        });
        (tables, longest)
    }

    /// Calls `f(level, block_lo, block_hi, slot value)` for every non-empty slot, under the lock.
    fn walk_slots(&self, f: &mut impl FnMut(usize, usize, usize, usize)) {
        let _w = self.exclusive();
        let Some(top) = deref(self.read.top.load(Acquire)) else {
            return;
        };
        fn rec(
            l: usize,
            base: usize,
            slots: &[AtomicUsize],
            f: &mut impl FnMut(usize, usize, usize, usize),
        ) {
            for (i, s) in slots.iter().enumerate() {
                let v = s.load(Relaxed);
                if v == EMPTY {
                    continue;
                }
                let lo = base + (i << SHIFT[l]);
                let hi = lo + ((1usize << SHIFT[l]) - 1);
                f(l, lo, hi, v);
                if tag(v) == TAB {
                    rec(l + 1, lo, &target::<Table>(v).slots, f);
                }
            }
        }
        rec(0, 0, &top.slots, f);
    }

    /// Asserts every invariant: each slot names exactly the ranges its block holds (a whole
    /// block one range covering it, a granule the ranges touching it), table counts match, no
    /// record, table or chain leaked, ranges do not overlap and the counters match.
    pub(super) fn check(&self) {
        let all = self.snapshot();
        let mut bytes = 0u128;
        for pair in all.windows(2) {
            assert!(
                pair[0].last() < pair[1].start,
                "overlap: {:?} {:?}",
                pair[0],
                pair[1]
            );
        }
        for r in &all {
            assert!(r.size >= 1);
            assert!(
                r.start.checked_add(r.size - 1).is_some(),
                "range passes the top"
            );
            bytes += r.size as u128;
        }
        assert_eq!(self.len(), all.len(), "published count");
        assert_eq!(
            self.live_bytes() as u128,
            bytes.min(usize::MAX as u128),
            "live bytes"
        );
        // Every slot against the ranges.
        let (mut tables, mut buckets) = (0, 0);
        let touching = |lo: usize, hi: usize| -> Vec<usize> {
            let i = all.partition_point(|a| a.last() < lo);
            all[i..]
                .iter()
                .take_while(|a| a.start <= hi)
                .map(|a| a.start)
                .collect()
        };
        let start_of = |v: usize| target::<Record>(v).get().start;
        let mut linked = 0u128;
        self.walk_slots(&mut |l, lo, hi, v| {
            let want = touching(lo, hi);
            match tag(v) {
                TAB => {
                    assert!(l < LEAF, "table at the leaf level");
                    tables += 1;
                    let t = target::<Table>(v);
                    let used = t.slots.iter().filter(|s| s.load(Relaxed) != EMPTY).count();
                    assert_eq!(t.used.load(Relaxed), used, "table count");
                    // Empty only as a leaf a shared removal left for the next exclusive edit.
                    assert!(
                        used > 0 || (l + 1 == LEAF && self.lanes.noted_empty(t)),
                        "empty table left linked"
                    );
                    assert!(!want.is_empty() || used == 0, "table over an empty block");
                    // Its block, or 0 for a table linked into one built aside (never a hint).
                    let base = t.base.load(Relaxed);
                    assert!(base == lo | (l + 1) || base == 0, "table base {base:#x}");
                }
                REC => {
                    let a = target::<Record>(v).get();
                    assert_eq!(want, vec![a.start], "slot {lo:#x}..={hi:#x} (level {l})");
                    if l < LEAF {
                        assert!(a.start <= lo && a.last() >= hi, "partial block as a record");
                    }
                    linked += (a.last().min(hi) - a.start.max(lo)) as u128 + 1;
                }
                BUCKET => {
                    assert_eq!(l, LEAF, "chain above the leaf level");
                    let mut recs = Vec::new();
                    target::<Bucket>(v).collect(&mut recs);
                    let mut b = Some(target::<Bucket>(v));
                    while let Some(x) = b {
                        buckets += 1;
                        let n = x.len.load(Relaxed);
                        assert!((1..=BUCKET_CAP).contains(&n), "bucket length {n}");
                        b = deref(x.next.load(Relaxed));
                    }
                    let mut got: Vec<usize> =
                        recs.iter().map(|&p| start_of(slot_of(p, REC))).collect();
                    got.sort_unstable();
                    assert!(got.len() >= 2, "chain of fewer than two ranges");
                    assert_eq!(got, want, "granule {lo:#x}");
                    for &p in &recs {
                        let a = target::<Record>(slot_of(p, REC)).get();
                        linked += (a.last().min(hi) - a.start.max(lo)) as u128 + 1;
                    }
                }
                _ => unreachable!(),
            }
        });
        // The readers' hint names a linked level-1 table, if any.
        if let Some(h) = deref::<Table>(self.read.hint.load(Acquire)) {
            let base = h.base.load(Relaxed);
            assert_eq!(base & 7, 1, "hint is not a level-1 table");
            let top = deref::<super::table::Top>(self.read.top.load(Acquire)).expect("top");
            let v = top.slots[base >> SHIFT[0]].load(Relaxed);
            assert!(
                tag(v) == TAB && core::ptr::eq(target::<Table>(v), h),
                "hint not linked"
            );
        }
        // The near hint names a linked level-3 table, if any: the slot of its block, found by
        // walking from the top, holds it.
        if let Some(n) = deref::<Table>(self.read.near.load(Acquire)) {
            let base = n.base.load(Relaxed);
            assert_eq!(base & 7, NEAR, "near hint is not a level-{NEAR} table");
            let block = base & !7;
            let top = deref::<super::table::Top>(self.read.top.load(Acquire)).expect("top");
            let mut v = top.slots[index(0, block)].load(Relaxed);
            for l in 1..NEAR {
                assert_eq!(tag(v), TAB, "near hint's path broken at level {l}");
                v = target::<Table>(v).slots[index(l, block)].load(Relaxed);
            }
            assert!(
                tag(v) == TAB && core::ptr::eq(target::<Table>(v), n),
                "near hint not linked"
            );
        }
        // Every byte of every range is linked exactly once (slots do not overlap).
        assert_eq!(linked, bytes, "bytes linked");
        let w = self.exclusive();
        let (count, recs, live_tables, live_buckets) = w.counts();
        // The lanes' counts and their spare records, buckets and tables (handed out by the
        // slabs, linked nowhere).
        let count = count.wrapping_add(self.lanes.booked().0);
        let (spare_recs, spare_buckets, spare_tables) = self.lanes.spares();
        let (recs, live_buckets) = (recs - spare_recs, live_buckets - spare_buckets);
        let live_tables = live_tables - spare_tables;
        assert_eq!(count, all.len(), "count");
        assert_eq!(recs, count, "record leak");
        assert_eq!(live_tables, tables, "table leak");
        assert_eq!(live_buckets, buckets, "bucket leak");
    }
}

/// An allocation with every field set from `(start, size, tag)`.
pub(super) fn alloc(start: usize, size: usize, tag: u64) -> Allocation {
    Allocation {
        start,
        size,
        mem_type: mem_type(tag),
        device: (tag % 7) as i32 - 1,
        flags: (tag >> 3) as u32 & 0x7f,
        pool: tag as usize,
        stream: (tag as usize).rotate_left(17),
        context: !(tag as usize),
        api: APIS[(tag % 4) as usize],
        stack: crate::stacks::StackId((tag >> 40) as u32),
        seq: 0,
    }
}
