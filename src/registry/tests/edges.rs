//! Edge cases, one behaviour per test.

use super::alloc;
use crate::registry::{Allocation, InsertOutcome, Registry, Removed};

const MAX: usize = usize::MAX;

/// Compile-time check that the registry can be a `static`.
static GLOBAL: Registry = Registry::new();

#[test]
fn registry_static_insert_lookup() {
    GLOBAL.insert(alloc(0x1000, 0x100, 1));
    assert_eq!(GLOBAL.lookup(0x10ff).map(|a| a.start), Some(0x1000));
    assert_eq!(
        GLOBAL.remove_allocation(0x1000).map(|a| a.size),
        Some(0x100)
    );
    assert!(GLOBAL.is_empty());
}

#[test]
fn registry_empty_lookups_find_nothing() {
    let r = Registry::new();
    assert!(r.is_empty());
    assert_eq!(r.len(), 0);
    for p in [0, 1, 0x1000, MAX] {
        assert_eq!(r.lookup(p), None);
        assert_eq!(r.lookup_span(p, 8), None);
    }
    assert_eq!(r.remove_allocation(0), None);
    assert_eq!(r.remove(0, MAX), Removed::default());
    r.check();
}

#[test]
fn registry_lookup_boundaries() {
    let r = Registry::new();
    let out = r.insert(alloc(100, 50, 7));
    assert_eq!(
        out,
        InsertOutcome {
            seq: Some(1),
            overwritten: 0,
            size: 50
        }
    );
    let found = r.lookup(100).expect("start is inside");
    assert_eq!(
        found,
        crate::registry::Allocation {
            seq: 1,
            ..alloc(100, 50, 7)
        }
    );
    assert_eq!(r.lookup(149).map(|a| a.start), Some(100));
    assert_eq!(r.lookup(99), None);
    assert_eq!(r.lookup(150), None);
    assert!(!r.is_empty());
    assert_eq!(r.live_bytes(), 50);
}

#[test]
fn registry_size_zero_inserts_nothing() {
    let r = Registry::new();
    assert_eq!(r.insert(alloc(100, 0, 1)), InsertOutcome::default());
    assert!(r.is_empty());
    assert_eq!(r.remove(100, 0), Removed::default());
    // Seq numbers are only used by real inserts.
    assert_eq!(r.insert(alloc(100, 1, 1)).seq, Some(1));
}

#[test]
fn registry_replace_counts_missed_free() {
    let r = Registry::new();
    r.insert(alloc(0x1000, 0x100, 1));
    // A pool hands the same address out again: the old range is replaced, one missed free.
    let out = r.insert(alloc(0x1000, 0x80, 2));
    assert_eq!(out.overwritten, 1);
    assert_eq!(r.missed_frees(), 1);
    let a = r.lookup(0x1000).unwrap();
    assert_eq!((a.size, a.pool, a.seq), (0x80, 2, 2));
    // Only the overlapped part is replaced; the old range's tail stays, trimmed.
    let tail = r.lookup(0x1080).unwrap();
    assert_eq!(
        (tail.start, tail.size, tail.pool, tail.seq),
        (0x1080, 0x80, 1, 1)
    );
    assert_eq!(r.len(), 2);
    // Same start and size: a plain replacement.
    assert_eq!(r.insert(alloc(0x1080, 0x80, 3)).overwritten, 1);
    assert_eq!(r.missed_frees(), 2);
    assert_eq!(r.len(), 2);
    r.check();
}

#[test]
fn registry_insert_over_several_trims_and_counts_each() {
    let r = Registry::new();
    r.insert(alloc(0, 100, 1)); // trimmed to [0, 50)
    r.insert(alloc(100, 10, 2)); // swallowed
    r.insert(alloc(120, 100, 3)); // trimmed to [180, 220)
    let out = r.insert(alloc(50, 130, 4));
    assert_eq!(out.overwritten, 3);
    assert_eq!(r.missed_frees(), 3);
    let starts: Vec<_> = r
        .snapshot()
        .iter()
        .map(|a| (a.start, a.size, a.pool))
        .collect();
    assert_eq!(starts, vec![(0, 50, 1), (50, 130, 4), (180, 40, 3)]);
    assert_eq!(r.live_bytes(), 220);
    r.check();
}

#[test]
fn registry_insert_inside_splits_old_range() {
    let r = Registry::new();
    r.insert(alloc(0, 100, 1));
    r.insert(alloc(40, 20, 2));
    let v: Vec<_> = r
        .snapshot()
        .iter()
        .map(|a| (a.start, a.size, a.seq))
        .collect();
    assert_eq!(v, vec![(0, 40, 1), (40, 20, 2), (60, 40, 1)]);
    assert_eq!(r.missed_frees(), 1);
    r.check();
}

#[test]
fn registry_partial_remove_splits() {
    let r = Registry::new();
    r.insert(alloc(0x10000, 0x4000, 9));
    let mut pieces = Vec::new();
    let rm = r.remove_with(0x11000, 0x1000, |a| pieces.push(a));
    assert_eq!(
        rm,
        Removed {
            whole: 0,
            partial: 1,
            bytes: 0x1000
        }
    );
    assert_eq!(pieces.len(), 1);
    assert_eq!(
        (pieces[0].start, pieces[0].size, pieces[0].pool),
        (0x11000, 0x1000, 9)
    );
    let v: Vec<_> = r
        .snapshot()
        .iter()
        .map(|a| (a.start, a.size, a.seq, a.pool))
        .collect();
    assert_eq!(v, vec![(0x10000, 0x1000, 1, 9), (0x12000, 0x2000, 1, 9)]);
    assert_eq!(r.lookup(0x11800), None);
    assert_eq!(r.missed_frees(), 0, "a remove is not a missed free");
    r.check();
}

#[test]
fn registry_remove_span_over_several() {
    let r = Registry::new();
    r.insert(alloc(0, 10, 1));
    r.insert(alloc(10, 10, 2));
    r.insert(alloc(30, 10, 3));
    let rm = r.remove(5, 30);
    assert_eq!(
        rm,
        Removed {
            whole: 1,
            partial: 2,
            bytes: 5 + 10 + 5
        }
    );
    let v: Vec<_> = r.snapshot().iter().map(|a| (a.start, a.size)).collect();
    assert_eq!(v, vec![(0, 5), (35, 5)]);
    r.check();
}

#[test]
fn registry_remove_allocation_needs_exact_start() {
    let r = Registry::new();
    r.insert(alloc(0x2000, 0x100, 1));
    assert_eq!(r.remove_allocation(0x2010), None);
    assert_eq!(r.len(), 1);
    let a = r.remove_allocation(0x2000).unwrap();
    assert_eq!((a.start, a.size), (0x2000, 0x100));
    assert!(r.is_empty());
    assert_eq!(r.live_bytes(), 0);
    r.check();
}

#[test]
fn registry_lookup_span_crossing_adjacent_ranges_not_found() {
    let r = Registry::new();
    r.insert(alloc(0x1000, 0x1000, 1));
    r.insert(alloc(0x2000, 0x1000, 2));
    assert_eq!(r.lookup_span(0x1800, 0x800).map(|a| a.pool), Some(1));
    assert_eq!(
        r.lookup_span(0x1800, 0x801),
        None,
        "crosses into the next range"
    );
    assert_eq!(r.lookup_span(0x1fff, 2), None);
    assert_eq!(r.lookup_span(0x2000, 0x1000).map(|a| a.pool), Some(2));
    assert_eq!(r.lookup_span(0x2000, 0), r.lookup(0x2000));
    assert_eq!(r.lookup_span(0x2fff, 2), None, "runs past the end");
    assert_eq!(r.lookup_span(0x2fff, MAX), None, "end overflows");
}

#[test]
fn registry_purge_by_device() {
    let r = Registry::new();
    for i in 0..100usize {
        let mut a = alloc(i * 0x100, 0x80, i as u64);
        a.device = (i % 3) as i32;
        r.insert(a);
    }
    let mut purged = Vec::new();
    let n = r.purge(|a| a.device == 1, |a| purged.push(a));
    assert_eq!(n, 33);
    assert_eq!(purged.len(), 33);
    assert!(purged.iter().all(|a| a.device == 1));
    assert!(
        purged.windows(2).all(|w| w[0].start < w[1].start),
        "address order"
    );
    assert_eq!(r.len(), 67);
    assert!(r.snapshot().iter().all(|a| a.device != 1));
    assert_eq!(r.lookup(0x100), None);
    assert_eq!(r.lookup(0x200).map(|a| a.device), Some(2));
    assert_eq!(r.purge(|_| false, |_| unreachable!()), 0);
    r.check();
}

#[test]
fn registry_callbacks_may_reenter() {
    let r = Registry::new();
    r.insert(alloc(0, 10, 1));
    r.insert(alloc(10, 10, 2));
    // `out` runs without the lock: writing from it must not deadlock.
    r.purge(
        |a| a.pool == 1,
        |a| {
            r.insert(alloc(a.start + 100, a.size, 3));
        },
    );
    r.remove_with(10, 5, |a| {
        r.insert(alloc(a.start + 200, a.size, 4));
    });
    r.for_each(|a| {
        assert!(r.lookup(a.start).is_some());
    });
    let v: Vec<_> = r.snapshot().iter().map(|a| (a.start, a.size)).collect();
    assert_eq!(v, vec![(15, 5), (100, 10), (210, 5)]);
    r.check();
}

#[test]
fn registry_address_zero() {
    let r = Registry::new();
    r.insert(alloc(0, 1, 1));
    assert_eq!(r.lookup(0).map(|a| a.size), Some(1));
    assert_eq!(r.lookup(1), None);
    r.insert(alloc(0, 16, 2));
    assert_eq!(r.missed_frees(), 1);
    assert_eq!(r.lookup_span(0, 16).map(|a| a.pool), Some(2));
    assert_eq!(r.remove(0, 1).bytes, 1);
    assert_eq!(r.lookup(0), None);
    assert_eq!(r.lookup(1).map(|a| a.start), Some(1));
    r.check();
}

#[test]
fn registry_top_of_address_space() {
    let r = Registry::new();
    let out = r.insert(alloc(MAX - 9, 10, 1));
    assert_eq!(out.size, 10);
    assert_eq!(r.lookup(MAX).map(|a| a.start), Some(MAX - 9));
    assert_eq!(r.lookup_span(MAX - 9, 10).map(|a| a.size), Some(10));
    // An end past the top is clipped.
    let out = r.insert(alloc(MAX - 4, 100, 2));
    assert_eq!((out.size, out.overwritten), (5, 1));
    assert_eq!(r.lookup(MAX).map(|a| (a.start, a.size)), Some((MAX - 4, 5)));
    let out = r.insert(alloc(MAX, MAX, 3));
    assert_eq!((out.size, out.overwritten), (1, 1));
    assert_eq!(r.lookup(MAX).map(|a| a.size), Some(1));
    assert_eq!(r.remove(MAX - 1, MAX).bytes, 2);
    assert_eq!(r.lookup(MAX), None);
    assert_eq!(r.lookup(MAX - 2).map(|a| a.start), Some(MAX - 4));
    assert_eq!(r.lookup(MAX - 5).map(|a| a.start), Some(MAX - 9));
    r.check();
}

#[test]
fn registry_whole_address_space() {
    let r = Registry::new();
    let out = r.insert(alloc(0, MAX, 1));
    assert_eq!(out.size, MAX);
    r.insert(alloc(MAX, 1, 2));
    assert_eq!(r.live_bytes(), MAX, "saturates");
    assert_eq!(r.lookup(MAX / 2).map(|a| a.pool), Some(1));
    assert_eq!(r.remove(0, MAX).bytes, MAX);
    assert_eq!(r.len(), 1);
    r.check();
}

#[test]
fn registry_grows_and_shrinks_without_leaks() {
    let r = Registry::new();
    let n = if cfg!(miri) { 64 } else { 50_000usize };
    // Interleaved order so splits and merges happen all over the tree.
    for i in (0..n).step_by(2).chain((1..n).step_by(2)) {
        r.insert(alloc(i * 64, 32, i as u64));
    }
    r.check();
    assert_eq!(r.len(), n);
    for i in 0..n {
        assert_eq!(r.lookup(i * 64 + 31).map(|a| a.start), Some(i * 64));
        assert_eq!(r.lookup(i * 64 + 32), None);
    }
    for i in (0..n).rev().step_by(3) {
        assert!(r.remove_allocation(i * 64).is_some());
    }
    r.check();
    for i in 0..n {
        r.remove_allocation(i * 64);
    }
    assert!(r.is_empty());
    r.check();
}

/// Closing empties the registry and refuses inserts under the writer lock, so an insert racing
/// with the uninstall that closes it (a hook that saw the registry attached just before) cannot
/// land after the clear and stay for good; opening takes inserts again. The flag moves with it.
#[test]
fn registry_closed_refuses_inserts_until_reopened() {
    use core::sync::atomic::{AtomicBool, Ordering};
    let r = Registry::new();
    let attached = AtomicBool::new(true);
    r.insert(alloc(0x10_0000, 0x1000, 1));
    assert!(r.set_open(&attached, false), "was attached");
    assert!(!attached.load(Ordering::Acquire));
    assert!(r.is_empty());
    assert_eq!(r.insert(alloc(0x20_0000, 0x1000, 2)).seq, None);
    assert_eq!(r.lookup(0x20_0000), None);
    assert!(!r.set_open(&attached, true), "was detached");
    assert!(r.insert(alloc(0x20_0000, 0x1000, 2)).seq.is_some());
    assert!(r.lookup(0x20_0000).is_some());
    r.check();
}

/// The free hooks keep a removed range encoded (`RemovedRecord`) and decode it only to tell
/// subscribers or to put it back: every field must come back as inserted, whichever way the
/// removal went (a shared edit in a lane, or the exclusive way), and an allocation encoded
/// directly (an unknown pointer's free) must decode to itself.
#[test]
fn registry_removed_record_keeps_every_field() {
    use crate::events::MemType;
    use crate::registry::RemovedRecord;
    use crate::stacks::StackId;
    let r = Registry::new();
    let full = |start: usize| Allocation {
        start,
        size: 0x1234,
        mem_type: MemType::CudaManaged,
        device: 3,
        flags: 0x8000_0011,
        pool: 0xdead_0000,
        stream: 0xbeef_0000,
        context: 0xc0de_0000,
        api: c"cuMemAllocManaged",
        stack: StackId(77),
        seq: 0,
    };
    // The first insert of a fresh registry goes the exclusive way (no table yet); the second,
    // in the same leaf, a shared one.
    for start in [0x7000_0000usize, 0x7000_4000] {
        let seq = r.insert(full(start)).seq.expect("inserted");
        let removed = r.remove_record(start).expect("found");
        assert_eq!(removed.allocation(), Allocation { seq, ..full(start) });
        r.insert(full(start));
    }
    let direct = RemovedRecord::from(&full(0x9000));
    assert_eq!(direct.allocation(), full(0x9000));
    assert!(format!("{direct:?}").contains("cuMemAllocManaged"));
    r.check();
}

/// A pool's packing (PyTorch's `cudaMallocAsync` mix at 512-byte steps): every range shares its
/// end granules with its neighbours, and the large ones cover hundreds of granules whole. Each
/// is found from every 512 bytes it covers, nothing is found past the last, and each removal,
/// in allocation order (a Python list freed) and then in reverse, leaves the others intact.
#[test]
fn registry_pool_packed_ranges_sharing_end_granules() {
    let r = Registry::new();
    let ranges = torch_packed();
    let at = ranges
        .last()
        .map_or(0, |&(start, size)| start + size.next_multiple_of(512));
    let found_all = |live: &[(usize, usize)]| {
        for &(start, size) in live {
            for p in (start..start + size).step_by(512).chain([start + size - 1]) {
                let a = r
                    .lookup(p)
                    .unwrap_or_else(|| panic!("{p:#x} in {start:#x}+{size}"));
                assert_eq!((a.start, a.size), (start, size), "at {p:#x}");
            }
        }
    };
    for order in [false, true] {
        for (k, &(start, size)) in ranges.iter().enumerate() {
            assert_eq!(r.insert(alloc(start, size, k as u64)).overwritten, 0);
        }
        r.check();
        found_all(&ranges);
        assert_eq!(r.lookup(at), None);
        let mut live = ranges.clone();
        while !live.is_empty() {
            let (start, size) = if order {
                live.pop()
            } else {
                Some(live.remove(0))
            }
            .unwrap();
            assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(size));
            assert_eq!(r.lookup(start), None);
            assert_eq!(r.lookup(start + size - 1), None);
            r.check();
            found_all(&live);
        }
        assert!(r.is_empty());
    }
}

/// `torch_threads.py`'s tensor sizes as PyTorch's `cudaMallocAsync` pool hands them out: each
/// at the next 512-byte boundary after the last, from 1.5 KiB into a granule, so that most
/// ranges share their end granules with a neighbour.
fn torch_packed() -> Vec<(usize, usize)> {
    torch_packed_from(0x7f12_3400_0000)
}

/// [`torch_packed`] from `base` (its first range 1.5 KiB past it).
fn torch_packed_from(base: usize) -> Vec<(usize, usize)> {
    const SIZES: [usize; 8] = [256, 4096, 65536, 1 << 20, 512, 16384, 262144, 2048];
    SIZES
        .iter()
        .scan(base + 3 * 512, |next, &size| {
            let start = *next;
            *next += size.next_multiple_of(512);
            Some((start, size))
        })
        .collect()
}

/// Issue 36: once the leaf exists and the thread's lane is stocked, the packed ranges'
/// inserts and removals (granules shared with a neighbour: chains built and taken apart) are
/// all shared edits, in either order. Before the shared edits could rebuild a chain, most of
/// these went the exclusive way (closing every thread's lanes); this fails then.
#[test]
fn registry_packed_pool_edits_stay_shared() {
    packed_edits_stay_shared(torch_packed());
}

/// The same with the pool's blocks laid out across a 2 MiB boundary, so that the 1 MiB one
/// lies in two leaf tables (each shared edit then holds both). Fails when such a range goes
/// the exclusive way.
#[test]
fn registry_packed_pool_edits_across_leaves_stay_shared() {
    // 512 KiB before a 2 MiB boundary: the 1 MiB range starts 70 KiB in and crosses it.
    let ranges = torch_packed_from(0x7f12_3420_0000 - 0x8_0000);
    let (start, size) = ranges[3];
    assert!(
        start >> 21 != (start + size - 1) >> 21,
        "{start:#x}+{size} crosses no boundary"
    );
    packed_edits_stay_shared(ranges);
}

fn packed_edits_stay_shared(ranges: Vec<(usize, usize)>) {
    use super::super::exclusive::EXCLUSIVE_EDITS;
    let r = Registry::new();
    // The pool's other blocks, live throughout, before and after the packed ones: its leaf
    // tables stay in use (emptying one and making it again are exclusive edits).
    let (first, (last, last_size)) = (ranges[0].0, ranges[ranges.len() - 1]);
    let keep = [(first - 8192, 4096), (last + last_size + 4096, 4096)];
    for (k, &(start, size)) in keep.iter().enumerate() {
        r.insert(alloc(start, size, 100 + k as u64));
    }
    let round = |reverse: bool| {
        for (k, &(start, size)) in ranges.iter().enumerate() {
            assert_eq!(r.insert(alloc(start, size, k as u64)).overwritten, 0);
        }
        let order: Vec<_> = if reverse {
            ranges.iter().rev().collect()
        } else {
            ranges.iter().collect()
        };
        for &&(start, size) in &order {
            assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(size));
        }
    };
    // The first rounds make the tables and stock the lane.
    round(false);
    round(true);
    EXCLUSIVE_EDITS.set(0);
    for k in 0..50 {
        round(k % 2 == 1);
        if k == 25 {
            // Halfway, with every range live: each found whole, the structure exact.
            for (k, &(start, size)) in ranges.iter().enumerate() {
                assert_eq!(r.insert(alloc(start, size, k as u64)).overwritten, 0);
            }
            // (The check's own exclusive walk is not counted.)
            let counted = EXCLUSIVE_EDITS.get();
            r.check();
            EXCLUSIVE_EDITS.set(counted);
            for &(start, size) in &ranges {
                for p in [start, start + size / 2, start + size - 1] {
                    let a = r.lookup(p).expect("live range found");
                    assert_eq!((a.start, a.size), (start, size), "at {p:#x}");
                }
                assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(size));
            }
        }
    }
    assert_eq!(EXCLUSIVE_EDITS.get(), 0, "exclusive edits in 50 rounds");
    r.check();
    for (start, size) in keep {
        assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(size));
    }
    assert!(r.is_empty());
}

/// Issue 36: a thread keeps its lane whatever the depth of the call in its stack. With the lane
/// picked from the stack's address, removals made 128 KiB or 256 KiB deeper than the inserts took
/// other lanes: the inserts' lane ran out of spare records, the removals' filled up, and every
/// few edits went the exclusive way to refill or drain them (PyTorch allocates and frees from
/// different depths). This fails then.
#[test]
fn registry_edits_keep_their_lane_at_any_stack_depth() {
    use super::super::exclusive::EXCLUSIVE_EDITS;
    use std::hint::black_box;
    /// Runs `f` `frames` frames of 16 KiB deeper in the stack.
    fn deeper(frames: usize, f: &mut dyn FnMut()) {
        let pad = black_box([0u8; 16 << 10]);
        if frames == 0 {
            f();
        } else {
            deeper(frames - 1, f);
        }
        black_box(pad[0]);
    }
    let r = Registry::new();
    let base = 0x7f12_3460_0000;
    // Keeps the leaf table in use while the ranges come and go.
    r.insert(alloc(base - 8192, 4096, 100));
    let ranges: Vec<usize> = (0..8).map(|k| base + k * 8192).collect();
    let round = |frames: usize| {
        for (k, &start) in ranges.iter().enumerate() {
            r.insert(alloc(start, 4096, k as u64));
        }
        deeper(frames, &mut || {
            for &start in &ranges {
                assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(4096));
            }
        });
    };
    // The first rounds make the tables and stock the lane.
    round(0);
    round(0);
    EXCLUSIVE_EDITS.set(0);
    for k in 0..100 {
        round(8 + 8 * (k % 2));
    }
    assert_eq!(
        EXCLUSIVE_EDITS.get(),
        0,
        "exclusive edits in 1,600 shared ones"
    );
}

/// A pool whose blocks move between 2 MiB blocks (as the CUDA pool's do under PyTorch): each
/// block's ranges are all freed, then the pool allocates in the next block, and comes back.
/// Each leaf table was freed once it emptied (at the next exclusive edit, which a second leaf
/// emptied through the lane forced), so the pool found it missing when it came back, and made
/// it again by an exclusive edit, closing every thread's lanes: now a lane notes a few emptied
/// leaves, and an insert makes a missing leaf as a shared edit, from the lane's spare tables.
#[test]
fn registry_leaf_tables_made_again_are_shared_edits() {
    use super::super::exclusive::EXCLUSIVE_EDITS;
    let r = Registry::new();
    let blocks = [0x7f22_0000_0000usize, 0x7f22_0020_0000, 0x7f22_0040_0000];
    // Keeps the level-3 table in use while the leaves come and go.
    r.insert(alloc(0x7f22_01f0_0000, 4096, 100));
    let round = |block: usize| {
        let ranges: Vec<usize> = (0..8).map(|k| block + k * 0x3_0000 + 512).collect();
        for (k, &start) in ranges.iter().enumerate() {
            r.insert(alloc(start, 0x2_0000, k as u64));
        }
        for &start in &ranges {
            assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(0x2_0000));
        }
    };
    // The first rounds make the tables and stock the lane.
    for &b in &blocks {
        round(b);
    }
    EXCLUSIVE_EDITS.set(0);
    const ROUNDS: usize = 60;
    for k in 0..ROUNDS {
        round(blocks[k % blocks.len()]);
    }
    let exclusive = EXCLUSIVE_EDITS.get();
    r.check();
    // 60 before (one a round: a leaf made again, or a second leaf emptied), 32 with the leaves
    // made as shared edits but one emptied leaf noted per lane.
    assert_eq!(
        exclusive, 0,
        "exclusive edits in {ROUNDS} rounds of 16 edits"
    );
}

/// The same with ranges crossing 2 MiB boundaries (a pool's 1 MiB blocks): each round, at one
/// of two boundaries, a range across it and one on each side, all then freed, which empties
/// both leaf tables. A crossing range's removal that emptied a leaf went the exclusive way, and
/// so, once that freed the leaf, did the next insert across that boundary: now the removal
/// notes the leaves it empties as any shared removal does.
#[test]
fn registry_leaves_emptied_across_a_boundary_stay_shared() {
    use super::super::exclusive::EXCLUSIVE_EDITS;
    const LEAF: usize = 2 << 20;
    let r = Registry::new();
    let boundaries = [0x7f24_0000_0000usize + LEAF, 0x7f24_0000_0000 + 3 * LEAF];
    // Keeps the level-3 table in use while the leaves come and go.
    r.insert(alloc(0x7f24_0000_0000 + 100 * LEAF, 4096, 100));
    let round = |boundary: usize| {
        let ranges = [
            (boundary - (256 << 10), 1 << 20),
            (boundary - (512 << 10), 4096),
            (boundary + (768 << 10), 4096),
        ];
        for (k, &(start, size)) in ranges.iter().enumerate() {
            r.insert(alloc(start, size, k as u64));
        }
        for &(start, size) in &ranges {
            assert_eq!(r.remove_allocation(start).map(|a| a.size), Some(size));
        }
    };
    for &b in &boundaries {
        round(b);
    }
    EXCLUSIVE_EDITS.set(0);
    const ROUNDS: usize = 40;
    for k in 0..ROUNDS {
        round(boundaries[k % 2]);
    }
    let exclusive = EXCLUSIVE_EDITS.get();
    r.check();
    assert_eq!(
        exclusive, 0,
        "exclusive edits in {ROUNDS} rounds of 6 edits"
    );
}

/// Threads that edit at once each get a lane of their own (up to the number of lanes), whatever
/// their stacks' addresses: lanes picked by hashing the thread pointer put two of eight Python
/// threads on one lane in about half the processes (two of sixteen almost always), and the two
/// then took turns with its spares and its cached leaf. In a process of its own, so that the
/// lanes are handed to these threads alone (a fork of the test process, which this test used
/// before, hung under qemu-user in CI), and each thread stays alive until all have picked.
#[test]
#[cfg_attr(miri, ignore = "starts a process, which Miri does not run")]
fn registry_threads_editing_at_once_have_lanes_of_their_own() {
    use super::super::lanes::LANES;
    use std::sync::{Barrier, Mutex};
    let path = concat!(
        module_path!(),
        "::registry_threads_editing_at_once_have_lanes_of_their_own"
    );
    if let Some(passed) = cuhook_fixtures::alone(path, std::time::Duration::from_secs(120)) {
        assert!(
            passed,
            "in a process of its own, {LANES} threads shared lanes"
        );
        return;
    }
    let r = Registry::new();
    let picked = Mutex::new(Vec::new());
    let all = Barrier::new(LANES);
    std::thread::scope(|s| {
        for t in 0..LANES {
            let (r, picked, all) = (&r, &picked, &all);
            s.spawn(move || {
                let start = 0x7f40_0000_0000 + t * (2 << 20);
                r.insert(alloc(start, 4096, t as u64));
                assert!(r.remove_allocation(start).is_some());
                picked.lock().unwrap().push(r.lanes.own_index());
                all.wait();
            });
        }
    });
    let mut lanes = picked.into_inner().unwrap();
    lanes.sort_unstable();
    lanes.dedup();
    assert_eq!(
        lanes.len(),
        LANES,
        "{LANES} threads took only lanes {lanes:?}"
    );
}
