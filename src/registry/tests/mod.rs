//! Registry tests: edge cases, a model-based random test, and a reader/writer race.
#![deny(unsafe_code)]

mod concurrency;
mod edges;
mod model;

use super::{tree, Allocation, Registry};
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
    /// Internal levels above the leaves of the copy readers use.
    pub(super) fn height(&self) -> usize {
        let _w = self.writer.lock();
        self.read.roots[0].height()
    }

    /// Asserts every invariant: both copies are valid trees with identical entries, ranges do not
    /// overlap, counters match, and no node or record leaked.
    pub(super) fn check(&self) {
        let w = self.writer.lock();
        let (a, na) = tree::check(&self.read.roots[0]);
        let (b, nb) = tree::check(&self.read.roots[1]);
        assert_eq!(a, b, "the two copies differ");
        let (count, recs, nodes) = w.counts();
        assert_eq!(a.len(), count, "count");
        assert_eq!(self.len(), count, "published count");
        assert_eq!(recs, count, "record leak");
        assert_eq!(nodes, na + nb, "node leak");
        drop(w);
        let all = self.snapshot();
        assert_eq!(all.len(), a.len());
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
        assert_eq!(
            self.live_bytes() as u128,
            bytes.min(usize::MAX as u128),
            "live bytes"
        );
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
        seq: 0,
    }
}
