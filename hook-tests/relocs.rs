//! The relocation tables the index reads, over synthetic objects: REL-format tables (`DT_REL`,
//! and `DT_JMPREL` with `DT_PLTREL = DT_REL`) beside RELA ones, and the relocation types of this
//! machine (`R_AARCH64_JUMP_SLOT` 1026, `GLOB_DAT` 1025, `ABS64` 257 on aarch64;
//! `R_X86_64_JUMP_SLOT` 7, `GLOB_DAT` 6, `64` 1 on x86-64) indexed, the other machine's ignored.
//! Real linkers give both machines RELA tables only, so no fixture has a REL table.

use std::sync::Arc;

use cuhook::elf::{LoadedObject, ObjectIndex, RelocKind};

/// (JUMP_SLOT, GLOB_DAT, ABS64) relocation types: this machine's, then the other one's.
const AARCH64: [u32; 3] = [1026, 1025, 257];
const X86_64: [u32; 3] = [7, 6, 1];
#[cfg(target_arch = "aarch64")]
const TYPES: ([u32; 3], [u32; 3]) = (AARCH64, X86_64);
#[cfg(target_arch = "x86_64")]
const TYPES: ([u32; 3], [u32; 3]) = (X86_64, AARCH64);
const JUMP_SLOT: usize = 0;
const GLOB_DAT: usize = 1;
const ABS64: usize = 2;

const DT_NULL: u64 = 0;
const DT_PLTRELSZ: u64 = 2;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_RELA: u64 = 7;
const DT_RELASZ: u64 = 8;
const DT_RELAENT: u64 = 9;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_REL: u64 = 17;
const DT_RELSZ: u64 = 18;
const DT_RELENT: u64 = 19;
const DT_PLTREL: u64 = 20;
const DT_JMPREL: u64 = 23;
const DT_GNU_HASH: u64 = 0x6fff_fef5;

/// Where things lie in the synthetic object.
const DYNAMIC: usize = 0x100;
const SYMTAB: usize = 0x300;
const STRTAB: usize = 0x400;
const GNU_HASH: usize = 0x4c0;
const TABLES: usize = 0x500;
const SLOTS: usize = 0xc00;
const SIZE: usize = 0x1000;

/// Imported (undefined) functions, symbol index = position + 1.
const SYMBOLS: [&str; 4] = ["cuMemAlloc_v2", "cuMemFree_v2", "cuInit", "cuMemcpy"];

/// One relocation: slot number (8 bytes each from `SLOTS`), symbol index, type, addend.
#[derive(Clone, Copy)]
struct Reloc(usize, u64, u32, i64);

enum Format {
    Rel,
    Rela,
}

/// An object image with one relocation table of each given kind, "loaded" in heap memory (which
/// is all the readers need: they read what the program headers declare).
struct Object {
    _memory: Vec<u64>,
    loaded: Arc<LoadedObject>,
}

impl Object {
    fn new(rel: &[Reloc], rela: &[Reloc], jmprel: (Format, &[Reloc])) -> Object {
        let mut img = vec![0u8; SIZE];
        let put = |img: &mut Vec<u8>, at: usize, bytes: &[u8]| {
            img[at..at + bytes.len()].copy_from_slice(bytes)
        };
        // Symbols: Elf64_Sym { st_name: u32, st_info: u8, st_other: u8, st_shndx: u16,
        // st_value: u64, st_size: u64 }; undefined global functions.
        let mut names = vec![0u8];
        for (i, name) in SYMBOLS.iter().enumerate() {
            let at = SYMTAB + 24 * (i + 1);
            put(&mut img, at, &(names.len() as u32).to_le_bytes());
            img[at + 4] = 0x12; // STB_GLOBAL, STT_FUNC
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        put(&mut img, STRTAB, &names);
        // A GNU hash table that hashes no symbol, with symoffset 1: what aarch64's GNU ld writes
        // for an executable that exports nothing (one bucket, one bloom word, all zero).
        for (i, word) in [1u32, 1, 1, 0].iter().enumerate() {
            put(&mut img, GNU_HASH + 4 * i, &word.to_le_bytes());
        }
        // The tables, one after the other.
        let mut at = TABLES;
        let mut table = |img: &mut Vec<u8>, format: &Format, relocs: &[Reloc]| -> (usize, usize) {
            let start = at;
            for &Reloc(slot, sym, kind, addend) in relocs {
                put(img, at, &((SLOTS + 8 * slot) as u64).to_le_bytes());
                put(img, at + 8, &((sym << 32) | kind as u64).to_le_bytes());
                at += 16;
                if let Format::Rela = format {
                    put(img, at, &addend.to_le_bytes());
                    at += 8;
                }
            }
            (start, at - start)
        };
        let mut dynamic = vec![
            (DT_SYMTAB, SYMTAB as u64),
            (DT_SYMENT, 24),
            (DT_STRTAB, STRTAB as u64),
            (DT_STRSZ, names.len() as u64),
            (DT_GNU_HASH, GNU_HASH as u64),
        ];
        if !rel.is_empty() {
            let (addr, size) = table(&mut img, &Format::Rel, rel);
            dynamic.extend([
                (DT_REL, addr as u64),
                (DT_RELSZ, size as u64),
                (DT_RELENT, 16),
            ]);
        }
        if !rela.is_empty() {
            let (addr, size) = table(&mut img, &Format::Rela, rela);
            dynamic.extend([
                (DT_RELA, addr as u64),
                (DT_RELASZ, size as u64),
                (DT_RELAENT, 24),
            ]);
        }
        let (format, relocs) = jmprel;
        let (addr, size) = table(&mut img, &format, relocs);
        let pltrel = match format {
            Format::Rel => DT_REL,
            Format::Rela => DT_RELA,
        };
        dynamic.extend([
            (DT_JMPREL, addr as u64),
            (DT_PLTRELSZ, size as u64),
            (DT_PLTREL, pltrel),
            (DT_NULL, 0),
        ]);
        assert!(at <= SLOTS, "tables overlap the slots");
        for (i, (tag, value)) in dynamic.iter().enumerate() {
            put(&mut img, DYNAMIC + 16 * i, &tag.to_le_bytes());
            put(&mut img, DYNAMIC + 16 * i + 8, &value.to_le_bytes());
        }
        // 8-aligned memory holding the image.
        let memory: Vec<u64> = img
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let phdr = |p_type, p_vaddr: usize, p_memsz: usize| libc::Elf64_Phdr {
            p_type,
            p_flags: libc::PF_R | libc::PF_W,
            p_offset: p_vaddr as u64,
            p_vaddr: p_vaddr as u64,
            p_paddr: p_vaddr as u64,
            p_filesz: p_memsz as u64,
            p_memsz: p_memsz as u64,
            p_align: 8,
        };
        let loaded = Arc::new(LoadedObject {
            base: memory.as_ptr() as usize,
            name: "synthetic.so".into(),
            phdrs: vec![
                phdr(libc::PT_LOAD, 0, SIZE),
                phdr(libc::PT_DYNAMIC, DYNAMIC, 16 * dynamic.len()),
            ],
            position: 1,
        });
        Object {
            _memory: memory,
            loaded,
        }
    }

    fn index(&self) -> ObjectIndex {
        ObjectIndex::build(self.loaded.clone(), None).expect("index the synthetic object")
    }

    /// (slot number, kind) of every indexed slot of `symbol`, in slot order.
    fn slots(&self, index: &ObjectIndex, symbol: &str) -> Vec<(usize, RelocKind)> {
        let mut v: Vec<_> = index
            .slots(symbol, None)
            .map(|s| ((s.address - self.loaded.base - SLOTS) / 8, s.kind))
            .collect();
        v.sort_by_key(|s| s.0);
        v
    }
}

#[test]
fn rel_format_tables_are_indexed_like_rela_ones() {
    let (native, foreign) = TYPES;
    let obj = Object::new(
        &[
            Reloc(0, 1, native[GLOB_DAT], 0),
            // REL keeps the addend in the slot, overwritten once relocated: unknowable, so an
            // ABS64 slot of a REL table is never taken for a plain function pointer.
            Reloc(1, 2, native[ABS64], 0),
            Reloc(2, 3, foreign[GLOB_DAT], 0),
        ],
        &[],
        (
            Format::Rel,
            &[
                Reloc(3, 1, native[JUMP_SLOT], 0),
                Reloc(4, 4, native[JUMP_SLOT], 0),
                Reloc(5, 3, foreign[JUMP_SLOT], 0),
            ],
        ),
    );
    let index = obj.index();
    assert_eq!(
        obj.slots(&index, "cuMemAlloc_v2"),
        [(0, RelocKind::GlobDat), (3, RelocKind::JumpSlot)]
    );
    assert_eq!(obj.slots(&index, "cuMemcpy"), [(4, RelocKind::JumpSlot)]);
    assert_eq!(obj.slots(&index, "cuMemFree_v2"), []);
    assert_eq!(obj.slots(&index, "cuInit"), [], "another machine's types");
    assert_eq!(index.len(), 3);
}

#[test]
fn rela_tables_take_abs64_only_with_a_zero_addend() {
    let (native, foreign) = TYPES;
    let obj = Object::new(
        &[Reloc(0, 1, native[GLOB_DAT], 0)],
        &[
            Reloc(1, 2, native[ABS64], 0),
            Reloc(2, 3, native[ABS64], 16),
            Reloc(3, 4, foreign[ABS64], 0),
        ],
        (
            Format::Rela,
            &[
                Reloc(4, 1, native[JUMP_SLOT], 0),
                Reloc(5, 4, native[GLOB_DAT], 0),
            ],
        ),
    );
    let index = obj.index();
    assert_eq!(
        obj.slots(&index, "cuMemAlloc_v2"),
        [(0, RelocKind::GlobDat), (4, RelocKind::JumpSlot)]
    );
    assert_eq!(obj.slots(&index, "cuMemFree_v2"), [(1, RelocKind::Abs64)]);
    assert_eq!(obj.slots(&index, "cuInit"), [], "ABS64 with an addend");
    assert_eq!(
        obj.slots(&index, "cuMemcpy"),
        [(5, RelocKind::GlobDat)],
        "the other machine's ABS64 is not indexed"
    );
}

/// Looking imports up by name goes through the hash table; one that hashes nothing (an executable
/// exporting no symbol) must not hide them, whatever its `symoffset` says (aarch64's GNU ld: 1).
#[test]
fn imports_are_found_by_name_when_the_gnu_hash_table_hashes_nothing() {
    let (native, _) = TYPES;
    let obj = Object::new(
        &[],
        &[Reloc(0, 1, native[GLOB_DAT], 0)],
        (
            Format::Rela,
            &[
                Reloc(1, 1, native[JUMP_SLOT], 0),
                Reloc(2, 4, native[JUMP_SLOT], 0),
                Reloc(3, 2, native[JUMP_SLOT], 0),
            ],
        ),
    );
    let wanted = [b"cuMemAlloc_v2".to_vec(), b"cuMemcpy".to_vec()];
    let index = ObjectIndex::build(obj.loaded.clone(), Some(&wanted)).expect("index by name");
    assert_eq!(
        obj.slots(&index, "cuMemAlloc_v2"),
        [(0, RelocKind::GlobDat), (1, RelocKind::JumpSlot)]
    );
    assert_eq!(obj.slots(&index, "cuMemcpy"), [(2, RelocKind::JumpSlot)]);
    assert_eq!(index.len(), 3, "only the names asked for");
}
