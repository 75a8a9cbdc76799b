//! What cuhook tells the user: the exit report, the event trace, and the counters behind them.

mod exit;
mod path;
pub mod replay;
mod sites;
pub mod stats;
pub mod summary;
pub mod trace;

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};

pub use exit::render;
pub use path::{expand_path, expand_path_for, rank, RANK_VARIABLES};

use crate::events::{self, mask, Callback};
use crate::output::{Mode, OutputFile, WriteError};
use crate::Result;

/// Subscriber priorities: before user subscribers (0). (The registry is no subscriber: the
/// hooks update it before any event is dispatched.)
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

/// How long the exit report waits, in all, for a slow pipe reader before it gives up.
const REPORT_PATIENCE_MS: i32 = 2000;

/// Write the exit report to `path` (already expanded): a file of its own, truncated; never
/// through a symlink, never waiting for a FIFO reader, never killed by one that leaves.
pub fn write_file(path: &OsStr, text: &[u8]) -> Result<()> {
    let what = "write the report";
    let file = OutputFile::open(path, Mode::Truncate).map_err(|e| crate::Error::Io {
        what,
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    let written = file.write(text, REPORT_PATIENCE_MS);
    file.close();
    written.map_err(|e| crate::Error::Io {
        what,
        errno: match e {
            WriteError::Replaced => libc::EBADF,
            WriteError::Closed => libc::EPIPE,
            WriteError::Full => libc::EAGAIN,
            WriteError::Other(errno) => errno,
        },
    })
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
        // SAFETY: registering a plain extern "C" function that never unwinds; glibc runs it at
        // exit (`-z nodelete` keeps this object mapped until then).
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(write_stacks_at_exit)
        };
    }
    Ok(())
}

/// At exit: the trace's stack table, when stacks were recorded (`trace::write_stacks`).
extern "C" fn write_stacks_at_exit() {
    crate::sys::boundary::guarded(
        || {
            if crate::stacks::table().is_some()
                && crate::sys::memory::available(crate::sys::memory::REPORT_MARGIN)
            {
                trace::write_stacks();
            }
        },
        || (),
    );
}
