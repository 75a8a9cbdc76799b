//! The dynamic section of a loaded object: where its string, symbol, version and relocation
//! tables are.

use goblin::elf::dynamic::{
    DF_TEXTREL, DT_FLAGS, DT_GNU_HASH, DT_HASH, DT_INIT, DT_INIT_ARRAYSZ, DT_JMPREL, DT_NULL,
    DT_PLTGOT, DT_PLTREL, DT_PLTRELSZ, DT_REL, DT_RELA, DT_RELACOUNT, DT_RELAENT, DT_RELASZ,
    DT_RELCOUNT, DT_RELENT, DT_RELSZ, DT_SONAME, DT_STRSZ, DT_STRTAB, DT_SYMENT, DT_SYMTAB,
    DT_TEXTREL, DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM, DT_VERSYM,
};
use goblin::elf64::dynamic::Dyn;
use libc::PT_DYNAMIC;

use super::image::Image;
use super::loaded::LoadedObject;
use super::records::Rel;

/// A relocation table: address, size in bytes, entry size, and whether entries carry addends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelocTable {
    pub addr: usize,
    pub size: usize,
    pub entsize: usize,
    pub rela: bool,
    /// Leading entries that are relative relocations (`DT_RELACOUNT`/`DT_RELCOUNT`, which the
    /// linker emits with `-z combreloc`): they name no symbol, so indexing skips them, as glibc
    /// applies them without looking at their type. Large libraries have hundreds of thousands.
    pub relative: usize,
}

/// Where the tables are, as absolute addresses.
#[derive(Debug, Clone, Default)]
pub struct DynamicTables {
    pub strtab: usize,
    pub strsz: usize,
    pub symtab: usize,
    pub syment: usize,
    pub versym: Option<usize>,
    pub verneed: Option<(usize, usize)>,
    pub verdef: Option<(usize, usize)>,
    /// `DT_RELA`, `DT_REL` and `DT_JMPREL`, in that order; any may be absent.
    pub relocs: RelocTables,
    /// `DT_GNU_HASH` and `DT_HASH`: how defined symbols are found by name.
    pub gnu_hash: Option<usize>,
    pub hash: Option<usize>,
    /// The object has constructors (`DT_INIT` or a non-empty `DT_INIT_ARRAY`).
    pub has_constructors: bool,
    /// The loader writes relocations into the object's code (`DT_TEXTREL`, or `DF_TEXTREL` in
    /// `DT_FLAGS`).
    pub text_relocations: bool,
    /// `DT_PLTGOT`, when it lies inside the object: the GOT whose third word the loader points
    /// at its lazy-binding resolver if, and only if, it binds the object's PLT slots lazily.
    pub pltgot: Option<usize>,
    /// `DT_SONAME`: the offset of the object's soname in its string table.
    pub soname: Option<usize>,
}

/// The relocation tables of one object (at most three), held inline: the dynamic section is
/// read inside walks of the loader's list, where nothing may allocate.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelocTables {
    tables: [Option<RelocTable>; 3],
}

impl RelocTables {
    fn push(&mut self, table: RelocTable) {
        if let Some(free) = self.tables.iter_mut().find(|t| t.is_none()) {
            *free = Some(table);
        }
    }

    /// The tables present, in `DT_RELA`, `DT_REL`, `DT_JMPREL` order.
    pub fn iter(&self) -> impl Iterator<Item = &RelocTable> {
        self.tables.iter().flatten()
    }
}

/// Why a dynamic section's tables cannot be located (a static reason: this is decided inside
/// walks of the loader's list, where nothing may allocate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadTables(pub &'static str);

/// Upper bound on dynamic entries we read (real objects have a few dozen).
const MAX_DYN: usize = 4096;

impl DynamicTables {
    /// Read the object's dynamic section. `Ok(None)`: the object has none (static executable,
    /// some vDSOs). `Err`: the section exists but its tables cannot be located.
    /// Allocates nothing.
    pub fn read(obj: &LoadedObject) -> Result<Option<DynamicTables>, BadTables> {
        Self::read_in(&Image::new(obj))
    }

    /// [`DynamicTables::read`] through an image the caller goes on reading with (the pages it
    /// has confirmed readable are not asked about again).
    pub(crate) fn read_in(img: &Image<'_>) -> Result<Option<DynamicTables>, BadTables> {
        let obj = img.obj;
        let Some(ph) = obj.phdr(PT_DYNAMIC) else {
            return Ok(None);
        };
        let bad = BadTables;
        let dyn_addr = obj.base.wrapping_add(ph.p_vaddr as usize);
        let mut t = DynamicTables {
            syment: std::mem::size_of::<goblin::elf64::sym::Sym>(),
            ..Default::default()
        };
        let (mut rela, mut relasz, mut relaent) = (None, 0usize, 0usize);
        let (mut rel, mut relsz, mut relent) = (None, 0usize, 0usize);
        let (mut jmprel, mut pltrelsz, mut pltrel) = (None, 0usize, 0u64);
        let (mut verneed, mut verneednum, mut verdef, mut verdefnum) = (None, 0usize, None, 0usize);
        let (mut strtab, mut symtab) = (None, None);
        let (mut relacount, mut relcount) = (0, 0);
        let (mut gnu_hash, mut hash, mut pltgot) = (None, None, None);
        // The entries `PT_DYNAMIC` declares, checked once as an array; past them (a section
        // without its `DT_NULL` there), or where the array check fails, one by one as before.
        let declared = (ph.p_memsz as usize / std::mem::size_of::<Dyn>()).min(MAX_DYN);
        let listed: &[Dyn] = img.array(dyn_addr, declared).unwrap_or(&[]);
        for i in 0..MAX_DYN {
            let d: Dyn = match listed.get(i) {
                Some(&d) => d,
                None => img
                    .read(dyn_addr.wrapping_add(i * std::mem::size_of::<Dyn>()))
                    .ok_or_else(|| bad("dynamic section not readable"))?,
            };
            let v = d.d_val as usize;
            match d.d_tag {
                DT_NULL => break,
                DT_STRTAB => strtab = Some(v),
                DT_STRSZ => t.strsz = v,
                DT_SYMTAB => symtab = Some(v),
                DT_SYMENT => t.syment = v,
                DT_RELA => rela = Some(v),
                DT_RELASZ => relasz = v,
                DT_RELAENT => relaent = v,
                DT_REL => rel = Some(v),
                DT_RELSZ => relsz = v,
                DT_RELENT => relent = v,
                DT_RELACOUNT => relacount = v,
                DT_RELCOUNT => relcount = v,
                DT_JMPREL => jmprel = Some(v),
                DT_PLTGOT => pltgot = Some(v),
                DT_PLTRELSZ => pltrelsz = v,
                DT_PLTREL => pltrel = d.d_val,
                DT_SONAME => t.soname = Some(v),
                DT_VERSYM => t.versym = Some(v),
                DT_VERNEED => verneed = Some(v),
                DT_VERNEEDNUM => verneednum = v,
                DT_VERDEF => verdef = Some(v),
                DT_VERDEFNUM => verdefnum = v,
                DT_GNU_HASH => gnu_hash = Some(v),
                DT_HASH => hash = Some(v),
                DT_INIT => t.has_constructors = true,
                DT_TEXTREL => t.text_relocations = true,
                DT_FLAGS if d.d_val & DF_TEXTREL != 0 => t.text_relocations = true,
                DT_INIT_ARRAYSZ if v > 0 => t.has_constructors = true,
                _ => {}
            }
        }
        let fix = |v: Option<usize>, what| -> Result<Option<usize>, BadTables> {
            match v {
                None => Ok(None),
                Some(v) => absolute(obj, v).map(Some).ok_or_else(|| bad(what)),
            }
        };
        // Not an error when it points elsewhere: the object then counts as bound lazily.
        t.pltgot = pltgot.and_then(|v| absolute(obj, v));
        let (Some(strtab), Some(symtab)) = (
            fix(strtab, "DT_STRTAB points outside the object")?,
            fix(symtab, "DT_SYMTAB points outside the object")?,
        ) else {
            // No symbol table: nothing can be imported by name, so there is nothing to patch.
            return Ok(Some(t));
        };
        t.strtab = strtab;
        t.symtab = symtab;
        t.versym = fix(t.versym, "DT_VERSYM points outside the object")?;
        t.gnu_hash = fix(gnu_hash, "DT_GNU_HASH points outside the object")?;
        t.hash = fix(hash, "DT_HASH points outside the object")?;
        t.verneed = fix(verneed, "DT_VERNEED points outside the object")?.map(|a| (a, verneednum));
        t.verdef = fix(verdef, "DT_VERDEF points outside the object")?.map(|a| (a, verdefnum));
        if let Some(addr) = fix(rela, "DT_RELA points outside the object")? {
            t.relocs.push(RelocTable {
                addr,
                size: relasz,
                entsize: relaent.max(1),
                rela: true,
                relative: relacount,
            });
        }
        if let Some(addr) = fix(rel, "DT_REL points outside the object")? {
            t.relocs.push(RelocTable {
                addr,
                size: relsz,
                entsize: relent.max(1),
                rela: false,
                relative: relcount,
            });
        }
        if let Some(addr) = fix(jmprel, "DT_JMPREL points outside the object")? {
            let is_rela = match pltrel {
                p if p == DT_RELA => true,
                p if p == DT_REL => false,
                _ => return Err(bad("DT_PLTREL is neither DT_RELA nor DT_REL")),
            };
            let entsize = if is_rela {
                std::mem::size_of::<goblin::elf64::reloc::Rela>()
            } else {
                std::mem::size_of::<Rel>()
            };
            t.relocs.push(RelocTable {
                addr,
                size: pltrelsz,
                entsize,
                rela: is_rela,
                relative: 0,
            });
        }
        Ok(Some(t))
    }
}

impl DynamicTables {
    /// Address of symbol `index`'s entry; `None` when a corrupt `DT_SYMENT` overflows it.
    pub(crate) fn sym_addr(&self, index: usize) -> Option<usize> {
        self.symtab.checked_add(index.checked_mul(self.syment)?)
    }

    /// Address of symbol `index`'s `DT_VERSYM` entry, if the object has version indexes.
    pub(crate) fn versym_addr(&self, index: usize) -> Option<usize> {
        self.versym?.checked_add(index.checked_mul(2)?)
    }
}

/// Turn a `d_ptr` value into an absolute address. glibc on x86_64 relocates most `d_ptr`
/// entries in place (absolute), while the vDSO and some loaders leave them base-relative: decide
/// by which reading lands inside the object's mapped segments.
pub fn absolute(obj: &LoadedObject, value: usize) -> Option<usize> {
    if obj.contains(value) {
        Some(value)
    } else {
        let rebased = value.wrapping_add(obj.base);
        obj.contains(rebased).then_some(rebased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{Elf64_Phdr, PF_R, PT_LOAD};

    fn object(base: usize, vaddr: u64, memsz: u64) -> LoadedObject {
        let load = Elf64_Phdr {
            p_type: PT_LOAD,
            p_flags: PF_R,
            p_offset: 0,
            p_vaddr: vaddr,
            p_paddr: vaddr,
            p_filesz: memsz,
            p_memsz: memsz,
            p_align: 4096,
        };
        LoadedObject {
            base,
            name: "libx.so".into(),
            phdrs: vec![load],
            position: 1,
        }
    }

    /// The leading entries `DT_RELACOUNT` announces, which indexing skips, are relative
    /// relocations in every object of this process that has the tag (libc, libgcc, the test
    /// program...), and at least one object has it.
    #[test]
    fn the_announced_leading_relocations_are_relative() {
        let relative = if cfg!(target_arch = "x86_64") {
            goblin::elf::reloc::R_X86_64_RELATIVE
        } else {
            goblin::elf::reloc::R_AARCH64_RELATIVE
        };
        let mut checked = 0;
        for obj in crate::elf::snapshot().objects {
            let Ok(Some(t)) = DynamicTables::read(&obj) else {
                continue;
            };
            let img = Image::new(&obj);
            for table in t.relocs.iter().filter(|r| r.relative > 0) {
                assert!(
                    table.relative <= table.size / table.entsize,
                    "{}",
                    obj.display_name()
                );
                for i in 0..table.relative {
                    let at = table.addr + i * table.entsize;
                    let info = if table.rela {
                        img.read::<goblin::elf64::reloc::Rela>(at).map(|r| r.r_info)
                    } else {
                        img.read::<Rel>(at).map(|r| r.r_info)
                    };
                    let info = info.expect("a relocation table is readable");
                    assert_eq!(
                        goblin::elf64::reloc::r_type(info),
                        relative,
                        "{}",
                        obj.display_name()
                    );
                    checked += 1;
                }
            }
        }
        assert!(
            checked > 0,
            "no object announces leading relative relocations"
        );
    }

    #[test]
    fn d_ptr_values_are_read_as_absolute_or_base_relative_by_range() {
        let obj = object(0x7f00_0000_0000, 0, 0x10000);
        // Already relocated by glibc: inside the mapping as is.
        assert_eq!(absolute(&obj, 0x7f00_0000_2000), Some(0x7f00_0000_2000));
        // Left base-relative (the vDSO, some loaders): inside once the base is added.
        assert_eq!(absolute(&obj, 0x2000), Some(0x7f00_0000_2000));
        // Neither reading lands in the object: refused.
        assert_eq!(absolute(&obj, 0x20000), None);
        assert_eq!(absolute(&obj, 0x7f00_0001_0000), None);
        // A non-PIE executable (base 0): both readings agree.
        let exe = object(0, 0x400000, 0x1000);
        assert_eq!(absolute(&exe, 0x400800), Some(0x400800));
    }

    #[test]
    fn objects_without_a_dynamic_section_have_no_tables() {
        assert!(DynamicTables::read(&object(0x1000, 0, 0x1000))
            .unwrap()
            .is_none());
    }
}
