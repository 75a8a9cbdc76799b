//! What cuhook tells the user: the exit report, the event trace, and the counters behind them.

mod exit;
mod path;
pub mod replay;
pub mod stats;
pub mod summary;
pub mod trace;

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};

pub use exit::render;
pub use path::{expand_path, expand_path_for, rank, RANK_VARIABLES};

use crate::events::{self, mask, Callback};
use crate::Result;

/// Subscriber priorities: after the registry (-1000), before user subscribers (0).
const STATS_PRIORITY: i32 = -900;
const TRACE_PRIORITY: i32 = -800;

static STATS_ON: AtomicBool = AtomicBool::new(false);
static TRACE_ON: AtomicBool = AtomicBool::new(false);

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

/// Start writing the trace to `path` (`%p` → pid, `%r` → rank).
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
