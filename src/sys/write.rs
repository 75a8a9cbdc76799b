//! Raw writes that can never harm the host: no death by `SIGPIPE` when a pipe's reader has
//! gone, no unbounded wait on a full pipe, no cancellation acted on inside cuhook's frames.
//! [`stderr`] is the one way cuhook writes to the host's stderr; `crate::output` adds its own
//! files on top.
//!
//! # Safety
//! This module calls `write`, `poll`, `pthread_sigmask`, `sigpending` and `sigtimedwait`
//! directly: std offers none of them without allocating or without its own `SIGPIPE` policy,
//! and the trace writes from inside hooks. Every call passes stack values or slices valid for
//! the call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

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
fn wait_writable(fd: BorrowedFd<'_>, millis: i32) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    unsafe { libc::poll(&mut p, 1, millis) };
}

/// Write all of `bytes` to `fd`: `EINTR` and short writes retried, `SIGPIPE` never delivered
/// (when `pipe`), and a full non-blocking pipe waited for at most `patience_ms` in all.
pub fn write_all(
    fd: BorrowedFd<'_>,
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
        let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
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

/// Write to the host's stderr: the one way cuhook writes there (log lines, classification
/// warnings, `CUHOOK_REPORT=stderr`). It is the host's descriptor, so no identity check; but a
/// closed pipe there must not kill the host, and a full one is not waited for.
pub fn stderr(bytes: &[u8]) {
    // SAFETY: descriptor 2 is the process's stderr; if the host closed it, the write fails.
    let fd = unsafe { BorrowedFd::borrow_raw(libc::STDERR_FILENO) };
    let _ = write_all(fd, bytes, true, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `write_all` on a descriptor number of the test's own.
    fn write_all(fd: i32, bytes: &[u8], pipe: bool, patience_ms: i32) -> Result<(), WriteError> {
        // SAFETY: a pipe end the test opened and keeps open for the call.
        super::write_all(
            unsafe { BorrowedFd::borrow_raw(fd) },
            bytes,
            pipe,
            patience_ms,
        )
    }

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
}
