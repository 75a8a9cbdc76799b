//! The GNU build-id of a loaded object, read from its `PT_NOTE` segments in memory: what
//! identifies the exact file its code came from, for symbolizing its addresses later (the
//! file on disk may have been replaced since it was loaded).
//!
//! A snapshot keeps only `PT_LOAD` and `PT_DYNAMIC`, so the program headers are found again
//! through the ELF header, which the loader maps with the first segment (file offset 0). Every
//! read goes through [`Image`], so a corrupt header yields `None`, never a fault.

use super::image::Image;
use super::loaded::LoadedObject;

/// `NT_GNU_BUILD_ID`.
const NT_GNU_BUILD_ID: u32 = 3;
/// Longest build-id kept (SHA-1 is 20 bytes; some linkers write up to 64).
const MAX_BUILD_ID: usize = 64;
/// Most program headers looked at.
const MAX_PHDRS: usize = 256;

/// The object's GNU build-id, if it has one. Read from memory: the caller keeps the object
/// loaded while this runs.
pub fn build_id(obj: &LoadedObject) -> Option<Vec<u8>> {
    let img = Image::new(obj);
    // The segment mapping file offset 0 holds the ELF header.
    let first = obj
        .phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_LOAD && p.p_offset == 0)?;
    let ehdr = obj.base.checked_add(first.p_vaddr as usize)?;
    if img.array::<u8>(ehdr, 4)? != b"\x7fELF" {
        return None;
    }
    let phoff = img.read::<u64>(ehdr + 0x20)? as usize;
    let phentsize = img.read::<u16>(ehdr + 0x36)? as usize;
    let phnum = (img.read::<u16>(ehdr + 0x38)? as usize).min(MAX_PHDRS);
    if phentsize < 56 {
        return None;
    }
    for i in 0..phnum {
        let ph = ehdr.checked_add(phoff.checked_add(i * phentsize)?)?;
        if img.read::<u32>(ph)? != libc::PT_NOTE {
            continue;
        }
        let vaddr = img.read::<u64>(ph + 16)? as usize;
        let size = img.read::<u64>(ph + 40)? as usize;
        if let Some(id) = find_in_notes(&img, obj.base.checked_add(vaddr)?, size) {
            return Some(id);
        }
    }
    None
}

/// Walk the notes of `[start, start + size)` for `NT_GNU_BUILD_ID` named "GNU".
fn find_in_notes(img: &Image<'_>, start: usize, size: usize) -> Option<Vec<u8>> {
    let end = start.checked_add(size)?;
    let mut at = start;
    while at.checked_add(12)? <= end {
        let namesz = img.read::<u32>(at)? as usize;
        let descsz = img.read::<u32>(at + 4)? as usize;
        let kind = img.read::<u32>(at + 8)?;
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.checked_next_multiple_of(4)?)?;
        let next = desc_at.checked_add(descsz.checked_next_multiple_of(4)?)?;
        if next > end {
            return None;
        }
        if kind == NT_GNU_BUILD_ID
            && namesz == 4
            && img.array::<u8>(name_at, 4)? == b"GNU\0"
            && (1..=MAX_BUILD_ID).contains(&descsz)
        {
            return Some(img.array::<u8>(desc_at, descsz)?.to_vec());
        }
        at = next;
    }
    None
}
