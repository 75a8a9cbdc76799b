//! Bounded reads of a loaded object's memory.
//!
//! # Safety
//! A [`LoadedObject`]'s `PT_LOAD` segments are mapped while the object stays loaded; callers
//! keep it loaded (pinned) while an [`Image`] is in use. Where the kernel can say
//! (`PROCMAP_QUERY`), only the parts of the readable segments that are readable *now* count (an
//! object may have changed the protection of its own pages); else the segment flags. Every read
//! is checked to lie inside one such range before it is made, so corrupt tables yield `None`,
//! never a fault.
#![allow(unsafe_code)]

use libc::PF_R;

use super::records::Plain;
use super::snapshot::LoadedObject;

/// Most objects have at most this many readable `PT_LOAD` segments (four is usual); more are
/// looked up in the program headers each time.
const CACHED: usize = 8;

/// Read access to one loaded object's mapped segments.
pub(crate) struct Image<'a> {
    pub obj: &'a LoadedObject,
    /// The readable segments, `[start, end)`, copied once: every read is checked against them.
    readable: [(usize, usize); CACHED],
    count: usize,
}

impl<'a> Image<'a> {
    pub fn new(obj: &'a LoadedObject) -> Self {
        let mut img = Image {
            obj,
            readable: [(0, 0); CACHED],
            count: 0,
        };
        // The pages as the kernel has them now: an object may have made its own pages
        // unreadable, whatever its program headers say. Parts beyond the cache are left unread.
        let declared = obj
            .segments()
            .filter(|&(_, _, flags)| flags & PF_R != 0)
            .map(|(s, e, _)| (s, e));
        if super::protection::readable_parts(declared, |s, e| {
            if img.count < CACHED {
                img.readable[img.count] = (s, e);
                img.count += 1;
            }
        }) {
            return img;
        }
        for (s, e, flags) in obj.segments() {
            if flags & PF_R == 0 {
                continue;
            }
            if img.count == CACHED {
                img.count = usize::MAX;
                break;
            }
            img.readable[img.count] = (s, e);
            img.count += 1;
        }
        img
    }

    /// The readable segment holding `[addr, addr+len)`.
    fn segment(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let end = addr.checked_add(len)?;
        let inside = |&(s, e): &(usize, usize)| addr >= s && end <= e && s < e;
        if self.count <= CACHED {
            return self.readable[..self.count].iter().copied().find(inside);
        }
        self.obj
            .segments()
            .filter(|&(_, _, flags)| flags & PF_R != 0)
            .map(|(s, e, _)| (s, e))
            .find(inside)
    }

    fn readable(&self, addr: usize, len: usize) -> bool {
        self.segment(addr, len).is_some()
    }

    /// Read a plain-old-data value at an absolute address.
    pub fn read<T: Copy + Plain>(&self, addr: usize) -> Option<T> {
        if !self.readable(addr, std::mem::size_of::<T>()) {
            return None;
        }
        // SAFETY: the range lies in a readable segment of a loaded object (checked above); `T`
        // is plain data valid for any bit pattern; the read is unaligned-safe.
        Some(unsafe { std::ptr::read_unaligned(addr as *const T) })
    }

    /// `n` consecutive values at `addr`, checked once: `None` unless they all lie in one
    /// readable segment and `addr` is aligned for `T` (callers then read one by one).
    pub fn array<T: Copy + Plain>(&self, addr: usize, n: usize) -> Option<&'a [T]> {
        let len = n.checked_mul(std::mem::size_of::<T>())?;
        if !addr.is_multiple_of(std::mem::align_of::<T>()) || !self.readable(addr, len) {
            return None;
        }
        // SAFETY: `[addr, addr+len)` lies in one readable segment of an object the caller keeps
        // loaded; `addr` is aligned for `T`, which is plain data valid for any bit pattern.
        Some(unsafe { std::slice::from_raw_parts(addr as *const T, n) })
    }

    /// The NUL-terminated string at `addr`, looking at most `max` bytes and never past a
    /// segment's end.
    pub fn c_str(&self, addr: usize, max: usize) -> Option<&'a [u8]> {
        let (_, seg_end) = self.segment(addr, 1)?;
        let len = max.min(seg_end - addr);
        // SAFETY: `[addr, addr+len)` lies inside one readable segment.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        let nul = memchr::memchr(0, bytes)?;
        Some(&bytes[..nul])
    }
}

/// Whether any readable, read-only segment of `obj` contains `needle` (data a program embeds,
/// such as the names a statically linked library looks up with `dlsym`).
pub fn segments_contain(obj: &LoadedObject, needle: &[u8]) -> bool {
    let finder = memchr::memmem::Finder::new(needle);
    obj.segments()
        .filter(|&(_, _, flags)| flags & PF_R != 0 && flags & libc::PF_W == 0)
        .any(|(start, end, _)| {
            // SAFETY: a read-only PT_LOAD segment of a loaded object is mapped and readable for its
            // whole memsz (the loader maps it page-rounded); the caller keeps the object loaded.
            let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
            finder.find(bytes).is_some()
        })
}
