//! The part of the exit report that the events alone determine — calls and bytes per API, live
//! and peak bytes per memory type and device, the allocations still live, frees of unknown
//! pointers and missed frees — as data with one renderer. The exit report fills it from the live
//! counters and the registry; `cuhook view` replays it from a trace ([`super::replay`]), so both
//! say the same thing in the same words.

use std::fmt::Write;

use super::stats::{ApiCounts, Usage};
use crate::events::MemType;

/// Live allocations listed (largest first).
pub const TOP_LIVE: usize = 20;

/// One allocation still live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAllocation {
    /// First byte.
    pub start: usize,
    /// Length in bytes.
    pub size: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for host or unknown.
    pub device: i32,
    /// The API that allocated it.
    pub api: String,
}

/// What the events of one process add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Calls and bytes per API.
    pub apis: Vec<ApiCounts>,
    /// Live and peak bytes per memory type and device.
    pub usage: Vec<Usage>,
    /// Allocations still live; [`Summary::write`] lists the [`TOP_LIVE`] largest.
    pub live: Vec<LiveAllocation>,
    /// Bytes still live in all.
    pub live_bytes: u64,
    /// Frees of pointers never seen allocated.
    pub unknown_frees: u64,
    /// Live ranges allocated over again (their free was not seen).
    pub missed_frees: u64,
    /// Frees the driver refused after they were announced.
    pub failed_frees: u64,
    /// Allocations not registered for lack of memory to record them.
    pub untracked: u64,
}

/// `n` bytes in the largest binary unit that keeps it at or above 1.
pub fn bytes(n: u64) -> String {
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

fn device(d: i32) -> String {
    if d < 0 {
        "-".to_owned()
    } else {
        d.to_string()
    }
}

impl Summary {
    /// Append the report's text for this summary to `r`.
    pub fn write(&self, r: &mut String) {
        let mut apis: Vec<&ApiCounts> = self.apis.iter().collect();
        apis.sort_by(|a, b| a.api.cmp(&b.api));
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

        if !self.usage.is_empty() {
            let _ = writeln!(r, "\nMemory by type and device:");
            let _ = writeln!(
                r,
                "  {:<8} {:>6} {:>14} {:>14}",
                "type", "device", "live", "peak"
            );
            for u in &self.usage {
                let _ = writeln!(
                    r,
                    "  {:<8} {:>6} {:>14} {:>14}",
                    u.mem_type.name(),
                    device(u.device),
                    bytes(u.live),
                    bytes(u.peak)
                );
            }
        }

        let mut live: Vec<&LiveAllocation> = self.live.iter().collect();
        live.sort_by_key(|a| (std::cmp::Reverse(a.size), a.start));
        let _ = writeln!(
            r,
            "\nLive allocations at exit: {} ({})",
            live.len(),
            bytes(self.live_bytes)
        );
        for a in live.iter().take(TOP_LIVE) {
            let _ = writeln!(
                r,
                "  {:#x} {:>12} {:<8} dev {:<2} {}",
                a.start,
                bytes(a.size),
                a.mem_type.name(),
                device(a.device),
                a.api
            );
        }
        if live.len() > TOP_LIVE {
            let _ = writeln!(r, "  ... and {} more", live.len() - TOP_LIVE);
        }
        let _ = writeln!(
            r,
            "\nFrees of pointers never seen allocated: {}",
            self.unknown_frees
        );
        let _ = writeln!(
            r,
            "Missed frees (a live range allocated over again): {}",
            self.missed_frees
        );
        if self.untracked > 0 {
            let _ = writeln!(
                r,
                "Allocations not tracked (no memory to record them; lookups ask the driver): {}",
                self.untracked
            );
        }
        if self.failed_frees > 0 {
            let _ = writeln!(
                r,
                "Frees refused by the driver after being announced: {}",
                self.failed_frees
            );
        }
    }
}
