//! Writing cuhook's own output (log lines, trace, exit report) so that it can never harm the
//! host: no death by `SIGPIPE` when a pipe's reader has gone, no wait for a FIFO reader that never
//! comes, no write through a symlink planted in a shared directory, and no write into a file the
//! host opened itself on a descriptor number that used to be ours. The system calls are
//! `crate::sys`'s (`write` for the raw writes, and the one way to stderr; `fd` for descriptors).

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use crate::sys::fd::{self, Watched};
pub use crate::sys::write::WriteError;

/// Lowest descriptor number an output file is moved to: far from the small numbers a program
/// that closes and reopens its files gets back.
const HIGH_FD: i32 = 512;

/// How an [`OutputFile`] is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Keep what is there and add at the end (the trace: several processes share it).
    Append,
    /// Start empty (the exit report).
    Truncate,
}

/// A file cuhook opened for its own output, remembered by device and inode so that a write can
/// tell whether the descriptor still names it.
#[derive(Debug)]
pub struct OutputFile {
    file: Watched,
    /// A FIFO or socket: writes may raise `SIGPIPE` or find it full.
    pipe: bool,
}

/// `path` as a C string (cut at a NUL inside it, as the C library would read it).
fn c_path(path: &OsStr) -> Vec<u8> {
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

impl OutputFile {
    /// Open `path` for writing: never through a symlink (`O_NOFOLLOW`), never inherited by a
    /// program the host runs (`O_CLOEXEC`), never waiting for a FIFO reader (`O_NONBLOCK`: with
    /// none, the open fails with `ENXIO`).
    pub fn open(path: &OsStr, mode: Mode) -> io::Result<OutputFile> {
        let bytes = c_path(path);
        let path = CStr::from_bytes_until_nul(&bytes).expect("NUL-terminated");
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            | libc::O_NONBLOCK
            | match mode {
                Mode::Append => libc::O_APPEND,
                Mode::Truncate => libc::O_TRUNC,
            };
        let low = fd::open(path, flags, 0o644)?;
        // The low duplicate is closed when `low` drops.
        let fd = fd::duplicate_at_least(low.as_fd(), HIGH_FD).unwrap_or(low);
        let (file, st) = Watched::new(fd)?;
        Ok(OutputFile {
            file,
            pipe: st.is_pipe(),
        })
    }

    /// Whether this is a regular file whose last byte is not a newline: its last writer stopped
    /// mid-line (an `execve` on another thread of that process ends a `write` at a page
    /// boundary). `path` is what it was opened by: a write-only descriptor cannot be read, so the
    /// path is opened again (read-only, not through a symlink) and checked to be the same file.
    pub fn ends_mid_line(&self, path: &OsStr) -> bool {
        let Some(ours) = self.file.get() else {
            return false;
        };
        let Some(st) = fd::status(ours) else {
            return false;
        };
        if !st.is_regular() || st.size <= 0 {
            return false;
        }
        let bytes = c_path(path);
        let path = CStr::from_bytes_until_nul(&bytes).expect("NUL-terminated");
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let Ok(reader) = fd::open(path, flags, 0) else {
            return false;
        };
        let mut last = [b'\n'];
        let same = fd::status(reader.as_fd()).is_some_and(|s| s.identity == st.identity);
        let read = if same {
            fd::read_at(reader.as_fd(), &mut last, st.size - 1)
        } else {
            0
        };
        read == 1 && last[0] != b'\n'
    }

    /// Write `bytes` if the descriptor still names the file we opened. A host may still swap
    /// the file between the check and the write (a window of one system call); it cannot
    /// make us write into a file it opened before the check.
    pub fn write(&self, bytes: &[u8], patience_ms: i32) -> Result<(), WriteError> {
        let Some(fd) = self.file.get() else {
            return Err(WriteError::Replaced);
        };
        crate::sys::write::write_all(fd, bytes, self.pipe, patience_ms)
    }

    /// Close the file. Only for a file no other thread can be writing to.
    pub fn close(self) {
        self.file.close();
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[test]
    fn a_file_replaced_behind_our_descriptor_is_not_written() {
        let dir = std::env::temp_dir().join(format!("cuhook-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours");
        let theirs = dir.join("theirs");
        let f = OutputFile::open(ours.as_os_str(), Mode::Truncate).unwrap();
        assert!(f.file.raw() >= HIGH_FD);
        f.write(b"one\n", 0).unwrap();
        // The host puts its own file on our descriptor number.
        let other = std::fs::File::create(&theirs).unwrap();
        // SAFETY: both descriptors are valid; dup2 replaces ours atomically.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&other), f.file.raw()) };
        assert_eq!(f.write(b"two\n", 0), Err(WriteError::Replaced));
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), "one\n");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
