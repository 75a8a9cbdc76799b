//! The calling thread's stack mapping: the only memory the unwinder reads stack words from.
//!
//! A corrupt or foreign stack can hold any value where a saved register or return address
//! should be; reading through it must never fault. The unwinder therefore reads a word only
//! when it lies inside the kernel's mapping (VMA) that holds the stack pointer at capture,
//! which stays mapped while the thread runs on it: a thread's stack is never unmapped under
//! it, and the main thread's grows but never shrinks.
//!
//! Why not `pthread_getattr_np`: it allocates (the affinity mask) and, on the main thread,
//! reads `/proc/self/maps` through stdio — neither is allowed inside a hook. Instead the
//! kernel is asked directly, without allocating:
//!
//! - Linux ≥ 6.11: `PROCMAP_QUERY` on a descriptor of `/proc/self/maps` (open, one ioctl,
//!   close);
//! - older kernels, or a sandbox that refuses the ioctl: the text of `/proc/self/maps`, read
//!   through a small buffer on the stack and parsed line by line (done once per thread).
//!
//! The answer is cached per thread in a const-initialised thread-local without destructor and
//! asked again only when the stack pointer leaves it (the main thread's stack grew below it, a
//! signal handler runs on its alternate stack, a coroutine switched stacks). A thread that
//! alternates between stacks pays the query on each switch; it stays correct.
//!
//! What remains unchecked: a mapping merged by the kernel with the stack's and later unmapped
//! (thread stacks are `MAP_STACK`, the main one `VM_GROWSDOWN`: neither merges with an
//! ordinary mapping on current kernels).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::sys::maps::{each_line, ProcmapQuery, PROCMAP_QUERY, VMA_READABLE};

thread_local! {
    /// This thread's last stack mapping, `[start, end)`; empty until asked.
    static STACK: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// How the kernel is asked: not decided, `PROCMAP_QUERY`, or the text.
static METHOD: AtomicU8 = AtomicU8::new(UNDECIDED);
const UNDECIDED: u8 = 0;
const IOCTL: u8 = 1;
const TEXT: u8 = 2;

/// Decide once, outside the hooks, whether the kernel query may be used
/// (`CUHOOK_NO_PROCMAP_QUERY=1` forces the text, as for the rest of cuhook).
pub(super) fn prepare() {
    if METHOD.load(Ordering::Relaxed) == UNDECIDED
        && std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_some_and(|v| v == "1")
    {
        METHOD.store(TEXT, Ordering::Relaxed);
    }
}

/// Use the text from now on (tests of the fallback).
#[cfg(test)]
pub(super) fn force_text(on: bool) {
    METHOD.store(if on { TEXT } else { UNDECIDED }, Ordering::Relaxed);
}

/// The readable mapping holding `sp`, `[start, end)`, from this thread's cache or the kernel.
/// No allocation; at most a few system calls when the cache misses. `None` when the kernel
/// cannot tell (no descriptor to be had, `/proc` not mounted): then nothing is read.
pub(super) fn stack_of(sp: usize) -> Option<(usize, usize)> {
    // `try_with`: a thread in its TLS destructors still answers (without the cache).
    let cached = STACK.try_with(Cell::get).unwrap_or((0, 0));
    if cached.0 <= sp && sp < cached.1 {
        return Some(cached);
    }
    // The maps text is read in pieces, and mappings changing meanwhile (other threads mapping
    // and unmapping) can make one reading miss a line: one more reading before giving up.
    let found = ask_kernel(sp).or_else(|| ask_kernel(sp))?;
    let _ = STACK.try_with(|c| c.set(found));
    Some(found)
}

/// The readable mapping holding `addr`, asked of the kernel.
fn ask_kernel(addr: usize) -> Option<(usize, usize)> {
    let fd = Descriptor::open()?;
    if METHOD.load(Ordering::Relaxed) != TEXT {
        match query(fd.0, addr) {
            Ok(found) => {
                METHOD.store(IOCTL, Ordering::Relaxed);
                return found;
            }
            // Not a kernel or sandbox that answers: the text from now on.
            Err(()) => METHOD.store(TEXT, Ordering::Relaxed),
        }
    }
    scan_text(fd.0, addr)
}

/// A descriptor of `/proc/self/maps`, closed on drop.
struct Descriptor(i32);

impl Descriptor {
    fn open() -> Option<Descriptor> {
        // SAFETY: a NUL-terminated path; the descriptor is ours.
        let fd = unsafe {
            libc::open(
                c"/proc/self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        (fd >= 0).then_some(Descriptor(fd))
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// `PROCMAP_QUERY`: `Ok(Some(mapping))` if readable, `Ok(None)` when nothing (readable) is
/// mapped there, `Err` when the kernel does not answer the ioctl.
fn query(fd: i32, addr: usize) -> Result<Option<(usize, usize)>, ()> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes exactly one `struct procmap_query`, of the size
    // passed in `size`; no name or build-id buffer is requested.
    let rc = unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if rc != 0 {
        // SAFETY: errno is this thread's.
        let errno = unsafe { *libc::__errno_location() };
        return if errno == libc::ENOENT {
            Ok(None)
        } else {
            Err(())
        };
    }
    let (start, end) = (q.vma_start as usize, q.vma_end as usize);
    let ok = start <= addr && addr < end && q.vma_flags & VMA_READABLE != 0;
    Ok(ok.then_some((start, end)))
}

/// The text of `/proc/self/maps`, streamed through a small stack buffer: the line whose
/// `start-end` holds `addr`, if its protection is readable.
fn scan_text(fd: i32, addr: usize) -> Option<(usize, usize)> {
    let mut found = None;
    each_line(fd, &mut [0u8; 512], |start, end, protection| {
        if start <= addr && addr < end {
            found = protection
                .contains(region::Protection::READ)
                .then_some((start, end));
        }
        // Mappings are listed in address order.
        end <= addr
    })
    .ok()?;
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_query_and_the_text_agree_on_this_threads_stack() {
        let local = 0u64;
        let sp = &local as *const u64 as usize;
        let fd = Descriptor::open().unwrap();
        let text = scan_text(fd.0, sp).expect("the stack is in the text");
        assert!(text.0 <= sp && sp < text.1);
        if let Ok(found) = query(Descriptor::open().unwrap().0, sp) {
            assert_eq!(found, Some(text));
        }
        assert_eq!(stack_of(sp), Some(text));
        // Nothing is mapped at page 0.
        assert_eq!(scan_text(Descriptor::open().unwrap().0, 16), None);
    }
}
