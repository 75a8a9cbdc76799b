//! C API for language bindings (the Python package, `python/cuhook`): counted installations,
//! event queues that a consumer thread drains outside the hooks, the live allocations, the
//! counters, the exit report as text, and traces scoped to a block of code.
//!
//! Bindings cannot run their own code inside a hook: a Python callback needs the interpreter's
//! lock, which the allocating thread may already hold — or be waiting for — and a garbage
//! collection or a lock taken by the callback could deadlock the host. So events reach them
//! through a queue: the subscriber that runs in the hook only copies the event into a bounded
//! lock-free ring (no allocation, no lock; one `futex` wake when the consumer sleeps), and the
//! binding's own thread pops the events and runs its callbacks. A full ring drops the event
//! and counts it: the allocating thread never waits.
//!
//! # Safety
//! Pointers from C are checked for NULL; beyond that the caller promises what the header says
//! (out-parameters writable, handles from the matching `_open` and not yet closed). Panics are
//! caught by [`ffi_call`].
#![allow(unsafe_code)]

mod queue;

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::cuda_api::{c_range, CMemInfo};
use super::status::{ffi_call, CUHOOK_OK};
use crate::events::{EventMask, MemEvent};
use crate::instance::{self, Route};
use crate::log::StackBuf;
use crate::output::{Mode, OutputFile};
use crate::{Error, Result};
use queue::{now_ns, thread_id, CQueueStats, CQueuedEvent};

// ------------------------------------------------------------------------ installations

/// Install the CUDA hooks and the registry once more, counted: the hooks stay until every
/// installation (this one, the constructor's, `cuhook_install`'s, a Rust guard's) is gone.
/// Also starts the exit report's counters (per API, live and peak bytes), which
/// `cuhook_report` and `cuhook_usage` read. When another copy of cuhook serves the process,
/// the installation is made there.
///
/// # Safety
/// `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_installation_open(id: *mut u64) -> c_int {
    ffi_call(|| {
        if id.is_null() {
            return Err(Error::InvalidArgument { what: "id is NULL" });
        }
        let installation = crate::install()?;
        if !installation.is_forwarded() {
            crate::report::enable_stats()?;
        }
        // SAFETY: non-null and writable (header contract).
        unsafe { id.write(installation.leak()) };
        Ok(CUHOOK_OK)
    })
}

/// Undo one `cuhook_installation_open`; the last installation puts every slot back and empties
/// the registry. `CUHOOK_ERR_NOT_INSTALLED` for an id with no installation left.
#[no_mangle]
pub extern "C" fn cuhook_installation_close(id: u64) -> c_int {
    ffi_call(|| crate::api::uninstall_forwarded(instance::route(), id).map(|_| CUHOOK_OK))
}

/// 1 when the CUDA hooks of the copy of cuhook that serves the process are installed (by
/// anyone: the constructor, the C or Rust API), else 0.
#[no_mangle]
pub extern "C" fn cuhook_installed() -> c_int {
    ffi_call(|| {
        Ok(match instance::route() {
            Route::Own => crate::registry::attached() as c_int,
            Route::Other(_) => 1,
        })
    })
}

/// The registry this copy may read whole: its own, when it serves the process. Another copy's
/// registry is reached only through its lookup and statistics entries, so enumerating it (and
/// its report counters) is refused.
fn own_engine(what: &'static str) -> Result<()> {
    match instance::route() {
        Route::Own => Ok(()),
        Route::Other(_) => Err(Error::NotInstalled).inspect_err(|_| {
            crate::log!(
                crate::log::Level::Warn,
                "{what}: another copy of cuhook serves this process; ask that copy"
            )
        }),
    }
}

// ------------------------------------------------------------------------ registry contents

/// Copy up to `capacity` live allocations, in address order, into `out`; returns how many
/// there are (call again with more room when that is larger than `capacity`).
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` records.
#[no_mangle]
pub unsafe extern "C" fn cuhook_live(out: *mut CMemInfo, capacity: usize) -> isize {
    ffi_call(|| {
        if out.is_null() && capacity > 0 {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        own_engine("cuhook_live")?;
        let mut live = crate::registry::global().snapshot();
        live.sort_unstable_by_key(|a| a.start);
        for (i, a) in live.iter().take(capacity).enumerate() {
            // SAFETY: `i < capacity`, and `out` has room for `capacity` records (contract).
            unsafe {
                out.add(i).write(CMemInfo {
                    event: c_range(a, a.api),
                    seq: a.seq,
                })
            };
        }
        Ok(live.len().min(i32::MAX as usize) as i32)
    }) as isize
}

/// `cuhook_stats_t`: the registry's counters (the Rust struct has the C layout).
pub type CStats = crate::registry::RegistryStats;

/// The registry's counters (of the copy that serves the process).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_stats(out: *mut CStats) -> c_int {
    ffi_call(|| {
        if out.is_null() {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(crate::stats()) };
        Ok(CUHOOK_OK)
    })
}

/// `cuhook_usage_t`: live and peak bytes of one memory type on one device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUsage {
    pub mem_type: c_int,
    pub device: c_int,
    pub live: u64,
    pub peak: u64,
}

/// Copy up to `capacity` rows of live and peak bytes per memory type and device (every pair
/// that ever held memory since the counters started) into `out`; returns how many there are.
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` rows.
#[no_mangle]
pub unsafe extern "C" fn cuhook_usage(out: *mut CUsage, capacity: usize) -> isize {
    ffi_call(|| {
        if out.is_null() && capacity > 0 {
            return Err(Error::InvalidArgument {
                what: "out is NULL",
            });
        }
        own_engine("cuhook_usage")?;
        let rows = crate::report::stats::usage();
        for (i, u) in rows.iter().take(capacity).enumerate() {
            // SAFETY: `i < capacity` rows of room (contract).
            unsafe {
                out.add(i).write(CUsage {
                    mem_type: u.mem_type as c_int,
                    device: u.device,
                    live: u.live,
                    peak: u.peak,
                })
            };
        }
        Ok(rows.len() as i32)
    }) as isize
}

/// The exit report as it would be written now, NUL-terminated in `buf` (at most `len` bytes,
/// truncated to fit); returns the full length without the NUL.
///
/// # Safety
/// `buf` is NULL (with `len` 0) or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuhook_report(buf: *mut c_char, len: usize) -> isize {
    ffi_call(|| {
        if buf.is_null() && len > 0 {
            return Err(Error::InvalidArgument {
                what: "buf is NULL",
            });
        }
        own_engine("cuhook_report")?;
        let text = crate::report::render();
        if len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `buf` has `len > n` writable bytes (contract).
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        Ok(text.len().min(i32::MAX as usize) as i32)
    }) as isize
}

// ------------------------------------------------------------------------ scoped traces

/// An open trace: the file and the subscription that writes its lines.
pub struct CTrace {
    subscription: crate::Subscription,
    file: Arc<OutputFile>,
}

/// Start writing the JSON-lines trace (the format of `CUHOOK_TRACE`) of every event to `path`
/// (`%p` the process id, `%r` the MPI rank; appended; never through a symbolic link), until
/// `cuhook_trace_close`. Does not install the hooks.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_trace_open(path: *const c_char, out: *mut *mut CTrace) -> c_int {
    ffi_call(|| {
        if path.is_null() || out.is_null() {
            return Err(Error::InvalidArgument {
                what: "path or out is NULL",
            });
        }
        // SAFETY: non-null and NUL-terminated (contract).
        let path = OsStr::from_bytes(unsafe { CStr::from_ptr(path) }.to_bytes());
        let path = crate::report::expand_path(path);
        let file = OutputFile::open(&path, Mode::Append).map_err(|e| Error::Io {
            what: "open the trace file",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        if file.ends_mid_line(&path) {
            let _ = file.write(b"\n", 0);
        }
        let file = Arc::new(file);
        let writer = file.clone();
        let subscription = crate::subscribe(EventMask::ALL, 0, move |ev: &MemEvent| {
            write_trace_line(&writer, ev)
        });
        let subscription = match subscription {
            Ok(s) => s,
            Err(e) => {
                if let Ok(f) = Arc::try_unwrap(file) {
                    f.close();
                }
                return Err(e);
            }
        };
        let trace = Box::new(CTrace { subscription, file });
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(Box::into_raw(trace)) };
        Ok(CUHOOK_OK)
    })
}

/// The trace subscriber: one line, formatted on the stack, one write (a line that does not
/// fit a full pipe is dropped).
fn write_trace_line(file: &OutputFile, ev: &MemEvent) {
    let mut line = StackBuf::<512>::new();
    if crate::report::trace::format(ev, thread_id() as i64, now_ns(), &mut line).is_ok() {
        let _ = file.write(line.as_bytes(), 0);
    }
}

/// Stop the trace and close its file; when this returns no line is written any more.
///
/// # Safety
/// `trace` is NULL or from `cuhook_trace_open`, not yet closed.
#[no_mangle]
pub unsafe extern "C" fn cuhook_trace_close(trace: *mut CTrace) -> c_int {
    ffi_call(|| {
        if trace.is_null() {
            return Err(Error::InvalidArgument {
                what: "trace is NULL",
            });
        }
        // SAFETY: made by `Box::into_raw` in `cuhook_trace_open`, closed once (contract).
        let CTrace { subscription, file } = *unsafe { Box::from_raw(trace) };
        subscription.unsubscribe()?;
        // The subscriber's clone went with its closure: the file is ours alone now.
        if let Ok(f) = Arc::try_unwrap(file) {
            f.close();
        }
        Ok(CUHOOK_OK)
    })
}

// The C layouts of the structs above and of `queue/` (`include/cuhook.h`).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CStats>() == 48);
    assert!(size_of::<CUsage>() == 24 && offset_of!(CUsage, live) == 8);
    assert!(size_of::<CQueuedEvent>() == 80);
    assert!(offset_of!(CQueuedEvent, event) == 64 && offset_of!(CQueuedEvent, tid) == 68);
    assert!(offset_of!(CQueuedEvent, time_ns) == 72);
    assert!(size_of::<CQueueStats>() == 24);
};

#[cfg(test)]
mod tests;
