//! What cuhook tells the user: the exit report, the event trace, and the counters behind them.

mod exit;
pub mod stats;
pub mod trace;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicBool, Ordering};

pub use exit::render;

use crate::events::{self, mask, Callback};
use crate::Result;

/// Subscriber priorities: after the registry (-1000), before user subscribers (0).
const STATS_PRIORITY: i32 = -900;
const TRACE_PRIORITY: i32 = -800;

static STATS_ON: AtomicBool = AtomicBool::new(false);
static TRACE_ON: AtomicBool = AtomicBool::new(false);

/// Replace `%p` in a path by the process id (one file per process under `cuhook run`).
pub fn expand_pid(path: &OsStr) -> OsString {
    let pid = std::process::id().to_string();
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && bytes.get(i + 1) == Some(&b'p') {
            out.extend_from_slice(pid.as_bytes());
            i += 2;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Start counting for the exit report.
pub fn enable_stats() -> Result<()> {
    if !STATS_ON.swap(true, Ordering::AcqRel) {
        events::subscribe(
            mask::ALL,
            STATS_PRIORITY,
            Callback::Rust(stats::on_event),
            0,
        )?;
    }
    Ok(())
}

/// Start writing the trace to `path` (`%p` → pid).
pub fn enable_trace(path: &OsStr) -> Result<()> {
    trace::open(path).map_err(|e| crate::Error::Io {
        what: "open the trace file",
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    if !TRACE_ON.swap(true, Ordering::AcqRel) {
        events::subscribe(
            mask::ALL,
            TRACE_PRIORITY,
            Callback::Rust(trace::on_event),
            0,
        )?;
    }
    Ok(())
}
