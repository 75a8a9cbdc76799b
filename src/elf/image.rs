//! Bounded reads of a loaded object's memory.
//!
//! # Safety
//! A [`LoadedObject`]'s `PT_LOAD` segments are mapped while the object stays loaded; callers
//! keep it loaded (pinned) while an [`Image`] is in use. Where the kernel can say
//! (`PROCMAP_QUERY`), a part of a readable segment counts only once the kernel has confirmed
//! that the mapping holding it is readable *now* (an object may have changed the protection of
//! its own pages); else the segment flags. Every read is checked to lie inside one such range
//! before it is made, so corrupt tables yield `None`, never a fault.
#![allow(unsafe_code)]

use std::cell::Cell;

use libc::PF_R;

use super::loaded::LoadedObject;
use super::records::Plain;
use crate::sys::maps::{kernel_query_refused, MapsQuery};

/// Most objects have at most this many readable `PT_LOAD` segments (four is usual); more are
/// looked up in the program headers each time.
const CACHED: usize = 8;
/// Confirmed mappings kept per image; an image that reads from more asks again each time.
const CONFIRMED: usize = 8;

/// Read access to one loaded object's mapped segments.
///
/// Mappings are confirmed lazily, one kernel query per mapping actually read (indexing reads
/// two or three: the tables' segment and the one holding `.dynamic`), rather than every
/// mapping of every segment up front: at install, those queries were half the time spent.
pub(crate) struct Image<'a> {
    pub obj: &'a LoadedObject,
    /// The readable segments as declared, `[start, end)`, copied once.
    declared: [(usize, usize); CACHED],
    /// How many of `declared` are used; `usize::MAX`: more than fit, use the program headers.
    count: usize,
    /// The kernel's answers; `None`: it cannot answer, the declared segments count as they are.
    kernel: Option<MapsQuery>,
    /// Parts of declared segments the kernel confirmed readable, `[start, end)`.
    confirmed: [Cell<(usize, usize)>; CONFIRMED],
    confirmed_count: Cell<usize>,
    /// The confirmed part the last read fell in (an empty range at first, which nothing is in).
    last: Cell<(usize, usize)>,
    /// The last mapping the kernel said is unreadable: reads touching it are refused without
    /// asking again (a corrupt table may send a million reads there).
    refused: Cell<(usize, usize)>,
}

impl<'a> Image<'a> {
    /// The object's image, confirmed by a query opened now (see [`MapsQuery::open`]).
    pub fn new(obj: &'a LoadedObject) -> Self {
        Image::asking(obj, MapsQuery::open())
    }

    /// The object's image, confirmed by `kernel` (`None`: the declared segments count): for
    /// readers inside walks of the loader's list, which must not open one (see
    /// [`MapsQuery::share`]).
    pub fn asking(obj: &'a LoadedObject, kernel: Option<MapsQuery>) -> Self {
        let mut img = Image {
            obj,
            declared: [(0, 0); CACHED],
            count: 0,
            kernel,
            confirmed: Default::default(),
            confirmed_count: Cell::new(0),
            last: Cell::new((usize::MAX, 0)),
            refused: Cell::new((usize::MAX, 0)),
        };
        for (s, e, flags) in obj.segments() {
            if flags & PF_R == 0 {
                continue;
            }
            if img.count == CACHED {
                img.count = usize::MAX;
                break;
            }
            img.declared[img.count] = (s, e);
            img.count += 1;
        }
        img
    }

    /// The declared readable segment holding `[addr, end)`.
    fn declared(&self, addr: usize, end: usize) -> Option<(usize, usize)> {
        let inside = |&(s, e): &(usize, usize)| addr >= s && end <= e && s < e;
        if self.count <= CACHED {
            return self.declared[..self.count].iter().copied().find(inside);
        }
        self.obj
            .segments()
            .filter(|&(_, _, flags)| flags & PF_R != 0)
            .map(|(s, e, _)| (s, e))
            .find(inside)
    }

    /// The readable range holding `[addr, addr+len)`: a declared segment, or where the kernel
    /// answers, the confirmed part of one (consecutive readable mappings joined).
    /// A zero-length read counts as one byte: it must still lie inside a segment, never at
    /// the end of one (where the walk below would find no mapping to step over).
    #[inline(always)]
    fn segment(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let end = addr.checked_add(len.max(1))?;
        // Reads come in runs from one table: try the part the last read used first (inline:
        // indexing makes a hundred reads per object, nearly all of them hits).
        let (s, e) = self.last.get();
        if addr >= s && end <= e && s < e {
            return Some((s, e));
        }
        self.segment_searched(addr, end)
    }

    /// [`Image::segment`] past the last-read check: the confirmed parts, then the kernel.
    #[inline(never)]
    fn segment_searched(&self, addr: usize, end: usize) -> Option<(usize, usize)> {
        let Some(kernel) = &self.kernel else {
            return self.declared(addr, end);
        };
        let known = self.confirmed_count.get();
        if let Some(part) = self.confirmed[..known]
            .iter()
            .map(Cell::get)
            .find(|&(s, e)| addr >= s && end <= e)
        {
            self.last.set(part);
            return Some(part);
        }
        let (seg_start, seg_end) = self.declared(addr, end)?;
        let (r_start, r_end) = self.refused.get();
        if addr < r_end && end > r_start {
            return None;
        }
        let (mut start, mut stop) = (addr, addr);
        // Each step moves past one mapping, strictly forward (`stop < end <= seg_end`).
        while stop < end {
            let (from, to, p) = match kernel.covering(stop) {
                Ok(found) => found,
                // Refused mid-way (a seccomp filter installed after start-up): the declared
                // segments count, as where the kernel has no query.
                Err(_) if kernel_query_refused() => {
                    return self.declared(addr, end);
                }
                Err(_) => return None,
            };
            if from > stop || to <= stop {
                return None;
            }
            if !p.contains(region::Protection::READ) {
                self.refused.set((from, to));
                return None;
            }
            if stop == addr {
                start = from.max(seg_start);
            }
            stop = to.min(seg_end);
        }
        if known < CONFIRMED {
            self.confirmed[known].set((start, stop));
            self.confirmed_count.set(known + 1);
        }
        self.last.set((start, stop));
        Some((start, stop))
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

/// The NUL-terminated string at `addr` in `obj` (at most `max` bytes, inside one readable
/// segment), copied.
pub fn read_c_str(obj: &LoadedObject, addr: usize, max: usize) -> Option<Vec<u8>> {
    Image::new(obj).c_str(addr, max).map(<[u8]>::to_vec)
}

/// Whether any readable, read-only segment of `obj` contains `needle` (data a program embeds,
/// such as the names a statically linked library looks up with `dlsym`). Only the parts the
/// kernel has readable are scanned (an object may have made some of its pages unreadable), one
/// mapping at a time: a needle across two mappings is not found.
pub fn segments_contain(obj: &LoadedObject, needle: &[u8]) -> bool {
    let finder = memchr::memmem::Finder::new(needle);
    let img = Image::new(obj);
    let page = region::page::size();
    obj.segments()
        .filter(|&(start, end, flags)| flags & PF_R != 0 && flags & libc::PF_W == 0 && start < end)
        .any(|(start, end, _)| {
            let mut at = start;
            while at < end {
                let Some((_, stop)) = img.segment(at, 1) else {
                    // Not readable here: try the next page.
                    at = (at & !(page - 1)).saturating_add(page);
                    continue;
                };
                // SAFETY: `[at, stop)` is one readable part of a segment of an object the
                // caller keeps loaded (`segment` confirmed it).
                let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, stop - at) };
                if finder.find(bytes).is_some() {
                    return true;
                }
                at = stop;
            }
            false
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{Elf64_Phdr, PT_LOAD};

    /// One declared readable segment over four pages: read-only, unreadable, read-only,
    /// read-write (as the program left them after its own `mprotect`).
    #[test]
    fn only_pages_the_kernel_has_readable_are_read() {
        let page = region::page::size();
        // SAFETY: a fresh private anonymous mapping of four pages, ours alone; unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        assert_ne!(base, libc::MAP_FAILED as usize);
        for i in 0..4 {
            // SAFETY: inside the mapping, still writable.
            unsafe { ((base + i * page) as *mut u64).write(0x1000 + i as u64) };
        }
        // SAFETY: the last byte of page 0: a string that runs on into page 1.
        unsafe { ((base + page - 1) as *mut u8).write(b'x') };
        for (i, prot) in [
            (0, libc::PROT_READ),
            (1, libc::PROT_NONE),
            (2, libc::PROT_READ),
        ] {
            // SAFETY: page `i` of our own mapping.
            let rc = unsafe { libc::mprotect((base + i * page) as *mut libc::c_void, page, prot) };
            assert_eq!(rc, 0);
        }
        let obj = LoadedObject {
            base: 0,
            name: "four-pages".into(),
            phdrs: vec![Elf64_Phdr {
                p_type: PT_LOAD,
                p_flags: PF_R,
                p_offset: 0,
                p_vaddr: base as u64,
                p_paddr: base as u64,
                p_filesz: 4 * page as u64,
                p_memsz: 4 * page as u64,
                p_align: page as u64,
            }],
            position: LoadedObject::UNKNOWN_POSITION,
        };
        let img = Image::new(&obj);
        let at = |i: usize| base + i * page;
        if img.kernel.is_none() {
            // No PROCMAP_QUERY here: the declared segment is all there is to go by.
            assert_eq!(img.read::<u64>(at(0)), Some(0x1000));
        } else {
            assert_eq!(img.read::<u64>(at(0)), Some(0x1000));
            assert_eq!(
                img.read::<u64>(at(1)),
                None,
                "the unreadable page is refused"
            );
            assert_eq!(img.read::<u64>(at(2)), Some(0x1002));
            assert_eq!(img.read::<u64>(at(3)), Some(0x1003));
            // A read across the read-only and read-write mappings is one readable range.
            assert!(img.array::<u64>(at(3) - 8, 2).is_some());
            // Across the hole: refused, from either side.
            assert!(img.array::<u64>(at(1) - 8, 2).is_none());
            assert!(img.array::<u64>(at(2) - 8, 2).is_none());
            // A string may not run into the hole.
            assert!(img.c_str(at(1) - 1, 64).is_none());
            // The hole, remembered, is still refused after reads elsewhere.
            assert_eq!(img.read::<u64>(at(1) + 64), None);
            // A needle is looked for only where the kernel has the pages readable (this
            // once read the whole declared segment: SIGSEGV on page 1).
            assert!(segments_contain(&obj, &0x1002u64.to_ne_bytes()));
            assert!(segments_contain(&obj, &0x1003u64.to_ne_bytes()));
            assert!(!segments_contain(&obj, b"no such bytes"));
            // Beyond the declared segment: refused whatever the kernel says.
            assert_eq!(img.read::<u64>(at(4) - 4), None);
            // Nothing at all, right at the segment's end (an empty table there): refused, at
            // once (this once looped forever, asking the kernel about the same address).
            assert!(img.array::<u64>(at(4), 0).is_none());
            assert!(img.array::<u64>(at(3), 0).is_some());
        }
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(base as *mut libc::c_void, 4 * page) };
    }
}
