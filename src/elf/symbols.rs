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
use super::wanted::{gnu_hash, sysv_hash, WantedNames};

/// Bound on hash-chain walks (corrupt tables must not loop forever).
const MAX_CHAIN: usize = 1 << 20;

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

/// The dynamic-symbol indexes whose names are in `names`, found through the hash table instead
/// of by reading the name of every relocation's symbol, into `found` (sorted, without repeats;
/// when `fixed`, within its capacity). `Ok(false)` when the object has no usable hash table
/// (then every relocation must be checked by name).
///
/// Complete by construction: a GNU hash table covers every symbol from `symoffset` on, so the
/// symbols below it (the unhashed ones: imports, locals; usually few) are read by name and the
/// rest are looked up per wanted name (most are turned away by the table's Bloom filter, as
/// the loader turns them away); a SysV table covers every symbol.
pub(crate) fn wanted_indexes(
    img: &Image<'_>,
    t: &DynamicTables,
    names: &WantedNames,
    found: &mut Vec<u32>,
    fixed: bool,
) -> Result<bool, Full> {
    found.clear();
    let symbol = |index: usize| t.sym_addr(index).and_then(|a| img.read::<Sym>(a));
    let is_wanted_symbol = |sym: Sym| -> bool {
        names.may_name(img, t, sym.st_name as usize)
            && t.string(img, sym.st_name as usize)
                .is_some_and(|n| names.contains(n))
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
        if let Some(table) = GnuTable::read(img, at) {
            for (name, hash) in names.with_gnu_hashes() {
                let named = |index: usize| {
                    symbol(index).and_then(|sym| t.string(img, sym.st_name as usize)) == Some(name)
                };
                if table.walk(img, hash, |index| named(index) && take(index)) {
                    return Err(Full);
                }
            }
        }
    } else if let Some(at) = t.hash {
        for (_, hash) in names.with_sysv_hashes() {
            if walk_sysv(img, at, hash, |index| is_wanted(index) && take(index)) {
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
    GnuTable::read(img, at).is_some_and(|t| t.walk(img, gnu_hash(name), matches))
}

fn lookup_sysv(img: &Image<'_>, at: usize, name: &[u8], matches: impl Fn(usize) -> bool) -> bool {
    walk_sysv(img, at, sysv_hash(name), matches)
}

/// The header of a GNU hash table (read once per object, not once per name looked up) and
/// where its parts start.
struct GnuTable {
    nbuckets: u32,
    symoffset: u32,
    /// Where the Bloom filter's 64-bit words start; `None` when the filter cannot be used the
    /// way the loader uses it (a word count that is not a power of two, a shift past 31).
    bloom: Option<(usize, u32, u32)>,
    buckets: usize,
    chains: usize,
}

impl GnuTable {
    fn read(img: &Image<'_>, at: usize) -> Option<GnuTable> {
        let (nbuckets, symoffset, bloom_size, shift) = (
            img.read::<u32>(at)?,
            img.read::<u32>(at.wrapping_add(4))?,
            img.read::<u32>(at.wrapping_add(8))?,
            img.read::<u32>(at.wrapping_add(12))?,
        );
        if nbuckets == 0 {
            return None;
        }
        let words = at.wrapping_add(16);
        let buckets = words.wrapping_add(bloom_size as usize * 8);
        Some(GnuTable {
            nbuckets,
            symoffset,
            bloom: (bloom_size.is_power_of_two() && shift < 32)
                .then_some((words, bloom_size, shift)),
            buckets,
            chains: buckets.wrapping_add(nbuckets as usize * 4),
        })
    }

    /// Whether the Bloom filter lets a symbol with GNU hash `h` through (the loader's own test:
    /// word `(h / 64) mod size`, bits `h mod 64` and `(h >> shift) mod 64`). A filter that
    /// cannot be read lets everything through.
    fn may_hold(&self, img: &Image<'_>, h: u32) -> bool {
        let Some((words, size, shift)) = self.bloom else {
            return true;
        };
        let index = (h as usize / 64) & (size as usize - 1);
        let Some(word) = img.read::<u64>(words.wrapping_add(index * 8)) else {
            return true;
        };
        (word >> (h % 64)) & (word >> ((h >> shift) % 64)) & 1 != 0
    }

    /// Visit the symbols of hash `h`'s chain whose hash matches, until `visit` says stop.
    fn walk(&self, img: &Image<'_>, h: u32, mut visit: impl FnMut(usize) -> bool) -> bool {
        if !self.may_hold(img, h) {
            return false;
        }
        let Some(mut index) =
            img.read::<u32>(self.buckets.wrapping_add((h % self.nbuckets) as usize * 4))
        else {
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

    /// The Bloom filter test is the loader's: every symbol a GNU hash table holds passes it (in
    /// every object of this process), and it turns most made-up names away.
    #[test]
    fn bloom_filter_passes_every_hashed_symbol_and_turns_others_away() {
        let (mut passed, mut refused, mut tried) = (0, 0, 0);
        for obj in snapshot().objects {
            let Ok(Some(t)) = DynamicTables::read(&obj) else {
                continue;
            };
            let img = Image::new(&obj);
            let Some(table) = t.gnu_hash.and_then(|at| GnuTable::read(&img, at)) else {
                continue;
            };
            // Every hashed symbol, chain by chain (up to 5,000 per object).
            let mut seen = 0;
            for b in 0..table.nbuckets as usize {
                let Some(mut index) = img.read::<u32>(table.buckets + b * 4) else {
                    break;
                };
                while index >= table.symoffset && seen < 5000 {
                    seen += 1;
                    let at = table.chains + (index - table.symoffset) as usize * 4;
                    let (Some(ch), Some(sym)) = (
                        img.read::<u32>(at),
                        t.sym_addr(index as usize).and_then(|a| img.read::<Sym>(a)),
                    ) else {
                        break;
                    };
                    if let Some(name) = t.string(&img, sym.st_name as usize) {
                        assert!(
                            table.may_hold(&img, gnu_hash(name)),
                            "{}: {} refused",
                            obj.display_name(),
                            String::from_utf8_lossy(name)
                        );
                        passed += 1;
                    }
                    if ch & 1 != 0 {
                        break;
                    }
                    index += 1;
                }
            }
            for k in 0..100 {
                tried += 1;
                let made_up = format!("cuhook_no_such_symbol_{k}");
                refused += usize::from(!table.may_hold(&img, gnu_hash(made_up.as_bytes())));
            }
        }
        assert!(passed > 100, "only {passed} symbols checked");
        assert!(
            refused * 2 > tried,
            "the filter refused {refused} of {tried}"
        );
    }
}
