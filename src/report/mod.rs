//! What cuhook tells the user: the exit report, the event trace, and the counters behind them.

mod exit;
pub mod stats;
pub mod trace;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicBool, Ordering};

pub use exit::render;

use crate::events::{self, mask, Callback};
use crate::output::{Mode, OutputFile, WriteError};
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
