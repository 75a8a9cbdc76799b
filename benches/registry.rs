//! Registry benchmarks: plain `Instant` loops, results in ns per operation.
//!
//! `cargo bench --bench registry` (`-- quick` for a shorter run, `-- 1t` to skip the two-thread
//! columns). Ranges are 4–32 KiB, one per 64 KiB slot, inserted in random order; every lookup
//! hits a live range. "hot" cycles through 256 pointers, "uniform" through 2^20 random ones.

use std::hint::black_box;
use std::time::Instant;

use cuhook::registry::{Allocation, Registry};

const BASE: usize = 0x7f00_0000_0000;
const SLOT: usize = 1 << 16;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn size_of_slot(i: usize) -> usize {
    4096 + (i * 2654435761) % (28 * 1024)
}

fn build(n: usize) -> Registry {
    let reg = Registry::new();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(n as u64);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    for i in order {
        let mut a = Allocation::new(BASE + i * SLOT, size_of_slot(i), c"cuMemAlloc_v2");
        a.device = 0;
        reg.insert(a);
    }
    assert_eq!(reg.len(), n);
    reg
}

/// `count` pointers, each inside a random live range.
fn pointers(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let i = rng.below(n);
            BASE + i * SLOT + rng.below(size_of_slot(i))
        })
        .collect()
}

/// ns per lookup over `total` lookups cycling through `ptrs`.
fn lookups(reg: &Registry, ptrs: &[usize], total: usize) -> f64 {
    let mut found = 0usize;
    let t = Instant::now();
    let mut done = 0;
    while done < total {
        for &p in ptrs {
            found += black_box(reg.lookup(black_box(p))).is_some() as usize;
        }
        done += ptrs.len();
    }
    let ns = t.elapsed().as_nanos() as f64 / done as f64;
    assert_eq!(found, done, "every pointer is inside a range");
    ns
}

/// Best of `runs` (the machine is shared; the minimum is the least disturbed run).
fn best(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let scale = if quick { 1 } else { 4 };
    println!(
        "machine: dependent random load {:.0} ns over 256 KiB, {:.0} ns over 64 MiB",
        chase(256 << 10),
        chase(64 << 20)
    );
    println!("registry benchmark (ns/op, best of 3)");
    println!(
        "{:>9} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "ranges", "hot 1t", "uniform 1t", "hot 2t", "uniform 2t", "insert+remove"
    );
    let one_thread = std::env::args().any(|a| a == "1t");
    // 8 ranges fit in one leaf (even with the pair's extra one): that row is the fixed cost of an
    // operation (latch, one node, record; no splits).
    for n in [8usize, 1_000, 100_000, 1_000_000] {
        let reg = build(n);
        let hot = pointers(n, 256, 1);
        let uniform = pointers(n, 1 << 20, 2);
        let total = 5_000_000 * scale;
        let hot1 = best(3, || lookups(&reg, &hot, total));
        let uni1 = best(3, || lookups(&reg, &uniform, total / 4));
        let (hot2, uni2) = if one_thread {
            (0.0, 0.0)
        } else {
            two_threads(&reg, n, total)
        };
        let pair = best(3, || insert_remove(&reg, n, 200_000 * scale));
        println!("{n:>9} {hot1:>10.1} {uni1:>10.1} {hot2:>12.1} {uni2:>12.1} {pair:>14.1}");
    }
}

/// ns per dependent load when chasing a random cycle through `bytes` of memory: the floor under
/// any lookup that has to touch that much memory.
fn chase(bytes: usize) -> f64 {
    let n = bytes / 8;
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(7);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut next = vec![0usize; n];
    for i in 0..n {
        next[order[i]] = order[(i + 1) % n];
    }
    best(3, || {
        let steps = 2_000_000;
        let mut p = 0;
        let t = Instant::now();
        for _ in 0..steps {
            p = next[black_box(p)];
        }
        black_box(p);
        t.elapsed().as_nanos() as f64 / steps as f64
    })
}

/// Per-thread ns per lookup with two threads looking up at once (hot, uniform).
fn two_threads(reg: &Registry, n: usize, total: usize) -> (f64, f64) {
    let run = |seed: u64, hot: bool| {
        let ptrs = if hot {
            pointers(n, 256, seed)
        } else {
            pointers(n, 1 << 20, seed)
        };
        let count = if hot { total } else { total / 4 };
        best(3, || lookups(reg, &ptrs, count))
    };
    let mut out = [0.0; 2];
    for (k, hot) in [true, false].into_iter().enumerate() {
        out[k] = std::thread::scope(|s| {
            let a = s.spawn(move || run(10, hot));
            let b = s.spawn(move || run(11, hot));
            (a.join().unwrap() + b.join().unwrap()) / 2.0
        });
    }
    (out[0], out[1])
}

/// ns per (insert, remove_allocation) pair of a fresh range in a random gap.
fn insert_remove(reg: &Registry, n: usize, pairs: usize) -> f64 {
    let mut rng = Rng(3);
    let gaps: Vec<usize> = (0..1 << 16)
        .map(|_| {
            let i = rng.below(n);
            BASE + i * SLOT + size_of_slot(i) + 64
        })
        .collect();
    let t = Instant::now();
    let mut done = 0;
    while done < pairs {
        for &g in &gaps {
            reg.insert(black_box(Allocation::new(g, 256, c"cuMemAllocAsync")));
            black_box(reg.remove_allocation(g));
        }
        done += gaps.len();
    }
    let ns = t.elapsed().as_nanos() as f64 / done as f64;
    assert_eq!(reg.len(), n);
    ns
}
