//! Page protections as the kernel has them now, asked one mapping at a time.
//!
//! The protection of a GOT page cannot be derived from the object's program headers alone:
//! glibc makes `PT_GNU_RELRO` read-only only after relocation, and the program may `mprotect`
//! its own pages. Only the kernel knows, so we ask it (`crate::sys::maps`), as cheaply as it
//! allows:
//!
//! - Linux ≥ 6.11: the `PROCMAP_QUERY` ioctl on `/proc/self/maps` answers "which mapping covers
//!   this address, with which protection" in well under a microsecond, whatever the number of
//!   mappings, without producing or reading any text. The file is opened when first needed in an
//!   engine operation ([`CheckedSpan`]) and closed when the operation ends; outside one, each
//!   reader opens and closes its own. cuhook holds no descriptor between operations: a host
//!   that uses every descriptor its limit allows never finds one of them taken.
//! - Older kernels, a sandbox that refuses the ioctl (a seccomp filter, at start or later), or
//!   `CUHOOK_NO_PROCMAP_QUERY=1` (tests use it): the mappings overlapping the batch are read from
//!   `/proc/self/maps` text (through `region`), once per batch. A refusal met mid-way switches
//!   for good, and the question that met it is answered from the text.
//! - No descriptor to be had (`RLIMIT_NOFILE` exhausted): protections cannot be read, so
//!   nothing is written; the engine reports the objects as unreadable and leaves them as they
//!   are (the host runs as it would without cuhook).
//!
//! Answers are cached for the batch (one query usually covers every slot of an object's GOT),
//! so a batch must not outlive the patch lock: the engine holds it while it writes.

use std::cell::{Cell, RefCell};

use region::Protection;

pub use crate::sys::maps::CheckedSpan;
use crate::sys::maps::{self, kernel_query_refused, MapsQuery};
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
        let mut regions = Regions::new();
        maps::read_text(lo, hi, |start, end, p| regions.push((start, end, p)))
            .map_err(|errno| Error::QueryProtection { address: lo, errno })?;
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
        let (start, end, p) = match query.covering(addr) {
            Ok(found) => found,
            // Refused mid-way (a seccomp filter installed after start-up): ask the text.
            Err(_) if kernel_query_refused() => {
                let text = Self::read_text(addr, addr.saturating_add(1))?;
                let found = lookup(&text.regions.borrow(), addr).ok_or(Error::QueryProtection {
                    address: addr,
                    errno: libc::ENOMEM,
                })?;
                found
            }
            Err(errno) => {
                return Err(Error::QueryProtection {
                    address: addr,
                    errno,
                })
            }
        };
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

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicU64;

    /// Some tests change process-wide state (in children of their own); one at a time.
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

    /// Descriptors of this process now.
    fn open_descriptors() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// No descriptor of ours outlives an engine operation (a span) or a query outside one:
    /// a host that uses every descriptor its limit leaves must find them all free. (Before, the
    /// descriptor was kept open for good.) In a child: other tests open files meanwhile.
    #[test]
    fn no_descriptor_is_held_between_operations() {
        let _serial = serial();
        in_child(
            || {
                let probe = open_descriptors as *const () as usize;
                let before = open_descriptors();
                let outside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
                assert_eq!(outside.at(probe).unwrap(), Protection::READ_EXECUTE);
                drop(outside);
                assert_eq!(
                    open_descriptors(),
                    before,
                    "kept after a query outside a span"
                );
                let span = CheckedSpan::begin();
                let inside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
                assert_eq!(inside.at(probe).unwrap(), Protection::READ_EXECUTE);
                let again = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
                assert_eq!(again.at(probe).unwrap(), Protection::READ_EXECUTE);
                assert!(open_descriptors() <= before + 1, "one per span at most");
                drop((inside, again, span));
                assert_eq!(open_descriptors(), before, "kept after the span");
            },
            "a descriptor was kept",
        );
    }

    /// The program closing the span's descriptor and reusing its number: queries fail (the
    /// object counts as unreadable), never answer from its file, and the span's end leaves the
    /// program's file open.
    #[test]
    fn a_replaced_span_descriptor_never_answers_and_is_not_closed() {
        let _serial = serial();
        in_child(descriptor_swap_check, "the descriptor checks failed");
    }

    /// A query the kernel refuses (a seccomp filter denying `ioctl` after start-up) is answered
    /// from the text, and so is every later one; reads of an object fall back to its declared
    /// segments. (Before, the object was "unreadable" and a plugin loaded later stayed unhooked.)
    #[test]
    fn a_refused_kernel_query_falls_back_to_the_text() {
        let _serial = serial();
        if cuhook_fixtures::skip_when_cross("qemu-user filters its own host system calls") {
            return;
        }
        in_child(
            || {
                let probe = open_descriptors as *const () as usize;
                let span = CheckedSpan::begin();
                let map = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
                if !map.uses_kernel_query() {
                    return; // nothing to refuse here
                }
                assert!(cuhook_fixtures::deny_syscalls(
                    &[libc::SYS_ioctl],
                    libc::EPERM
                ));
                assert_eq!(map.at(probe).unwrap(), Protection::READ_EXECUTE);
                assert!(kernel_query_refused());
                let page = read_only_page();
                assert_eq!(map.at(page).unwrap(), Protection::READ);
                drop(span);
                let later = ProtectionMap::for_addresses(std::iter::once(page)).unwrap();
                assert!(!later.uses_kernel_query());
                assert_eq!(later.at(page).unwrap(), Protection::READ);
            },
            "a refused query was not answered from the text",
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

    fn descriptor_swap_check() {
        let probe = descriptor_swap_check as *const () as usize;
        let span = CheckedSpan::begin();
        let inside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        if !inside.uses_kernel_query() {
            return;
        }
        assert_eq!(inside.at(probe).unwrap(), Protection::READ_EXECUTE);
        let fd = maps::span_descriptor().unwrap_or(-1);
        assert!(fd >= 0);
        // SAFETY: the span's descriptor, replaced by /dev/null under the same number (what a
        // program that closes descriptors it does not own would do).
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            assert!(null >= 0);
            assert_eq!(libc::dup2(null, fd), fd);
            libc::close(null);
        }
        let swapped = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert!(swapped.at(probe).is_err(), "a query on /dev/null answered");
        assert!(!kernel_query_refused(), "a foreign file is no refusal");
        drop((inside, swapped, span));
        // SAFETY: F_GETFD only asks whether the descriptor is open.
        let still_open = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
        assert!(still_open, "closed the program's file");
        // SAFETY: the /dev/null descriptor is ours to close (it stood in for the program's).
        unsafe { libc::close(fd) };
        let after = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
        assert_eq!(after.at(probe).unwrap(), Protection::READ_EXECUTE);
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
