//! One-line diagnostics on stderr through `write(2)`: classification may run before `main`
//! (from a library constructor) or late in process exit, when std's printing machinery may not
//! be usable.
//!
//! # Safety
//! `write` is given a pointer and length of one live byte slice.
#![allow(unsafe_code)]

/// Write `line` (which ends in a newline) to stderr; errors are ignored.
pub fn stderr_line(line: &str) {
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is a live slice; write reads at most `rest.len()` bytes from it.
        let n = unsafe { libc::write(libc::STDERR_FILENO, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            rest = &rest[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        } else {
            return;
        }
    }
}
