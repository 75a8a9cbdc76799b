//! READ side of the engine: which objects are loaded, and where their GOT slots are.
//!
//! Nothing here writes to memory or calls into the dynamic loader other than through
//! `dl_iterate_phdr`, so it can run while other threads load and call code.

mod dynamic;
mod image;
mod index;
mod loaded;
mod notes;
mod protection;
mod records;
mod room;
mod snapshot;
mod symbols;
mod versions;
mod wanted;

pub(crate) use crate::sys::maps::errno_of;
pub use dynamic::{absolute, BadTables, DynamicTables, RelocTable};
pub use image::{read_c_str, segments_contain};
pub use index::{IndexFailure, IndexRoom, Indexed, NameFilter, ObjectIndex, RelocKind, Slot};
pub use loaded::LoadedObject;
pub use notes::build_id;
pub use protection::{letters, CheckedSpan, ProtectionMap};
pub use room::Full;
pub use snapshot::{
    counters, listed_after, listing_unknown, snapshot, Listing, LoadCounters, Snapshot,
};
pub use symbols::{defines, defines_unversioned};
pub use wanted::{gnu_hash, WantedNames};
