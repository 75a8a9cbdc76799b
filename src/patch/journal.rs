//! What was written where, so that every slot can be put back.

use std::sync::Arc;

use region::Protection;

use crate::elf::{LoadedObject, RelocKind};

/// One patched slot.
#[derive(Debug, Clone)]
pub struct JournalEntry {
    /// Which installed hook set wrote it.
    pub set_id: u64,
    pub object: Arc<LoadedObject>,
    pub symbol: Arc<str>,
    pub address: usize,
    pub kind: RelocKind,
    /// The value before we wrote (a lazy PLT stub, or the bound function).
    pub old: usize,
    /// What we wrote (the replacement).
    pub new: usize,
    /// The page's protection when we wrote (and after, since we restore it).
    pub protection: Protection,
}

/// All live patches, in the order they were made.
#[derive(Debug, Default)]
pub struct Journal {
    entries: Vec<JournalEntry>,
}

impl Journal {
    pub const fn new() -> Journal {
        Journal {
            entries: Vec::new(),
        }
    }

    pub fn record(&mut self, e: JournalEntry) {
        self.entries.push(e);
    }

    pub fn entries(&self) -> &[JournalEntry] {
        &self.entries
    }

    /// Remove and return the entries of one hook set, newest first (undo order).
    pub fn take_set(&mut self, set_id: u64) -> Vec<JournalEntry> {
        let (mut taken, kept): (Vec<_>, Vec<_>) =
            self.entries.drain(..).partition(|e| e.set_id == set_id);
        self.entries = kept;
        taken.reverse();
        taken
    }

    /// Forget entries of objects that are no longer loaded (never write to them again).
    pub fn forget_objects(&mut self, gone: impl Fn(&LoadedObject) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| !gone(&e.object));
        before - self.entries.len()
    }

    /// Whether `address` is already patched by the given set.
    pub fn contains(&self, set_id: u64, address: usize) -> bool {
        self.entries
            .iter()
            .any(|e| e.set_id == set_id && e.address == address)
    }
}
