//! The exit report: what the process allocated through CUDA, what is still live, what cuhook
//! hooked, and what it may have missed.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::stats;
use super::summary::{LiveAllocation, Summary};
use crate::{elf, hooks, registry};

/// Objects that carry a static CUDA runtime: they are not libcudart or the driver, yet embed the
/// name the runtime asks `dlsym` for (`cuGetProcAddress_v2`) and the runtime's error messages
/// (cudarc names every driver function but links no runtime). Their driver calls are visible
/// only through cuGetProcAddress. (Executables export none of their own symbols, so the name
/// in their read-only data is the reliable sign.)
fn static_runtimes() -> Vec<String> {
    const REVERSED_MESSAGE: &[u8] = b"noisrev emitnur ADUC rof tneiciffusni si noisrev revird ADUC";
    // Besides the name it resolves the driver through, a runtime carries its error messages
    // (`cudaGetErrorString`): a program that merely names every driver function (cudarc does,
    // `cuGetProcAddress_v2` included) has no runtime linked into it. The message is kept
    // reversed here, so that a program embedding cuhook does not carry it.
    let message: Vec<u8> = std::hint::black_box(REVERSED_MESSAGE)
        .iter()
        .rev()
        .copied()
        .collect();
    elf::snapshot()
        .objects
        .iter()
        .filter(|o| {
            !o.name.contains("libcudart")
                && hooks::skip_reason(o, &[]).is_none()
                && hooks::while_pinned(o, || {
                    !elf::defines(o, "cuGetProcAddress_v2", None)
                        && elf::segments_contain(o, b"cuGetProcAddress_v2\0")
                        && elf::segments_contain(o, &message)
                })
                .unwrap_or(false)
        })
        .map(|o| o.display_name().to_owned())
        .collect()
}

/// Names a warning lists before it says how many more there are: a process that loads
/// thousands of libraries still gets one readable line (the diagnostics text has them all).
const NAMED_IN_WARNING: usize = 8;

/// The warning about libraries whose constructors ran before they were hooked: how many
/// (`total`, which may exceed the names kept), and the first of `names`.
fn late_constructors_warning(names: &[String], total: u64) -> String {
    let shown = &names[..names.len().min(NAMED_IN_WARNING)];
    let mut w = format!(
        "constructors of {total} {} loaded after install ran before they were hooked (allocations made there are classified on first lookup instead): {}",
        if total == 1 { "library" } else { "libraries" },
        shown.join(", ")
    );
    let more = total.saturating_sub(shown.len() as u64);
    if more > 0 {
        let _ = write!(w, " and {more} more");
    }
    w
}

/// The whole report, as text.
pub fn render() -> String {
    let mut r = String::new();
    let _ = writeln!(r, "==== cuhook report (pid {}) ====", std::process::id());

    let rs = crate::cuda::stats();
    let live = registry::global().snapshot();
    let summary = Summary {
        apis: stats::api_counts(),
        usage: stats::usage(),
        live: live
            .iter()
            .map(|a| LiveAllocation {
                start: a.start,
                size: a.size as u64,
                mem_type: a.mem_type,
                device: a.device,
                api: a.api.to_str().unwrap_or("?").to_owned(),
            })
            .collect(),
        live_bytes: rs.live_bytes as u64,
        unknown_frees: rs.unknown_frees,
        missed_frees: rs.missed_frees,
        failed_frees: rs.failed_frees,
        untracked: rs.untracked,
    };
    summary.write(&mut r);
    if let Some(section) = super::sites::render(&live) {
        r.push_str(&section);
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
    let driver_loaded = elf::snapshot().objects.iter().any(|o| {
        hooks::while_pinned(o, || elf::defines(o, "cuGetProcAddress_v2", None)).unwrap_or(false)
    });
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
    for (o, n) in &diag.text_relocations {
        warnings.push(format!(
            "{o} has {n} text relocation(s) of hooked functions: its code is never made writable, so calls made through them are not seen"
        ));
    }
    if diag.constructors_before_patch_total > 0 {
        warnings.push(late_constructors_warning(
            &diag.constructors_before_patch,
            diag.constructors_before_patch_total,
        ));
    }
    let _ = writeln!(r, "\nCoverage warnings: {}", warnings.len());
    for w in &warnings {
        let _ = writeln!(r, "  - {w}");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("/lib/lib{i}.so")).collect()
    }

    #[test]
    fn late_constructors_warning_names_the_libraries() {
        assert_eq!(
            late_constructors_warning(&names(1), 1),
            "constructors of 1 library loaded after install ran before they were hooked (allocations made there are classified on first lookup instead): /lib/lib0.so"
        );
        let w = late_constructors_warning(&names(3), 3);
        assert!(
            w.starts_with("constructors of 3 libraries ")
                && w.ends_with(": /lib/lib0.so, /lib/lib1.so, /lib/lib2.so"),
            "{w}"
        );
    }

    #[test]
    fn late_constructors_warning_is_bounded() {
        let w = late_constructors_warning(&names(8), 8);
        assert!(w.ends_with("/lib/lib7.so"), "{w}");
        let w = late_constructors_warning(&names(256), 5000);
        assert!(w.starts_with("constructors of 5000 libraries "), "{w}");
        assert!(w.ends_with(": /lib/lib0.so, /lib/lib1.so, /lib/lib2.so, /lib/lib3.so, /lib/lib4.so, /lib/lib5.so, /lib/lib6.so, /lib/lib7.so and 4992 more"), "{w}");
        assert!(!w.contains("/lib/lib8.so"), "{w}");
    }
}
