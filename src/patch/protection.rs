//! Page protections read from the kernel (`/proc/self/maps`, through `region`), read once per
//! batch of writes so patching a thousand slots does not re-read the map a thousand times.

use region::Protection;

use crate::{Error, Result};

/// The protections of the mappings covering a span of addresses, at one moment.
#[derive(Debug, Default)]
pub struct ProtectionMap {
    regions: Vec<(usize, usize, Protection)>,
}

impl ProtectionMap {
    /// Read the mappings that overlap `[lo, hi)`.
    pub fn read(lo: usize, hi: usize) -> Result<ProtectionMap> {
        let size = hi.saturating_sub(lo).max(1);
        let err = |e: region::Error| Error::QueryProtection {
            address: lo,
            errno: errno_of(&e),
        };
        let mut regions = Vec::new();
        for r in region::query_range(lo as *const u8, size).map_err(err)? {
            let r = r.map_err(err)?;
            let range = r.as_range();
            regions.push((range.start, range.end, r.protection()));
        }
        regions.sort_by_key(|r| r.0);
        Ok(ProtectionMap { regions })
    }

    /// The protection of the page holding `addr`.
    pub fn at(&self, addr: usize) -> Result<Protection> {
        let i = self.regions.partition_point(|r| r.1 <= addr);
        match self.regions.get(i) {
            Some(&(s, e, p)) if addr >= s && addr < e => Ok(p),
            _ => Err(Error::QueryProtection {
                address: addr,
                errno: libc::ENOMEM,
            }),
        }
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

pub(crate) fn errno_of(e: &region::Error) -> i32 {
    match e {
        region::Error::SystemCall(errno) => *errno,
        region::Error::UnmappedRegion => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}
