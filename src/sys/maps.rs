//! This process's mappings as the kernel has them now, asked one address at a time
//! (`PROCMAP_QUERY`), or read as `/proc/self/maps` text. `elf::protection` builds its per-batch
//! answers on these.
//!
//! - Linux ≥ 6.11: the `PROCMAP_QUERY` ioctl on `/proc/self/maps` answers "which mapping covers
//!   this address, with which protection" in well under a microsecond, whatever the number of
//!   mappings, without producing or reading any text. The file is opened when first needed in an
//!   engine operation ([`CheckedSpan`]) and closed when the operation ends; outside one, each
//!   reader opens and closes its own. cuhook holds no descriptor between operations: a host
//!   that uses every descriptor its limit allows never finds one of them taken.
//! - Older kernels, a sandbox that refuses the ioctl (a seccomp filter, at start or later), or
//!   `CUHOOK_NO_PROCMAP_QUERY=1` (tests use it): [`read_text`] (`maps_text.rs`). A refusal met
//!   mid-way switches for good ([`kernel_query_refused`]).
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

use region::Protection;

use super::fd::{self, Watched};
pub(crate) use super::maps_text::{each_line, read_text};

/// `struct procmap_query` of `<linux/fs.h>` (Linux 6.11).
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProcmapQuery {
    pub(crate) size: u64,
    pub(crate) query_flags: u64,
    pub(crate) query_addr: u64,
    pub(crate) vma_start: u64,
    pub(crate) vma_end: u64,
    pub(crate) vma_flags: u64,
    pub(crate) vma_page_size: u64,
    pub(crate) vma_offset: u64,
    pub(crate) inode: u64,
    pub(crate) dev_major: u32,
    pub(crate) dev_minor: u32,
    pub(crate) vma_name_size: u32,
    pub(crate) build_id_size: u32,
    pub(crate) vma_name_addr: u64,
    pub(crate) build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
pub(crate) const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
    | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;
pub(crate) const VMA_READABLE: u64 = 1;
const VMA_WRITABLE: u64 = 2;
const VMA_EXECUTABLE: u64 = 4;

const SPAN_NONE: u8 = 0;
const SPAN_OPEN: u8 = 1;

thread_local! {
    /// Whether this thread is inside a [`CheckedSpan`] (an engine operation).
    static SPAN: Cell<u8> = const { Cell::new(SPAN_NONE) };
    /// The descriptor this thread's span opened (none yet), closed when the span ends; watched,
    /// since a descriptor the program closed and reused meanwhile is the program's, never
    /// closed by us.
    static SPAN_FD: RefCell<Option<Watched>> = const { RefCell::new(None) };
}

/// One engine operation on one thread, in which `/proc/self/maps` is opened once (at its first
/// query) and closed at the end: indexing and patching one new object are two batches, and an
/// open per batch would cost ≈ 2 µs of each hooked `dlopen`. The program could close and reuse
/// the descriptor's number meanwhile; a query on a file that is not a maps file fails, and the
/// object is then treated as unreadable, never read. Spans do not nest.
#[derive(Debug)]
pub struct CheckedSpan(());

impl CheckedSpan {
    /// Enter a span on this thread.
    pub fn begin() -> CheckedSpan {
        SPAN.with(|s| s.set(SPAN_OPEN));
        CheckedSpan(())
    }

    /// In a child just forked by a thread inside a span: the descriptor opened in the parent
    /// reads the parent's mappings. The child's copy is closed; the next query opens its own.
    pub fn recheck_after_fork() {
        close_span_descriptor();
    }
}

impl Drop for CheckedSpan {
    fn drop(&mut self) {
        close_span_descriptor();
        SPAN.with(|s| s.set(SPAN_NONE));
    }
}

fn close_span_descriptor() {
    if let Some(fd) = SPAN_FD.with(|f| f.borrow_mut().take()) {
        fd.close();
    }
}

/// The number of this thread's span descriptor, if it has one (for tests that play a program
/// closing it).
#[cfg(test)]
pub(crate) fn span_descriptor() -> Option<std::os::fd::RawFd> {
    SPAN_FD.with(|f| f.borrow().as_ref().map(Watched::raw))
}

/// Whether `PROCMAP_QUERY` can be used: not known yet, yes, or no (an older kernel,
/// `CUHOOK_NO_PROCMAP_QUERY=1`, or refused — then for good).
static KERNEL_QUERY: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const USABLE: u8 = 1;
const REFUSED: u8 = 2;

/// Whether the kernel query was refused (or never existed): callers answer from the text.
pub(crate) fn kernel_query_refused() -> bool {
    KERNEL_QUERY.load(Ordering::Acquire) == REFUSED
}

/// Use the text from now on, after `errno` (said once).
fn refuse(errno: i32) {
    if KERNEL_QUERY.swap(REFUSED, Ordering::AcqRel) == USABLE {
        crate::log!(
            crate::log::Level::Info,
            "PROCMAP_QUERY failed ({}): reading /proc/self/maps as text from now on",
            std::io::Error::from_raw_os_error(errno)
        );
    }
}

/// Where a [`MapsQuery`] asks: a descriptor another holder closes (the span's, or the query it
/// was [shared](MapsQuery::share) from), or one of its own (closed on drop).
#[derive(Debug)]
enum Descriptor {
    /// Its number; its holder closes it.
    Borrowed(std::os::fd::RawFd),
    Own(OwnedFd),
}

/// A `/proc/self/maps` descriptor of this process to ask `PROCMAP_QUERY` on.
#[derive(Debug)]
pub(crate) struct MapsQuery {
    fd: Descriptor,
}

impl MapsQuery {
    /// A descriptor to query: the span's (opened now if it has none), or outside a span a
    /// fresh one of its own. `None` when the kernel query is not available, or no descriptor
    /// can be had.
    pub(crate) fn open() -> Option<MapsQuery> {
        match KERNEL_QUERY.load(Ordering::Acquire) {
            REFUSED => return None,
            UNKNOWN if std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_some_and(|v| v == "1") => {
                KERNEL_QUERY.store(REFUSED, Ordering::Release);
                return None;
            }
            _ => {}
        }
        if SPAN.with(Cell::get) == SPAN_OPEN {
            if let Some(fd) = SPAN_FD.with(|f| f.borrow().as_ref().map(Watched::raw)) {
                return Some(MapsQuery {
                    fd: Descriptor::Borrowed(fd),
                });
            }
            let fd = Self::open_fresh()?;
            let (watched, _) = Watched::new(fd).ok()?;
            let raw = watched.raw();
            SPAN_FD.with(|f| *f.borrow_mut() = Some(watched));
            return Some(MapsQuery {
                fd: Descriptor::Borrowed(raw),
            });
        }
        Self::open_fresh().map(|fd| MapsQuery {
            fd: Descriptor::Own(fd),
        })
    }

    /// The same descriptor, for a reader that cannot open one itself: code inside a walk of
    /// the loader's list, where [`MapsQuery::open`]'s thread-local (the span) must not be
    /// touched (`__tls_get_addr` may take the loader's TLS lock there, against a `dlclose`
    /// waiting for the walk's list lock). Ask it only while `self` lives: once `self` closed
    /// the descriptor, the number may be another file's, and a query there fails (the object
    /// is then treated as unreadable), never reads that file.
    pub(crate) fn share(&self) -> MapsQuery {
        let raw = match &self.fd {
            Descriptor::Borrowed(fd) => *fd,
            Descriptor::Own(fd) => fd.as_raw_fd(),
        };
        MapsQuery {
            fd: Descriptor::Borrowed(raw),
        }
    }

    /// Open `/proc/self/maps`; the first time, check that the kernel answers the query.
    fn open_fresh() -> Option<OwnedFd> {
        let fd = fd::open(c"/proc/self/maps", libc::O_RDONLY | libc::O_CLOEXEC, 0).ok()?;
        if KERNEL_QUERY.load(Ordering::Acquire) == UNKNOWN {
            // Probe with an address that is surely mapped: this function's code.
            match covering(fd.as_fd(), MapsQuery::open as *const () as usize) {
                Ok(_) => {
                    let _ = KERNEL_QUERY.compare_exchange(
                        UNKNOWN,
                        USABLE,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                Err(_) => {
                    KERNEL_QUERY.store(REFUSED, Ordering::Release);
                    return None;
                }
            }
        }
        Some(fd)
    }

    /// The mapping covering `addr`: (start, end, protection); else the errno (`ENOMEM`:
    /// nothing is mapped there).
    pub(crate) fn covering(&self, addr: usize) -> Result<(usize, usize, Protection), i32> {
        let fd = match &self.fd {
            // SAFETY: the span's (or a shared query's) descriptor number; if the program
            // closed or reused it, the ioctl fails (EBADF, ENOTTY) and nothing is read from
            // another file.
            Descriptor::Borrowed(fd) => unsafe { BorrowedFd::borrow_raw(*fd) },
            Descriptor::Own(fd) => fd.as_fd(),
        };
        covering(fd, addr)
    }
}

/// `PROCMAP_QUERY` on `fd` for `addr`.
fn covering(fd: BorrowedFd<'_>, addr: usize) -> Result<(usize, usize, Protection), i32> {
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: PROCMAP_QUERY reads and writes exactly one `struct procmap_query`, whose size
    // we pass in `size`; the name and build-id buffers are not requested (sizes 0).
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PROCMAP_QUERY as _,
            &mut q as *mut ProcmapQuery,
        )
    };
    if rc != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // ENOENT: nothing is mapped there. EBADF, ENOTTY: not (or no longer) a maps file of
        // ours (the program closed the descriptor and reused its number): the object is
        // treated as unreadable. Anything else (EPERM, EACCES, ENOSYS from a seccomp filter;
        // EINVAL from a kernel that does not know the ioctl): the query is not to be had.
        if !matches!(errno, libc::ENOENT | libc::EBADF | libc::ENOTTY) {
            refuse(errno);
        }
        return Err(errno);
    }
    let (start, end) = (q.vma_start as usize, q.vma_end as usize);
    if !(start <= addr && addr < end) {
        return Err(libc::ENOMEM);
    }
    let mut p = Protection::NONE;
    for (bit, prot) in [
        (VMA_READABLE, Protection::READ),
        (VMA_WRITABLE, Protection::WRITE),
        (VMA_EXECUTABLE, Protection::EXECUTE),
    ] {
        if q.vma_flags & bit != 0 {
            p |= prot;
        }
    }
    Ok((start, end, p))
}

/// The errno behind an error of `region` (its queries read `/proc/self/maps`; its `protect` is
/// `mprotect`).
pub(crate) fn errno_of(e: &region::Error) -> i32 {
    match e {
        region::Error::SystemCall(errno) => *errno,
        region::Error::UnmappedRegion => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}
