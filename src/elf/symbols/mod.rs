//! Finding a symbol *defined* by one object, through its GNU or SysV hash table: what the
//! loader does for each object of a scope, needed to emulate `dlsym(RTLD_NEXT, …)` for a caller
//! that is not cuhook.

use goblin::elf::section_header::{SHN_LORESERVE, SHN_UNDEF};
use goblin::elf::sym::{st_bind, st_type, STB_GLOBAL, STB_WEAK, STT_FUNC, STT_OBJECT, STT_TLS};
use goblin::elf64::sym::Sym;

use super::dynamic::DynamicTables;
use super::image::Image;
use super::loaded::LoadedObject;
use super::room::{push, Full};
use super::versions::VersionNames;
use super::wanted::{gnu_hash, sysv_hash, WantedNames};

/// Bound on hash-chain walks (corrupt tables must not loop forever).
const MAX_CHAIN: usize = 1 << 20;

/// Whether `obj` itself defines `name` (with `version`, when given) as a global or weak,
/// non-TLS symbol.
pub fn defines(obj: &LoadedObject, name: &str, version: Option<&str>) -> bool {
    defines_with(obj, name, Wanted::Version(version))
}

/// Whether `obj` defines `name` without a version of its own (no version table, or the base
/// index): a definition the loader binds a *versioned* reference to as readily as an exact one
/// (a preloaded wrapper built without a version script takes a program's `dlopen@GLIBC_2.34`),
/// although `dlvsym` passes it by.
pub fn defines_unversioned(obj: &LoadedObject, name: &str) -> bool {
    defines_with(obj, name, Wanted::Base)
}

/// Which definitions count.
enum Wanted<'a> {
    /// Of this version (`None`: the default one).
    Version(Option<&'a str>),
    /// Without a version: no version table, or the base index (0 or 1).
    Base,
}

fn defines_with(obj: &LoadedObject, name: &str, wanted: Wanted<'_>) -> bool {
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
        let version = match wanted {
            Wanted::Base => return versym.is_none_or(|vs| vs & 0x7fff <= 1),
            Wanted::Version(v) => v,
        };
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

/// Symbols [`exported_names`] looks at before it gives up.
const EXPORT_SEARCH: usize = 64;

/// Names `obj` defines and exports, from its GNU hash table (which holds only definitions), in
/// table order, to `found` until it returns false: global (not weak: a weak definition is
/// often one of many, such as a C++ template's), non-TLS functions and objects of the default
/// version, defined in a section of the object. A `dlsym` through a handle whose scope holds
/// `obj` finds such a name in it unless an object earlier in that scope defines the name too.
/// Reads nothing but the object's own tables through `img` and allocates nothing (it runs
/// inside loader walks: see `IndexRoom::exported_names`).
pub(crate) fn exported_names(img: &Image<'_>, found: &mut dyn FnMut(&[u8]) -> bool) {
    let Ok(Some(t)) = DynamicTables::read_in(img) else {
        return;
    };
    let Some(table) = t.gnu_hash.and_then(|at| GnuTable::read(img, at)) else {
        return;
    };
    if t.symtab == 0 {
        return;
    }
    let mut seen = 0;
    for b in 0..table.nbuckets as usize {
        let Some(mut index) = table.bucket(img, b) else {
            return;
        };
        if index == 0 || index < table.symoffset {
            continue;
        }
        loop {
            seen += 1;
            if seen > EXPORT_SEARCH {
                return;
            }
            let Some(sym) = t.sym_addr(index as usize).and_then(|a| img.read::<Sym>(a)) else {
                return;
            };
            let kind = st_type(sym.st_info);
            let default_version = t
                .versym_addr(index as usize)
                .and_then(|a| img.read::<u16>(a))
                .is_none_or(|vs| vs & 0x8000 == 0);
            let in_section =
                sym.st_shndx as u32 != SHN_UNDEF && (sym.st_shndx as u32) < SHN_LORESERVE;
            if in_section
                && st_bind(sym.st_info) == STB_GLOBAL
                && (kind == STT_FUNC || kind == STT_OBJECT)
                && sym.st_value != 0
                && default_version
            {
                let name = t.string(img, sym.st_name as usize).unwrap_or_default();
                if !name.is_empty() && !found(name) {
                    return;
                }
            }
            match table.chain(img, index) {
                Some(word) if word & 1 == 0 => index = index.saturating_add(1),
                _ => break,
            }
        }
    }
}

/// The dynamic-symbol indexes whose names are in `names`, each with its name's position among
/// `names`, found through the hash table instead of by reading the name of every relocation's
/// symbol, into `found` (sorted, without repeats; when `fixed`, within its capacity).
/// `Ok(false)` when the object has no usable hash table (then every relocation must be checked
/// by name).
///
/// Complete by construction: a GNU hash table covers every symbol from `symoffset` on, so the
/// symbols below it (the unhashed ones: imports, locals; usually few) are read by name and the
/// rest are looked up per wanted name (most are turned away by the table's Bloom filter, as
/// the loader turns them away); a SysV table covers every symbol.
pub(crate) fn wanted_indexes(
    img: &Image<'_>,
    t: &DynamicTables,
    names: &WantedNames,
    found: &mut Vec<(u32, u32)>,
    fixed: bool,
) -> Result<bool, Full> {
    found.clear();
    let symbol = |index: usize| t.sym_addr(index).and_then(|a| img.read::<Sym>(a));
    let wanted_symbol = |sym: Sym| -> Option<usize> {
        if !names.may_name(img, t, sym.st_name as usize) {
            return None;
        }
        names.position(t.string(img, sym.st_name as usize)?)
    };
    let wanted = |index: usize| symbol(index).and_then(wanted_symbol);
    // Record a wanted index; true (stop) when there is no room left.
    let mut take = |index: usize, at: usize| push(found, (index as u32, at as u32), fixed).is_err();
    if let Some(at) = t.gnu_hash {
        let Some(table) = GnuTable::read(img, at) else {
            return Ok(false);
        };
        let unhashed = unhashed_symbols(img, t, &table);
        // Up to the first entry that cannot be read: a corrupt `symoffset` may claim billions.
        for index in 1..unhashed.min(MAX_CHAIN) {
            let Some(sym) = symbol(index) else {
                break;
            };
            if let Some(at) = wanted_symbol(sym) {
                if take(index, at) {
                    return Err(Full);
                }
            }
        }
        // An object that hashes fewer symbols than there are names (most libraries a program
        // opens export a handful) is read symbol by symbol, each passed over on its hash alone
        // unless a wanted name has it; a bigger one is asked name by name.
        if let Some(hashed) = table.few_hashed(img, 2 * names.len()) {
            for index in hashed {
                let Some(h) = table.chain(img, index) else {
                    break;
                };
                if !names.may_have_hash(h) {
                    continue;
                }
                if let Some(at) = wanted(index as usize) {
                    if take(index as usize, at) {
                        return Err(Full);
                    }
                }
            }
        } else {
            for (at, (name, hash)) in names.with_gnu_hashes().enumerate() {
                let named = |index: usize| {
                    symbol(index).and_then(|sym| t.string(img, sym.st_name as usize)) == Some(name)
                };
                if table.walk(img, hash, |index| named(index) && take(index, at)) {
                    return Err(Full);
                }
            }
        }
    } else if let Some(at) = t.hash {
        for (_, hash) in names.with_sysv_hashes() {
            let found_here = |index: usize| match wanted(index) {
                Some(at) => take(index, at),
                None => false,
            };
            if walk_sysv(img, at, hash, found_here) {
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

/// How many symbols precede the hashed ones of a GNU hash table: the imports are among them.
/// Normally `symoffset`; but a table that hashes no symbol at all (an executable that exports
/// nothing) leaves `symoffset` meaningless, and aarch64's GNU ld writes 1 there (x86-64's
/// writes the symbol count): then every symbol is unhashed, and their count is bounded by where
/// `.dynstr` starts (it follows `.dynsym` in GNU ld's and gold's layout; a bound too large only
/// reads more names) or by a SysV table's `nchain`.
fn unhashed_symbols(img: &Image<'_>, t: &DynamicTables, table: &GnuTable<'_>) -> usize {
    let symoffset = table.symoffset as usize;
    // Up to the first bucket that cannot be read: a corrupt count may claim four billion.
    let hashes_any = (0..table.nbuckets as usize)
        .map_while(|b| table.bucket(img, b))
        .any(|b| b != 0);
    if hashes_any {
        return symoffset;
    }
    let from_sysv = t
        .hash
        .and_then(|h| img.read::<u32>(h + 4))
        .map(|n| n as usize);
    let from_layout =
        (t.strtab > t.symtab && t.syment > 0).then(|| (t.strtab - t.symtab) / t.syment);
    from_sysv.or(from_layout).unwrap_or(0).max(symoffset)
}

fn lookup_gnu(img: &Image<'_>, at: usize, name: &[u8], matches: impl Fn(usize) -> bool) -> bool {
    GnuTable::read(img, at).is_some_and(|t| t.walk(img, gnu_hash(name), matches))
}

fn lookup_sysv(img: &Image<'_>, at: usize, name: &[u8], matches: impl Fn(usize) -> bool) -> bool {
    walk_sysv(img, at, sysv_hash(name), matches)
}

/// A GNU hash table, its header read once per object (not once per name looked up), its Bloom
/// filter and buckets checked once as arrays where they lie in one readable segment (each
/// bounded read costs a segment lookup; an object is asked for ≈ 80 names). A table without
/// buckets hashes nothing.
struct GnuTable<'a> {
    nbuckets: u32,
    symoffset: u32,
    /// The Bloom filter's 64-bit words and its shift; `None` when it cannot be used the way the
    /// loader uses it (a word count that is not a power of two, a shift past 31, unreadable).
    bloom: Option<(&'a [u64], u32)>,
    /// The buckets as an array; `None`: read one by one from `buckets_at`.
    buckets: Option<&'a [u32]>,
    buckets_at: usize,
    chains: usize,
}

impl<'a> GnuTable<'a> {
    fn read(img: &Image<'a>, at: usize) -> Option<GnuTable<'a>> {
        let (nbuckets, symoffset, bloom_size, shift) = (
            img.read::<u32>(at)?,
            img.read::<u32>(at.wrapping_add(4))?,
            img.read::<u32>(at.wrapping_add(8))?,
            img.read::<u32>(at.wrapping_add(12))?,
        );
        let words = at.wrapping_add(16);
        let buckets_at = words.wrapping_add(bloom_size as usize * 8);
        let bloom = (bloom_size.is_power_of_two() && shift < 32)
            .then(|| img.array::<u64>(words, bloom_size as usize))
            .flatten()
            .map(|w| (w, shift));
        Some(GnuTable {
            nbuckets,
            symoffset,
            bloom,
            buckets: img.array::<u32>(buckets_at, nbuckets as usize),
            buckets_at,
            chains: buckets_at.wrapping_add(nbuckets as usize * 4),
        })
    }

    /// Whether the Bloom filter lets a symbol with GNU hash `h` through (the loader's own test:
    /// word `(h / 64) mod size`, bits `h mod 64` and `(h >> shift) mod 64`). A filter that
    /// cannot be used lets everything through.
    fn may_hold(&self, h: u32) -> bool {
        let Some((words, shift)) = self.bloom else {
            return true;
        };
        let word = words[(h as usize / 64) & (words.len() - 1)];
        (word >> (h % 64)) & (word >> ((h >> shift) % 64)) & 1 != 0
    }

    fn bucket(&self, img: &Image<'_>, b: usize) -> Option<u32> {
        match self.buckets {
            Some(all) => all.get(b).copied(),
            None => img.read::<u32>(self.buckets_at.wrapping_add(b * 4)),
        }
    }

    /// The chain word of hashed symbol `index` (its hash, the low bit marking a chain's end).
    fn chain(&self, img: &Image<'_>, index: u32) -> Option<u32> {
        let k = index.checked_sub(self.symoffset)? as usize;
        img.read::<u32>(self.chains.wrapping_add(k * 4))
    }

    /// The indexes of every hashed symbol when there are at most `limit` of them (and at most
    /// `limit` buckets to look through); `None` when there are more. The hashed symbols run
    /// from `symoffset` to the end of the chain the highest bucket starts.
    fn few_hashed(&self, img: &Image<'_>, limit: usize) -> Option<std::ops::Range<u32>> {
        if self.nbuckets as usize > limit {
            return None;
        }
        // The highest bucket start (0: an empty bucket; symbol 0 is never hashed).
        let mut last = 0;
        for b in 0..self.nbuckets as usize {
            last = last.max(self.bucket(img, b)?);
        }
        if last == 0 || last < self.symoffset {
            return Some(self.symoffset..self.symoffset); // hashes nothing
        }
        let mut end = last;
        loop {
            if (end - self.symoffset) as usize >= limit {
                return None;
            }
            if self.chain(img, end)? & 1 != 0 {
                return end.checked_add(1).map(|after| self.symoffset..after);
            }
            end = end.checked_add(1)?;
        }
    }

    /// Visit the symbols of hash `h`'s chain whose hash matches, until `visit` says stop.
    fn walk(&self, img: &Image<'_>, h: u32, mut visit: impl FnMut(usize) -> bool) -> bool {
        if self.nbuckets == 0 || !self.may_hold(h) {
            return false;
        }
        let Some(mut index) = self.bucket(img, (h % self.nbuckets) as usize) else {
            return false;
        };
        if index < self.symoffset {
            return false;
        }
        for _ in 0..MAX_CHAIN {
            let at = self
                .chains
                .wrapping_add((index - self.symoffset) as usize * 4);
            let Some(ch) = img.read::<u32>(at) else {
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
}

/// Visit the symbols of the SysV hash chain of hash `h`, until `visit` says stop.
fn walk_sysv(img: &Image<'_>, at: usize, h: u32, mut visit: impl FnMut(usize) -> bool) -> bool {
    let (Some(nbucket), Some(nchain)) = (img.read::<u32>(at), img.read::<u32>(at + 4)) else {
        return false;
    };
    if nbucket == 0 {
        return false;
    }
    let bucket = at + 8;
    let chain = bucket + nbucket as usize * 4;
    let Some(mut index) = img.read::<u32>(bucket + (h % nbucket) as usize * 4) else {
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
mod tests;
