//! `CUHOOK_TRACE`: one JSON object per event and line, appended with a single `write(2)` from a
//! stack buffer (no allocation inside hooks; `O_APPEND` keeps lines of several threads and
//! processes whole).

use std::ffi::OsStr;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::events::{EventKind, MemEvent};
use crate::log::{write_fd, StackBuf};

static FD: AtomicI32 = AtomicI32::new(-1);

/// Open (append) the trace file; `%p` in the path becomes the process id, `%r` the MPI rank.
pub fn open(path: &OsStr) -> std::io::Result<()> {
    let path = super::expand_path(path);
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: NUL-terminated path; the returned descriptor is owned by this module.
    #[allow(unsafe_code)]
    let fd = unsafe {
        libc::open(
            bytes.as_ptr().cast(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let old = FD.swap(fd, Ordering::AcqRel);
    if old >= 0 {
        // SAFETY: closing the descriptor this module opened before.
        #[allow(unsafe_code)]
        unsafe {
            libc::close(old)
        };
    }
    Ok(())
}

/// Format one event as a JSON line; `time_ns` is the wall-clock time (ns since the Unix epoch),
/// which lines up the traces of several processes (`cuhook view`, one lane per rank).
pub fn format(ev: &MemEvent, tid: i64, time_ns: u64, out: &mut impl Write) -> std::fmt::Result {
    let kind = match ev.kind {
        EventKind::Alloc => "alloc",
        EventKind::Free => "free",
    };
    // API names are C identifiers: nothing to escape.
    writeln!(
        out,
        "{{\"event\":\"{kind}\",\"api\":\"{}\",\"address\":\"{:#x}\",\"size\":{},\"mem_type\":\"{}\",\"device\":{},\"flags\":{},\"stream\":\"{:#x}\",\"pool\":\"{:#x}\",\"tid\":{tid},\"time_ns\":{time_ns}}}",
        ev.api.to_str().unwrap_or("?"),
        ev.address,
        ev.size,
        ev.mem_type.name(),
        ev.device,
        ev.flags,
        ev.stream,
        ev.pool,
    )
}

/// The subscriber.
pub fn on_event(ev: &MemEvent, _context: usize) {
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: gettid has no preconditions.
    #[allow(unsafe_code)]
    let tid = unsafe { libc::gettid() } as i64;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_REALTIME always exists (vDSO, no lock).
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut now)
    };
    let time_ns = (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64;
    let mut line = StackBuf::<512>::new();
    if format(ev, tid, time_ns, &mut line).is_ok() {
        write_fd(fd, line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{flags, MemType};

    #[test]
    fn a_trace_line_is_one_json_object() {
        let mut ev = MemEvent::new(EventKind::Alloc, 0x7f00_0000_1000, 4096, c"cudaMallocAsync");
        ev.mem_type = MemType::Cuda;
        ev.device = 1;
        ev.flags = flags::STREAM_ORDERED;
        let mut s = String::new();
        format(&ev, 42, 1_700_000_000_000_000_000, &mut s).unwrap();
        assert_eq!(
            s,
            "{\"event\":\"alloc\",\"api\":\"cudaMallocAsync\",\"address\":\"0x7f0000001000\",\"size\":4096,\"mem_type\":\"cuda\",\"device\":1,\"flags\":1,\"stream\":\"0x0\",\"pool\":\"0x0\",\"tid\":42,\"time_ns\":1700000000000000000}\n"
        );
    }
}
