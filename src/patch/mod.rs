//! WRITE side of the engine: one slot at a time, with its page's protection handled, and a
//! journal of every write for uninstall.
//!
//! The rule that keeps this safe: a page that was read-only is made writable only for the one
//! atomic store and then gets its *original* protection back; an executable page is never made
//! writable; all writers are serialised by the engine's patch lock (see `hooks`).

mod journal;
mod slot;

pub use crate::elf::{letters, ProtectionMap};
pub use journal::{Journal, JournalEntry};
pub use slot::{
    compare_and_write, compare_and_write_raw, read_slot, LeftWritable, SlotWrite, WriteFailure,
};

#[cfg(test)]
mod tests;
