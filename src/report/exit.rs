//! The exit report: what the process allocated through CUDA, what is still live, what cuhook
//! hooked, and what it may have missed.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::stats;
use crate::{elf, hooks, registry};

/// Live allocations listed (largest first).
const TOP_LIVE: usize = 20;

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Objects that carry a static CUDA runtime: they are not libcudart or the driver, yet embed the
/// name the runtime asks `dlsym` for (`cuGetProcAddress_v2`). Their driver calls are visible
/// only through cuGetProcAddress. (Executables export none of their own symbols, so the name
/// in their read-only data is the reliable sign.)
fn static_runtimes() -> Vec<String> {
    elf::snapshot()
        .objects
        .iter()
        .filter(|o| {
            !o.name.contains("libcudart")
                && hooks::skip_reason(o, &[]).is_none()
                && !elf::defines(o, "cuGetProcAddress_v2", None)
                && elf::segments_contain(o, b"cuGetProcAddress_v2\0")
        })
        .map(|o| o.display_name().to_owned())
        .collect()
}

/// The whole report, as text.
pub fn render() -> String {
    let mut r = String::new();
    let _ = writeln!(r, "==== cuhook report (pid {}) ====", std::process::id());

    let mut apis = stats::api_counts();
    apis.sort_by(|a, b| a.api.cmp(b.api));
    let _ = writeln!(r, "\nCalls by API:");
    if apis.is_empty() {
        let _ = writeln!(r, "  (no CUDA allocation or free was seen)");
    } else {
        let _ = writeln!(
            r,
            "  {:<34} {:>8} {:>12} {:>8} {:>12}",
            "api", "allocs", "bytes", "frees", "bytes"
        );
        for a in &apis {
            let _ = writeln!(
                r,
                "  {:<34} {:>8} {:>12} {:>8} {:>12}",
                a.api, a.allocs, a.alloc_bytes, a.frees, a.free_bytes
            );
        }
    }

    let usage = stats::usage();
    if !usage.is_empty() {
        let _ = writeln!(r, "\nMemory by type and device:");
        let _ = writeln!(
            r,
            "  {:<8} {:>6} {:>14} {:>14}",
            "type", "device", "live", "peak"
        );
        for u in &usage {
            let dev = if u.device < 0 {
                "-".to_owned()
            } else {
                u.device.to_string()
            };
            let _ = writeln!(
                r,
                "  {:<8} {:>6} {:>14} {:>14}",
                u.mem_type.name(),
                dev,
                bytes(u.live),
                bytes(u.peak)
            );
        }
    }

    let mut live = registry::global().snapshot();
    let rs = registry::stats();
    live.sort_by_key(|a| std::cmp::Reverse(a.size));
    let _ = writeln!(
        r,
        "\nLive allocations at exit: {} ({})",
        live.len(),
        bytes(rs.live_bytes as u64)
    );
    for a in live.iter().take(TOP_LIVE) {
        let dev = if a.device < 0 {
            "-".to_owned()
        } else {
            a.device.to_string()
        };
        let _ = writeln!(
            r,
            "  {:#x} {:>12} {:<8} dev {:<2} {}",
            a.start,
            bytes(a.size as u64),
            a.mem_type.name(),
            dev,
            a.api.to_str().unwrap_or("?")
        );
    }
    if live.len() > TOP_LIVE {
        let _ = writeln!(r, "  ... and {} more", live.len() - TOP_LIVE);
    }
    let _ = writeln!(
        r,
        "\nFrees of pointers never seen allocated: {}",
        rs.unknown_frees
    );
    let _ = writeln!(
        r,
        "Missed frees (a live range allocated over again): {}",
        rs.missed_frees
    );
    if rs.failed_frees > 0 {
        let _ = writeln!(
            r,
            "Frees refused by the driver after being announced: {}",
            rs.failed_frees
        );
    }

    let dropped = super::trace::dropped_lines();
    if dropped > 0 {
        let _ = writeln!(
            r,
            "Trace lines dropped (the trace pipe's reader did not keep up): {dropped}"
        );
    }

    let slots = hooks::patched_slots();
    let mut per_object: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &slots {
        *per_object.entry(s.object.as_str()).or_default() += 1;
    }
    let _ = writeln!(
        r,
        "\nHooked: {} slots in {} objects",
        slots.len(),
        per_object.len()
    );
    for (object, n) in &per_object {
        let _ = writeln!(r, "  {n:>4} {object}");
    }
    let diag = hooks::diagnostics();
    let proc = crate::cuda::lookup_counts();

    let mut warnings = Vec::new();
    let static_rt = static_runtimes();
    let driver_loaded = elf::snapshot()
        .objects
        .iter()
        .any(|o| elf::defines(o, "cuGetProcAddress_v2", None));
    if !static_rt.is_empty() && driver_loaded && proc.calls == 0 {
        warnings.push(format!(
            "a static CUDA runtime is linked into {} but no cuGetProcAddress call was seen: its driver calls were invisible (was libcuda loaded before cuhook, or through an unpatched object?)",
            static_rt.join(", ")
        ));
    }
    for c in &diag.conflicts {
        warnings.push(format!(
            "{} in {} is bound to {:#x}, not the hooked definition {:#x}: left unpatched",
            c.symbol, c.object, c.bound_to, c.original
        ));
    }
    for o in &diag.other_namespaces {
        warnings.push(format!(
            "{o} was opened in another dlmopen namespace and is not hooked"
        ));
    }
    for o in &diag.unpinnable {
        warnings.push(format!("{o} could not be pinned and is not hooked"));
    }
    for f in &diag.foreign {
        warnings.push(format!(
            "{} in {} was re-patched by someone else and left as found",
            f.symbol, f.object
        ));
    }
    if !diag.constructors_before_patch.is_empty() {
        warnings.push(format!(
            "constructors of {} libraries loaded after install ran before they were hooked (allocations made there are classified on first lookup instead)",
            diag.constructors_before_patch.len()
        ));
    }
    let _ = writeln!(r, "\nCoverage warnings: {}", warnings.len());
    for w in &warnings {
        let _ = writeln!(r, "  - {w}");
    }
    r
}
