//! Time of the first `install` of a hook set in a process with N small libraries loaded (each
//! calling the CUDA stream-ordered pair through its own GOT), optionally with thousands of
//! extra memory mappings. Each sample is a fresh process: the first install is what a host
//! pays (later ones find every object already indexed).
//!
//! Run: `cargo bench --bench install` (N = 50, 300, 1,000; then 1,000 with 5,000 extra
//! mappings), or `cargo bench --bench install -- --objects 300 --maps 5000 --rounds 15`.
//! Printed: median (min–max) of install (wall clock and the thread's CPU time) and of the
//! uninstall that follows, in ms, and the slots patched. `BENCH_SET=cuda` installs cuhook's
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
    let (t, c) = (Instant::now(), support::cpu_now());
    let installed = cuhook::hooks::install(&set).unwrap();
    let install = t.elapsed().as_secs_f64() * 1e3;
    let install_cpu = (support::cpu_now() - c) * 1e3;
    let slots = cuhook::hooks::patched_slots().len();
    let t = Instant::now();
    installed.uninstall().unwrap();
    let uninstall = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "sample {install} {uninstall} {slots} {} {} {install_cpu}",
        support::object_count(),
        support::mapping_count()
    );
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
    let mut samples: Vec<Vec<(f64, f64, String, f64)>> = vec![Vec::new(); configs.len()];
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
            samples[i].push((
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                format!("slots={} objects={} mappings={}", f[2], f[3], f[4]),
                f[5].parse().unwrap(),
            ));
        }
    }
    for (i, &(objects, maps)) in configs.iter().enumerate() {
        let inst: Vec<f64> = samples[i].iter().map(|s| s.0).collect();
        let cpu: Vec<f64> = samples[i].iter().map(|s| s.3).collect();
        let uninst: Vec<f64> = samples[i].iter().map(|s| s.1).collect();
        let s = summary(&inst);
        let c = summary(&cpu);
        println!(
            "N={objects:>5} +maps={maps:>5}: install wall {}, CPU {} ({:.2} µs CPU per object)   uninstall wall {}   [{}]",
            show(&s, "ms"),
            show(&c, "ms"),
            c.median * 1e3 / objects as f64,
            show(&summary(&uninst), "ms"),
            samples[i][0].2
        );
    }
}
