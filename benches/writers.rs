//! Registry writers in parallel: what the hooks of T threads, each allocating and freeing on its
//! own stream, cost each other in the registry. Each thread repeats one insert + exact-start
//! removal of a 4 KiB range (a warm stream-ordered pool hands the same block back every time),
//! with 1,000 other ranges live; ns per pair, per thread (the median thread's mean).
//!
//! Beside the registry (one writer lock for the whole table) the same work on a
//! `Mutex<BTreeMap>` (the simplest shared map) and on a private `BTreeMap` per thread (no
//! sharing at all: how this machine scales when nothing is shared). Layouts: *own block* —
//! every thread's range in its own 2 MiB block (separate pools); *shared block* — neighbouring
//! 4 KiB ranges of one block (one pool shared by all streams).
//!
//! Run: `cargo bench --bench writers` (threads 1, 2, 4, 8, 16 capped at the CPUs), or
//! `cargo bench --bench writers -- 1 16` for chosen thread counts; `-- sizes` for the cost of one
//! insert+removal by range size, on one thread (`-- replay`, for `benches/callgrind_edits.sh`,
//! the same edits untimed); `-- torch [T...]` for `torch_threads.py`'s
//! allocations taking turns through one lock, as PyTorch's allocator makes them, and
//! `-- torch-moving [T...]` for the same with each thread's pool moving between three 2 MiB
//! blocks. Meant for a machine with many cores (the H200 host: 16): on 2 cores it shows little.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use cuhook::registry::{Allocation, Registry};

const BLOCKS: usize = 7;
const PAIRS: usize = 100_000;
const BASE: usize = 0x7f00_0000_0000;
const BLOCK: usize = 2 << 20;

trait Shared: Sync {
    const NAME: &'static str;
    fn insert(&self, a: Allocation);
    fn remove(&self, start: usize) -> bool;
}

impl Shared for Registry {
    const NAME: &'static str = "registry";
    fn insert(&self, a: Allocation) {
        Registry::insert(self, a);
    }
    fn remove(&self, start: usize) -> bool {
        self.remove_allocation(start).is_some()
    }
}

impl Shared for Mutex<BTreeMap<usize, Allocation>> {
    const NAME: &'static str = "Mutex<BTreeMap>";
    fn insert(&self, a: Allocation) {
        self.lock().unwrap().insert(a.start, a);
    }
    fn remove(&self, start: usize) -> bool {
        self.lock().unwrap().remove(&start).is_some()
    }
}

/// A 4 KiB block of a warm stream-ordered pool at `start`.
fn range(start: usize) -> Allocation {
    sized(start, 4096)
}

/// A stream-ordered allocation of `size` bytes at `start`.
fn sized(start: usize, size: usize) -> Allocation {
    let mut a = Allocation::new(start, size, c"cuMemAllocAsync");
    a.device = 0;
    a
}

/// The address thread `t` allocates at.
fn address(t: usize, shared_block: bool) -> usize {
    if shared_block {
        BASE + t * 4096
    } else {
        BASE + (t + 1) * BLOCK
    }
}

/// 1,000 other live ranges, far from the threads' blocks.
fn populate(m: &impl Shared) {
    for i in 0..1000 {
        m.insert(range(BASE - (1 << 32) + i * 65536));
    }
}

/// Each thread's mean over all its blocks (threads start together and run the same number of
/// pairs, so they overlap nearly all the time), ns per pair; returns the median thread's.
fn run_threads(threads: usize, work: &(dyn Fn(usize) -> f64 + Sync)) -> f64 {
    let barrier = Barrier::new(threads);
    let mut best: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    (0..BLOCKS).map(|_| work(t)).sum::<f64>() / BLOCKS as f64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    best.sort_by(f64::total_cmp);
    best[best.len() / 2]
}

fn shared<M: Shared>(m: &M, threads: usize, shared_block: bool) -> f64 {
    run_threads(threads, &|t| {
        let at = address(t, shared_block);
        let t0 = Instant::now();
        for _ in 0..PAIRS {
            m.insert(range(at));
            black_box(m.remove(at));
        }
        t0.elapsed().as_nanos() as f64 / PAIRS as f64
    })
}

fn private(threads: usize) -> f64 {
    run_threads(threads, &|t| {
        let mut m = BTreeMap::new();
        for i in 0..1000 {
            m.insert(BASE + i * 65536, range(BASE + i * 65536));
        }
        let at = address(t, false);
        let t0 = Instant::now();
        for _ in 0..PAIRS {
            m.insert(at, range(at));
            black_box(m.remove(&at));
        }
        t0.elapsed().as_nanos() as f64 / PAIRS as f64
    })
}

/// One thread, one registry with the 1,000 other ranges: ns per insert + removal of a range of
/// each size, at the start of a 2 MiB block and one granule in (a range is written into every
/// 4 KiB granule it covers in part, and as one slot per whole aligned block), then per
/// allocation of a round of `torch_threads.py`'s sizes laid out as a pool would (each at the next
/// 512-byte boundary, so small ones share granules) and one per granule.
fn sizes() {
    let reg = Registry::new();
    populate(&reg);
    let pairs = |starts: &[(usize, usize)], rounds: usize| {
        let t0 = Instant::now();
        for _ in 0..rounds {
            for &(start, size) in starts {
                reg.insert(sized(start, size));
            }
            for &(start, _) in starts {
                black_box(reg.remove_allocation(start));
            }
        }
        t0.elapsed().as_nanos() as f64 / (rounds * starts.len()) as f64
    };
    let block = BASE + 64 * BLOCK;
    println!("sizes: one thread, ns per insert+remove pair");
    for size in [4096, 16384, 65536, 262144, 1 << 20, 2 << 20] {
        let (aligned, inside) = (
            pairs(&[(block, size)], 20_000),
            pairs(&[(block + 4096, size)], 20_000),
        );
        println!("  {size:>8} B   at a block's start {aligned:7.1}   one granule in {inside:7.1}");
    }
    for (what, align) in [("pool-packed (512 B)", 512), ("one granule each", 4096)] {
        let starts = packed(&TORCH, block, align);
        println!(
            "  torch_threads.py's sizes, {what}: {:7.1} per allocation",
            pairs(&starts, 20_000)
        );
    }
}

/// `(start, size)` of ranges of `sizes` laid out from `at` as a pool packs them: each at the
/// next multiple of `align` after the last.
fn packed(sizes: &[usize], mut at: usize, align: usize) -> Vec<(usize, usize)> {
    sizes
        .iter()
        .map(|&size| {
            let start = at;
            at += size.next_multiple_of(align);
            (start, size)
        })
        .collect()
}

/// `torch_threads.py`'s tensor sizes, in its order.
const TORCH: [usize; 8] = [256, 4096, 65536, 1 << 20, 512, 16384, 262144, 2048];

/// `torch_threads.py` on the H200 without the GPU: T threads each allocate a round of its sizes
/// (packed at 512-byte steps in the thread's own region, as the pool packs a stream's blocks)
/// and free them, every insert and every removal inside one shared lock, as PyTorch's
/// `CudaMallocAsync` allocator holds its lock around each call. What the registry adds there is
/// waited for by every thread. Prints allocations per second (all threads), with the registry's
/// work and without it (the lock alone).
///
/// `moving`: each round in the next of three 2 MiB blocks of the thread's region, as the CUDA
/// pool moves a stream's blocks between the blocks it holds: every leaf table empties and is
/// needed again three rounds later.
fn torch(threads: usize, moving: bool) {
    const ROUNDS: usize = 20_000;
    let reg = Registry::new();
    populate(&reg);
    let lock = Mutex::new(());
    let run = |with_registry: bool| {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (reg, lock) = (&reg, &lock);
                s.spawn(move || {
                    let region = BASE + 64 * BLOCK + t * 8 * BLOCK;
                    let layouts: Vec<_> = (0..3)
                        .map(|k| packed(&TORCH, region + 2 * k * BLOCK + 512, 512))
                        .collect();
                    for round in 0..ROUNDS {
                        let starts = &layouts[if moving { round % 3 } else { 0 }];
                        for &(start, size) in starts {
                            let _held = lock.lock().unwrap();
                            if with_registry {
                                reg.insert(sized(start, size));
                            }
                        }
                        for &(start, _) in starts {
                            let _held = lock.lock().unwrap();
                            if with_registry {
                                black_box(reg.remove_allocation(start));
                            }
                        }
                    }
                });
            }
        });
        (threads * ROUNDS * TORCH.len()) as f64 / t0.elapsed().as_secs_f64()
    };
    let (lock_only, registry) = (run(false), run(true));
    println!(
        "torch{}: threads={threads:2}  allocations/s: the lock alone {lock_only:11.0}   with the registry {registry:11.0}   ns of registry work per allocation+free {:7.1}",
        if moving { " (moving)" } else { "" },
        1e9 / registry - 1e9 / lock_only
    );
}

/// `replay SIZE ROUNDS STEP`: ROUNDS rounds of one insert and exact-start removal, on one
/// thread, with 1,000 other ranges live — of one SIZE-byte range at a block's start plus STEP,
/// or, for SIZE 0, of `torch_threads.py`'s sizes packed at STEP-byte steps (all inserted, then
/// all removed). No timing: `benches/callgrind_edits.sh` counts its instructions.
fn replay(args: &[usize]) {
    let [size, rounds, step] = args else {
        panic!("replay SIZE ROUNDS STEP");
    };
    let reg = Registry::new();
    populate(&reg);
    let block = BASE + 64 * BLOCK;
    let starts = if *size == 0 {
        packed(&TORCH, block, *step)
    } else {
        vec![(block + step, *size)]
    };
    for _ in 0..*rounds {
        for &(start, size) in &starts {
            reg.insert(sized(start, size));
        }
        for &(start, _) in &starts {
            black_box(reg.remove_allocation(start));
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("sizes") {
        return sizes();
    }
    if std::env::args().nth(1).as_deref() == Some("replay") {
        let args: Vec<usize> = std::env::args()
            .skip(2)
            .map(|a| a.parse().expect("replay SIZE ROUNDS STEP: numbers"))
            .collect();
        return replay(&args);
    }
    let mode = std::env::args().nth(1);
    if let Some(moving) = mode.as_deref().and_then(|m| match m {
        "torch" => Some(false),
        "torch-moving" => Some(true),
        _ => None,
    }) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let counts: Vec<usize> = std::env::args()
            .skip(2)
            .filter_map(|a| a.parse().ok())
            .collect();
        for t in if counts.is_empty() {
            vec![1, cpus.min(8)]
        } else {
            counts
        } {
            torch(t, moving);
        }
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if counts.is_empty() {
        counts = [1, 2, 4, 8, 16]
            .into_iter()
            .filter(|&t| t <= cpus)
            .collect();
    }
    println!("writers: {cpus} CPUs; ns per insert+remove pair, per thread (median thread's mean over {BLOCKS} blocks of {PAIRS})");
    for &shared_block in &[false, true] {
        let layout = if shared_block {
            "shared block"
        } else {
            "own block"
        };
        for &t in &counts {
            let reg = Registry::new();
            populate(&reg);
            let mutex = Mutex::new(BTreeMap::new());
            populate(&mutex);
            let (r, m) = (
                shared(&reg, t, shared_block),
                shared(&mutex, t, shared_block),
            );
            // A private map per thread has no shared block to write to: no column there.
            let p = if shared_block {
                format!("{:>7}", "-")
            } else {
                format!("{:7.1}", private(t))
            };
            println!(
                "  {layout:12} threads={t:2}  {}: {r:7.1}   {}: {m:7.1}   private BTreeMap: {p}",
                Registry::NAME,
                <Mutex<BTreeMap<usize, Allocation>> as Shared>::NAME
            );
        }
    }
}
