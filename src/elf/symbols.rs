//! Finding a symbol *defined* by one object, through its GNU or SysV hash table: what the
//! loader does for each object of a scope, needed to emulate `dlsym(RTLD_NEXT, …)` for a caller
//! that is not cuhook.

use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::{st_bind, st_type, STB_GLOBAL, STB_WEAK, STT_TLS};
use goblin::elf64::sym::Sym;

use super::dynamic::DynamicTables;
use super::image::Image;
use super::room::{push, Full};
use super::snapshot::LoadedObject;
use super::versions::VersionNames;

/// Bound on hash-chain walks (corrupt tables must not loop forever).
const MAX_CHAIN: usize = 1 << 20;

/// The GNU hash of a name (goblin 0.10 keeps its own `gnu_hash` module crate-private, and its
/// table lookup needs the table as a trusted slice, where ours reads a loaded object's memory
/// with bounds checks).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

/// Whether `obj` itself defines `name` (with `version`, when given) as a global or weak,
/// non-TLS symbol.
pub fn defines(obj: &LoadedObject, name: &str, version: Option<&str>) -> bool {
    let Ok(Some(t)) = DynamicTables::read(obj) else {
        return false;
    };
    if t.symtab == 0 {
        return false;
    }
    let img = Image::new(obj);
    let mut version_buf = Vec::new();
    let Ok(versions) = VersionNames::read(&img, &t, &mut version_buf, false) else {
        return false;
    };
    let matches = |index: usize| -> bool {
        let Some(sym) = t.sym_addr(index).and_then(|a| img.read::<Sym>(a)) else {
            return false;
        };
        let (bind, kind) = (st_bind(sym.st_info), st_type(sym.st_info));
        if sym.st_shndx as u32 == SHN_UNDEF
            || (bind != STB_GLOBAL && bind != STB_WEAK)
            || kind == STT_TLS
        {
            return false;
        }
        if t.string(&img, sym.st_name as usize) != Some(name.as_bytes()) {
            return false;
        }
        let versym = t.versym_addr(index).and_then(|a| img.read::<u16>(a));
        match (version, versym) {
            (Some(v), Some(vs)) => versions.name_of(&img, &t, vs & 0x7fff) == Some(v.as_bytes()),
            (Some(_), None) => false,
            // An unversioned lookup takes the default (non-hidden) version.
            (None, Some(vs)) => vs & 0x8000 == 0,
            (None, None) => true,
        }
    };
    if let Some(gh) = t.gnu_hash {
        return lookup_gnu(&img, gh, name.as_bytes(), matches);
    }
    if let Some(h) = t.hash {
        return lookup_sysv(&img, h, name.as_bytes(), matches);
    }
    false
}

/// The dynamic-symbol indexes whose names are in `names` (sorted), found through the hash
/// table instead of by reading the name of every relocation's symbol, into `found` (sorted,
/// without repeats; when `fixed`, within its capacity). `Ok(false)` when the object has no
/// usable hash table (then every relocation must be checked by name).
///
/// Complete by construction: a GNU hash table covers every symbol from `symoffset` on, so the
/// symbols below it (the unhashed ones: imports, locals; usually few) are read by name and the
/// rest are looked up per wanted name; a SysV table covers every symbol.
pub(crate) fn wanted_indexes(
    img: &Image<'_>,
    t: &DynamicTables,
    names: &[Vec<u8>],
    found: &mut Vec<u32>,
    fixed: bool,
) -> Result<bool, Full> {
    found.clear();
    let prefixes = Prefixes::of(names);
    let symbol = |index: usize| t.sym_addr(index).and_then(|a| img.read::<Sym>(a));
    let is_wanted_symbol = |sym: Sym| -> bool {
        prefixes.may_name(img, t, sym.st_name as usize)
            && t.string(img, sym.st_name as usize)
                .is_some_and(|n| names.binary_search_by(|w| w.as_slice().cmp(n)).is_ok())
    };
    let is_wanted = |index: usize| symbol(index).is_some_and(is_wanted_symbol);
    // Record a wanted index; true (stop) when there is no room left.
    let mut take = |index: usize| push(found, index as u32, fixed).is_err();
    if let Some(at) = t.gnu_hash {
        let Some(unhashed) = unhashed_symbols(img, t, at) else {
            return Ok(false);
        };
        // Up to the first entry that cannot be read: a corrupt `symoffset` may claim billions.
        for index in 1..unhashed.min(MAX_CHAIN) {
            let Some(sym) = symbol(index) else {
                break;
            };
            if is_wanted_symbol(sym) && take(index) {
                return Err(Full);
            }
        }
        for name in names {
            let named = |index: usize| {
                symbol(index).and_then(|sym| t.string(img, sym.st_name as usize))
                    == Some(name.as_slice())
            };
            if walk_gnu(img, at, name, |index| named(index) && take(index)) {
                return Err(Full);
            }
        }
    } else if let Some(at) = t.hash {
        for name in names {
            if walk_sysv(img, at, name, |index| is_wanted(index) && take(index)) {
                return Err(Full);
            }
        }
    } else {
        return Ok(false);
    }
    found.sort_unstable();
    found.dedup();
    Ok(true)
}

/// The first two bytes of each wanted name, as a 4,096-bit set. A big library imports
/// thousands of symbols that no hash table covers, nearly all C++ names (`_Z...`); each is
/// passed over after one two-byte read and a bit test instead of a string scan and a search.
struct Prefixes([u64; 64]);

impl Prefixes {
    fn of(names: &[Vec<u8>]) -> Prefixes {
        let mut set = [0u64; 64];
        for name in names {
            let k = Self::key(
                name.first().copied().unwrap_or(0),
                name.get(1).copied().unwrap_or(0),
            );
            set[k >> 6] |= 1 << (k & 63);
        }
        Prefixes(set)
    }

    fn key(b0: u8, b1: u8) -> usize {
        ((b0 as usize & 63) << 6) | (b1 as usize & 63)
    }

    /// Whether the string at `offset` may be one of the names: false only when its first two
    /// bytes (the second is the NUL of a one-byte name) start none of them, or cannot be read.
    fn may_name(&self, img: &Image<'_>, t: &DynamicTables, offset: usize) -> bool {
        if t.strsz != 0 && offset.saturating_add(2) > t.strsz {
            return true; // too near the end to read two bytes: let the full check decide
        }
        let Some(two) = img.read::<u16>(t.strtab.wrapping_add(offset)) else {
            return true;
        };
        let [b0, b1] = two.to_ne_bytes();
        let k = Self::key(b0, b1);
        self.0[k >> 6] & (1 << (k & 63)) != 0
    }
}

/// How many symbols precede the hashed ones of a GNU hash table at `at`: the imports are among
/// them. Normally `symoffset`; but a table that hashes no symbol at all (an executable that
/// exports nothing) leaves `symoffset` meaningless, and aarch64's GNU ld writes 1 there (x86-64's
/// writes the symbol count): then every symbol is unhashed, and their count is bounded by where
/// `.dynstr` starts (it follows `.dynsym` in GNU ld's and gold's layout; a bound too large only
/// reads more names) or by a SysV table's `nchain`.
fn unhashed_symbols(img: &Image<'_>, t: &DynamicTables, at: usize) -> Option<usize> {
    let (nbuckets, symoffset, bloom_size) = (
        img.read::<u32>(at)?,
        img.read::<u32>(at + 4)?,
        img.read::<u32>(at + 8)?,
    );
    let buckets = at.wrapping_add(16).wrapping_add(bloom_size as usize * 8);
    // Up to the first bucket that cannot be read: a corrupt count may claim four billion.
    let hashes_any = (0..nbuckets as usize)
        .map_while(|i| img.read::<u32>(buckets.wrapping_add(i * 4)))
        .any(|b| b != 0);
    if hashes_any {
        return Some(symoffset as usize);
    }
    let from_sysv = t
        .hash
        .and_then(|h| img.read::<u32>(h + 4))
        .map(|n| n as usize);
    let from_layout =
        (t.strtab > t.symtab && t.syment > 0).then(|| (t.strtab - t.symtab) / t.syment);
    Some(
        from_sysv
            .or(from_layout)
            .unwrap_or(0)
            .max(symoffset as usize),
    )
}

fn lookup_gnu(img: &Image<'_>, at: usize, name: &[u8], matches: impl Fn(usize) -> bool) -> bool {
    walk_gnu(img, at, name, matches)
}

fn lookup_sysv(img: &Image<'_>, at: usize, name: &[u8], matches: impl Fn(usize) -> bool) -> bool {
    walk_sysv(img, at, name, matches)
}

/// Visit the symbols of `name`'s GNU hash chain whose hash matches, until `visit` says stop.
fn walk_gnu(img: &Image<'_>, at: usize, name: &[u8], mut visit: impl FnMut(usize) -> bool) -> bool {
    let (Some(nbuckets), Some(symoffset), Some(bloom_size)) = (
        img.read::<u32>(at),
        img.read::<u32>(at + 4),
        img.read::<u32>(at + 8),
    ) else {
        return false;
    };
    if nbuckets == 0 {
        return false;
    }
    let buckets = at + 16 + bloom_size as usize * 8;
    let chains = buckets + nbuckets as usize * 4;
    let h = gnu_hash(name);
    let Some(mut index) = img.read::<u32>(buckets + (h % nbuckets) as usize * 4) else {
        return false;
    };
    if index < symoffset {
        return false;
    }
    for _ in 0..MAX_CHAIN {
        let Some(ch) = img.read::<u32>(chains + (index - symoffset) as usize * 4) else {
            return false;
        };
        if (ch | 1) == (h | 1) && visit(index as usize) {
            return true;
        }
        if ch & 1 != 0 {
            return false;
        }
        let Some(next) = index.checked_add(1) else {
            return false;
        };
        index = next;
    }
    false
}

/// Visit the symbols of `name`'s SysV hash chain, until `visit` says stop.
fn walk_sysv(
    img: &Image<'_>,
    at: usize,
    name: &[u8],
    mut visit: impl FnMut(usize) -> bool,
) -> bool {
    let (Some(nbucket), Some(nchain)) = (img.read::<u32>(at), img.read::<u32>(at + 4)) else {
        return false;
    };
    if nbucket == 0 {
        return false;
    }
    let bucket = at + 8;
    let chain = bucket + nbucket as usize * 4;
    let Some(mut index) = img.read::<u32>(bucket + (sysv_hash(name) % nbucket) as usize * 4) else {
        return false;
    };
    for _ in 0..MAX_CHAIN.min(nchain as usize + 1) {
        if index == 0 {
            return false;
        }
        if visit(index as usize) {
            return true;
        }
        let Some(next) = img.read::<u32>(chain + index as usize * 4) else {
            return false;
        };
        index = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::snapshot;

    #[test]
    fn libc_defines_getpid_and_not_a_made_up_name() {
        let snap = snapshot();
        let libc = snap
            .objects
            .iter()
            .find(|o| o.name.contains("libc.so"))
            .expect("libc loaded");
        assert!(defines(libc, "getpid", None));
        // The oldest symbol version glibc has on each architecture.
        let base_version = if cfg!(target_arch = "aarch64") {
            "GLIBC_2.17"
        } else {
            "GLIBC_2.2.5"
        };
        assert!(defines(libc, "getpid", Some(base_version)));
        assert!(!defines(libc, "getpid", Some("NO_SUCH_VERSION")));
        assert!(!defines(libc, "cuhook_no_such_symbol", None));
        // The main program imports getpid-like symbols but defines none of libc's.
        assert!(!defines(&snap.objects[0], "getpid", None));
    }

    #[test]
    fn hash_functions_match_the_elf_specification() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
    }
}
