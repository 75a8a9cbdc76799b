//! `CUHOOK_TRACE`: one JSON object per event and line, appended with a single `write(2)` from a
//! stack buffer (no allocation inside hooks; `O_APPEND` keeps lines of several threads and
//! processes whole; a line is shorter than `PIPE_BUF`, so a pipe takes it whole or not at all).

use std::ffi::OsStr;
use std::fmt::Write;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use crate::events::{EventKind, MemEvent};
use crate::log::{Level, StackBuf};
use crate::output::{Mode, OutputFile, WriteError};

/// The open trace. Never freed: a hook on another thread may hold it while a new one is opened
/// (one small leak per `enable_trace`, which happens once per process in practice).
static FILE: AtomicPtr<OutputFile> = AtomicPtr::new(ptr::null_mut());
/// Lines dropped because the trace's reader (a pipe) did not keep up.
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The "tracing stopped" warning was printed.
static STOP_WARNED: AtomicBool = AtomicBool::new(false);

/// Open (append) the trace file; `%p` in the path becomes the process id, `%r` the MPI rank. See
/// [`OutputFile::open`] for what is refused (symlinks, a FIFO without reader).
pub fn open(path: &OsStr) -> std::io::Result<()> {
    let path = super::expand_path(path);
    let file = OutputFile::open(&path, Mode::Append)?;
    // A previous writer (this program's image before an `execve`, another process) stopped
    // mid-line: start on a new line, so that our first event is not glued to its fragment.
    if file.ends_mid_line(&path) {
        let _ = file.write(b"\n", 0);
    }
    let file = Box::into_raw(Box::new(file));
    FILE.store(file, Ordering::Release);
    Ok(())
}

/// Lines dropped so far because a pipe reader was too slow.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Stop tracing to `file` (if it is still the trace), with one warning saying why.
fn stop(file: *mut OutputFile, why: &str) {
    if FILE
        .compare_exchange(file, ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
        && !STOP_WARNED.swap(true, Ordering::Relaxed)
    {
        crate::log!(Level::Warn, "CUHOOK_TRACE: {why}; tracing stops");
    }
}

/// Format one event as a JSON line; `time_ns` is the wall-clock time (ns since the Unix epoch),
/// which lines up the traces of several processes (`cuhook view`, one lane per rank).
pub fn format(ev: &MemEvent, tid: i64, time_ns: u64, out: &mut impl Write) -> std::fmt::Result {
    let kind = match ev.kind {
        EventKind::Alloc => "alloc",
        EventKind::Free => "free",
    };
    // API names are C identifiers: nothing to escape.
    write!(
        out,
        "{{\"event\":\"{kind}\",\"api\":\"{}\",\"address\":\"{:#x}\",\"size\":{},\"mem_type\":\"{}\",\"device\":{},\"flags\":{},\"stream\":\"{:#x}\",\"pool\":\"{:#x}\",\"tid\":{tid},\"time_ns\":{time_ns}",
        ev.api.to_str().unwrap_or("?"),
        ev.range.start,
        ev.range.size,
        ev.range.mem_type.name(),
        ev.range.device,
        ev.range.flags,
        ev.range.stream,
        ev.range.pool,
    )?;
    // The call stack (`CUHOOK_STACKS`) only when one was recorded: its frames are in a
    // `"stack"` line written at exit ([`write_stacks`]).
    if ev.range.stack.0 != 0 {
        write!(out, ",\"stack\":{}", ev.range.stack.0)?;
    }
    out.write_str("}\n")
}

/// One `{"stack":ID,"frames":[…]}` line per stack the table holds, each frame with its module,
/// the offset in it, the module's build-id and, where its debug information says, the
/// function and line: what lets `cuhook` name call sites after the process is gone. Written
/// at exit (outside any hook: symbolizing reads DWARF and allocates).
pub fn write_stacks() {
    let file = FILE.load(Ordering::Acquire);
    let Some(table) = crate::stacks::table() else {
        return;
    };
    if file.is_null() {
        return;
    }
    // SAFETY: trace files are leaked, never freed: the pointer stays valid.
    #[allow(unsafe_code)]
    let f = unsafe { &*file };
    let modules = crate::stacks::module::Modules::loaded();
    let mut symbolizer = crate::stacks::symbolize::Symbolizer::new();
    for (id, frames) in table.iter() {
        let mut line = format!("{{\"stack\":{},\"frames\":[", id.0);
        for (i, &pc) in frames.iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            match modules.resolve(pc) {
                Some(frame) => {
                    let symbol = symbolizer
                        .describe(&frame, true)
                        .into_iter()
                        .next()
                        .unwrap_or_default();
                    let _ = write!(
                        line,
                        "{{\"module\":{},\"offset\":\"{:#x}\",\"build_id\":\"{}\",\"symbol\":{}}}",
                        json_string(&frame.module.path),
                        frame.offset,
                        frame.module.build_id_hex(),
                        json_string(&symbol)
                    );
                }
                None => {
                    let _ = write!(line, "{{\"address\":\"{pc:#x}\"}}");
                }
            }
        }
        line.push_str("]}\n");
        if f.write(line.as_bytes(), 100).is_err() {
            return;
        }
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The subscriber. One identity-checked, `SIGPIPE`-safe, non-blocking write per line; a line
/// a slow pipe reader has no room for is dropped and counted.
pub fn on_event(ev: &MemEvent, _context: usize) {
    let file = FILE.load(Ordering::Acquire);
    if file.is_null() {
        return;
    }
    // SAFETY: trace files are leaked, never freed: the pointer stays valid.
    #[allow(unsafe_code)]
    let f = unsafe { &*file };
    let tid = crate::sys::thread::id() as i64;
    let time_ns = crate::sys::process::realtime_ns();
    let mut line = StackBuf::<512>::new();
    if format(ev, tid, time_ns, &mut line).is_err() {
        return;
    }
    match f.write(line.as_bytes(), 0) {
        Ok(()) => {}
        Err(WriteError::Full) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Err(WriteError::Replaced) => stop(
            file,
            "the program closed the trace file's descriptor (and may have reused it)",
        ),
        Err(WriteError::Closed) => stop(file, "the trace pipe's reader has gone"),
        Err(WriteError::Other(_)) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{flags, Allocation, MemType};

    #[test]
    fn a_trace_line_is_one_json_object() {
        let mut ev = MemEvent::alloc(Allocation::new(0x7f00_0000_1000, 4096, c"cudaMallocAsync"));
        ev.range.mem_type = MemType::Cuda;
        ev.range.device = 1;
        ev.range.flags = flags::STREAM_ORDERED;
        let mut s = String::new();
        format(&ev, 42, 1_700_000_000_000_000_000, &mut s).unwrap();
        assert_eq!(
            s,
            "{\"event\":\"alloc\",\"api\":\"cudaMallocAsync\",\"address\":\"0x7f0000001000\",\"size\":4096,\"mem_type\":\"cuda\",\"device\":1,\"flags\":1,\"stream\":\"0x0\",\"pool\":\"0x0\",\"tid\":42,\"time_ns\":1700000000000000000}\n"
        );
    }
}
