//! Finding the other copies of cuhook: the `cuhook` notes of loaded objects.
//!
//! # Safety
//! Notes are read inside a walk of the loader's list, while no object can be unloaded, and
//! only within the `PT_NOTE` segment the object's program headers declare, which lies inside a
//! readable `PT_LOAD` segment (checked). A table is used only after its magic, ABI and size
//! were checked, and only once its object is pinned.
#![allow(unsafe_code)]

use std::ops::ControlFlow;

use libc::{PF_R, PT_LOAD, PT_NOTE};

use super::table::{Peer, ABI, MAGIC, NOTE_TYPE};
use crate::sys::dl::{self, Listed};

/// Most copies looked at in one walk (more in one process would be a build mistake).
pub(crate) const MOST: usize = 8;

/// What a walk found: the table addresses of other copies with a compatible ABI, and how
/// many copies were left out because their ABI differs.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Found {
    pub tables: [usize; MOST],
    pub count: usize,
    pub incompatible: usize,
}

/// Walk every loaded object's notes for copies other than `own` (its table's address).
/// Allocates nothing.
pub(crate) fn others(own: usize) -> Found {
    let mut found = Found::default();
    let _ = dl::iterate(&mut |o: &Listed<'_>| {
        let base = o.info.dlpi_addr as usize;
        let headers = o.program_headers();
        let readable = |start: usize, len: usize| {
            headers.iter().any(|p| {
                let s = base.wrapping_add(p.p_vaddr as usize);
                p.p_type == PT_LOAD
                    && p.p_flags & PF_R != 0
                    && start >= s
                    && start
                        .checked_add(len)
                        .is_some_and(|e| e <= s.wrapping_add(p.p_memsz as usize))
            })
        };
        for p in headers.iter().filter(|p| p.p_type == PT_NOTE) {
            let start = base.wrapping_add(p.p_vaddr as usize);
            let len = p.p_memsz as usize;
            if len > 1 << 20 || !readable(start, len) {
                continue;
            }
            // SAFETY: a readable segment of a listed object (see the module doc).
            let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
            for (ty, name, desc, at) in notes(bytes) {
                if ty != NOTE_TYPE || name != b"cuhook\0" || desc.len() != 8 {
                    continue;
                }
                let offset = i64::from_ne_bytes(desc.try_into().unwrap_or([0; 8]));
                let table = (start + at).wrapping_add(offset as usize);
                if table == own || !readable(table, std::mem::size_of::<Peer>()) {
                    continue;
                }
                // SAFETY: a readable range of the object, read as plain bytes/integers first.
                let (magic, abi, size) = unsafe {
                    let head = table as *const Peer;
                    (
                        std::ptr::addr_of!((*head).magic).read_unaligned(),
                        std::ptr::addr_of!((*head).abi).read_unaligned(),
                        std::ptr::addr_of!((*head).size).read_unaligned(),
                    )
                };
                if magic != MAGIC {
                    continue;
                }
                if abi != ABI || size as usize != std::mem::size_of::<Peer>() {
                    found.incompatible += 1;
                } else if found.count < MOST {
                    found.tables[found.count] = table;
                    found.count += 1;
                }
            }
        }
        ControlFlow::Continue(())
    });
    found
}

/// The notes in a note segment: (type, name with its NUL, descriptor, offset of the
/// descriptor from the segment's start), 4-byte aligned as the ELF note format lays them out.
fn notes(bytes: &[u8]) -> impl Iterator<Item = (u32, &[u8], &[u8], usize)> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let (namesz, descsz, ty) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.checked_add(3)? & !3)?;
        let end = desc_at.checked_add(descsz.checked_add(3)? & !3)?;
        let name = bytes.get(name_at..name_at + namesz)?;
        let desc = bytes.get(desc_at..desc_at + descsz)?;
        at = end;
        Some((ty, name, desc, desc_at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_split_as_laid_out() {
        let mut seg = Vec::new();
        for (ty, name, desc) in [
            (1u32, &b"GNU\0"[..], &[7u8; 20][..]),
            (NOTE_TYPE, b"cuhook\0", &[1; 8]),
        ] {
            seg.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            seg.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
            seg.extend_from_slice(&ty.to_ne_bytes());
            seg.extend_from_slice(name);
            seg.resize(seg.len().next_multiple_of(4), 0);
            seg.extend_from_slice(desc);
            seg.resize(seg.len().next_multiple_of(4), 0);
        }
        let got: Vec<_> = notes(&seg)
            .map(|(t, n, d, _)| (t, n.to_vec(), d.len()))
            .collect();
        assert_eq!(
            got,
            [
                (1, b"GNU\0".to_vec(), 20),
                (NOTE_TYPE, b"cuhook\0".to_vec(), 8)
            ]
        );
        // A truncated segment ends the walk instead of reading past it.
        assert_eq!(notes(&seg[..seg.len() - 4]).count(), 1);
    }

    /// This test program's own note is found by its own walk (so the linker kept it), and is
    /// left out as "own".
    #[test]
    fn the_own_note_survives_the_link() {
        let own = &super::super::table::PEER as *const Peer as usize;
        assert_eq!(others(own).count, 0);
        let all = others(0);
        assert!(all.tables[..all.count].contains(&own), "{all:?}");
    }
}
