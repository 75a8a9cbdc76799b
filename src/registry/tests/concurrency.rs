//! Readers race writers. Every range a writer inserts carries a checksum of its original
//! `(start, size)` in its metadata; pieces of a trimmed or split range keep that metadata, so a
//! reader can tell a genuine (possibly trimmed) range from a torn or invented one.
//!
//! The address space is cut into windows: each window has a *permanent* range that no writer
//! touches, followed by a churn area. Permanent ranges sit in the same leaves as churned ones, so
//! splits and merges move them around all the time, and a reader must still find each of them,
//! exactly as inserted, on every lookup.
//!
//! Also run under ThreadSanitizer (all registry tests pass; it reports only races inside the
//! uninstrumented standard library's `Arc` and the test harness):
//! `RUSTFLAGS="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer" cargo +nightly test
//! --release --lib --target x86_64-unknown-linux-gnu registry_`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::{mem_type, Rng, APIS};
use crate::registry::{Allocation, Registry};

const BASE: usize = 1 << 32;
const WINDOW: usize = 4096;
const WINDOWS: usize = 2048;
const PERM: usize = 64;
/// Churn ranges live in `[window + CHURN, window + WINDOW)`.
const CHURN: usize = 128;

fn window(k: usize) -> usize {
    BASE + k * WINDOW
}

fn mix(start: usize, size: usize) -> u64 {
    let mut r = Rng::new((start as u64).rotate_left(32) ^ size as u64);
    r.next()
}

/// A churn range whose metadata is derived from `(start, size)`.
fn churn(start: usize, size: usize) -> Allocation {
    let m = mix(start, size);
    Allocation {
        start,
        size,
        mem_type: mem_type(m),
        device: (m % 8) as i32,
        flags: (m >> 8) as u32 & 0xff,
        pool: start,
        stream: size,
        context: m as usize,
        api: APIS[(m >> 16) as usize % APIS.len()],
        stack: crate::stacks::StackId((m >> 24) as u32),
        seq: 0,
    }
}

/// A permanent range (device -1 tells it apart from churn).
fn permanent(k: usize) -> Allocation {
    Allocation {
        device: -1,
        pool: k,
        ..Allocation::new(window(k), PERM, c"permanent")
    }
}

/// Panics unless `a` is a piece of a churn range that could have been inserted and holds `ptr`.
fn verify_churn(a: &Allocation, ptr: usize, len: usize) {
    let (start0, size0) = (a.pool, a.stream);
    let m = mix(start0, size0);
    assert_eq!(a.context, m as usize, "torn record: {a:?}");
    assert_eq!(a.device, (m % 8) as i32, "torn record: {a:?}");
    assert_eq!(a.flags, (m >> 8) as u32 & 0xff, "torn record: {a:?}");
    assert_eq!(a.mem_type, mem_type(m), "torn record: {a:?}");
    assert_eq!(
        a.api,
        APIS[(m >> 16) as usize % APIS.len()],
        "torn record: {a:?}"
    );
    assert!(
        a.size >= 1 && a.start >= start0 && a.last() < start0 + size0,
        "not a piece of its range: {a:?}"
    );
    assert!(a.seq >= 1, "no seq: {a:?}");
    let k = (start0 - BASE) / WINDOW;
    assert!(
        start0 >= window(k) + CHURN && start0 + size0 <= window(k + 1),
        "invented range: {a:?}"
    );
    assert!(
        a.contains(ptr) && a.contains(ptr + len.saturating_sub(1)),
        "{a:?} does not hold {ptr:#x}+{len}"
    );
}

fn writer(reg: &Registry, seed: u64, stop: &AtomicBool, ops: &AtomicU64) {
    let mut rng = Rng::new(seed);
    let mut recent = [0usize; 64];
    let mut n = 0u64;
    while !stop.load(Relaxed) {
        // Alternate growing and shrinking phases so the tree changes height.
        let growing = (n / 20_000).is_multiple_of(2);
        let k = rng.below(WINDOWS as u64) as usize;
        let start = window(k) + CHURN + rng.below((WINDOW - CHURN) as u64) as usize;
        let room = window(k + 1) - start;
        let size = 1 + rng.below(room.min(600) as u64) as usize;
        match rng.below(100) {
            r if r < if growing { 70 } else { 30 } => {
                let out = reg.insert(churn(start, size));
                assert!(out.seq.is_some() && out.size == size);
                recent[(n % 64) as usize] = start;
            }
            r if r < 85 => {
                reg.remove(start, size);
            }
            r if r < 99 || !n.is_multiple_of(3) => {
                reg.remove_allocation(recent[rng.below(64) as usize]);
            }
            _ => {
                let dev = rng.below(8) as i32;
                let lo = window(k);
                reg.purge(
                    |a| a.device == dev && a.start >= lo && a.start < lo + 8 * WINDOW,
                    |a| assert_eq!(a.device, dev),
                );
            }
        }
        n += 1;
    }
    ops.fetch_add(n, Relaxed);
}

fn reader(reg: &Registry, seed: u64, stop: &AtomicBool, found: &AtomicU64) {
    let mut rng = Rng::new(seed);
    let mut hits = 0u64;
    while !stop.load(Relaxed) {
        assert!(!reg.is_empty(), "permanent ranges are always there");
        let k = rng.below(WINDOWS as u64) as usize;
        if rng.chance(25) {
            let ptr = window(k) + rng.below(PERM as u64) as usize;
            let want = Allocation {
                seq: k as u64 + 1,
                ..permanent(k)
            };
            assert_eq!(
                reg.lookup(ptr),
                Some(want),
                "permanent range lost at {ptr:#x}"
            );
            let len = rng.below((window(k) + PERM - ptr) as u64 + 1) as usize;
            assert_eq!(
                reg.lookup_span(ptr, len),
                Some(want),
                "permanent span lost at {ptr:#x}+{len}"
            );
            continue;
        }
        let ptr = window(k) + CHURN + rng.below((WINDOW - CHURN) as u64) as usize;
        if let Some(a) = reg.lookup(ptr) {
            verify_churn(&a, ptr, 0);
            hits += 1;
        }
        let len = rng.below(256) as usize;
        if let Some(a) = reg.lookup_span(ptr, len) {
            verify_churn(&a, ptr, len);
        }
        // The gap between a permanent range and the churn area is never registered.
        assert_eq!(
            reg.lookup(window(k) + PERM + rng.below((CHURN - PERM) as u64) as usize),
            None
        );
    }
    found.fetch_add(hits, Relaxed);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_concurrent_readers_never_see_torn_entries() {
    let reg = Registry::new();
    for k in 0..WINDOWS {
        assert_eq!(reg.insert(permanent(k)).seq, Some(k as u64 + 1));
    }
    let stop = AtomicBool::new(false);
    let (ops, found) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for i in 0..2 {
            let (reg, stop, ops) = (&reg, &stop, &ops);
            s.spawn(move || writer(reg, 0xdead_0000 + i, stop, ops));
        }
        for i in 0..3 {
            let (reg, stop, found) = (&reg, &stop, &found);
            s.spawn(move || reader(reg, 0xbeef_0000 + i, stop, found));
        }
        let until = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Relaxed);
    });
    // The race only means something if both sides did work.
    assert!(
        ops.load(Relaxed) > 1000,
        "writers made {} ops",
        ops.load(Relaxed)
    );
    assert!(
        found.load(Relaxed) > 1000,
        "readers found {} churn ranges",
        found.load(Relaxed)
    );
    reg.check();
    for k in 0..WINDOWS {
        assert_eq!(reg.lookup(window(k)).map(|a| a.pool), Some(k));
    }
}

/// A range that is trimmed (a VMM unmap of part of it, an insert over part of it) keeps its other
/// bytes allocated throughout: a lookup there must never miss, while the trim rewrites the slots
/// around it (blocks turning into tables of pieces, granules getting new chains).
#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_trimmed_range_never_disappears() {
    const BASE: usize = 1 << 40;
    const SIZE: usize = 16 << 20;
    const KEEP: usize = 4 << 20;
    let reg = Registry::new();
    let whole = || Allocation::new(BASE, SIZE, c"cuMemMap");
    reg.insert(whole());
    // Odd while the writer replaces the whole range (then a miss is allowed).
    let epoch = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (trims, checked) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = Rng::new(0x7123);
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                if n % 64 == 63 {
                    epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    reg.insert(whole());
                    epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                } else {
                    let x = KEEP + rng.below((SIZE - KEEP) as u64) as usize;
                    let len = (1 + rng.below(2 << 20) as usize).min(SIZE - x);
                    reg.remove(BASE + x, len);
                    let mut filler = Allocation::new(BASE + x, len, c"filler");
                    filler.pool = 1;
                    assert_eq!(reg.insert(filler).overwritten, 0);
                    trims.fetch_add(1, Relaxed);
                }
                n += 1;
            }
        });
        for seed in 0..2 {
            let (reg, stop, epoch, checked) = (&reg, &stop, &epoch, &checked);
            s.spawn(move || {
                let mut rng = Rng::new(seed);
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    let ptr = BASE + rng.below(KEEP as u64) as usize;
                    let e1 = epoch.load(std::sync::atomic::Ordering::SeqCst);
                    let got = reg.lookup(ptr);
                    let e2 = epoch.load(std::sync::atomic::Ordering::SeqCst);
                    if e1 == e2 && e1 % 2 == 0 {
                        let a = got.unwrap_or_else(|| panic!("{ptr:#x} lost during a trim"));
                        assert_eq!((a.start, a.pool, a.api), (BASE, 0, c"cuMemMap"));
                        assert!(a.contains(ptr) && a.size >= KEEP);
                        n += 1;
                    }
                }
                checked.fetch_add(n, Relaxed);
            });
        }
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Relaxed);
    });
    assert!(trims.load(Relaxed) > 100, "{} trims", trims.load(Relaxed));
    assert!(checked.load(Relaxed) > 10_000);
    reg.check();
}

/// Shared edits (lanes) from several threads at once, beside exclusive ones in the same leaf
/// tables: each thread owns its addresses, checks every range it inserted is found whole until
/// it removes it and gone after, and the structure's counts are exact at the end (a slot taken
/// twice, a table count lost, or a table freed under a shared edit all show). Checked to fail
/// with a slot claimed by a plain store, and with a table's count kept by a load and a store.
#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_shared_and_exclusive_writers_side_by_side() {
    shared_and_exclusive_writers(4);
}

/// The same with more threads than lanes: threads share lanes, try the next ones, and go the
/// exclusive way when those are taken too.
#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_more_writers_than_lanes() {
    shared_and_exclusive_writers(24);
}

/// `threads` writers in groups of four, each group in its own four leaf tables (one range in
/// each keeps it in use, so that most removals can be shared edits), and one exclusive editor
/// in the first group's leaves.
fn shared_and_exclusive_writers(threads: usize) {
    const LEAF: usize = 1 << 21;
    let groups = threads.div_ceil(4);
    let reg = Registry::new();
    reg.prime();
    for b in 0..4 * groups {
        reg.insert(Allocation::new(
            BASE + b * LEAF + LEAF - 4096,
            4096,
            c"keep",
        ));
    }
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (reg, stop, ops) = (&reg, &stop, &ops);
            s.spawn(move || {
                let mut rng = Rng(0x5eed_0000 + t as u64);
                let (group, u) = (t / 4, t % 4);
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    // Granules next to the other threads' in one leaf, or a few in a row.
                    let leaf = BASE + (group * 4 + n as usize % 4) * LEAF;
                    let (start, size) = match rng.below(4) {
                        0 => (leaf + (u * 64 + rng.below(64) as usize) * 4096, 4096),
                        1 => (leaf + (u * 64 + rng.below(60) as usize) * 4096 + 512, 512),
                        // Granules the group's threads share, each its own 512 bytes of them.
                        2 => (leaf + (300 + rng.below(4) as usize) * 4096 + u * 512, 512),
                        _ => (leaf + 256 * 4096 + u * 16 * 4096, 3 * 4096 + 100),
                    };
                    let tag = mix(start, size);
                    let mut a = Allocation::new(start, size, c"shared");
                    a.pool = tag as usize;
                    if reg.insert(a).seq.is_none() {
                        continue;
                    }
                    let got = reg.lookup(start + size - 1).expect("own range found");
                    assert_eq!((got.start, got.size, got.pool), (start, size, tag as usize));
                    let gone = reg.remove_allocation(start).expect("own range removed");
                    assert_eq!((gone.start, gone.size), (start, size));
                    assert!(
                        reg.lookup(start).is_none_or(|g| g.start != start),
                        "removed range still found"
                    );
                    n += 1;
                }
                ops.fetch_add(n, Relaxed);
            });
        }
        // Exclusive edits in the same leaves: a range made and trimmed (a table built aside
        // and swapped in), and a range inserted over another (a missed free).
        let (reg, stop) = (&reg, &stop);
        s.spawn(move || {
            let mut k = 0usize;
            while !stop.load(Relaxed) {
                let leaf = BASE + (k % 4) * LEAF + 400 * 4096;
                reg.insert(Allocation::new(leaf, 16 * 4096, c"trimmed"));
                reg.remove(leaf + 4096, 4096);
                reg.insert(Allocation::new(leaf, 8 * 4096, c"over"));
                reg.remove(leaf, 16 * 4096);
                k += 1;
            }
        });
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Relaxed);
    });
    assert!(
        ops.load(Relaxed) > 1000,
        "shared edits: {}",
        ops.load(Relaxed)
    );
    assert_eq!(reg.len(), 4 * groups, "{:?}", reg.snapshot());
    reg.check();
}

/// Ranges crossing 2 MiB boundaries, inserted and removed by shared edits that hold both leaf
/// tables (the lower first), from threads whose boundaries are neighbours: each leaf is the
/// upper table of one thread's edits and the lower of the next one's, with a small range of its
/// own packed into the same end granules. Each thread checks its ranges found whole until
/// removed and gone after; the structure is exact at the end. A lock order that differed
/// between the two kinds of edit would hang here.
#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_ranges_across_leaves_side_by_side() {
    const LEAF: usize = 1 << 21;
    const THREADS: usize = 4;
    let reg = Registry::new();
    reg.prime();
    // One range in the middle of each leaf keeps it in use.
    for b in 0..=THREADS {
        reg.insert(Allocation::new(BASE + b * LEAF + LEAF / 2, 4096, c"keep"));
    }
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (reg, stop, ops) = (&reg, &stop, &ops);
            s.spawn(move || {
                let boundary = BASE + (t + 1) * LEAF;
                let mut rng = Rng(0x00ac_ce55 + t as u64);
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    // Across the boundary, and a neighbour in its lower end granule.
                    let below = 512 * (1 + rng.below(6) as usize);
                    let across = (
                        boundary - 4096 - below,
                        4096 + below + 512 * rng.below(7) as usize,
                    );
                    let beside = (across.0 - 512, 512);
                    round_trip(reg, &[across, beside], c"across");
                    n += 1;
                }
                ops.fetch_add(n, Relaxed);
            });
        }
        std::thread::sleep(Duration::from_millis(800));
        stop.store(true, Relaxed);
    });
    assert!(ops.load(Relaxed) > 1000, "rounds: {}", ops.load(Relaxed));
    assert_eq!(reg.len(), THREADS + 1);
    reg.check();
}

/// Leaf tables made by shared inserts and left empty by shared removals, from threads that
/// meet in the same four 2 MiB blocks (nothing else keeps those leaves in use; some ranges
/// cross from one block into the next, so an insert may make two leaves), while another
/// thread's exclusive edits free the emptied ones again: two inserts race to make one leaf, a
/// removal empties a leaf another thread is about to use, and a noted leaf is freed only if it
/// is still empty. Each thread checks its ranges found whole until removed and gone after; the
/// structure is exact at the end (a leaf linked twice, a table leaked or freed while linked).
#[test]
#[cfg_attr(
    miri,
    ignore = "timed stress: too slow interpreted (the loom models cover the race)"
)]
fn registry_leaves_made_and_emptied_side_by_side() {
    const LEAF: usize = 1 << 21;
    const THREADS: usize = 4;
    let reg = Registry::new();
    reg.prime();
    // Keeps the level-3 table above the four blocks in use.
    reg.insert(Allocation::new(BASE + 7 * LEAF, 4096, c"keep"));
    let stop = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (reg, stop, ops) = (&reg, &stop, &ops);
            s.spawn(move || {
                let mut rng = Rng(0x1eaf_0000 + t as u64);
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    let leaf = BASE + rng.below(4) as usize * LEAF;
                    let mut ranges: Vec<(usize, usize)> = (0..1 + rng.below(3) as usize)
                        .map(|k| (leaf + (32 + t * 64 + k * 8) * 4096 + 512, 4096 + 512 * k))
                        .collect();
                    // Threads 0–2 also cross "their" boundary (between blocks t and t + 1)
                    // every other round: its last and first three granules.
                    if t < 3 && rng.below(2) == 0 {
                        ranges.push((BASE + (t + 1) * LEAF - 3 * 4096 - 512, 6 * 4096));
                    }
                    round_trip(reg, &ranges, c"moving");
                    n += 1;
                }
                ops.fetch_add(n, Relaxed);
            });
        }
        // Exclusive edits beside them (a range over another: a missed free), each of which
        // first frees the leaves the lanes noted empty.
        let (reg, stop) = (&reg, &stop);
        s.spawn(move || {
            let at = BASE + 6 * LEAF;
            while !stop.load(Relaxed) {
                reg.insert(Allocation::new(at, 8192, c"under"));
                reg.insert(Allocation::new(at, 4096, c"over"));
                reg.remove(at, 8192);
                std::thread::yield_now();
            }
        });
        std::thread::sleep(Duration::from_millis(1000));
        stop.store(true, Relaxed);
    });
    assert!(ops.load(Relaxed) > 1000, "rounds: {}", ops.load(Relaxed));
    assert_eq!(reg.len(), 1, "{:?}", reg.snapshot());
    reg.check();
}

/// Inserts `ranges` (each must be linked), checks each found whole, then removes them in the
/// reverse order, checking each removed as inserted and no longer found.
fn round_trip(reg: &Registry, ranges: &[(usize, usize)], api: &'static core::ffi::CStr) {
    for &(start, size) in ranges {
        assert!(reg.insert(Allocation::new(start, size, api)).seq.is_some());
    }
    for &(start, size) in ranges {
        let got = reg.lookup(start + size - 1).expect("own range found");
        assert_eq!((got.start, got.size), (start, size));
    }
    for &(start, size) in ranges.iter().rev() {
        let gone = reg.remove_allocation(start).expect("own range removed");
        assert_eq!((gone.start, gone.size), (start, size));
        assert!(
            reg.lookup(start + size - 1).is_none(),
            "removed range found"
        );
    }
}
