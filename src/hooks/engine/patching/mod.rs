//! Patching: resolving each hook's original in the object's scope, planning every slot write
//! before any is made, writing them (compare-and-write, through walks of the loader's list) and
//! rechecking slots a lazy-binding resolver may have raced.
//!
//! A batch is patched in phases ([`State::patch_batch`]): `matching.rs` finds every hook's
//! slots in the batch and the hooks with work there; `plan.rs` reads the slots' values and
//! plans each write (resolving originals, stacking, chaining, conflicts); `write.rs` writes
//! the plans and rechecks the slots a lazy-binding resolver may have raced.

mod matching;
mod plan;
mod write;

use std::sync::Arc;

use region::Protection;

use crate::elf::{LoadedObject, NameFilter, ObjectIndex, Slot};
use crate::patch::JournalEntry;

use crate::hooks::batch::{few, Batch};
use crate::hooks::diagnostics::push_name_counted;
use crate::hooks::resolver::matters;
use crate::hooks::set::Hook;

use super::State;
use matching::Hits;

/// An installed set as a patch takes it (shared): its id, hooks, their names' hashes in hook
/// order, and (hash, hook position) sorted by hash.
type SetHooks = (u64, Arc<[Hook]>, Arc<[u32]>, Arc<[(u32, u32)]>);

/// One slot write decided before any write is made.
#[derive(Clone, Copy)]
pub(super) struct Plan<'h> {
    pub set_id: u64,
    /// Position of the object in its batch.
    pub object: usize,
    pub hook: &'h Hook,
    pub slot: Slot,
    pub expected: usize,
    pub original: usize,
    /// What the slot gets: the hook's replacement, or one of its chains (`original` is then
    /// that chain's).
    pub replacement: usize,
}

impl Plan<'_> {
    /// The journal entry of this plan's write into `object`, made over `old` on a page of
    /// `protection`.
    pub fn entry(
        &self,
        object: &Arc<LoadedObject>,
        old: usize,
        protection: Protection,
    ) -> JournalEntry {
        JournalEntry {
            set_id: self.set_id,
            object: object.clone(),
            symbol: self.hook.shared_symbol().clone(),
            address: self.slot.address,
            kind: self.slot.kind,
            old,
            new: self.replacement,
            protection,
        }
    }
}

impl State {
    /// The objects that matter to a patch (those with slots, and those that may define a
    /// hooked function: their scope is searched for originals), as a batch touched through
    /// walks of the loader's list (see `batch.rs`).
    fn batch(&self, objects: &[Arc<ObjectIndex>]) -> Batch {
        let objects = objects.iter().filter(|i| matters(i)).cloned().collect();
        Batch::listed(objects, self.last_counters.subs)
    }

    /// Patch objects that appeared since the last sync with every installed set, and note those
    /// whose constructors already ran unhooked. `complete`: the batch holds every object loaded
    /// since the last sync that may matter (none was left unread). Then, unless a loaded object
    /// hides what it defines (excluded, unreadable), a missing original can only come from
    /// the batch, and only the hooks the batch may define are looked for.
    pub(super) fn patch_new(&mut self, mut batch: Batch, complete: bool) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let mark = self.journal.mark();
        let patched = self.patch_batch_new(&mut batch, complete);
        self.note_late_constructors(&batch.objects, mark);
        patched
    }

    /// Note the new objects whose constructors ran before they were patched (patched since
    /// `mark`; asked per object: a batch of many is not compared entry by entry with every one
    /// of them).
    pub(super) fn note_late_constructors(&mut self, objects: &[Arc<ObjectIndex>], mark: u64) {
        let diag = &mut self.diag;
        for n in objects.iter().filter(|n| n.has_constructors) {
            if self.journal.has_entries_since(&n.object, mark) {
                push_name_counted(
                    &mut diag.constructors_before_patch,
                    &mut diag.constructors_before_patch_total,
                    n.object.display_name(),
                );
            }
        }
    }

    /// [`State::patch_new`] without the note on constructors (its caller makes it).
    pub(super) fn patch_batch_new(&mut self, batch: &mut Batch, complete: bool) -> usize {
        let complete = complete && self.hiding == 0;
        let ids = few(self.sets.iter().map(|s| s.id));
        self.patch_batch(&ids, batch, complete)
    }

    /// Apply the given sets to the given objects. Errors on single slots are recorded in the
    /// diagnostics and do not stop the other slots.
    pub(super) fn patch(&mut self, set_ids: &[u64], objects: &[Arc<ObjectIndex>]) -> usize {
        if objects.is_empty() || set_ids.is_empty() {
            return 0;
        }
        let mut batch = self.batch(objects);
        self.patch_batch(set_ids, &mut batch, false)
    }

    /// Apply the given sets to `batch`. `new_objects`: the batch holds every object loaded since
    /// the last sync and nothing else (so a hook whose original was not found before can only
    /// find it in one of them).
    fn patch_batch(&mut self, set_ids: &[u64], batch: &mut Batch, new_objects: bool) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let sets = self.set_hooks(set_ids);
        // What the batch's objects may define, by name hash: a new object can only provide
        // the originals it may define.
        let defines = batch
            .objects
            .iter()
            .fold(NameFilter::EMPTY, |d, o| d | o.defines());
        let hits = Hits::find(&sets, batch);
        // When the new objects define no wanted name, only hooks with slots here have anything
        // to do (no original can come from them).
        let groups = hits.groups(new_objects && defines.is_empty());
        let (work, found) = hits.work(&sets, groups, new_objects, defines);
        let Some(read) = self.read_slots(batch, &found) else {
            return 0;
        };
        let plans = self.plan(work, &found, &read.values, batch);
        self.write(&plans, batch, &read.maps, &read.bound_at_load)
    }
}
