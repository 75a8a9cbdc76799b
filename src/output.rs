//! Writing cuhook's own output (log lines, trace, exit report) so that it can never harm the
//! host: no death by `SIGPIPE` when a pipe's reader has gone, no wait for a FIFO reader that never
//! comes, no write through a symlink planted in a shared directory, and no write into a file the
//! host opened itself on a descriptor number that used to be ours.
//!
//! # Safety
//! This module calls `open`, `fstat`, `fcntl`, `write`, `poll`, `pthread_sigmask`, `sigpending`
//! and `sigtimedwait` directly: std offers none of them without allocating or without its own
//! `SIGPIPE` policy, and the trace writes from inside hooks. Every call passes stack values or
//! slices valid for the call, and descriptors this module opened (or the host's stderr).
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;

/// Lowest descriptor number an output file is moved to: far from the small numbers a program
/// that closes and reopens its files gets back.
const HIGH_FD: i32 = 512;

/// Why a write did not happen (completely).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// The descriptor no longer names the file we opened (the host closed it, and may have
    /// opened its own file on the same number): never to be written again.
    Replaced,
    /// The reader of the pipe or FIFO has gone.
    Closed,
    /// The reader is not keeping up and the patience ran out; the rest was dropped.
    Full,
    /// Any other error of `write(2)` (errno).
    Other(i32),
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `SIGPIPE` blocked on this thread for the life of the guard. A `SIGPIPE` our own write raised
/// is consumed before the old mask comes back; one that was pending before is left alone.
struct SigpipeGuard {
    old: libc::sigset_t,
    was_pending: bool,
}

impl SigpipeGuard {
    fn new() -> SigpipeGuard {
        // SAFETY: sigset_t is plain data; the calls only write to the stack values given.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            libc::sigpending(&mut pending);
            SigpipeGuard {
                old,
                was_pending: libc::sigismember(&pending, libc::SIGPIPE) == 1,
            }
        }
    }

    /// Our write failed with `EPIPE`: take the `SIGPIPE` it raised, unless one was pending
    /// already (then it belongs to the host, and signals of one number do not queue).
    fn consume(&self) {
        if self.was_pending {
            return;
        }
        // SAFETY: as in `new`; a zero timeout makes `sigtimedwait` a poll.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            while libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) < 0
                && errno() == libc::EINTR
            {}
        }
    }
}

impl Drop for SigpipeGuard {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Wait until `fd` takes more bytes or `millis` pass.
fn wait_writable(fd: i32, millis: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    unsafe { libc::poll(&mut p, 1, millis) };
}

/// Write all of `bytes` to `fd`: `EINTR` and short writes retried, `SIGPIPE` never delivered
/// (when `pipe`), and a full non-blocking pipe waited for at most `patience_ms` in all.
pub fn write_all(
    fd: i32,
    mut bytes: &[u8],
    pipe: bool,
    patience_ms: i32,
) -> Result<(), WriteError> {
    let guard = pipe.then(SigpipeGuard::new);
    // `write` and `poll` are cancellation points: never acted on inside cuhook's frames.
    let _cancel = crate::sys::cancel::Deferred::begin();
    let mut patience = patience_ms;
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable slice for its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        if n == 0 {
            // Nothing taken and no error (a device or FUSE file may answer so): asking again
            // could loop forever; drop the rest.
            return Err(WriteError::Other(libc::EIO));
        }
        match errno() {
            libc::EINTR => {}
            libc::EPIPE => {
                if let Some(g) = &guard {
                    g.consume();
                }
                return Err(WriteError::Closed);
            }
            libc::EAGAIN => {
                if patience <= 0 {
                    return Err(WriteError::Full);
                }
                let step = patience.min(10);
                wait_writable(fd, step);
                patience -= step;
            }
            e => return Err(WriteError::Other(e)),
        }
    }
    Ok(())
}

/// Write to the host's stderr (log lines, `CUHOOK_REPORT=stderr`). It is the host's descriptor,
/// so no identity check; but a closed pipe there must not kill the host.
pub fn write_stderr(bytes: &[u8]) {
    let _ = write_all(2, bytes, true, 0);
}

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
    fd: i32,
    dev: u64,
    ino: u64,
    /// A FIFO or socket: writes may raise `SIGPIPE` or find it full.
    pipe: bool,
}

impl OutputFile {
    /// Open `path` for writing: never through a symlink (`O_NOFOLLOW`), never inherited by a
    /// program the host runs (`O_CLOEXEC`), never waiting for a FIFO reader (`O_NONBLOCK`: with
    /// none, the open fails with `ENXIO`).
    pub fn open(path: &OsStr, mode: Mode) -> io::Result<OutputFile> {
        let mut bytes = path.as_bytes().to_vec();
        bytes.push(0);
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            | libc::O_NONBLOCK
            | match mode {
                Mode::Append => libc::O_APPEND,
                Mode::Truncate => libc::O_TRUNC,
            };
        // SAFETY: NUL-terminated path.
        let fd = unsafe { libc::open(bytes.as_ptr().cast(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is ours; F_DUPFD_CLOEXEC returns a new descriptor or -1.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH_FD) };
        let fd = if high >= 0 {
            // SAFETY: closing the low duplicate we just opened.
            unsafe { libc::close(fd) };
            high
        } else {
            fd
        };
        match stat(fd) {
            Some(st) => Ok(OutputFile {
                fd,
                dev: st.st_dev,
                ino: st.st_ino,
                pipe: matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK),
            }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd) };
                Err(e)
            }
        }
    }

    /// Whether this is a regular file whose last byte is not a newline: its last writer stopped
    /// mid-line (an `execve` on another thread of that process ends a `write` at a page
    /// boundary). `path` is what it was opened by: a write-only descriptor cannot be read, so the
    /// path is opened again (read-only, not through a symlink) and checked to be the same file.
    pub fn ends_mid_line(&self, path: &OsStr) -> bool {
        let Some(st) = stat(self.fd) else {
            return false;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size <= 0 {
            return false;
        }
        let mut bytes = path.as_bytes().to_vec();
        bytes.push(0);
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: NUL-terminated path.
        let fd = unsafe { libc::open(bytes.as_ptr().cast(), flags) };
        if fd < 0 {
            return false;
        }
        let mut last = [b'\n'];
        let same = stat(fd).is_some_and(|s| s.st_dev == self.dev && s.st_ino == self.ino);
        // SAFETY: one byte into our buffer from our own descriptor, which is then closed.
        let read = unsafe {
            let n = if same {
                libc::pread(fd, last.as_mut_ptr().cast(), 1, st.st_size - 1)
            } else {
                0
            };
            libc::close(fd);
            n
        };
        read == 1 && last[0] != b'\n'
    }

    /// Write `bytes` if the descriptor still names the file we opened. A host may still swap
    /// the file between the check and the write (a window of one system call); it cannot
    /// make us write into a file it opened before the check.
    pub fn write(&self, bytes: &[u8], patience_ms: i32) -> Result<(), WriteError> {
        match stat(self.fd) {
            Some(st) if st.st_dev == self.dev && st.st_ino == self.ino => {}
            _ => return Err(WriteError::Replaced),
        }
        write_all(self.fd, bytes, self.pipe, patience_ms)
    }

    /// Close the file. Only for a file no other thread can be writing to.
    pub fn close(self) {
        if stat(self.fd).is_some_and(|st| st.st_dev == self.dev && st.st_ino == self.ino) {
            // SAFETY: still our descriptor (checked just above).
            unsafe { libc::close(self.fd) };
        }
    }
}

fn stat(fd: i32) -> Option<libc::stat> {
    // SAFETY: `st` is plain data that fstat fills.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (i32, i32) {
        let mut fds = [0; 2];
        assert_eq!(
            // SAFETY: two ints for pipe2 to fill.
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) },
            0
        );
        (fds[0], fds[1])
    }

    fn sigpipe_set() -> libc::sigset_t {
        // SAFETY: plain data initialised by the calls.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            set
        }
    }

    fn sigpipe_pending() -> bool {
        // SAFETY: plain data filled by sigpending.
        unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            libc::sigismember(&pending, libc::SIGPIPE) == 1
        }
    }

    /// The SIGPIPE our write raises is taken back. (Checked on a thread that keeps SIGPIPE
    /// blocked, where a signal left behind would stay pending and show: the test harness
    /// ignores SIGPIPE, which would hide it otherwise.)
    #[test]
    fn a_write_to_a_pipe_without_reader_fails_instead_of_killing() {
        std::thread::spawn(|| {
            let (r, w) = pipe();
            let set = sigpipe_set();
            // SAFETY: this thread's own mask and descriptors.
            unsafe {
                libc::close(r);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            assert_eq!(write_all(w, b"x", true, 0), Err(WriteError::Closed));
            assert!(!sigpipe_pending(), "our SIGPIPE was left behind");
            // SAFETY: our descriptor.
            unsafe { libc::close(w) };
        })
        .join()
        .unwrap();
    }

    /// A SIGPIPE the host already had pending (blocked) is its own: it stays pending.
    #[test]
    fn a_sigpipe_pending_before_our_write_is_left_to_the_host() {
        std::thread::spawn(|| {
            let (r, w) = pipe();
            let set = sigpipe_set();
            // SAFETY: this thread's own mask, signal and descriptors.
            unsafe {
                libc::close(r);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE);
            }
            assert_eq!(write_all(w, b"x", true, 0), Err(WriteError::Closed));
            assert!(sigpipe_pending(), "the host's own SIGPIPE was taken");
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: take the host's signal back (test clean-up) and close our descriptor.
            unsafe {
                assert_eq!(
                    libc::sigtimedwait(&set, std::ptr::null_mut(), &zero),
                    libc::SIGPIPE
                );
                libc::close(w);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_full_pipe_is_given_up_after_the_patience() {
        let (r, w) = pipe();
        let big = vec![b'x'; 1 << 20];
        let start = std::time::Instant::now();
        assert_eq!(write_all(w, &big, true, 50), Err(WriteError::Full));
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        // SAFETY: our descriptors.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn a_file_replaced_behind_our_descriptor_is_not_written() {
        let dir = std::env::temp_dir().join(format!("cuhook-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = dir.join("ours");
        let theirs = dir.join("theirs");
        let f = OutputFile::open(ours.as_os_str(), Mode::Truncate).unwrap();
        assert!(f.fd >= HIGH_FD);
        f.write(b"one\n", 0).unwrap();
        // The host puts its own file on our descriptor number.
        let other = std::fs::File::create(&theirs).unwrap();
        // SAFETY: both descriptors are valid; dup2 replaces `f.fd` atomically.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&other), f.fd) };
        assert_eq!(f.write(b"two\n", 0), Err(WriteError::Replaced));
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), "one\n");
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
