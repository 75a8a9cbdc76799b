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
//!   `/proc/self/maps` text (`sys::maps_text`, as bytes), once per batch. A refusal met mid-way
//!   switches for good, and the question that met it is answered from the text.
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
mod tests;
