//! WRITE side of the engine: slots written one page at a time, with the page's protection
//! handled, and a journal of every write for uninstall.
//!
//! The rule that keeps this safe: a page that was read-only is made writable only for the
//! atomic stores to its slots and then gets its *original* protection back; an executable page
//! is never made writable; all writers are serialised by the engine's patch lock (see `hooks`).

mod journal;
mod slot;

pub use crate::elf::{letters, ProtectionMap};
pub use journal::{Journal, JournalEntry};
#[cfg(test)]
use slot::compare_and_write;
pub(crate) use slot::page_start;
pub use slot::{
    compare_and_write_page, read_slot, read_slot_confirmed, LeftWritable, SlotWrite, WriteFailure,
};

#[cfg(test)]
mod tests;
