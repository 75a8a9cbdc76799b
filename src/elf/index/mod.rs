//! Per-object index: symbol name → every GOT slot that relocates to it. The index's types and
//! lookups are here; reading an object's tables into a room is `tables.rs`.

use std::fmt;
use std::sync::Arc;

mod tables;

use goblin::elf::reloc::{
    R_AARCH64_ABS64, R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT, R_X86_64_64, R_X86_64_GLOB_DAT,
    R_X86_64_JUMP_SLOT,
};

use super::dynamic::BadTables;
use super::image::Image;
use super::loaded::LoadedObject;
use super::room::Full;
use super::wanted::WantedNames;
use crate::sys::maps::MapsQuery;
use crate::Result;
use tables::index_tables;

/// Which kind of relocation fills a slot. Only these three ever name a function we can hook.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelocKind {
    /// PLT slot (`R_*_JUMP_SLOT`), possibly lazily bound.
    JumpSlot = 1,
    /// GOT entry (`R_*_GLOB_DAT`): address-taken functions, `-fno-plt` calls.
    GlobDat = 2,
    /// Absolute 64-bit pointer with addend 0 (`R_X86_64_64`): function pointers in data tables.
    Abs64 = 3,
}

impl RelocKind {
    fn from_type(t: u32) -> Option<RelocKind> {
        match t {
            R_X86_64_JUMP_SLOT if cfg!(target_arch = "x86_64") => Some(RelocKind::JumpSlot),
            R_X86_64_GLOB_DAT if cfg!(target_arch = "x86_64") => Some(RelocKind::GlobDat),
            R_X86_64_64 if cfg!(target_arch = "x86_64") => Some(RelocKind::Abs64),
            R_AARCH64_JUMP_SLOT if cfg!(target_arch = "aarch64") => Some(RelocKind::JumpSlot),
            R_AARCH64_GLOB_DAT if cfg!(target_arch = "aarch64") => Some(RelocKind::GlobDat),
            R_AARCH64_ABS64 if cfg!(target_arch = "aarch64") => Some(RelocKind::Abs64),
            _ => None,
        }
    }

    /// The ELF name, as `readelf -r` prints it (without the machine prefix).
    pub const fn name(self) -> &'static str {
        match self {
            RelocKind::JumpSlot => "JUMP_SLOT",
            RelocKind::GlobDat => "GLOB_DAT",
            RelocKind::Abs64 => "ABS64",
        }
    }
}

impl fmt::Display for RelocKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One slot of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Absolute address of the 8-byte slot.
    pub address: usize,
    pub kind: RelocKind,
    /// For an undefined symbol with a nonzero value (a non-PIE executable's canonical PLT entry
    /// for an address-taken function): that absolute address. Other objects' slots bound to it
    /// reach the function through this executable's own slot.
    pub canonical_plt: Option<usize>,
}

/// One indexed slot with its symbol name and version, as (offset, length) in the arena.
#[derive(Debug, Clone, Copy)]
struct NamedSlot {
    name: (u32, u32),
    version: Option<(u32, u32)>,
    /// The name's GNU hash.
    hash: u32,
    slot: Slot,
}

/// Symbol name → slots, for one object. Names are copied into one arena, so the index stays
/// readable even if the object is unloaded later (it is then simply stale).
pub struct ObjectIndex {
    pub object: Arc<LoadedObject>,
    /// Constructors ran before anyone could patch this object (if it was loaded late).
    pub has_constructors: bool,
    /// Which wanted names it may define.
    defines: NameFilter,
    /// Relocations of wanted symbols that the loader wrote into the object's code
    /// (`DT_TEXTREL`). Code is never made writable, so calls made through them are not seen.
    pub text_references: usize,
    /// See [`ObjectIndex::lazy_resolver_word`].
    resolver_word: Option<usize>,
    entries: Vec<NamedSlot>,
    arena: Vec<u8>,
}

impl fmt::Debug for ObjectIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectIndex")
            .field("object", &self.object.display_name())
            .field("slots", &self.entries.len())
            .finish()
    }
}

/// Storage object indexes are built in. One room serves many objects in turn: each object's
/// entries and names are appended (its [`Indexed`] part says where), and
/// [`ObjectIndex::from_room`] copies them out afterwards. A [`IndexRoom::fixed`] room never
/// grows (see `room.rs`): it is used inside walks of the loader's list.
pub struct IndexRoom {
    entries: Vec<NamedSlot>,
    arena: Vec<u8>,
    /// Scratch of the object being indexed: its version names (index, string offset) and the
    /// symbol indexes of the wanted names (with each name's position among them).
    versions: Vec<(u16, u32)>,
    indexes: Vec<(u32, u32)>,
    fixed: bool,
    /// A fixed room's mappings query, opened with the room: readers inside a walk of the
    /// loader's list must not open one (see [`MapsQuery::share`]). `None` in a fixed room: the
    /// kernel cannot answer, the declared segments count.
    maps: Option<MapsQuery>,
}

/// Version records kept per object in a fixed room (real objects have a few dozen).
const ROOM_VERSIONS: usize = 1024;

impl IndexRoom {
    /// A room that grows as needed (ordinary code).
    pub const fn growable() -> IndexRoom {
        IndexRoom {
            entries: Vec::new(),
            arena: Vec::new(),
            versions: Vec::new(),
            indexes: Vec::new(),
            fixed: false,
            maps: None,
        }
    }

    /// A room that never grows: `entries` slots and `arena` bytes of names in all, for a set of
    /// `wanted` names. Everything a reader of objects needs inside a walk of the loader's list
    /// is reserved here, before the walk: the storage, and the mappings query.
    pub fn fixed(entries: usize, arena: usize, wanted: usize) -> IndexRoom {
        IndexRoom {
            entries: Vec::with_capacity(entries),
            arena: Vec::with_capacity(arena),
            versions: Vec::with_capacity(ROOM_VERSIONS),
            // A name may be defined under several versions.
            indexes: Vec::with_capacity(wanted * 4 + 64),
            fixed: true,
            maps: MapsQuery::open(),
        }
    }

    /// A view of `object`'s memory for reading it into this room: in a fixed room, through the
    /// room's query (nothing is opened, no thread-local touched); else a query opened now.
    pub(crate) fn image<'o>(&self, object: &'o LoadedObject) -> Image<'o> {
        if self.fixed {
            Image::asking(object, self.maps.as_ref().map(MapsQuery::share))
        } else {
            Image::new(object)
        }
    }

    /// A few names `object` exports, to `found` until it returns false (see
    /// `symbols::exported_names`), read as [`IndexRoom::image`] reads.
    pub(crate) fn exported_names(
        &self,
        object: &LoadedObject,
        found: &mut dyn FnMut(&[u8]) -> bool,
    ) {
        super::symbols::exported_names(&self.image(object), found)
    }

    /// Nothing indexed into it yet (or since [`IndexRoom::clear`]).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.arena.is_empty()
    }

    /// Forget every part, keeping the reserved storage.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.arena.clear();
    }
}

/// One object's part of an [`IndexRoom`].
#[derive(Debug, Clone)]
pub struct Indexed {
    has_constructors: bool,
    resolver_word: Option<usize>,
    defines: NameFilter,
    text_references: usize,
    entries: std::ops::Range<usize>,
    arena: std::ops::Range<usize>,
}

/// Why an object was not indexed into a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexFailure {
    /// A fixed room had no space left; nothing of the object was kept.
    Full,
    /// Its dynamic section cannot be read.
    Bad(BadTables),
}

impl From<Full> for IndexFailure {
    fn from(_: Full) -> IndexFailure {
        IndexFailure::Full
    }
}

impl ObjectIndex {
    /// Read the object's relocation tables and index every hookable slot of a symbol named in
    /// `wanted` (sorted; `None`: every symbol).
    pub fn build(object: Arc<LoadedObject>, wanted: Option<&[Vec<u8>]>) -> Result<ObjectIndex> {
        let wanted = wanted.map(WantedNames::of);
        ObjectIndex::build_in(object, wanted.as_ref(), &mut IndexRoom::growable())
    }

    /// [`ObjectIndex::build`] in a growable room kept by the caller and emptied first: one
    /// object after another, the room's storage is reused instead of grown from nothing.
    pub fn build_in(
        object: Arc<LoadedObject>,
        wanted: Option<&WantedNames>,
        room: &mut IndexRoom,
    ) -> Result<ObjectIndex> {
        room.clear();
        match ObjectIndex::index_into(&object, wanted, room) {
            Ok(part) => Ok(ObjectIndex::from_room(object, room, &part)),
            Err(e) => Err(e.into_error(&object)),
        }
    }

    /// Index `object` into `room` (see [`ObjectIndex::build`]); allocates nothing when the room
    /// is fixed. Big objects have hundreds of thousands of relocations: the wanted names are
    /// first turned into symbol indexes through the object's hash table, so most relocations
    /// cost an integer comparison, not a string read, and an object that imports none of them
    /// is not scanned at all. On `Full` the room is left as it was.
    pub fn index_into(
        object: &LoadedObject,
        wanted: Option<&WantedNames>,
        room: &mut IndexRoom,
    ) -> std::result::Result<Indexed, IndexFailure> {
        let mark = (room.entries.len(), room.arena.len());
        let result = index_tables(object, wanted, room);
        if result.is_err() {
            room.entries.truncate(mark.0);
            room.arena.truncate(mark.1);
        }
        let mut part = result?;
        part.entries.start = mark.0;
        part.arena.start = mark.1;
        // Sorted by name, then address, in place (an unstable sort needs no buffer).
        let (entries, arena) = (&mut room.entries[part.entries.clone()], &room.arena);
        entries.sort_unstable_by(|a, b| {
            name_of(arena, a.name)
                .cmp(name_of(arena, b.name))
                .then(a.slot.address.cmp(&b.slot.address))
        });
        Ok(part)
    }

    /// The index of `object` from its part of `room`.
    pub fn from_room(object: Arc<LoadedObject>, room: &IndexRoom, part: &Indexed) -> ObjectIndex {
        let shift = part.arena.start as u32;
        let rebase = |(off, len): (u32, u32)| (off - shift, len);
        let arena = room.arena[part.arena.clone()].to_vec();
        let mut entries: Vec<NamedSlot> = room.entries[part.entries.clone()]
            .iter()
            .map(|e| NamedSlot {
                name: rebase(e.name),
                version: e.version.map(rebase),
                hash: e.hash,
                slot: e.slot,
            })
            .collect();
        // DT_RELA may cover DT_JMPREL on some linkers: keep each slot once, as a `JUMP_SLOT`
        // if either listing says so (only those are bound lazily: see the patch's recheck).
        entries.dedup_by(|later, kept| {
            let same = later.slot.address == kept.slot.address;
            if same && later.slot.kind == RelocKind::JumpSlot {
                kept.slot.kind = RelocKind::JumpSlot;
            }
            same
        });
        ObjectIndex {
            object,
            has_constructors: part.has_constructors,
            defines: part.defines,
            text_references: part.text_references,
            resolver_word: part.resolver_word,
            entries,
            arena,
        }
    }

    /// The address of the word (the third of the PLT's GOT) where glibc's loader puts its
    /// lazy-binding resolver when it binds the object's `JUMP_SLOT`s lazily, on x86-64 and
    /// aarch64 alike. Zero there means the loader bound every slot at load time (`RTLD_NOW`,
    /// `DF_BIND_NOW`, `LD_BIND_NOW`): no thread can be inside the resolver for one of them.
    /// `None` when the object has no such word inside it, or it was not readable when the
    /// object was indexed; then assume lazy binding. Its page was confirmed readable then.
    pub fn lazy_resolver_word(&self) -> Option<usize> {
        self.resolver_word
    }

    /// Every slot of `symbol`; with `version`, only imports of exactly that version.
    pub fn slots<'s>(
        &'s self,
        symbol: &'s str,
        version: Option<&'s str>,
    ) -> impl Iterator<Item = Slot> + 's {
        let key = symbol.as_bytes();
        let start = self
            .entries
            .partition_point(|e| name_of(&self.arena, e.name) < key);
        self.entries[start..]
            .iter()
            .take_while(move |e| name_of(&self.arena, e.name) == key)
            .filter(move |e| match version {
                None => true,
                Some(v) => e.version.map(|r| name_of(&self.arena, r)) == Some(v.as_bytes()),
            })
            .map(|e| e.slot)
    }

    /// Every slot with its name's GNU hash, name and import version (if versioned), in name
    /// order: what a patch matches against its hooks.
    pub fn named_slots(&self) -> impl Iterator<Item = (u32, &[u8], Option<&[u8]>, Slot)> + '_ {
        self.entries.iter().map(|e| {
            (
                e.hash,
                name_of(&self.arena, e.name),
                e.version.map(|v| name_of(&self.arena, v)),
                e.slot,
            )
        })
    }

    /// The import version of the slot at `address`, if the object uses versioning.
    pub fn version_of(&self, address: usize) -> Option<&str> {
        let e = self.entries.iter().find(|e| e.slot.address == address)?;
        e.version
            .and_then(|v| std::str::from_utf8(name_of(&self.arena, v)).ok())
    }

    /// The object may define one of the wanted symbols (its scope can tell where a hooked
    /// function lives even when nothing imports it through a slot).
    pub fn defines_wanted(&self) -> bool {
        !self.defines.is_empty()
    }

    /// The wanted names the object may define (by GNU hash): a new object's patch looks for
    /// the originals of only those hooks.
    pub fn defines(&self) -> NameFilter {
        self.defines
    }

    /// Whether any slot is a non-PIE executable's canonical PLT import (see
    /// [`Slot::canonical_plt`]); almost always only the main program has them.
    pub fn has_canonical_plt(&self) -> bool {
        self.entries.iter().any(|e| e.slot.canonical_plt.is_some())
    }

    /// Number of hookable slots.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No hookable slot at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every (symbol, version, slot), in symbol order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<&str>, Slot)> + '_ {
        self.entries.iter().map(|e| {
            let name = std::str::from_utf8(name_of(&self.arena, e.name)).unwrap_or("?");
            let ver = e
                .version
                .and_then(|v| std::str::from_utf8(name_of(&self.arena, v)).ok());
            (name, ver, e.slot)
        })
    }
}

impl IndexFailure {
    /// The crate error for `object`, which could not be indexed.
    pub fn into_error(self, object: &LoadedObject) -> crate::Error {
        crate::Error::BadObject {
            object: object.display_name().to_owned(),
            reason: match self {
                IndexFailure::Bad(BadTables(reason)) => reason,
                IndexFailure::Full => "too many slots to index",
            },
        }
    }
}

/// A set of names as a 64-bit filter keyed by their GNU hash ([`gnu_hash`](super::gnu_hash)):
/// a name not in the set is usually turned away by one bit test; one in it, always let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameFilter(u64);

impl NameFilter {
    pub const EMPTY: NameFilter = NameFilter(0);
    /// Lets every name through (what is not known is not excluded).
    pub const ALL: NameFilter = NameFilter(u64::MAX);

    /// The set of the one name with this hash.
    pub fn of(hash: u32) -> NameFilter {
        NameFilter(1 << (hash % 64))
    }

    /// Whether a name with this hash may be in the set.
    pub fn may_hold(self, hash: u32) -> bool {
        self.0 & NameFilter::of(hash).0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for NameFilter {
    type Output = NameFilter;
    fn bitor(self, other: NameFilter) -> NameFilter {
        NameFilter(self.0 | other.0)
    }
}

fn name_of(arena: &[u8], (off, len): (u32, u32)) -> &[u8] {
    &arena[off as usize..(off + len) as usize]
}

#[cfg(test)]
mod tests;
