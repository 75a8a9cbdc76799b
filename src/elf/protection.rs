//! Page protections as the kernel has them now, asked one mapping at a time.
//!
//! The protection of a GOT page cannot be derived from the object's program headers alone:
//! glibc makes `PT_GNU_RELRO` read-only only after relocation, and the program may `mprotect`
//! its own pages. Only the kernel knows, so we ask it, as cheaply as it allows:
//!
//! - Linux ≥ 6.11: the `PROCMAP_QUERY` ioctl on `/proc/self/maps` answers "which mapping covers
//!   this address, with which protection" in well under a microsecond, whatever the number of
//!   mappings, without producing or reading any text. The file is opened once and kept (close on
//!   exec); before each batch, or once per engine operation ([`CheckedSpan`]), its identity
//!   (`fstat`) and our pid (a forked child must not query its parent's map) are checked, and it
//!   is reopened when either changed.
//! - Older kernels (or a sandbox that refuses the ioctl): the mappings overlapping the batch are
//!   read from `/proc/self/maps` text (through `region`), once per batch. The environment
//!   variable `CUHOOK_NO_PROCMAP_QUERY=1` selects this path (tests use it).
//!
//! Answers are cached for the batch (one query usually covers every slot of an object's GOT),
//! so a batch must not outlive the patch lock: the engine holds it while it writes.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use region::Protection;

use crate::{Error, Result};

/// Mappings one map keeps without a heap allocation: a `dlopen` writes one or two pages (the
/// map is returned by value: a bigger inline part would be copied on every `dlopen`).
type Regions = smallvec::SmallVec<[(usize, usize, Protection); 4]>;

/// An empty mapping: no address is in it.
const NOTHING: (usize, usize, Protection) = (0, 0, Protection::NONE);

/// The protections of the mappings covering some addresses, at one moment.
#[derive(Debug, Default)]
pub struct ProtectionMap {
    /// Mappings known so far: (start, end, protection), sorted by start.
    regions: RefCell<Regions>,
    /// The kernel query to fill misses with; `None`: only `regions` (read from text) count.
    query: Option<MapsQuery>,
    /// The mapping the last answer came from (empty at first): consecutive slots of one object
    /// nearly always share it, and are answered without a search.
    last: Cell<(usize, usize, Protection)>,
}

impl ProtectionMap {
    /// A map for writes to `addresses`: asks the kernel lazily where it can, else reads the
    /// mappings overlapping their span now.
    pub fn for_addresses(addresses: impl Iterator<Item = usize>) -> Result<ProtectionMap> {
        if let Some(query) = MapsQuery::open() {
            return Ok(ProtectionMap {
                regions: RefCell::new(Regions::new()),
                query: Some(query),
                last: Cell::new(NOTHING),
            });
        }
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for a in addresses {
            lo = lo.min(a);
            hi = hi.max(a.saturating_add(8));
        }
        if lo >= hi {
            return Ok(ProtectionMap::default());
        }
        Self::read_text(lo, hi)
    }

    /// Read the mappings that overlap `[lo, hi)` from `/proc/self/maps` (the fallback; also
    /// what the tests compare the kernel query with).
    pub fn read_text(lo: usize, hi: usize) -> Result<ProtectionMap> {
        let size = hi.saturating_sub(lo).max(1);
        let err = |e: region::Error| Error::QueryProtection {
            address: lo,
            errno: errno_of(&e),
        };
        let mut regions = Regions::new();
        for r in region::query_range(lo as *const u8, size).map_err(err)? {
            let r = r.map_err(err)?;
            let range = r.as_range();
            regions.push((range.start, range.end, r.protection()));
        }
        regions.sort_by_key(|r| r.0);
        Ok(ProtectionMap {
            regions: RefCell::new(regions),
            query: None,
            last: Cell::new(NOTHING),
        })
    }

    /// Make room for `n` more answers, so that asking allocates nothing (inside a
    /// `dl_iterate_phdr` callback).
    pub fn reserve(&self, n: usize) {
        self.regions.borrow_mut().reserve(n);
    }

    /// Whether this map asks the kernel with `PROCMAP_QUERY` (rather than reading text).
    pub fn uses_kernel_query(&self) -> bool {
        self.query.is_some()
    }

    /// The protection of the page holding `addr`.
    pub fn at(&self, addr: usize) -> Result<Protection> {
        let (start, end, p) = self.last.get();
        if addr >= start && addr < end {
            return Ok(p);
        }
        if let Some(r) = lookup(&self.regions.borrow(), addr) {
            self.last.set(r);
            return Ok(r.2);
        }
        let Some(query) = &self.query else {
            return Err(Error::QueryProtection {
                address: addr,
                errno: libc::ENOMEM,
            });
        };
        let (start, end, p) = query.covering(addr)?;
        let mut regions = self.regions.borrow_mut();
        let at = regions.partition_point(|r| r.0 < start);
        regions.insert(at, (start, end, p));
        self.last.set((start, end, p));
        Ok(p)
    }
}

/// The known mapping holding `addr`.
fn lookup(
    regions: &[(usize, usize, Protection)],
    addr: usize,
) -> Option<(usize, usize, Protection)> {
    let i = regions.partition_point(|r| r.1 <= addr);
    match regions.get(i) {
        Some(&r) if addr >= r.0 && addr < r.1 => Some(r),
        _ => None,
    }
}

/// `struct procmap_query` of `<linux/fs.h>` (Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30)
    | ((std::mem::size_of::<ProcmapQuery>() as libc::c_ulong) << 16)
    | ((b'f' as libc::c_ulong) << 8)
    | 17;
const VMA_READABLE: u64 = 1;
const VMA_WRITABLE: u64 = 2;
const VMA_EXECUTABLE: u64 = 4;

const SPAN_NONE: u8 = 0;
const SPAN_OPEN: u8 = 1;
const SPAN_CHECKED: u8 = 2;

thread_local! {
    /// This thread's [`CheckedSpan`]: none, open (descriptor not checked yet in it), or checked.
    static SPAN: Cell<u8> = const { Cell::new(SPAN_NONE) };
}

/// A stretch of work on one thread (one engine operation) in which the kept descriptor is
/// checked (pid, `fstat`) once, at its first use, rather than at every batch: indexing and
/// patching one new object are two batches, and the check cost ≈ 1 µs of each hooked
/// `dlopen`. The program could close and reuse the descriptor's number between two uses, as it
/// could between the check and the query anyway; a query on a file that is not a maps file
/// fails, and the object is then treated as unreadable, never read. Spans do not nest.
#[derive(Debug)]
pub struct CheckedSpan(());

impl CheckedSpan {
    pub fn begin() -> CheckedSpan {
        SPAN.with(|s| s.set(SPAN_OPEN));
        CheckedSpan(())
    }

    /// In a child just forked by a thread inside a span: the descriptor checked in the parent
    /// reads the parent's mappings, so the span's next use checks (and reopens) it again.
    pub fn recheck_after_fork() {
        SPAN.with(|s| {
            if s.get() == SPAN_CHECKED {
                s.set(SPAN_OPEN);
            }
        });
    }
}

impl Drop for CheckedSpan {
    fn drop(&mut self) {
        SPAN.with(|s| s.set(SPAN_NONE));
    }
}

/// The kept `/proc/self/maps` descriptor: -1 not opened yet, -2 the kernel has no
/// `PROCMAP_QUERY` (use the text), else the descriptor.
static MAPS_FD: AtomicI32 = AtomicI32::new(-1);
/// The pid that opened `MAPS_FD`.
static MAPS_PID: AtomicI32 = AtomicI32::new(0);
/// `st_dev` and `st_ino` of `MAPS_FD` when we opened it.
static MAPS_DEV: AtomicU64 = AtomicU64::new(0);
static MAPS_INO: AtomicU64 = AtomicU64::new(0);
const UNSUPPORTED: i32 = -2;

fn current_pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// A validated `/proc/self/maps` descriptor of this process.
#[derive(Debug)]
pub(super) struct MapsQuery {
    fd: i32,
}

impl MapsQuery {
    /// The kept descriptor if it is still ours, else a fresh one; `None` when the kernel query
    /// is not available.
    pub(super) fn open() -> Option<MapsQuery> {
        let fd = MAPS_FD.load(Ordering::Acquire);
        if fd == UNSUPPORTED {
            return None;
        }
        let span = SPAN.with(Cell::get);
        if span == SPAN_CHECKED && fd >= 0 {
            return Some(MapsQuery { fd });
        }
        let q = Self::open_checked(fd)?;
        if span == SPAN_OPEN {
            SPAN.with(|s| s.set(SPAN_CHECKED));
        }
        Some(q)
    }

    /// [`MapsQuery::open`] with the identity and pid checks.
    fn open_checked(fd: i32) -> Option<MapsQuery> {
        if fd == -1 && std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_some_and(|v| v == "1") {
            MAPS_FD.store(UNSUPPORTED, Ordering::Release);
            return None;
        }
        let pid = current_pid();
        if fd >= 0 && MAPS_PID.load(Ordering::Acquire) == pid && same_file(fd) {
            return Some(MapsQuery { fd });
        }
        // Not opened yet, opened by our parent before a fork, or closed (and maybe reused) by
        // the program: open our own. (A forked child's inherited descriptor is left alone.)
        // SAFETY: a NUL-terminated path; the descriptor is ours.
        let fresh = unsafe {
            libc::open(
                c"/proc/self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fresh < 0 {
            return None;
        }
        let q = MapsQuery { fd: fresh };
        // Probe with an address that is surely mapped: this function's code.
        if q.covering(MapsQuery::open as *const () as usize).is_err() {
            // SAFETY: closing the descriptor we just opened.
            unsafe { libc::close(fresh) };
            MAPS_FD.store(UNSUPPORTED, Ordering::Release);
            return None;
        }
        let Some((dev, ino)) = identity(fresh) else {
            // SAFETY: as above.
            unsafe { libc::close(fresh) };
            return None;
        };
        MAPS_DEV.store(dev, Ordering::Release);
        MAPS_INO.store(ino, Ordering::Release);
        MAPS_PID.store(pid, Ordering::Release);
        // Another thread may have installed its own fresh descriptor meanwhile and be using it:
        // never close that one. Install ours only over the value found stale; when a valid one
        // won the race, use it and close ours.
        let mut expected = fd;
        loop {
            match MAPS_FD.compare_exchange(expected, fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(q),
                Err(current) if current >= 0 && same_file_as(current, dev, ino) => {
                    // SAFETY: closing the descriptor we just opened, never published.
                    unsafe { libc::close(fresh) };
                    return Some(MapsQuery { fd: current });
                }
                Err(current) => expected = current,
            }
        }
    }

    /// The mapping covering `addr`: (start, end, protection).
    pub(super) fn covering(&self, addr: usize) -> Result<(usize, usize, Protection)> {
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY reads and writes exactly one `struct procmap_query`, whose size
        // we pass in `size`; the name and build-id buffers are not requested (sizes 0).
        let rc = unsafe { libc::ioctl(self.fd, PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
        if rc != 0 {
            return Err(Error::QueryProtection {
                address: addr,
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        let (start, end) = (q.vma_start as usize, q.vma_end as usize);
        if !(start <= addr && addr < end) {
            return Err(Error::QueryProtection {
                address: addr,
                errno: libc::ENOMEM,
            });
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
}

fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: fstat fills the zeroed struct for a descriptor (or fails).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn same_file_as(fd: i32, dev: u64, ino: u64) -> bool {
    identity(fd) == Some((dev, ino))
}

fn same_file(fd: i32) -> bool {
    same_file_as(
        fd,
        MAPS_DEV.load(Ordering::Acquire),
        MAPS_INO.load(Ordering::Acquire),
    )
}

/// `rwx` letters as in `/proc/self/maps`.
pub fn letters(p: Protection) -> String {
    let f = |bit, c| if p.contains(bit) { c } else { '-' };
    [
        f(Protection::READ, 'r'),
        f(Protection::WRITE, 'w'),
        f(Protection::EXECUTE, 'x'),
    ]
    .iter()
    .collect()
}

pub(crate) fn errno_of(e: &region::Error) -> i32 {
    match e {
        region::Error::SystemCall(errno) => *errno,
        region::Error::UnmappedRegion => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the kept descriptor, and one of them closes it under the others.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages of every kind this process has: code (r-x), read-only data, RELRO (r--),
    /// writable data (rw-), and fresh anonymous pages whose protection we set ourselves.
    #[test]
    fn kernel_query_agrees_with_the_maps_text() {
        let _serial = serial();
        static DATA: AtomicU64 = AtomicU64::new(1);
        let page = region::page::size();
        // SAFETY: a fresh private anonymous mapping of three pages, ours alone.
        let anon = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert_ne!(anon as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: the middle page of our own mapping.
        let rc =
            unsafe { libc::mprotect((anon + page) as *mut libc::c_void, page, libc::PROT_READ) };
        assert_eq!(rc, 0);
        let probes = [
            kernel_query_agrees_with_the_maps_text as *const () as usize,
            "a string literal".as_ptr() as usize,
            &DATA as *const AtomicU64 as usize,
            anon,
            anon + page + 8,
            anon + 2 * page + 16,
        ];
        let lazy = ProtectionMap::for_addresses(probes.iter().copied()).unwrap();
        if !lazy.uses_kernel_query() {
            eprintln!(
                "PROCMAP_QUERY unavailable (kernel {}): only the text path was checked",
                release()
            );
        }
        for &a in &probes {
            let text = ProtectionMap::read_text(a, a + 8).unwrap().at(a).unwrap();
            assert_eq!(lazy.at(a).unwrap(), text, "address {a:#x}");
        }
        assert_eq!(lazy.at(anon + page).unwrap(), Protection::READ);
        assert_eq!(lazy.at(anon).unwrap(), Protection::READ_WRITE);
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(anon as *mut libc::c_void, 3 * page) };
        // Unmapped now: the kernel query must say so rather than answer from anything stale.
        let fresh = ProtectionMap::for_addresses(std::iter::once(anon)).unwrap();
        assert!(fresh.at(anon + page).is_err());
    }

    /// Where `PROCMAP_QUERY` exists (Linux ≥ 6.11), it is what the engine uses.
    #[test]
    fn kernel_query_used_where_the_kernel_has_it() {
        let _serial = serial();
        let (major, minor) = kernel_version();
        let map = ProtectionMap::for_addresses(std::iter::once(0x1000)).unwrap();
        // qemu-user reports the host's kernel but does not pass the ioctl through.
        if cuhook_fixtures::skip_when_cross("qemu-user has no PROCMAP_QUERY") {
            return;
        }
        if (major, minor) >= (6, 11) && std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_none() {
            assert!(map.uses_kernel_query(), "kernel {}", release());
        }
    }

    /// The program closing our descriptor and reusing its number must not make us ask (or
    /// close) its file; a forked child must not get its parent's answers.
    #[test]
    fn kept_descriptor_is_checked_before_each_batch() {
        let _serial = serial();
        // The check closes and replaces the process-wide descriptor while other tests of this
        // process read objects through it, so it runs in a child of its own (the module keeps
        // only atomics, no lock a vanished thread could hold).
        in_child(
            descriptor_swap_check,
            "the descriptor checks failed in the child",
        );
    }

    /// A thread that forks inside a checked span (a subscriber called during an engine
    /// operation may) must not go on asking its parent's map in the child: the engine's
    /// child fork handler calls [`CheckedSpan::recheck_after_fork`].
    #[test]
    fn a_child_forked_inside_a_span_asks_its_own_map() {
        let _serial = serial();
        in_child(fork_inside_span_check, "the child asked its parent's map");
    }

    fn fork_inside_span_check() {
        let probe = fork_inside_span_check as *const () as usize;
        let span = CheckedSpan::begin();
        let Ok(map) = ProtectionMap::for_addresses(std::iter::once(probe)) else {
            return;
        };
        if !map.uses_kernel_query() {
            return; // no kept descriptor to go stale
        }
        assert_eq!(map.at(probe).unwrap(), Protection::READ_EXECUTE);
        in_child(
            || {
                let page = read_only_page();
                // Still checked: the parent's map, which has no such page.
                assert!(
                    protection_of(page).is_none(),
                    "answered from the parent's map"
                );
                CheckedSpan::recheck_after_fork();
                assert_eq!(protection_of(page), Some(Protection::READ));
            },
            "the child asked its parent's map",
        );
        drop(span);
    }

    /// A fresh read-only page of this process (never unmapped: the tests using it end their
    /// process soon).
    fn read_only_page() -> usize {
        // SAFETY: a fresh private anonymous mapping, ours alone.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        page as usize
    }

    /// The protection a fresh map finds at `addr`.
    fn protection_of(addr: usize) -> Option<Protection> {
        ProtectionMap::for_addresses(std::iter::once(addr))
            .and_then(|m| m.at(addr))
            .ok()
    }

    /// Run `check` in a forked child; fail with `what` unless it passes there.
    fn in_child(check: fn(), what: &str) {
        assert!(
            cuhook_fixtures::forked(60, || {
                check();
                true
            }),
            "{what} (its panic is printed above)"
        );
    }

    /// Threads that open the kept descriptor for the first time together each get one that
    /// works: the one that loses the race never has its descriptor closed by the winner
    /// (before, a reader saw EBADF and an object looked unreadable). Runs in a child of its own,
    /// since it resets the process-wide descriptor.
    #[test]
    fn concurrent_first_opens_all_get_a_working_descriptor() {
        let _serial = serial();
        in_child(first_open_race, "a reader got a broken descriptor");
    }

    fn first_open_race() {
        let probe = first_open_race as *const () as usize;
        if MapsQuery::open().is_none() {
            return; // no kernel query on this kernel
        }
        const THREADS: usize = 8;
        const ROUNDS: usize = 3000;
        let start = std::sync::Barrier::new(THREADS + 1);
        let done = std::sync::Barrier::new(THREADS + 1);
        let failures = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..ROUNDS {
                        start.wait();
                        // A reader keeps using what it got for a while (one batch).
                        let ok = MapsQuery::open()
                            .is_some_and(|q| (0..20).all(|_| q.covering(probe).is_ok()));
                        if !ok {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        done.wait();
                    }
                });
            }
            for _ in 0..ROUNDS {
                // As before any query: no descriptor kept yet.
                let fd = MAPS_FD.swap(-1, Ordering::AcqRel);
                if fd >= 0 {
                    // SAFETY: our own descriptor, unused between rounds.
                    unsafe { libc::close(fd) };
                }
                start.wait();
                done.wait();
            }
        });
        assert_eq!(
            failures.load(Ordering::Relaxed),
            0,
            "of {ROUNDS} rounds × {THREADS} readers"
        );
    }

    fn descriptor_swap_check() {
        let probe = descriptor_swap_check as *const () as usize;
        let first = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        if !first.uses_kernel_query() {
            return;
        }
        first.at(probe).unwrap();
        let fd = MAPS_FD.load(Ordering::Acquire);
        assert!(fd >= 0);
        // The program closes it and opens something else under the same number.
        // SAFETY: our own descriptor, then /dev/null duplicated onto its number.
        let other = unsafe {
            libc::close(fd);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            assert!(null >= 0);
            if null != fd {
                assert_eq!(libc::dup2(null, fd), fd);
                libc::close(null);
            }
            fd
        };
        let again = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert_eq!(again.at(probe).unwrap(), Protection::READ_EXECUTE);
        assert_ne!(MAPS_FD.load(Ordering::Acquire), other, "a fresh descriptor");
        // The program's file is still open (we did not close it).
        // SAFETY: F_GETFD only asks whether the descriptor is open.
        assert!(unsafe { libc::fcntl(other, libc::F_GETFD) } >= 0);
        // SAFETY: the /dev/null descriptor is ours to close (it stood in for the program's).
        unsafe { libc::close(other) };

        // A forked child asks about its own mappings.
        in_child(
            || assert_eq!(protection_of(read_only_page()), Some(Protection::READ)),
            "child saw the wrong mappings",
        );

        // Inside a checked span the descriptor is checked once: swapped after that, a query
        // fails (the caller treats the address as unreadable), it never answers from the
        // wrong file; once the span ends, the next batch checks and reopens.
        let span = CheckedSpan::begin();
        let inside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert_eq!(inside.at(probe).unwrap(), Protection::READ_EXECUTE);
        let fd = MAPS_FD.load(Ordering::Acquire);
        // SAFETY: our own descriptor, replaced by /dev/null under the same number.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            assert!(null >= 0);
            assert_eq!(libc::dup2(null, fd), fd);
            libc::close(null);
        }
        let swapped = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert!(swapped.at(probe).is_err(), "a query on /dev/null answered");
        drop(span);
        let after = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert_eq!(after.at(probe).unwrap(), Protection::READ_EXECUTE);
        assert_ne!(
            MAPS_FD.load(Ordering::Acquire),
            fd,
            "reopened after the span"
        );
        // SAFETY: the /dev/null descriptor left under the old number is ours.
        unsafe { libc::close(fd) };
    }

    fn release() -> String {
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
    }

    fn kernel_version() -> (u32, u32) {
        let r = release();
        let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
        let major = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let minor = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        (major, minor)
    }
}
