//! What was written where, so that every slot can be put back.
//!
//! Kept in patch order, with indexes so that the questions asked on every `dlopen` and
//! `dlclose` ("is this slot patched?", "is this hook live anywhere?", "drop this object's
//! entries") cost O(1) per entry concerned, never O(all entries). Entries live in one list in
//! patch order; a removed one leaves a hole until the holes are the majority (then the list
//! is compacted and the indexes rebuilt), and holes at the end are dropped at once: a plugin
//! opened and closed again leaves nothing behind.

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
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
    /// Entries in patch order; `None`: removed. Entry `i` has sequence number `base + i`.
    entries: Vec<Option<JournalEntry>>,
    base: u64,
    /// Entries that are `Some`.
    live: usize,
    /// (set, slot address) → sequence number.
    by_slot: Option<HashMap<(u64, usize), u64>>,
    /// Object (its `Arc` address) → sequence numbers of its entries (a handful: inline).
    by_object: Option<HashMap<usize, SmallVec<[u64; 4]>>>,
    /// (set, symbol) → number of live entries. The symbol is keyed by its shared name's
    /// address: every entry of a hook shares that hook's `Arc`, so the key is exact and costs
    /// no string hashing (set ids are never reused, so a freed name's address cannot alias).
    by_symbol: Option<HashMap<(u64, usize), usize>>,
}

fn object_key(o: &Arc<LoadedObject>) -> usize {
    Arc::as_ptr(o) as usize
}

fn symbol_key(set_id: u64, symbol: &Arc<str>) -> (u64, usize) {
    (set_id, Arc::as_ptr(symbol).cast::<u8>() as usize)
}

/// Lists shorter than this are never compacted (holes cost nothing there).
const COMPACT_FROM: usize = 64;

impl Journal {
    pub const fn new() -> Journal {
        Journal {
            entries: Vec::new(),
            base: 0,
            live: 0,
            by_slot: None,
            by_object: None,
            by_symbol: None,
        }
    }

    /// Make room for `more` entries at once (an install records thousands: growing the
    /// indexes step by step rehashes them again and again).
    pub fn reserve(&mut self, more: usize) {
        self.entries.reserve(more);
        self.by_slot
            .get_or_insert_with(HashMap::default)
            .reserve(more);
        self.by_object
            .get_or_insert_with(HashMap::default)
            .reserve(more);
    }

    pub fn record(&mut self, e: JournalEntry) {
        let seq = self.mark();
        self.index(seq, &e);
        self.entries.push(Some(e));
        self.live += 1;
    }

    /// Enter entry `seq` in the indexes.
    fn index(&mut self, seq: u64, e: &JournalEntry) {
        self.by_slot
            .get_or_insert_with(HashMap::default)
            .insert((e.set_id, e.address), seq);
        self.by_object
            .get_or_insert_with(HashMap::default)
            .entry(object_key(&e.object))
            .or_default()
            .push(seq);
        *self
            .by_symbol
            .get_or_insert_with(HashMap::default)
            .entry(symbol_key(e.set_id, &e.symbol))
            .or_default() += 1;
    }

    /// Every live entry, in patch order.
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = &JournalEntry> + '_ {
        self.entries.iter().flatten()
    }

    /// Number of live entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }

    /// No live entry.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// A position to pass to [`Journal::has_entries_since`]: entries recorded after this call.
    /// Only for an operation that removes nothing in between: a removal drops trailing holes
    /// (later records then reuse their numbers, which an older mark would miss) or compacts the
    /// journal (renumbering everything).
    pub fn mark(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    /// Whether `object` has a live entry recorded since `mark` (see [`Journal::mark`]).
    pub fn has_entries_since(&self, object: &Arc<LoadedObject>, mark: u64) -> bool {
        debug_assert!(mark <= self.mark(), "a mark from before a removal");
        self.by_object
            .as_ref()
            .and_then(|m| m.get(&object_key(object)))
            .is_some_and(|seqs| seqs.iter().any(|&s| s >= mark))
    }

    fn remove_seq(&mut self, seq: u64) -> Option<JournalEntry> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        let e = self.entries.get_mut(i)?.take()?;
        self.live -= 1;
        if let Some(m) = &mut self.by_slot {
            m.remove(&(e.set_id, e.address));
        }
        if let Some(m) = &mut self.by_symbol {
            let key = symbol_key(e.set_id, &e.symbol);
            if let Some(n) = m.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&key);
                }
            }
        }
        Some(e)
    }

    /// Drop the holes at the end; compact when holes are the majority of a long list (the
    /// sequence numbers change then, so the indexes are rebuilt: O(live), once per as many
    /// removals).
    fn tidy(&mut self) {
        while matches!(self.entries.last(), Some(None)) {
            self.entries.pop();
        }
        if self.entries.len() < COMPACT_FROM || self.live * 2 >= self.entries.len() {
            return;
        }
        self.base += self.entries.len() as u64;
        let kept: Vec<JournalEntry> = std::mem::take(&mut self.entries)
            .into_iter()
            .flatten()
            .collect();
        self.by_slot = None;
        self.by_object = None;
        self.by_symbol = None;
        self.live = 0;
        for e in kept {
            self.record(e);
        }
    }

    /// Remove and return the entries of one hook set, newest first (undo order).
    pub fn take_set(&mut self, set_id: u64) -> Vec<JournalEntry> {
        let base = self.base;
        let seqs: Vec<u64> = self
            .entries
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| e.as_ref().is_some_and(|e| e.set_id == set_id))
            .map(|(i, _)| base + i as u64)
            .collect();
        let taken: Vec<JournalEntry> = seqs
            .into_iter()
            .filter_map(|s| self.remove_seq(s))
            .collect();
        if let Some(m) = &mut self.by_object {
            for e in &taken {
                let key = object_key(&e.object);
                if let Some(v) = m.get_mut(&key) {
                    let (entries, base) = (&self.entries, self.base);
                    v.retain(|s| {
                        s.checked_sub(base)
                            .and_then(|i| entries.get(i as usize))
                            .is_some_and(Option::is_some)
                    });
                    if v.is_empty() {
                        m.remove(&key);
                    }
                }
            }
        }
        self.tidy();
        taken
    }

    /// Forget the entries of one object (it was unloaded: never write to it again). Returns
    /// how many there were.
    pub fn forget_object(&mut self, object: &Arc<LoadedObject>) -> usize {
        let seqs = self
            .by_object
            .as_mut()
            .and_then(|m| m.remove(&object_key(object)))
            .unwrap_or_default();
        let n = seqs.into_iter().filter_map(|s| self.remove_seq(s)).count();
        self.tidy();
        n
    }

    /// Whether `address` is already patched by the given set.
    pub fn contains(&self, set_id: u64, address: usize) -> bool {
        self.by_slot
            .as_ref()
            .is_some_and(|m| m.contains_key(&(set_id, address)))
    }

    /// The set's entries that were written over `old`: they get `to` as the value to put back
    /// (the set below them in a stack of hooks on one symbol left). Returns their addresses.
    pub fn reroute(&mut self, set_id: u64, old: usize, to: usize) -> Vec<usize> {
        let mut moved = Vec::new();
        for e in self.entries.iter_mut().flatten() {
            if e.set_id == set_id && e.old == old {
                e.old = to;
                moved.push(e.address);
            }
        }
        moved
    }

    /// Whether any slot of the hook whose shared name is `symbol` is patched by the given set
    /// (entries are counted by that name's `Arc`, as the hook made them).
    pub fn has_symbol(&self, set_id: u64, symbol: &Arc<str>) -> bool {
        self.by_symbol
            .as_ref()
            .is_some_and(|m| m.contains_key(&symbol_key(set_id, symbol)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> Arc<LoadedObject> {
        Arc::new(LoadedObject {
            base: 0x1000,
            name: name.to_owned(),
            phdrs: Vec::new(),
            position: 1,
        })
    }

    /// One shared name per symbol, as a hook shares its name with all its entries.
    fn name(symbol: &str) -> Arc<str> {
        thread_local! {
            static NAMES: std::cell::RefCell<HashMap<String, Arc<str>>> = Default::default();
        }
        NAMES.with(|n| {
            n.borrow_mut()
                .entry(symbol.to_owned())
                .or_insert_with(|| Arc::from(symbol))
                .clone()
        })
    }

    fn entry(
        set_id: u64,
        object: &Arc<LoadedObject>,
        symbol: &str,
        address: usize,
    ) -> JournalEntry {
        JournalEntry {
            set_id,
            object: object.clone(),
            symbol: name(symbol),
            address,
            kind: RelocKind::JumpSlot,
            old: 1,
            new: 2,
            protection: Protection::READ_WRITE,
        }
    }

    #[test]
    fn indexes_follow_records_and_removals() {
        let (a, b) = (object("a"), object("b"));
        let mut j = Journal::new();
        for i in 0..100 {
            j.record(entry(1, if i % 2 == 0 { &a } else { &b }, "f", 8 * i));
        }
        j.record(entry(2, &a, "g", 8));
        assert_eq!(j.len(), 101);
        assert!(j.contains(1, 8) && j.contains(2, 8) && !j.contains(2, 16));
        assert!(
            j.has_symbol(1, &name("f"))
                && j.has_symbol(2, &name("g"))
                && !j.has_symbol(1, &name("g"))
        );

        assert_eq!(j.forget_object(&b), 50);
        assert_eq!(j.len(), 51);
        assert!(!j.contains(1, 8), "b's slot 8 is gone");
        assert!(j.contains(1, 16) && j.contains(2, 8));
        assert!(j.entries().all(|e| Arc::ptr_eq(&e.object, &a)));

        let mark = j.mark();
        j.record(entry(1, &b, "f", 8));
        assert!(j.has_entries_since(&b, mark) && !j.has_entries_since(&a, mark));

        let taken = j.take_set(1);
        assert_eq!(taken.len(), 51);
        assert!(Arc::ptr_eq(&taken[0].object, &b), "newest first");
        assert!(
            taken[1..].windows(2).all(|w| w[0].address > w[1].address),
            "undo order"
        );
        assert!(!j.has_symbol(1, &name("f")));
        assert_eq!(j.len(), 1);
        assert!(j.contains(2, 8));
        assert_eq!(j.forget_object(&a), 1);
        assert!(j.is_empty() && !j.has_symbol(2, &name("g")));
    }
    /// A plugin opened and closed leaves no hole; a journal that lost most of its entries is
    /// compacted, and every question still gets the answer it got before.
    #[test]
    fn holes_are_dropped_or_compacted_without_changing_answers() {
        let (a, b, c) = (object("a"), object("b"), object("c"));
        let mut j = Journal::new();
        for i in 0..200 {
            j.record(entry(1, if i % 2 == 0 { &a } else { &b }, "f", 8 * i));
        }
        // Opened and closed again: its entries were the last, nothing stays behind.
        let before = j.entries.len();
        for i in 0..3 {
            j.record(entry(2, &c, "g", 0x10_000 + 8 * i));
        }
        assert_eq!(j.forget_object(&c), 3);
        assert_eq!(j.entries.len(), before, "trailing holes dropped");
        assert!(!j.has_symbol(2, &name("g")));

        // Half removed: kept as holes.
        assert_eq!(j.forget_object(&b), 100);
        assert_eq!(j.entries.len(), 199, "the last of b's entries was trailing");
        let mark = j.mark();
        for i in 0..10 {
            j.record(entry(3, &b, "h", 0x20_000 + 8 * i));
        }
        // Most removed: compacted, sequence numbers renumbered, indexes rebuilt.
        assert_eq!(j.forget_object(&a), 100);
        assert_eq!(j.entries.len(), 10, "compacted");
        assert_eq!(j.len(), 10);
        assert!(
            j.has_entries_since(&b, mark) && !j.has_entries_since(&a, mark),
            "a mark from before still works"
        );
        assert!(j.contains(3, 0x20_000) && !j.contains(1, 0));
        assert!(j.has_symbol(3, &name("h")) && !j.has_symbol(1, &name("f")));
        let order: Vec<usize> = j.entries().map(|e| e.address).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "patch order kept");
        let mark = j.mark();
        j.record(entry(3, &c, "h", 0x30_000));
        assert!(j.has_entries_since(&c, mark) && !j.has_entries_since(&b, mark));
        let taken = j.take_set(3);
        assert_eq!(taken.len(), 11);
        assert_eq!(taken[0].address, 0x30_000, "newest first");
        assert!(j.is_empty() && j.entries.is_empty());
        assert_eq!(j.forget_object(&b), 0, "b's index was emptied by take_set");
    }
}
