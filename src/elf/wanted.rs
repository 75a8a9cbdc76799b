//! The names an index looks for, with what each object's search needs computed once, and the
//! ELF hash functions they are looked up by.
//!
//! Every object the engine admits is searched for every hooked name (≈ 80 with the CUDA set):
//! hashing each name again per object cost more than the rest of indexing a small library.

use super::dynamic::DynamicTables;
use super::image::Image;

/// The GNU hash of a symbol name (goblin 0.10 keeps its own `gnu_hash` module crate-private,
/// and its table lookup needs the table as a trusted slice, where ours reads a loaded object's
/// memory with bounds checks). Also what a [`NameFilter`](super::NameFilter) is keyed by.
pub fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

pub(super) fn sysv_hash(name: &[u8]) -> u32 {
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

/// A set of 12-bit keys as 4,096 bits: the filters that turn most of a big table's entries
/// away with one bit test (the wanted names' hashes and prefixes, the wanted symbol indexes).
#[derive(Debug, Clone)]
pub(super) struct KeySet([u64; 64]);

impl KeySet {
    pub(super) const fn new() -> KeySet {
        KeySet([0; 64])
    }

    /// Add `key` (its low 12 bits).
    pub(super) fn insert(&mut self, key: usize) {
        self.0[(key >> 6) & 63] |= 1 << (key & 63);
    }

    /// Whether a key with these low 12 bits was added.
    pub(super) fn may_hold(&self, key: usize) -> bool {
        self.0[(key >> 6) & 63] & (1 << (key & 63)) != 0
    }
}

/// Sorted, unique names, with their GNU and SysV hashes and the set of their first two bytes.
#[derive(Debug, Clone)]
pub struct WantedNames {
    names: Vec<Vec<u8>>,
    gnu: Vec<u32>,
    sysv: Vec<u32>,
    prefixes: Prefixes,
    /// The names' GNU hashes, keyed without their lowest bit (a hash table's chain words keep
    /// only the others).
    hashes: KeySet,
}

impl Default for WantedNames {
    fn default() -> Self {
        WantedNames::new()
    }
}

impl WantedNames {
    /// No name.
    pub const fn new() -> WantedNames {
        WantedNames {
            names: Vec::new(),
            gnu: Vec::new(),
            sysv: Vec::new(),
            prefixes: Prefixes(KeySet::new()),
            hashes: KeySet::new(),
        }
    }

    /// These names (in any order, repeats ignored).
    pub fn of<N: AsRef<[u8]>>(names: impl IntoIterator<Item = N>) -> WantedNames {
        let mut w = WantedNames::new();
        for n in names {
            w.insert(n.as_ref());
        }
        w
    }

    /// Add `name`; false when it was there already.
    pub fn insert(&mut self, name: &[u8]) -> bool {
        let Err(at) = self.names.binary_search_by(|w| w.as_slice().cmp(name)) else {
            return false;
        };
        self.names.insert(at, name.to_vec());
        let h = gnu_hash(name);
        self.gnu.insert(at, h);
        self.hashes.insert(h as usize >> 1);
        self.sysv.insert(at, sysv_hash(name));
        self.prefixes.add(name);
        true
    }

    /// The names, sorted.
    pub fn names(&self) -> &[Vec<u8>] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.position(name).is_some()
    }

    /// The name at `position` and its GNU hash.
    pub(super) fn at(&self, position: usize) -> Option<(&[u8], u32)> {
        Some((self.names.get(position)?, *self.gnu.get(position)?))
    }

    /// Where `name` is among the names (see [`WantedNames::names`]), if it is one.
    pub fn position(&self, name: &[u8]) -> Option<usize> {
        self.names.binary_search_by(|w| w.as_slice().cmp(name)).ok()
    }

    /// Whether a name may have the GNU hash `h` (its lowest bit ignored, as in a chain word):
    /// false for most hashes no name has.
    pub(super) fn may_have_hash(&self, h: u32) -> bool {
        self.hashes.may_hold(h as usize >> 1)
    }

    /// Each name with its GNU hash.
    pub(super) fn with_gnu_hashes(&self) -> impl Iterator<Item = (&[u8], u32)> {
        self.names
            .iter()
            .map(Vec::as_slice)
            .zip(self.gnu.iter().copied())
    }

    /// Each name with its SysV hash.
    pub(super) fn with_sysv_hashes(&self) -> impl Iterator<Item = (&[u8], u32)> {
        self.names
            .iter()
            .map(Vec::as_slice)
            .zip(self.sysv.iter().copied())
    }

    /// Whether the string at `offset` of the object's string table may be one of the names
    /// (see [`Prefixes`]).
    pub(super) fn may_name(&self, img: &Image<'_>, t: &DynamicTables, offset: usize) -> bool {
        self.prefixes.may_name(img, t, offset)
    }
}

/// The first two bytes of each wanted name (six bits of each). A big library imports
/// thousands of symbols that no hash table covers, nearly all C++ names (`_Z...`); each is
/// passed over after one two-byte read and a bit test instead of a string scan and a search.
#[derive(Debug, Clone)]
struct Prefixes(KeySet);

impl Prefixes {
    fn add(&mut self, name: &[u8]) {
        self.0.insert(Self::key(
            name.first().copied().unwrap_or(0),
            name.get(1).copied().unwrap_or(0),
        ));
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
        self.0.may_hold(Self::key(b0, b1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_sorted_and_unique_with_their_hashes() {
        let w = WantedNames::of(["dlsym", "cuMemAlloc_v2", "dlsym", "cuMemFree_v2"]);
        assert_eq!(
            w.names(),
            [&b"cuMemAlloc_v2"[..], b"cuMemFree_v2", b"dlsym"]
        );
        assert!(w.contains(b"dlsym") && !w.contains(b"dlopen"));
        for (name, h) in w.with_gnu_hashes() {
            assert_eq!(h, gnu_hash(name));
        }
        for (name, h) in w.with_sysv_hashes() {
            assert_eq!(h, sysv_hash(name));
        }
        let mut more = w.clone();
        assert!(more.insert(b"a") && !more.insert(b"a"));
        assert_eq!(more.names()[0], b"a");
        assert_eq!(
            more.with_gnu_hashes().next(),
            Some((&b"a"[..], gnu_hash(b"a")))
        );
    }

    #[test]
    fn hash_functions_match_the_elf_specification() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
    }
}
