//! Cost of `SubscriberList::dispatch` with 0, 1 and 4 trivial subscribers, on 1 and 2 threads at
//! once, against a bare indirect call of the same trivial function; plus the hook guard.
//!
//! Plain loops: each thread times its own `ITERS` calls, by wall clock (`Instant`) and by its own
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`, which leaves out time the thread spent preempted on a
//! shared machine). A configuration's figure is the mean over its threads, best of `RUNS` runs;
//! the runs of all configurations are interleaved so that a slow spell of a shared machine hits
//! them alike. Run: `cargo bench --bench dispatch` (a word after `--` keeps matching rows only).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

use cuhook::events::{asymmetric_barriers, mask, Callback, HookGuard, MemEvent, SubscriberList};

const ITERS: u64 = 5_000_000;
const RUNS: usize = 15;
const THREADS: [usize; 2] = [1, 2];

fn trivial(ev: &MemEvent, context: usize) {
    black_box((ev.range.start, context));
}

/// This thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

type Op<'a> = Box<dyn Fn(u64) + Sync + 'a>;

/// One run: (wall, thread CPU) nanoseconds per call of `op`, `threads` threads calling at once.
fn run_once(threads: usize, op: &(dyn Fn(u64) + Sync)) -> (f64, f64) {
    let start = Barrier::new(threads);
    let (wall, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let (t, c) = (Instant::now(), thread_cpu_ns());
                    for i in 0..ITERS {
                        op(i);
                    }
                    let cpu = thread_cpu_ns() - c;
                    (t.elapsed().as_nanos() as f64, cpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let per = (threads as u64 * ITERS) as f64;
    (wall / per, cpu / per)
}

fn list_with(subscribers: usize) -> SubscriberList {
    let list = SubscriberList::new();
    for i in 0..subscribers {
        list.subscribe(mask::ALL, i as i32, Callback::Rust(trivial), i)
            .unwrap();
    }
    list
}

fn main() {
    let ev = MemEvent::alloc(cuhook::events::Allocation::new(
        0x7f00_0000_0000,
        4096,
        c"cuMemAlloc_v2",
    ));
    let lists: Vec<SubscriberList> = [0, 1, 4].iter().map(|&n| list_with(n)).collect();
    let ev = &ev;

    let mut ops: Vec<(String, Op)> = vec![(
        "bare indirect call".into(),
        Box::new(|i| {
            let f: fn(&MemEvent, usize) = black_box(trivial);
            f(black_box(ev), i as usize);
        }),
    )];
    for (n, list) in [0, 1, 4].iter().zip(&lists) {
        ops.push((
            format!("dispatch, {n} subscriber(s)"),
            Box::new(move |_| list.dispatch(black_box(ev))),
        ));
    }
    ops.push((
        "HookGuard::enter + drop".into(),
        Box::new(|_| {
            black_box(HookGuard::enter(c"cuMemAlloc_v2"));
        }),
    ));
    if let Some(filter) = std::env::args().skip(1).find(|a| !a.starts_with("--")) {
        ops.retain(|(name, _)| name.contains(filter.as_str()));
    }

    // best[op][threads] = (wall, cpu)
    let mut best = vec![[(f64::INFINITY, f64::INFINITY); THREADS.len()]; ops.len()];
    for _ in 0..RUNS {
        for (b, (_, op)) in best.iter_mut().zip(&ops) {
            for (slot, threads) in b.iter_mut().zip(THREADS) {
                let (wall, cpu) = run_once(threads, op.as_ref());
                *slot = (slot.0.min(wall), slot.1.min(cpu));
            }
        }
    }

    let barriers = if asymmetric_barriers() {
        "asymmetric (membarrier)"
    } else {
        "symmetric (fence)"
    };
    println!(
        "dispatch benchmark: {ITERS} calls per thread and run, best of {RUNS} interleaved runs"
    );
    println!("barriers: {barriers}; ns per call per thread, wall clock / thread CPU time");
    println!("| operation | 1 thread wall | 1 thread CPU | 2 threads wall | 2 threads CPU |");
    println!("|---|---|---|---|---|");
    for ((name, _), b) in ops.iter().zip(&best) {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            b[0].0, b[0].1, b[1].0, b[1].1
        );
    }
    let row = |name: &str| ops.iter().position(|(n, _)| n == name).map(|i| best[i]);
    if let (Some(bare), Some(one)) = (row("bare indirect call"), row("dispatch, 1 subscriber(s)")) {
        println!(
            "dispatch with 1 subscriber minus bare indirect call (CPU time): {:.2} ns (1 thread), {:.2} ns (2 threads)",
            one[0].1 - bare[0].1,
            one[1].1 - bare[1].1
        );
    }
}
