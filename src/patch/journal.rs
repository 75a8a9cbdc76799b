//! What was written where, so that every slot can be put back.
//!
//! Kept in patch order, with indexes so that the questions asked on every `dlopen` and
//! `dlclose` ("is this slot patched?", "is this hook live anywhere?", "drop this object's
//! entries") cost O(1) or O(log n) per entry concerned, never O(all entries).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
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
    /// Sequence number (patch order) → entry.
    entries: BTreeMap<u64, JournalEntry>,
    next: u64,
    /// (set, slot address) → sequence number.
    by_slot: Option<HashMap<(u64, usize), u64>>,
    /// Object (its `Arc` address) → sequence numbers of its entries.
    by_object: Option<HashMap<usize, Vec<u64>>>,
    /// set → symbol → number of live entries.
    by_symbol: Option<HashMap<u64, HashMap<Arc<str>, usize>>>,
}

fn object_key(o: &Arc<LoadedObject>) -> usize {
    Arc::as_ptr(o) as usize
}

impl Journal {
    pub const fn new() -> Journal {
        Journal {
            entries: BTreeMap::new(),
            next: 0,
            by_slot: None,
            by_object: None,
            by_symbol: None,
        }
    }

    pub fn record(&mut self, e: JournalEntry) {
        let seq = self.next;
        self.next += 1;
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
            .entry(e.set_id)
            .or_default()
            .entry(e.symbol.clone())
            .or_default() += 1;
        self.entries.insert(seq, e);
    }

    /// Every live entry, in patch order.
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = &JournalEntry> + '_ {
        self.entries.values()
    }

    /// Number of live entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No live entry.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A position to pass to [`Journal::since`]: entries recorded after this call.
    pub fn mark(&self) -> u64 {
        self.next
    }

    /// Live entries recorded since `mark`.
    pub fn since(&self, mark: u64) -> impl Iterator<Item = &JournalEntry> + '_ {
        self.entries.range(mark..).map(|(_, e)| e)
    }

    fn remove_seq(&mut self, seq: u64) -> Option<JournalEntry> {
        let e = self.entries.remove(&seq)?;
        if let Some(m) = &mut self.by_slot {
            m.remove(&(e.set_id, e.address));
        }
        if let Some(m) = self.by_symbol.as_mut().and_then(|m| m.get_mut(&e.set_id)) {
            if let Some(n) = m.get_mut(&*e.symbol) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&*e.symbol);
                }
            }
        }
        Some(e)
    }

    /// Remove and return the entries of one hook set, newest first (undo order).
    pub fn take_set(&mut self, set_id: u64) -> Vec<JournalEntry> {
        let seqs: Vec<u64> = self
            .entries
            .iter()
            .rev()
            .filter(|(_, e)| e.set_id == set_id)
            .map(|(&s, _)| s)
            .collect();
        let taken: Vec<JournalEntry> = seqs
            .into_iter()
            .filter_map(|s| self.remove_seq(s))
            .collect();
        if let Some(m) = &mut self.by_object {
            for e in &taken {
                if let Some(v) = m.get_mut(&object_key(&e.object)) {
                    v.retain(|s| self.entries.contains_key(s));
                    if v.is_empty() {
                        m.remove(&object_key(&e.object));
                    }
                }
            }
        }
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
        seqs.into_iter().filter_map(|s| self.remove_seq(s)).count()
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
        for e in self.entries.values_mut() {
            if e.set_id == set_id && e.old == old {
                e.old = to;
                moved.push(e.address);
            }
        }
        moved
    }

    /// Whether any slot of `symbol` is patched by the given set.
    pub fn has_symbol(&self, set_id: u64, symbol: &str) -> bool {
        self.by_symbol
            .as_ref()
            .and_then(|m| m.get(&set_id))
            .is_some_and(|m| m.contains_key(symbol))
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

    fn entry(
        set_id: u64,
        object: &Arc<LoadedObject>,
        symbol: &str,
        address: usize,
    ) -> JournalEntry {
        JournalEntry {
            set_id,
            object: object.clone(),
            symbol: Arc::from(symbol),
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
        assert!(j.has_symbol(1, "f") && j.has_symbol(2, "g") && !j.has_symbol(1, "g"));

        assert_eq!(j.forget_object(&b), 50);
        assert_eq!(j.len(), 51);
        assert!(!j.contains(1, 8), "b's slot 8 is gone");
        assert!(j.contains(1, 16) && j.contains(2, 8));
        assert!(j.entries().all(|e| Arc::ptr_eq(&e.object, &a)));

        let mark = j.mark();
        j.record(entry(1, &b, "f", 8));
        assert_eq!(j.since(mark).count(), 1);

        let taken = j.take_set(1);
        assert_eq!(taken.len(), 51);
        assert!(Arc::ptr_eq(&taken[0].object, &b), "newest first");
        assert!(
            taken[1..].windows(2).all(|w| w[0].address > w[1].address),
            "undo order"
        );
        assert!(!j.has_symbol(1, "f"));
        assert_eq!(j.len(), 1);
        assert!(j.contains(2, 8));
        assert_eq!(j.forget_object(&a), 1);
        assert!(j.is_empty() && !j.has_symbol(2, "g"));
    }
}
