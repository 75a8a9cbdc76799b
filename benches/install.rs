//! Time of the first `install` of a hook set in a process with N small libraries loaded (each
//! calling the CUDA stream-ordered pair through its own GOT), optionally with thousands of
//! extra memory mappings. Each sample is a fresh process: the first install is what a host
//! pays (later ones find every object already indexed).
//!
//! Run: `cargo bench --bench install` (N = 50, 300, 1,000; then 1,000 with 5,000 extra
//! mappings), or `cargo bench --bench install -- --objects 300 --maps 5000 --rounds 15`.
//! Printed: median (min–max) of install (wall clock and the thread's CPU time) and of the
//! uninstall that follows, in ms, the install's minor page faults (fresh memory it touched),
//! and the slots patched. `BENCH_SET=cuda` installs cuhook's
//! CUDA set instead of the two-hook bench set (as the dlopen bench).

#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use support::{show, summary};

/// One sample, in this process: (install ms, uninstall ms, slots).
fn child(o: &support::Options) {
    let libs = support::libraries(o.objects);
    support::load_all(&libs);
    support::add_mappings(o.maps);
    let set = support::hook_set();
    let (t, c, f) = (Instant::now(), support::cpu_now(), support::minor_faults());
    let installed = cuhook::hooks::install(&set).unwrap();
    let install = t.elapsed().as_secs_f64() * 1e3;
    let install_cpu = (support::cpu_now() - c) * 1e3;
    let faults = support::minor_faults() - f;
    let slots = cuhook::hooks::patched_slots().len();
    let t = Instant::now();
    installed.uninstall().unwrap();
    let uninstall = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "sample {install} {uninstall} {slots} {} {} {install_cpu} {faults}",
        support::object_count(),
        support::mapping_count()
    );
}

/// What one child process measured (ms, and the install's minor page faults).
struct Sample {
    install: f64,
    uninstall: f64,
    install_cpu: f64,
    faults: f64,
    /// Slots, objects and mappings of the process.
    what: String,
}

fn main() {
    let o = support::Options::parse();
    if o.rest.iter().any(|a| a == "--child") {
        child(&o);
        return;
    }
    let configs: Vec<(usize, usize)> = if std::env::args().any(|a| a == "--objects") {
        vec![(o.objects, o.maps)]
    } else {
        vec![(50, 0), (300, 0), (1000, 0), (1000, 5000)]
    };
    // Build every library first, so no sample pays for it.
    support::libraries(configs.iter().map(|c| c.0).max().unwrap_or(0));
    let exe = std::env::current_exe().unwrap();
    let mut samples: Vec<Vec<Sample>> = configs.iter().map(|_| Vec::new()).collect();
    // Configurations interleaved, round by round, so machine noise hits all alike.
    for _ in 0..o.rounds {
        for (i, &(objects, maps)) in configs.iter().enumerate() {
            let out = std::process::Command::new(&exe)
                .args(["--child", "--objects", &objects.to_string()])
                .args(["--maps", &maps.to_string()])
                .output()
                .expect("run bench child");
            assert!(
                out.status.success(),
                "child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("sample "))
                .expect("sample line");
            let f: Vec<&str> = line.split(' ').collect();
            samples[i].push(Sample {
                install: f[0].parse().unwrap(),
                uninstall: f[1].parse().unwrap(),
                what: format!("slots={} objects={} mappings={}", f[2], f[3], f[4]),
                install_cpu: f[5].parse().unwrap(),
                faults: f[6].parse().unwrap(),
            });
        }
    }
    for (i, &(objects, maps)) in configs.iter().enumerate() {
        let of = |f: fn(&Sample) -> f64| summary(&samples[i].iter().map(f).collect::<Vec<_>>());
        let s = of(|s| s.install);
        let c = of(|s| s.install_cpu);
        println!(
            "N={objects:>5} +maps={maps:>5}: install wall {}, CPU {} ({:.2} µs CPU per object), {:.0} page faults   uninstall wall {}   [{}]",
            show(&s, "ms"),
            show(&c, "ms"),
            c.median * 1e3 / objects as f64,
            of(|s| s.faults).median,
            show(&of(|s| s.uninstall), "ms"),
            samples[i][0].what
        );
    }
}
