//! Reading one object's tables into an [`IndexRoom`]: the phases of
//! [`ObjectIndex::index_into`](super::ObjectIndex::index_into), and the relocation walk they
//! end with.

use goblin::elf::program_header::PF_X;
use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf64::reloc::{r_sym, r_type, Rela};
use goblin::elf64::sym::Sym;

use super::{IndexFailure, IndexRoom, Indexed, NameFilter, NamedSlot, RelocKind, Slot};
use crate::elf::dynamic::{DynamicTables, RelocTable};
use crate::elf::image::Image;
use crate::elf::loaded::LoadedObject;
use crate::elf::records::Rel;
use crate::elf::room::{extend, push, Full};
use crate::elf::symbols::wanted_indexes;
use crate::elf::versions::VersionNames;
use crate::elf::wanted::{gnu_hash, KeySet, WantedNames};

/// Longest symbol or version name we accept.
const MAX_SYMBOL: usize = 4096;

/// The work of [`ObjectIndex::index_into`](super::ObjectIndex::index_into): append the
/// object's entries to the room and return its part (ranges filled in by the caller); may leave
/// a partial part behind on error. In phases: the dynamic tables and the lazy resolver's word;
/// the wanted names' symbol indexes (through the hash table) and which of them the object
/// defines; its version names; then its relocations.
pub(super) fn index_tables(
    object: &LoadedObject,
    wanted: Option<&WantedNames>,
    room: &mut IndexRoom,
) -> std::result::Result<Indexed, IndexFailure> {
    let mut part = Indexed {
        has_constructors: false,
        resolver_word: None,
        defines: NameFilter::EMPTY,
        text_references: 0,
        entries: 0..0,
        arena: 0..0,
    };
    let img = room.image(object);
    let IndexRoom {
        entries,
        arena,
        versions,
        indexes,
        fixed,
        ..
    } = room;
    let fixed = *fixed;
    let finish = |part: Indexed, entries: &Vec<NamedSlot>, arena: &Vec<u8>| Indexed {
        entries: 0..entries.len(),
        arena: 0..arena.len(),
        ..part
    };
    let Some(tables) = DynamicTables::read_in(&img).map_err(IndexFailure::Bad)? else {
        return Ok(finish(part, entries, arena));
    };
    part.has_constructors = tables.has_constructors;
    part.resolver_word = resolver_word(object, &img, &tables);
    if tables.symtab == 0 {
        return Ok(finish(part, entries, arena));
    }
    let by_index = match wanted {
        Some(names) => wanted_indexes(&img, &tables, names, indexes, fixed)?,
        None => false,
    };
    let reader = Reader {
        object,
        img: &img,
        tables: &tables,
        wanted,
        indexes: by_index.then_some(&indexes[..]),
    };
    part.defines = reader.defined_names();
    if reader.indexes.is_some_and(|i| i.is_empty()) {
        return Ok(finish(part, entries, arena));
    }
    let versions = VersionNames::read(&img, &tables, versions, fixed)?;
    let mut out = Out {
        entries: &mut *entries,
        arena: &mut *arena,
        fixed,
    };
    part.text_references = reader.relocations(&versions, &mut out)?;
    Ok(finish(part, entries, arena))
}

/// The word where the loader puts its lazy-binding resolver (see
/// [`ObjectIndex::lazy_resolver_word`](super::ObjectIndex::lazy_resolver_word)), if the object
/// has one inside a writable segment and it is readable now.
fn resolver_word(object: &LoadedObject, img: &Image<'_>, tables: &DynamicTables) -> Option<usize> {
    tables
        .pltgot
        .and_then(|got| got.checked_add(2 * std::mem::size_of::<usize>()))
        .filter(|&w| {
            // The loader writes this word only in a writable GOT: a DT_PLTGOT that points into
            // a segment declared otherwise (never dereferenced by glibc unless it binds lazily)
            // is not read, and the object counts as bound lazily.
            w.is_multiple_of(std::mem::align_of::<usize>())
                && object.segment_holds(w, std::mem::size_of::<usize>(), libc::PF_R | libc::PF_W)
                // Confirmed readable now, so patches can read it without asking again (it
                // shares `.dynamic`'s page, which was just confirmed, in the usual layout); an
                // object that hid it counts as bound lazily.
                && img.read::<usize>(w).is_some()
        })
}

/// What the later phases read: the object, its tables, the wanted names and, when the hash
/// table gave them, the wanted names' symbol indexes (index, position among the names), sorted
/// by index.
struct Reader<'r, 'o> {
    object: &'o LoadedObject,
    img: &'r Image<'o>,
    tables: &'r DynamicTables,
    wanted: Option<&'r WantedNames>,
    indexes: Option<&'r [(u32, u32)]>,
}

/// Where entries go: the room's entries and name arena (never grown when `fixed`).
struct Out<'a> {
    entries: &'a mut Vec<NamedSlot>,
    arena: &'a mut Vec<u8>,
    fixed: bool,
}

/// What one relocation that passed the symbol filter is to the index.
enum Found<'a> {
    /// Nothing: not a slot's kind, misaligned, outside the object, unnamed or not wanted.
    Nothing,
    /// A relocation the loader wrote into code: counted, never a slot.
    TextReference,
    /// A slot, with its symbol's name, the name's GNU hash and the import's version.
    Slot(&'a [u8], u32, Option<&'a [u8]>, Slot),
}

impl<'r> Reader<'r, '_> {
    /// Symbol `index` of the object's symbol table, if readable.
    fn symbol(&self, index: usize) -> Option<Sym> {
        self.tables
            .sym_addr(index)
            .and_then(|a| self.img.read::<Sym>(a))
    }

    /// The wanted name of a symbol index (and its hash), when the hash table gave the indexes.
    fn name_at(&self, ix: &[(u32, u32)], sym_index: usize) -> Option<(&'r [u8], u32)> {
        let k = ix.binary_search_by_key(&(sym_index as u32), |e| e.0).ok()?;
        self.wanted?.at(ix[k].1 as usize)
    }

    /// Which wanted names the object defines, by GNU hash (read only for defined symbols: an
    /// object defines few of the names it is searched for, and imports are undefined).
    fn defined_names(&self) -> NameFilter {
        let Some(ix) = self.indexes else {
            return NameFilter::ALL;
        };
        ix.iter().fold(NameFilter::EMPTY, |bits, &(i, _)| {
            let Some(sym) = self.symbol(i as usize) else {
                return NameFilter::ALL; // unreadable now: it may be a definition
            };
            if sym.st_shndx as u32 == SHN_UNDEF {
                return bits;
            }
            bits | match self.name_at(ix, i as usize) {
                Some((_, hash)) => NameFilter::of(hash),
                None => NameFilter::ALL,
            }
        })
    }

    /// Walk every relocation table, adding each slot of a wanted symbol to `out`; the number
    /// of relocations of wanted symbols the loader wrote into code.
    fn relocations(
        &self,
        versions: &VersionNames<'_>,
        out: &mut Out<'_>,
    ) -> std::result::Result<usize, Full> {
        let indexes = self.indexes;
        // The wanted symbol indexes as a 4,096-bit filter: most relocations of a big library
        // name other symbols, and are passed over with one bit test instead of a search.
        let mut filter = KeySet::new();
        for &(i, _) in indexes.unwrap_or(&[]) {
            filter.insert(i as usize);
        }
        // Relocations naming no symbol, or none wanted, are passed over without a call.
        let wanted = |info: u64| {
            let sym_index = r_sym(info) as usize;
            sym_index != 0
                && indexes.is_none_or(|ix| {
                    filter.may_hold(sym_index)
                        && ix
                            .binary_search_by_key(&(sym_index as u32), |e| e.0)
                            .is_ok()
                })
        };
        let mut text_references = 0;
        for table in self.tables.relocs.iter() {
            each_relocation(
                self.img,
                table,
                &wanted,
                |offset, info, addend| -> std::result::Result<(), Full> {
                    match self.found(table, versions, offset, info, addend) {
                        Found::Nothing => Ok(()),
                        Found::TextReference => {
                            text_references += 1;
                            Ok(())
                        }
                        Found::Slot(name, hash, version, slot) => {
                            out.push(name, hash, version, slot)
                        }
                    }
                },
            )?;
        }
        Ok(text_references)
    }

    /// What relocation (`offset`, `info`, `addend`) of `table` is to the index.
    fn found(
        &self,
        table: &RelocTable,
        versions: &VersionNames<'_>,
        offset: u64,
        info: u64,
        addend: i64,
    ) -> Found<'r> {
        let object = self.object;
        let sym_index = r_sym(info) as usize;
        let address = object.base.wrapping_add(offset as usize);
        // A relocation the loader wrote into code, of any type: counted, never a slot.
        let in_code = self.tables.text_relocations && in_code(object, address);
        let kind = RelocKind::from_type(r_type(info));
        if kind.is_none() && !in_code {
            return Found::Nothing;
        }
        let slot_kind = match kind {
            Some(RelocKind::Abs64) if !table.rela || addend != 0 => None,
            k => k,
        };
        if !in_code
            && (slot_kind.is_none()
                || !address.is_multiple_of(std::mem::align_of::<usize>())
                || !object.contains_range(address, 8))
        {
            return Found::Nothing;
        }
        let Some(sym) = self.symbol(sym_index) else {
            return Found::Nothing;
        };
        // Found through the hash table: the name (and its hash) is the wanted one it matched
        // (read and compared then); otherwise read it and ask.
        let named = match self.indexes {
            Some(ix) => self.name_at(ix, sym_index),
            None => self
                .tables
                .string(self.img, sym.st_name as usize)
                .filter(|n| self.wanted.is_none_or(|names| names.contains(n)))
                .map(|n| (n, gnu_hash(n))),
        };
        let Some((name, hash)) = named.filter(|(n, _)| !n.is_empty()) else {
            return Found::Nothing;
        };
        let (false, Some(kind)) = (in_code, slot_kind) else {
            return Found::TextReference;
        };
        let defined_here = sym.st_shndx as u32 != SHN_UNDEF;
        let canonical_plt = (!defined_here && sym.st_value != 0)
            .then(|| object.base.wrapping_add(sym.st_value as usize));
        let version = self
            .tables
            .versym_addr(sym_index)
            .and_then(|a| self.img.read::<u16>(a))
            .and_then(|v| versions.name_of(self.img, self.tables, v & 0x7fff));
        let slot = Slot {
            address,
            kind,
            canonical_plt,
        };
        Found::Slot(name, hash, version, slot)
    }
}

impl Out<'_> {
    /// Add one slot with its name and version (copied into the arena).
    fn push(
        &mut self,
        name: &[u8],
        hash: u32,
        version: Option<&[u8]>,
        slot: Slot,
    ) -> std::result::Result<(), Full> {
        let name = intern(self.arena, name, self.fixed)?;
        let version = match version {
            Some(v) => Some(intern(self.arena, v, self.fixed)?),
            None => None,
        };
        push(
            self.entries,
            NamedSlot {
                name,
                version,
                hash,
                slot,
            },
            self.fixed,
        )
    }
}

/// Copy `s` into the arena; its (offset, length) there.
fn intern(arena: &mut Vec<u8>, s: &[u8], fixed: bool) -> std::result::Result<(u32, u32), Full> {
    let off = arena.len() as u32;
    extend(arena, s, fixed)?;
    Ok((off, s.len() as u32))
}

impl DynamicTables {
    pub(crate) fn string<'a>(&self, img: &Image<'a>, offset: usize) -> Option<&'a [u8]> {
        if offset >= self.strsz && self.strsz != 0 {
            return None;
        }
        let max = if self.strsz == 0 {
            MAX_SYMBOL
        } else {
            (self.strsz - offset).min(MAX_SYMBOL)
        };
        img.c_str(self.strtab + offset, max)
    }
}

/// Call `f(r_offset, r_info, addend)` for every entry of a table after its leading relative
/// ones whose `r_info` passes `keep`, in order, until `f` fails; REL entries report addend 0.
/// A table of standard entries lying in one readable segment is checked once and walked as an
/// array in a plain loop (big libraries have hundreds of thousands of entries, nearly all
/// rejected by `keep`, which is meant to be small enough to inline); anything else is read
/// entry by entry, each read checked, up to the first unreadable one.
pub(super) fn each_relocation<E>(
    img: &Image<'_>,
    t: &RelocTable,
    keep: &impl Fn(u64) -> bool,
    mut f: impl FnMut(u64, u64, i64) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let n = t.size / t.entsize;
    let from = t.relative.min(n);
    let at = t.addr.wrapping_add(from.wrapping_mul(t.entsize));
    if t.rela && t.entsize == std::mem::size_of::<Rela>() {
        if let Some(all) = img.array::<Rela>(at, n - from) {
            for r in all.iter().filter(|r| keep(r.r_info)) {
                f(r.r_offset, r.r_info, r.r_addend)?;
            }
            return Ok(());
        }
    } else if !t.rela && t.entsize == std::mem::size_of::<Rel>() {
        if let Some(all) = img.array::<Rel>(at, n - from) {
            for r in all.iter().filter(|r| keep(r.r_info)) {
                f(r.r_offset, r.r_info, 0)?;
            }
            return Ok(());
        }
    }
    for i in from..n {
        let Some((offset, info, addend)) = entry(img, t, i) else {
            break;
        };
        if keep(info) {
            f(offset, info, addend)?;
        }
    }
    Ok(())
}

/// Entry `i` of a table, read alone (checked).
pub(super) fn entry(img: &Image<'_>, t: &RelocTable, i: usize) -> Option<(u64, u64, i64)> {
    let at = t.addr.checked_add(i.checked_mul(t.entsize)?)?;
    if t.rela {
        img.read::<Rela>(at)
            .map(|r| (r.r_offset, r.r_info, r.r_addend))
    } else {
        img.read::<Rel>(at).map(|r| (r.r_offset, r.r_info, 0))
    }
}

/// Whether `address` lies in one of the object's executable segments.
fn in_code(object: &LoadedObject, address: usize) -> bool {
    object
        .segments()
        .any(|(start, end, flags)| flags & PF_X != 0 && (start..end).contains(&address))
}
