//! Registry benchmarks: the page table (`cuhook::registry::Registry`) beside its baselines, the
//! B+tree with two latched copies it replaced (`baseline/tree`) and a `RwLock<BTreeMap>`, in one
//! run, alternated, each cell the median of the runs with the spread. ns per operation.
//!
//! `cargo bench --bench registry` (`-- quick`: fewer and shorter runs).
//!
//! Layouts: *sparse* — ranges of 4–32 KiB, one per 64 KiB slot (the layout of earlier runs);
//! *pool* — 4 KiB ranges packed back to back, as a stream-ordered pool hands them out.
//! Lookups: *hot* cycles through 256 pointers inside live ranges, *uniform* through 2^20 random
//! ones, *miss* through pointers in no range (host memory, the common answer). *pair*: insert a
//! range and `remove_allocation` it (pool: a fresh 4 KiB block after the last range; sparse: a
//! 256-byte range in the gap after a random range, sharing its 4 KiB granule). *B/range*: heap
//! bytes the structure holds after the inserts, per range (allocator-counted; the page table's
//! 512 KiB top level is included, so it dominates at 1,000 ranges).

#[path = "baseline/tree/mod.rs"]
mod tree;

use std::alloc::{GlobalAlloc, Layout as MemLayout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Instant;

use cuhook::registry::{Allocation, Registry};

/// Counts live heap bytes, so each structure's footprint can be read off exactly (RSS would not
/// show memory the allocator reuses).
struct Counting;

static HEAP: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: MemLayout) -> *mut u8 {
        HEAP.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: MemLayout) -> *mut u8 {
        HEAP.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: MemLayout) {
        HEAP.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: MemLayout, new: usize) -> *mut u8 {
        HEAP.fetch_add(new, Ordering::Relaxed);
        HEAP.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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

/// What every structure under test offers.
trait Map: Sync {
    const NAME: &'static str;
    fn new() -> Self;
    fn insert(&self, a: Allocation);
    fn remove_allocation(&self, start: usize) -> bool;
    fn lookup(&self, ptr: usize) -> Option<Allocation>;
}

impl Map for Registry {
    const NAME: &'static str = "page table";
    fn new() -> Self {
        Registry::new()
    }
    fn insert(&self, a: Allocation) {
        Registry::insert(self, a);
    }
    fn remove_allocation(&self, start: usize) -> bool {
        Registry::remove_allocation(self, start).is_some()
    }
    #[inline]
    fn lookup(&self, ptr: usize) -> Option<Allocation> {
        Registry::lookup(self, ptr)
    }
}

impl Map for tree::Registry {
    const NAME: &'static str = "latched B+tree";
    fn new() -> Self {
        tree::Registry::new()
    }
    fn insert(&self, a: Allocation) {
        tree::Registry::insert(self, a);
    }
    fn remove_allocation(&self, start: usize) -> bool {
        tree::Registry::remove_allocation(self, start).is_some()
    }
    #[inline]
    fn lookup(&self, ptr: usize) -> Option<Allocation> {
        tree::Registry::lookup(self, ptr)
    }
}

/// The obvious baseline: a reader-writer lock around an ordered map.
struct Locked(RwLock<BTreeMap<usize, Allocation>>);

impl Map for Locked {
    const NAME: &'static str = "RwLock<BTreeMap>";
    fn new() -> Self {
        Locked(RwLock::new(BTreeMap::new()))
    }
    fn insert(&self, a: Allocation) {
        self.0.write().unwrap().insert(a.start, a);
    }
    fn remove_allocation(&self, start: usize) -> bool {
        self.0.write().unwrap().remove(&start).is_some()
    }
    #[inline]
    fn lookup(&self, ptr: usize) -> Option<Allocation> {
        let map = self.0.read().unwrap();
        let (_, a) = map.range(..=ptr).next_back()?;
        a.contains(ptr).then_some(*a)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Sparse,
    Pool,
}

/// Range `i` of a layout.
fn range(layout: Layout, i: usize) -> (usize, usize) {
    match layout {
        Layout::Sparse => (BASE + i * SLOT, 4096 + (i * 2654435761) % (28 * 1024)),
        Layout::Pool => (BASE + i * 4096, 4096),
    }
}

fn build<M: Map>(layout: Layout, n: usize) -> M {
    let reg = M::new();
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = Rng(n as u64);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    for i in order {
        let (start, size) = range(layout, i);
        let mut a = Allocation::new(start, size, c"cuMemAllocAsync");
        a.device = 0;
        reg.insert(a);
    }
    reg
}

/// `count` pointers, each inside a random live range.
fn inside(layout: Layout, n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let (start, size) = range(layout, rng.below(n));
            start + rng.below(size)
        })
        .collect()
}

/// Pointers in no range: host addresses far from the device ranges.
fn outside(count: usize) -> Vec<usize> {
    let mut rng = Rng(9);
    (0..count)
        .map(|_| 0x5555_0000_0000 + rng.below(1 << 30))
        .collect()
}

/// ns per lookup over `total` lookups cycling through `ptrs`; checks every answer.
fn lookups<M: Map>(reg: &M, ptrs: &[usize], total: usize, hit: bool) -> f64 {
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
    assert_eq!(found, if hit { done } else { 0 });
    ns
}

/// ns per (insert, remove_allocation) pair.
fn pairs<M: Map>(reg: &M, layout: Layout, n: usize, total: usize) -> f64 {
    let starts: Vec<usize> = match layout {
        // A block after the last range: a new granule, like a pool growing.
        Layout::Pool => vec![range(layout, n).0],
        Layout::Sparse => {
            let mut rng = Rng(3);
            (0..1 << 16)
                .map(|_| {
                    let (start, size) = range(layout, rng.below(n));
                    start + size + 64
                })
                .collect()
        }
    };
    let size = if layout == Layout::Pool { 4096 } else { 256 };
    let t = Instant::now();
    let mut done = 0;
    while done < total {
        for &s in &starts {
            reg.insert(black_box(Allocation::new(s, size, c"cuMemAllocAsync")));
            assert!(reg.remove_allocation(black_box(s)));
        }
        done += starts.len();
    }
    t.elapsed().as_nanos() as f64 / done as f64
}

/// Live heap bytes.
fn heap() -> usize {
    HEAP.load(Ordering::Relaxed)
}

/// Median and spread of `runs` samples.
struct Cell(Vec<f64>);

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        write!(f, "{med:7.1} ({:.1}–{:.1})", v[0], v[v.len() - 1])
    }
}

/// Per-thread ns per hot lookup with two threads at once.
fn two_threads<M: Map>(reg: &M, layout: Layout, n: usize, total: usize) -> f64 {
    std::thread::scope(|s| {
        let a = s.spawn(|| lookups(reg, &inside(layout, n, 256, 10), total, true));
        let b = s.spawn(|| lookups(reg, &inside(layout, n, 256, 11), total, true));
        (a.join().unwrap() + b.join().unwrap()) / 2.0
    })
}

struct Row {
    hot: Vec<f64>,
    hot2: Vec<f64>,
    uniform: Vec<f64>,
    miss: Vec<f64>,
    pair: Vec<f64>,
}

fn measure<M: Map>(reg: &M, layout: Layout, n: usize, scale: usize, row: &mut Row) {
    let hot = inside(layout, n, 256, 1);
    let uniform = inside(layout, n, 1 << 20, 2);
    let miss = outside(256);
    let total = 2_000_000 * scale;
    row.hot.push(lookups(reg, &hot, total, true));
    row.hot2.push(two_threads(reg, layout, n, total));
    row.uniform.push(lookups(reg, &uniform, total / 4, true));
    row.miss.push(lookups(reg, &miss, total, false));
    row.pair.push(pairs(reg, layout, n, 100_000 * scale));
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (scale, runs) = if quick { (1, 3) } else { (2, 5) };
    println!(
        "machine: dependent random load {:.0} ns over 256 KiB, {:.0} ns over 64 MiB",
        chase(256 << 10),
        chase(64 << 20)
    );
    println!("ns/op, median of {runs} alternated runs (min–max)");
    for layout in [Layout::Sparse, Layout::Pool] {
        for n in [1_000usize, 1_000_000] {
            let name = if layout == Layout::Sparse {
                "sparse"
            } else {
                "pool"
            };
            println!("\n{name} layout, {n} ranges");
            println!(
                "{:>18} {:>22} {:>22} {:>22} {:>22} {:>22} {:>10}",
                "structure", "hot", "hot, 2 threads", "uniform", "miss", "insert+remove", "B/range"
            );
            let before = heap();
            let a: Registry = build(layout, n);
            let mem_a = heap().saturating_sub(before);
            let before = heap();
            let b: tree::Registry = build(layout, n);
            let mem_b = heap().saturating_sub(before);
            let before = heap();
            let c: Locked = build(layout, n);
            let mem_c = heap().saturating_sub(before);
            let mut rows: Vec<Row> = (0..3)
                .map(|_| Row {
                    hot: vec![],
                    hot2: vec![],
                    uniform: vec![],
                    miss: vec![],
                    pair: vec![],
                })
                .collect();
            for _ in 0..runs {
                measure(&a, layout, n, scale, &mut rows[0]);
                measure(&b, layout, n, scale, &mut rows[1]);
                measure(&c, layout, n, scale, &mut rows[2]);
            }
            let names = [Registry::NAME, tree::Registry::NAME, Locked::NAME];
            for ((name, row), mem) in names.iter().zip(rows).zip([mem_a, mem_b, mem_c]) {
                println!(
                    "{:>18} {:>22} {:>22} {:>22} {:>22} {:>22} {:>10}",
                    name,
                    Cell(row.hot).to_string(),
                    Cell(row.hot2).to_string(),
                    Cell(row.uniform).to_string(),
                    Cell(row.miss).to_string(),
                    Cell(row.pair).to_string(),
                    mem / n
                );
            }
        }
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
    let steps = 2_000_000;
    let mut p = 0;
    let t = Instant::now();
    for _ in 0..steps {
        p = next[black_box(p)];
    }
    black_box(p);
    t.elapsed().as_nanos() as f64 / steps as f64
}
