//! File descriptors: opened as owned values, asked which file they name (`fstat`, the one
//! identity check), and, for descriptors the host may close and reuse behind our back,
//! [`Watched`]: used and closed only while they still name the file we opened.
//!
//! std's `File` would do for the opens, but it allocates for the path and closes on drop; the
//! callers here need neither (the trace writes from inside hooks; a descriptor the host took
//! over must never be closed by us).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, CStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

/// Which file a descriptor names: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
}

/// What `fstat` says of a descriptor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    /// The file it names.
    pub(crate) identity: Identity,
    /// `st_mode & S_IFMT`.
    pub(crate) kind: libc::mode_t,
    /// `st_size`.
    pub(crate) size: i64,
}

impl Status {
    /// A FIFO or a socket: writes may raise `SIGPIPE` or find it full.
    pub(crate) fn is_pipe(&self) -> bool {
        matches!(self.kind, libc::S_IFIFO | libc::S_IFSOCK)
    }

    /// A regular file.
    pub(crate) fn is_regular(&self) -> bool {
        self.kind == libc::S_IFREG
    }
}

/// `fstat(fd)`; `None` when the descriptor is not open.
pub(crate) fn status(fd: BorrowedFd<'_>) -> Option<Status> {
    // SAFETY: `st` is plain data that fstat fills (or leaves alone when it fails).
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd.as_raw_fd(), &mut st) == 0).then_some(Status {
            identity: Identity {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            kind: st.st_mode & libc::S_IFMT,
            size: st.st_size,
        })
    }
}

/// `open(path, flags, mode)`: a descriptor of our own.
pub(crate) fn open(path: &CStr, flags: c_int, mode: c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor returned is ours alone.
    let fd = unsafe { libc::open(path.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A duplicate of `fd` numbered `lowest` or above (`F_DUPFD_CLOEXEC`); `None` when there is
/// no such number free.
pub(crate) fn duplicate_at_least(fd: BorrowedFd<'_>, lowest: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1; no memory is passed.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, lowest) };
    // SAFETY: a fresh descriptor nobody else owns.
    (high >= 0).then(|| unsafe { OwnedFd::from_raw_fd(high) })
}

/// `pread(fd, buf, offset)`: the bytes read, or -1.
pub(crate) fn read_at(fd: BorrowedFd<'_>, buf: &mut [u8], offset: i64) -> isize {
    // SAFETY: `buf` is writable for its length.
    unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), offset) }
}

/// Whether `path` exists (`access(F_OK)`).
pub(crate) fn exists(path: &CStr) -> bool {
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), libc::F_OK) == 0 }
}

/// A descriptor of ours that the host may close and reuse the number of (a program that closes
/// every descriptor it did not open, then opens its own): it is used, and closed, only while
/// it still names the file we opened. It is never closed on drop, since by then the number may
/// be the host's.
#[derive(Debug)]
pub(crate) struct Watched {
    fd: RawFd,
    identity: Identity,
}

impl Watched {
    /// Watch `fd`, with what `fstat` says of it now; the error of `fstat` (the descriptor is
    /// then closed).
    pub(crate) fn new(fd: OwnedFd) -> io::Result<(Watched, Status)> {
        match status(fd.as_fd()) {
            Some(st) => Ok((
                Watched {
                    fd: fd.into_raw_fd(),
                    identity: st.identity,
                },
                st,
            )),
            None => Err(io::Error::last_os_error()),
        }
    }

    /// The descriptor, if it still names our file (the host may still swap it between this
    /// check and the use: a window of one system call).
    pub(crate) fn get(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the number was ours; if the host has closed it since, `fstat` fails and the
        // borrow is not handed out, and a concurrent close only makes the use fail (EBADF).
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        (status(fd)?.identity == self.identity).then_some(fd)
    }

    /// Whether the descriptor still names our file.
    pub(crate) fn is_ours(&self) -> bool {
        self.get().is_some()
    }

    /// The number, for a use that fails harmlessly on another file (an ioctl only a maps file
    /// answers), or for tests that play the host.
    pub(crate) fn raw(&self) -> RawFd {
        self.fd
    }

    /// Close the descriptor if it still names our file; else it is the host's, and left open.
    pub(crate) fn close(self) {
        if self.is_ours() {
            // SAFETY: still our descriptor (checked just above), closed once (`self` is gone).
            drop(unsafe { OwnedFd::from_raw_fd(self.fd) });
        }
    }
}
