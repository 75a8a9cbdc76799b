//! Bounded reads of a loaded object's memory.
//!
//! # Safety
//! A [`LoadedObject`]'s `PT_LOAD` segments are mapped and readable while the object stays loaded;
//! callers keep it loaded (pinned) while an [`Image`] is in use. Every read is checked to lie
//! inside one readable segment before it is made, so corrupt tables yield `None`, never a fault.
#![allow(unsafe_code)]

use libc::PF_R;

use super::snapshot::LoadedObject;

/// Read access to one loaded object's mapped segments.
pub(crate) struct Image<'a> {
    pub obj: &'a LoadedObject,
}

impl<'a> Image<'a> {
    pub fn new(obj: &'a LoadedObject) -> Self {
        Image { obj }
    }

    fn readable(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.obj
            .segments()
            .any(|(s, e, flags)| flags & PF_R != 0 && addr >= s && end <= e)
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

    /// The NUL-terminated string at `addr`, looking at most `max` bytes and never past a
    /// segment's end.
    pub fn c_str(&self, addr: usize, max: usize) -> Option<&'a [u8]> {
        let (_, seg_end, _) = self
            .obj
            .segments()
            .find(|&(s, e, flags)| flags & PF_R != 0 && addr >= s && addr < e)?;
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

/// Types for which every bit pattern is a valid value (ELF records and integers).
pub(crate) trait Plain {}
impl Plain for u16 {}
impl Plain for u32 {}
impl Plain for u64 {}
impl Plain for usize {}
impl Plain for goblin::elf64::dynamic::Dyn {}
impl Plain for goblin::elf64::reloc::Rela {}
impl Plain for super::dynamic::Rel {}
impl Plain for goblin::elf64::sym::Sym {}
impl Plain for super::dynamic::Verneed {}
impl Plain for super::dynamic::Vernaux {}
impl Plain for super::dynamic::Verdef {}
impl Plain for super::dynamic::Verdaux {}
