//! The `__managed__` variables a cubin (a CUDA ELF object) defines: object symbols of its
//! `.symtab` marked `STO_CUDA_MANAGED` in `st_other`, as cuda-gdb reads them. Bounded reads
//! only; anything out of place ends the scan.

use std::ffi::CStr;

use super::container::{u16_at, u32_at, u64_at};

const ELF_HEADER: usize = 64;
const SECTION_HEADER: usize = 64;
const SYMBOL: usize = 24;
const SHT_SYMTAB: u32 = 2;
const STT_OBJECT: u8 = 1;
/// `st_other` bit of a managed variable.
const STO_CUDA_MANAGED: u8 = 0x4;

/// Section `i`'s `(type, offset, size, link)`.
fn section(b: &[u8], shoff: usize, i: usize) -> Option<(u32, usize, usize, usize)> {
    let at = shoff.checked_add(i.checked_mul(SECTION_HEADER)?)?;
    let h = b.get(at..at.checked_add(SECTION_HEADER)?)?;
    Some((
        u32_at(h, 4)?,
        usize::try_from(u64_at(h, 24)?).ok()?,
        usize::try_from(u64_at(h, 32)?).ok()?,
        usize::try_from(u32_at(h, 40)?).ok()?,
    ))
}

/// Section header table offset and count, for a 64-bit little-endian ELF.
fn sections(b: &[u8]) -> Option<(usize, usize)> {
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(b, 0x28)?).ok()?;
    if usize::from(u16_at(b, 0x3a)?) != SECTION_HEADER {
        return None;
    }
    Some((shoff, usize::from(u16_at(b, 0x3c)?)))
}

/// How many bytes of a cubin in memory the scan reads, given the first `b.len()` of them: the ELF
/// header, then the section headers, then the symbol table and its string table. Saturates on
/// nonsense (the decoder's bound then applies).
pub(super) fn need(b: &[u8]) -> usize {
    if b.len() < ELF_HEADER {
        return ELF_HEADER;
    }
    let Some((shoff, n)) = sections(b) else {
        return 0; // not an ELF object: nothing more to read
    };
    let table_end = shoff.saturating_add(n.saturating_mul(SECTION_HEADER));
    if b.len() < table_end {
        return table_end;
    }
    let mut end = table_end;
    for i in 0..n {
        if let Some((SHT_SYMTAB, off, size, link)) = section(b, shoff, i) {
            end = end.max(off.saturating_add(size));
            if let Some((_, soff, ssize, _)) = section(b, shoff, link) {
                end = end.max(soff.saturating_add(ssize));
            }
        }
    }
    end
}

/// Calls `found` with the name and size of each managed variable `b` defines. False when `b`
/// is not a readable cubin (nothing was found).
pub(super) fn managed(b: &[u8], found: &mut dyn FnMut(&CStr, usize)) -> bool {
    let Some((shoff, n)) = sections(b) else {
        return false;
    };
    let mut readable = false;
    for i in 0..n {
        let Some((SHT_SYMTAB, off, size, link)) = section(b, shoff, i) else {
            continue;
        };
        let (Some(symtab), Some((_, soff, ssize, _))) = (
            b.get(off..off.saturating_add(size)),
            section(b, shoff, link),
        ) else {
            continue;
        };
        let Some(strtab) = b.get(soff..soff.saturating_add(ssize)) else {
            continue;
        };
        readable = true;
        for sym in symtab.chunks_exact(SYMBOL) {
            let (info, other) = (sym[4], sym[5]);
            let defined = u16_at(sym, 6).is_some_and(|s| s != 0);
            if info & 0xf != STT_OBJECT || other & STO_CUDA_MANAGED == 0 || !defined {
                continue;
            }
            let name = u32_at(sym, 0).and_then(|o| strtab.get(usize::try_from(o).ok()?..));
            let size = u64_at(sym, 16).and_then(|s| usize::try_from(s).ok());
            if let (Some(Ok(name)), Some(size)) = (name.map(CStr::from_bytes_until_nul), size) {
                if !name.is_empty() {
                    found(name, size);
                }
            }
        }
    }
    readable
}
