//! Installed hook sets: what object indexes must cover, adding a set, stacking sets on one
//! symbol and unstacking them in any order, and restoring a set's slots at uninstall.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use crate::elf::{self};
use crate::patch::{compare_and_write, ProtectionMap, SlotWrite};
use crate::Result;

use crate::hooks::diagnostics::{push_bounded, ForeignSlot};
use crate::hooks::loader::Pin;
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
                            && self.journal.has_symbol(s.id, h.symbol())
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
    pub(super) fn restore(&mut self, set_id: u64) -> Result<UninstallReport> {
        self.dirty = true;
        let entries = self.journal.take_set(set_id);
        let snap = elf::snapshot();
        let loaded: HashSet<(usize, &str)> = snap
            .objects
            .iter()
            .map(|o| (o.base, o.name.as_str()))
            .collect();
        // One pin per object (entries share their object's `Arc`); `None`: gone or unpinnable.
        let mut pins: HashMap<usize, Option<Pin>> = HashMap::default();
        let mut report = UninstallReport::default();
        let mut writable = Vec::new();
        for e in entries {
            let pinned = pins
                .entry(Arc::as_ptr(&e.object) as usize)
                .or_insert_with(|| {
                    if loaded.contains(&(e.object.base, e.object.name.as_str())) {
                        Pin::object(&e.object)
                    } else {
                        None
                    }
                })
                .is_some();
            if pinned {
                writable.push(e);
            } else {
                report.gone += 1;
            }
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
        for e in writable {
            // SAFETY: the object is pinned and the slot was an aligned GOT slot when we patched
            // it; we hold the patch lock.
            #[allow(unsafe_code)]
            let outcome = unsafe {
                compare_and_write(&maps, e.object.display_name(), e.address, e.new, e.old)
            };
            match outcome {
                // One slot failing must not strand the others: report it and go on.
                Err(err) => {
                    push_bounded(&mut self.diag.unreadable, err.to_string());
                    report.failed += 1;
                }
                Ok(SlotWrite::Written { .. }) => report.restored += 1,
                Ok(SlotWrite::Mismatch { actual }) => {
                    let f = ForeignSlot {
                        object: e.object.display_name().to_owned(),
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
        drop(pins);
        Ok(report)
    }
}
