//! Hooked vs plain `dlopen`+`dlclose` in a process that looks like a big host.
//!
//! - *new library*: a library that is not loaded yet (the hooked path indexes and patches it,
//!   then forgets it at `dlclose`), opened while N other small libraries (each calling the CUDA
//!   stream-ordered pair through its own GOT) are loaded, optionally with thousands of extra
//!   memory mappings;
//! - *loaded library*: one that is already loaded (only its reference count changes; the
//!   hooked path only checks the loader's counters).
//!
//! Plain and hooked rounds alternate (hooked = the bench hook set installed, so the loader
//! interposers are in place); medians, spread (min–max over rounds) and the ratio of medians
//! are printed.
//!
//! - *k new objects*: `--new K` opens a library that brings K - 1 new dependencies with it (the
//!   loader adds K objects at once, and removes them at `dlclose`).
//!
//! Run: `cargo bench --bench dlopen` (the sweep: k = 1, 2, 10 at N = 50, 300, 1,000, and N = 50
//! and 1,000 with 5,000 extra mappings, each in its own process), or one configuration:
//! `cargo bench --bench dlopen -- --objects 300 --maps 5000 --new 2 --rounds 15`. `BENCH_SET=cuda`
//! installs cuhook's CUDA set (≈ 80 names, what a preloaded libcuhook.so installs) instead of
//! the two-hook bench set.

#[path = "support/mod.rs"]
mod support;

use std::ffi::CString;
use std::time::Instant;

use support::{show, summary, Caller};

/// Microseconds per open+close pair over `iters` pairs (wall clock, or with `BENCH_CLOCK=cpu`
/// the thread's CPU time, which leaves out time preempted by other jobs).
fn round(c: &Caller, lib: &CString, iters: usize) -> f64 {
    if std::env::var("BENCH_CLOCK").is_ok_and(|v| v == "cpu") {
        let t = support::cpu_now();
        pairs(c, lib, iters);
        return (support::cpu_now() - t) * 1e6 / iters as f64;
    }
    let t = Instant::now();
    pairs(c, lib, iters);
    t.elapsed().as_nanos() as f64 / iters as f64 / 1000.0
}

fn pairs(c: &Caller, lib: &CString, iters: usize) {
    for _ in 0..iters {
        // SAFETY: the fixture's dlopen/dlclose wrappers with a valid path.
        unsafe {
            let h = (c.open)(lib.as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null());
            (c.close)(h);
        }
    }
}

/// Alternate plain and hooked rounds; samples in µs per pair.
fn compare(
    c: &Caller,
    set: &cuhook::hooks::HookSet,
    lib: &CString,
    iters: usize,
    rounds: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut plain, mut hooked) = (Vec::new(), Vec::new());
    // Warm up both paths (first install indexes every loaded object).
    round(c, lib, iters);
    let installed = cuhook::hooks::install(set).unwrap();
    round(c, lib, iters);
    installed.uninstall().unwrap();
    // BENCH_SIDE=plain|hooked runs one side only (for profiling the difference).
    let side = std::env::var("BENCH_SIDE").unwrap_or_default();
    for _ in 0..rounds {
        if side != "hooked" {
            plain.push(round(c, lib, iters));
        }
        if side != "plain" {
            let installed = cuhook::hooks::install(set).unwrap();
            hooked.push(round(c, lib, iters));
            installed.uninstall().unwrap();
        }
    }
    (plain, hooked)
}

fn report(what: &str, plain: &[f64], hooked: &[f64], unit: &str, scale: f64) {
    if plain.is_empty() || hooked.is_empty() {
        return;
    }
    let scaled = |v: &[f64]| v.iter().map(|x| x * scale).collect::<Vec<_>>();
    let (p, h) = (summary(&scaled(plain)), summary(&scaled(hooked)));
    println!(
        "{what}: plain {}   hooked {}   ratio {:.3}   (+{:.1} {unit})",
        show(&p, unit),
        show(&h, unit),
        h.median / p.median,
        h.median - p.median
    );
}

/// One configuration, in this process.
fn run(o: &support::Options) {
    let libs = support::libraries(o.objects + 1);
    let (fresh, loaded) = libs.split_last().unwrap();
    let fresh = if o.new > 1 {
        support::group(o.new)
    } else {
        fresh.clone()
    };
    // The caller first: glibc looks the calling object up from the head of its list on every
    // dlopen, so a caller loaded after the N libraries would make plain calls pay for that walk
    // (the hooked calls come from cuhook, inside the main program).
    let c = support::caller();
    support::load_all(loaded);
    support::add_mappings(o.maps);
    let set = support::hook_set();
    println!(
        "objects={} mappings={} rounds={} new objects per dlopen={}",
        support::object_count(),
        support::mapping_count(),
        o.rounds,
        o.new
    );
    let fresh = CString::new(fresh.to_str().unwrap()).unwrap();
    // BENCH_ONLY=new|loaded runs one of the two comparisons; BENCH_PAIRS and
    // BENCH_LOADED_PAIRS set the pairs per round of each (benches/callgrind_loader.sh counts
    // instructions as the slope between two such lengths).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let count = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    if only != "loaded" {
        let pairs = count("BENCH_PAIRS", 50);
        let (plain, hooked) = compare(&c, &set, &fresh, pairs, o.rounds);
        report(
            "dlopen+dlclose of a new library   ",
            &plain,
            &hooked,
            "µs",
            1.0,
        );
    }
    if only == "new" {
        return;
    }
    let resident = CString::new(loaded[0].to_str().unwrap()).unwrap();
    let pairs = count("BENCH_LOADED_PAIRS", 10_000);
    let (plain, hooked) = compare(&c, &set, &resident, pairs, o.rounds);
    report(
        "dlopen+dlclose of a loaded library",
        &plain,
        &hooked,
        "ns",
        1000.0,
    );
    let d = cuhook::hooks::diagnostics();
    println!(
        "engine: rescans={} quick_scans={} direct_patches={} objects_indexed={}",
        d.rescans, d.quick_scans, d.direct_patches, d.objects_indexed
    );
}

fn main() {
    let o = support::Options::parse();
    // The bench measures the group path for k >= 2 (the library's default,
    // `cuhook::hooks::group_dlopen`), set here in case the environment of a run turned it off;
    // `CUHOOK_GROUP_DLOPEN=0` measures the whole sync instead.
    cuhook::hooks::set_group_dlopen(
        std::env::var("CUHOOK_GROUP_DLOPEN").map_or(true, |v| v.trim() != "0"),
    );
    if std::env::args().any(|a| a == "--objects") {
        run(&o);
        return;
    }
    // The sweep: each configuration in a fresh process; the library opened alone (k = 1),
    // with one new dependency (k = 2) and with nine (k = 10).
    let exe = std::env::current_exe().unwrap();
    let mut configs = Vec::new();
    for objects in [50, 300, 1000] {
        for new in [1, 2, 10] {
            configs.push((objects, 0, new));
        }
    }
    configs.extend([(50, 5000, 1), (1000, 5000, 1), (1000, 5000, 2)]);
    for (objects, maps, new) in configs {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["--objects", &objects.to_string()])
            .args(["--maps", &maps.to_string()])
            .args(["--new", &new.to_string()])
            .args(["--rounds", &o.rounds.to_string()]);
        if new > 1 {
            // The already-loaded comparison does not depend on k.
            cmd.env("BENCH_ONLY", "new");
        }
        let out = cmd.output().expect("run bench child");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child failed: {}", out.status);
        println!();
    }
}
