//! Cost of one stack capture (`cuhook::stacks::capture`) of 16 frames, from the unwind tables,
//! and of capture plus insertion into the dedup table (`record`), on a chain of 24 functions
//! built without frame pointers. ns per capture, median of 9 runs.
//!
//! `cargo bench --bench stacks` (`-- quick`: fewer iterations). Instructions: run the built
//! bench under `valgrind --tool=callgrind --toggle-collect='*stacks*capture*'` with `-- once`
//! (one warm-up, then 1,000 captures) and divide the total by 1,000.

use std::hint::black_box;
use std::time::Instant;

use cuhook::stacks::{capture, prepare, record, Table};

/// Recurse `depth` frames (not inlined, no tail call), then run `f` at the bottom.
#[inline(never)]
fn chain(depth: usize, f: &mut dyn FnMut()) -> usize {
    if depth == 0 {
        f();
        return 0;
    }
    black_box(chain(black_box(depth - 1), f)) + 1
}

fn main() {
    assert!(prepare(), "glibc ≥ 2.35 (_dl_find_object) is needed");
    let args: Vec<String> = std::env::args().collect();
    let once = args.iter().any(|a| a == "once");
    let iterations = if args.iter().any(|a| a == "quick") {
        2_000
    } else {
        20_000
    };
    let table = Table::new(1024, 16);
    let mut frames = [0usize; 16];
    if once {
        chain(24, &mut || {
            black_box(capture(0, &mut frames));
            for _ in 0..1_000 {
                black_box(capture(0, &mut frames));
            }
        });
        return;
    }
    for (name, with_table) in [
        ("capture, 16 frames", false),
        ("record (capture + insert), 16 frames", true),
    ] {
        let mut runs = Vec::new();
        for _ in 0..9 {
            let mut ns = 0.0;
            chain(24, &mut || {
                let start = Instant::now();
                for _ in 0..iterations {
                    if with_table {
                        black_box(record(&table, 0, 16));
                    } else {
                        black_box(capture(0, &mut frames));
                    }
                }
                ns = start.elapsed().as_nanos() as f64 / iterations as f64;
            });
            runs.push(ns);
        }
        runs.sort_by(f64::total_cmp);
        println!(
            "{name}: {:.0} ns (min {:.0}, max {:.0})",
            runs[4], runs[0], runs[8]
        );
    }
    let n = chain(24, &mut || {
        black_box(capture(0, &mut frames));
    });
    black_box(n);
}
