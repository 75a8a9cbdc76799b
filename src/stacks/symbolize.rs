//! (module file, offset) → `function (file:line)`, from the module's DWARF line tables
//! (`addr2line`), else its symbol table, else `module+0xoffset`.
//!
//! For the exit report (inside the process, at exit) and the CLI (after the program exited),
//! never the hook path: it reads whole files and allocates freely. Each file is read once and
//! kept. The file must be the one that was loaded: when the module's build-id is known and
//! the file's differs (replaced since), the file is not used; a file without debug info is
//! completed by its separate debug file (`/usr/lib/debug/.build-id/xx/rest.debug`), found by
//! build-id. Compressed debug sections are read when compressed with zstd (the crate's
//! decoder); zlib-compressed ones count as absent (their frames show the symbol table's name).
//!
//! The ELF file is read with a few bounds-checked field reads (no unsafe, no extra crate):
//! section headers, their names, the symbol tables and the build-id note.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use gimli::{EndianArcSlice, NativeEndian, SectionId};

use super::module::ModuleFrame;

type Reader = EndianArcSlice<NativeEndian>;

/// One source-level frame of an address (inlined calls give several, innermost first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Symbol {
    /// Demangled function name.
    pub function: Option<String>,
    /// Source file (as the compiler recorded it, joined with its directory).
    pub file: Option<String>,
    /// Line in it.
    pub line: Option<u32>,
}

/// A module file as looked up: its path and the build-id it must have.
type FileKey = (String, Option<Vec<u8>>);

/// Symbolizes offsets in module files, caching each file read.
#[derive(Default)]
pub struct Symbolizer {
    files: HashMap<FileKey, Option<Arc<Debug>>>,
}

/// What one module file offers: DWARF, and its function symbols.
struct Debug {
    dwarf: Option<addr2line::Context<Reader>>,
    /// `(start, end, name)`, sorted by start.
    symbols: Vec<(u64, u64, String)>,
}

impl Symbolizer {
    /// An empty cache.
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// The source frames at `offset` (an address in the module's ELF view) of the file at
    /// `path`, innermost first; empty when neither DWARF nor a symbol covers it, or the file
    /// cannot be read or is not the build `build_id` names.
    pub fn lookup(&mut self, path: &str, build_id: Option<&[u8]>, offset: u64) -> Vec<Symbol> {
        let key = (path.to_owned(), build_id.map(<[u8]>::to_vec));
        let debug = self
            .files
            .entry(key)
            .or_insert_with(|| Debug::load(path, build_id).map(Arc::new))
            .clone();
        let Some(debug) = debug else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(ctx) = &debug.dwarf {
            if let Ok(mut frames) = ctx.find_frames(offset).skip_all_loads() {
                while let Ok(Some(frame)) = frames.next() {
                    let function = frame
                        .function
                        .as_ref()
                        .and_then(|f| f.demangle().ok())
                        .map(Cow::into_owned);
                    let (file, line) = frame
                        .location
                        .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
                    if function.is_some() || file.is_some() {
                        out.push(Symbol {
                            function,
                            file,
                            line,
                        });
                    }
                }
            }
        }
        if out.iter().all(|s| s.function.is_none()) {
            if let Some(name) = debug.symbol_at(offset) {
                match out.first_mut() {
                    Some(first) => first.function = Some(name),
                    None => out.push(Symbol {
                        function: Some(name),
                        ..Symbol::default()
                    }),
                }
            }
        }
        out
    }

    /// The report's lines for one frame: `function (file:line)` per source frame (inlined
    /// ones first), `function (module+0xoffset)` without line information, `module+0xoffset`
    /// without a symbol. `return_address`: the frame is a return address (as captured stacks
    /// are), so the call before it is looked up.
    pub fn describe(&mut self, frame: &ModuleFrame, return_address: bool) -> Vec<String> {
        let probe = if return_address {
            frame.offset.saturating_sub(1)
        } else {
            frame.offset
        };
        let module = &frame.module;
        let plain = format!("{}+{:#x}", module.file_name(), frame.offset);
        let symbols = self.lookup(&module.path, module.build_id.as_deref(), probe as u64);
        if symbols.is_empty() {
            return vec![plain];
        }
        symbols
            .into_iter()
            .map(|s| {
                let function = s.function.unwrap_or_else(|| "??".to_owned());
                match (s.file, s.line) {
                    (Some(file), Some(line)) => format!("{function} ({file}:{line})"),
                    (Some(file), None) => format!("{function} ({file})"),
                    _ => format!("{function} ({plain})"),
                }
            })
            .collect()
    }
}

impl Debug {
    fn load(path: &str, build_id: Option<&[u8]>) -> Option<Debug> {
        let file = Elf::read(path)?;
        if let (Some(want), Some(has)) = (build_id, file.build_id()) {
            if want != has.as_slice() {
                return None;
            }
        }
        let symbols = file.function_symbols();
        let separate = || {
            let id = build_id.map(<[u8]>::to_vec).or_else(|| file.build_id())?;
            Elf::read(&debug_file_path(&id)?)
        };
        let dwarf = if file.section(".debug_info").is_some() {
            file.dwarf()
        } else {
            separate().and_then(|d| d.dwarf())
        };
        Some(Debug { dwarf, symbols })
    }

    fn symbol_at(&self, offset: u64) -> Option<String> {
        let i = self.symbols.partition_point(|s| s.0 <= offset);
        let (start, end, name) = self.symbols.get(i.checked_sub(1)?)?;
        (offset >= *start && offset < *end)
            .then(|| addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned())
    }
}

/// `/usr/lib/debug/.build-id/ab/cdef….debug` for build-id `abcdef…`.
fn debug_file_path(id: &[u8]) -> Option<String> {
    let (first, rest) = id.split_first()?;
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("/usr/lib/debug/.build-id/{first:02x}/{rest}.debug"))
}

/// One ELF file's bytes and section headers (64-bit, native byte order).
struct Elf {
    data: Arc<[u8]>,
    sections: Vec<Section>,
}

struct Section {
    name: String,
    kind: u32,
    flags: u64,
    offset: usize,
    size: usize,
    link: u32,
}

const SHT_SYMTAB: u32 = 2;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
const SHF_COMPRESSED: u64 = 0x800;
const ELFCOMPRESS_ZSTD: u32 = 2;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}
fn c_str_at(d: &[u8], at: usize) -> Option<&[u8]> {
    let rest = d.get(at..)?;
    Some(&rest[..memchr::memchr(0, rest)?])
}

impl Elf {
    fn read(path: &str) -> Option<Elf> {
        let data: Arc<[u8]> = std::fs::read(path).ok()?.into();
        let native = if cfg!(target_endian = "little") { 1 } else { 2 };
        if data.get(..4)? != b"\x7fELF" || data[4] != 2 || *data.get(5)? != native {
            return None;
        }
        let shoff = u64_at(&data, 0x28)? as usize;
        let shentsize = u16_at(&data, 0x3a)? as usize;
        let shnum = u16_at(&data, 0x3c)? as usize;
        let shstrndx = u16_at(&data, 0x3e)? as usize;
        if shentsize < 64 {
            return None;
        }
        let header = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
        let names_at = u64_at(&data, header(shstrndx)? + 24)? as usize;
        let mut sections = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let h = header(i)?;
            let name = c_str_at(&data, names_at.checked_add(u32_at(&data, h)? as usize)?)
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default();
            sections.push(Section {
                name,
                kind: u32_at(&data, h + 4)?,
                flags: u64_at(&data, h + 8)?,
                offset: u64_at(&data, h + 24)? as usize,
                size: u64_at(&data, h + 32)? as usize,
                link: u32_at(&data, h + 40)?,
            });
        }
        Some(Elf { data, sections })
    }

    fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// A section's bytes, decompressed (zstd) when compressed; `None` when it is absent,
    /// out of the file, or compressed another way.
    fn bytes(&self, s: &Section) -> Option<Cow<'_, [u8]>> {
        if s.kind == SHT_NOBITS {
            return None;
        }
        let raw = self.data.get(s.offset..s.offset.checked_add(s.size)?)?;
        if s.flags & SHF_COMPRESSED == 0 {
            return Some(Cow::Borrowed(raw));
        }
        let (kind, size) = (u32_at(raw, 0)?, u64_at(raw, 8)? as usize);
        if kind != ELFCOMPRESS_ZSTD {
            return None;
        }
        zstd::bulk::decompress(raw.get(24..)?, size)
            .ok()
            .map(Cow::Owned)
    }

    fn dwarf(&self) -> Option<addr2line::Context<Reader>> {
        let load = |id: SectionId| -> Result<Reader, ()> {
            let data: Arc<[u8]> = self
                .section(id.name())
                .and_then(|s| self.bytes(s))
                .map_or_else(|| Arc::from(&[][..]), |b| Arc::from(b.as_ref()));
            Ok(EndianArcSlice::new(data, NativeEndian))
        };
        let dwarf = gimli::Dwarf::load(load).ok()?;
        addr2line::Context::from_dwarf(dwarf).ok()
    }

    /// The file's GNU build-id (`.note.gnu.build-id`).
    fn build_id(&self) -> Option<Vec<u8>> {
        let notes = self.bytes(self.section(".note.gnu.build-id")?)?;
        let (namesz, descsz) = (u32_at(&notes, 0)? as usize, u32_at(&notes, 4)? as usize);
        let desc = 12 + namesz.next_multiple_of(4);
        (u32_at(&notes, 8)? == 3).then_some(())?;
        Some(notes.get(desc..desc.checked_add(descsz)?)?.to_vec())
    }

    /// Function symbols of `.symtab`, else `.dynsym`: `(start, end, name)` sorted by start.
    fn function_symbols(&self) -> Vec<(u64, u64, String)> {
        let table = self
            .sections
            .iter()
            .find(|s| s.kind == SHT_SYMTAB)
            .or_else(|| self.sections.iter().find(|s| s.kind == SHT_DYNSYM));
        let Some(table) = table else {
            return Vec::new();
        };
        let (Some(syms), Some(names)) = (
            self.bytes(table),
            self.sections
                .get(table.link as usize)
                .and_then(|s| self.bytes(s)),
        ) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64, String)> = syms
            .chunks_exact(24)
            .filter_map(|sym| {
                let kind = sym[4] & 0xf;
                let value = u64_at(sym, 8)?;
                let size = u64_at(sym, 16)?;
                if !(kind == STT_FUNC || kind == STT_GNU_IFUNC) || value == 0 || size == 0 {
                    return None;
                }
                let name = c_str_at(&names, u32_at(sym, 0)? as usize)?;
                Some((
                    value,
                    value + size,
                    String::from_utf8_lossy(name).into_owned(),
                ))
            })
            .collect();
        out.sort_unstable_by_key(|s| s.0);
        out.dedup_by_key(|s| s.0);
        out
    }
}
