//! Installed hook sets: what object indexes must cover, adding a set, stacking sets on one
//! symbol and unstacking them in any order, and restoring a set's slots at uninstall.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use crate::elf::{self, LoadedObject};
use crate::patch::{ProtectionMap, SlotWrite};
use crate::Result;

use crate::hooks::batch::Batch;
use crate::hooks::diagnostics::{push_bounded, ForeignSlot};
use crate::hooks::set::{Hook, HookSet};

use super::{InstalledSet, State, UninstallReport};

impl State {
    /// Make object indexes cover the symbols of `set`; indexes built without them are dropped
    /// (and rebuilt by the next sync).
    pub(super) fn want(&mut self, set: &HookSet) {
        let mut grew = false;
        for h in set.hooks() {
            grew |= self.wanted.insert(h.symbol().as_bytes());
        }
        if grew {
            self.known = None;
            self.hiding = 0;
            self.by_link_map = None;
            self.canonical.clear();
        }
    }

    pub(super) fn add_set(&mut self, set: HookSet) -> u64 {
        self.dirty = true;
        let id = self.next_id;
        self.next_id += 1;
        self.sets.push(InstalledSet { id, set, refs: 1 });
        id
    }

    /// The replacement at the top of the stack of installed hooks on `symbol` that starts at
    /// `definition`: each set installed later on the same symbol calls the one below it.
    pub(super) fn top_of_stack(&self, set_id: u64, hook: &Hook, definition: usize) -> usize {
        let mut top = definition;
        // Each step moves to another set; a chain cannot be longer than the set list.
        for _ in 0..self.sets.len() {
            let above = self.sets.iter().filter(|s| s.id != set_id).find_map(|s| {
                s.set
                    .hooks
                    .iter()
                    .find(|h| {
                        h.symbol() == hook.symbol()
                            && h.version() == hook.version()
                            && h.original.get() == top
                            && top != 0
                            && self.journal.has_symbol(s.id, h.shared_symbol())
                    })
                    .map(|h| h.replacement)
            });
            match above {
                Some(r) if r != top => top = r,
                _ => break,
            }
        }
        top
    }

    /// Take a leaving set out of the stacks it is part of: a set above it (whose hooks call
    /// this set's replacement) now calls what this set called, and its slots written over this
    /// set's replacement put that back at uninstall. Those slots are handed over (never
    /// restored by this set, which would find them changed and report them foreign).
    pub(super) fn unstack(&mut self, set_id: u64, leaving: &HookSet) {
        let mut handed_over = HashSet::default();
        for h in leaving.hooks.iter() {
            let below = h.original.get();
            if h.replacement == 0 || below == 0 {
                continue;
            }
            for s in &self.sets {
                for above in s.set.hooks.iter() {
                    if above.symbol() == h.symbol()
                        && above.version() == h.version()
                        && above.original.get() == h.replacement
                    {
                        above.original.set(below);
                        self.dirty = true;
                        handed_over.extend(self.journal.reroute(s.id, h.replacement, below));
                    }
                }
            }
        }
        if !handed_over.is_empty() {
            for e in self.journal.take_set(set_id) {
                if !handed_over.contains(&e.address) {
                    self.journal.record(e);
                }
            }
        }
    }

    /// Put back every slot journaled for `set_id` (compare-and-swap), in objects still loaded.
    /// The objects are touched as a patch touches them (`Batch::write`): from inside one walk
    /// of the loader's list, and pinned by name only when the walk cannot vouch for them;
    /// pinning each by name would make glibc compare its name with every loaded object, O(N²)
    /// for an uninstall from N objects.
    pub(super) fn restore(&mut self, set_id: u64) -> Result<UninstallReport> {
        self.dirty = true;
        let entries = self.journal.take_set(set_id);
        let snap = elf::snapshot();
        let loaded: HashSet<(usize, &str)> = snap
            .objects
            .iter()
            .map(|o| (o.base, o.name.as_str()))
            .collect();
        let mut report = UninstallReport::default();
        // Each loaded object once (entries share their object's `Arc`), and each entry's write:
        // (object, address, expected: our replacement, new: what the slot held before).
        let mut objects: Vec<Arc<LoadedObject>> = Vec::new();
        let mut position: HashMap<usize, usize> = HashMap::default();
        let mut writable = Vec::with_capacity(entries.len());
        let mut writes = Vec::with_capacity(entries.len());
        for e in entries {
            if !loaded.contains(&(e.object.base, e.object.name.as_str())) {
                report.gone += 1;
                continue;
            }
            let i = *position
                .entry(Arc::as_ptr(&e.object) as usize)
                .or_insert_with(|| {
                    objects.push(e.object.clone());
                    objects.len() - 1
                });
            writes.push((i, e.address, e.new, e.old));
            writable.push(e);
        }
        let maps = match ProtectionMap::for_addresses(writable.iter().map(|e| e.address)) {
            Ok(m) => m,
            Err(e) => {
                // Nothing was written: keep the entries, so a later uninstall can retry.
                for entry in writable {
                    self.journal.record(entry);
                }
                return Err(e);
            }
        };
        let batch = Batch::listed(objects, snap.counters.subs);
        // Journal entries may be stale (an object replaced at the same address and path since
        // it was patched): each page is confirmed readable before its slots are read.
        let outcomes = batch.write(&maps, &writes, true);
        for (e, outcome) in writable.into_iter().zip(outcomes) {
            let name = e.object.display_name();
            match outcome {
                // Unloaded since the snapshot, or it could not be pinned.
                None => report.gone += 1,
                // One slot failing must not strand the others: report it and go on.
                Some(Err(f)) => {
                    push_bounded(
                        &mut self.diag.unreadable,
                        f.into_error(name, e.address).to_string(),
                    );
                    report.failed += 1;
                }
                Some(Ok((found, restored))) => {
                    if let Err(left) = restored {
                        left.log(name, e.address);
                    }
                    match found {
                        SlotWrite::Written { .. } => report.restored += 1,
                        SlotWrite::Mismatch { actual } => {
                            let f = ForeignSlot {
                                object: name.to_owned(),
                                symbol: e.symbol.to_string(),
                                address: e.address,
                                found: actual,
                                ours: e.new,
                            };
                            push_bounded(&mut self.diag.foreign, f.clone());
                            report.foreign.push(f);
                        }
                    }
                }
            }
        }
        Ok(report)
    }
}
