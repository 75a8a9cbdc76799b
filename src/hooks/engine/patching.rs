//! Patching: resolving each hook's original in the object's scope, planning every slot write
//! before any is made, writing them (compare-and-write, through walks of the loader's list) and
//! rechecking slots a lazy-binding resolver may have raced.

use std::ops::Range;
use std::sync::Arc;

use region::Protection;

use crate::elf::{LoadedObject, NameFilter, ObjectIndex, RelocKind, Slot};
use crate::patch::{JournalEntry, ProtectionMap, SlotWrite};

use crate::hooks::batch::{few, group_by_key, Batch, Few, SlotValues};
use crate::hooks::diagnostics::{push_bounded, push_name_bounded, push_name_counted, Conflict};
use crate::hooks::resolver::{matters, Resolver};
use crate::hooks::set::{hooks_for_import, Hook};

use super::State;

/// An installed set as a patch takes it (shared): its id, hooks, their names' hashes in hook
/// order, and (hash, hook position) sorted by hash.
type SetHooks = (u64, Arc<[Hook]>, Arc<[u32]>, Arc<[(u32, u32)]>);

/// One slot write decided before any write is made.
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

    /// Patch objects that appeared since the last scan with every installed set, and note those
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
        let sets: Few<SetHooks> = set_ids
            .iter()
            .filter_map(|&id| {
                let s = self.sets.iter().find(|s| s.id == id)?;
                Some((
                    id,
                    s.set.hooks.clone(),
                    s.set.hashes.clone(),
                    s.set.by_hash.clone(),
                ))
            })
            .collect();
        // What the batch's objects may define, by name hash: a new object can only provide
        // the originals it may define.
        let defines = batch
            .objects
            .iter()
            .fold(NameFilter::EMPTY, |d, o| d | o.defines());
        // Every slot of every hook, found from the objects' side: each slot's name hash leads
        // to the hooks with that hash (a binary search per set), and only an equal name (and
        // version, for a versioned hook) counts. `hits`: (hook number across the sets, object,
        // slot), objects in order.
        let mut first_hook: Few<usize> = Few::new();
        let mut hooks_total = 0;
        for (_, hooks, _, _) in &sets {
            first_hook.push(hooks_total);
            hooks_total += hooks.len();
        }
        let mut hits: Few<(usize, usize, Slot)> = Few::new();
        // Every indexed slot names a hooked symbol: an upper bound for one set, reserved at
        // once (an install's thousands of hits would grow the list a dozen times).
        hits.reserve(batch.objects.iter().map(|o| o.len()).sum());
        for (i, idx) in batch.objects.iter().enumerate() {
            for (hash, name, version, slot) in idx.named_slots() {
                for (k, (_, hooks, _, by_hash)) in sets.iter().enumerate() {
                    for (j, _) in hooks_for_import(hooks, by_hash, (hash, name, version)) {
                        hits.push((first_hook[k] + j, i, slot));
                    }
                }
            }
        }
        // By hook, then object (the order the planning walks them in): many (an install) with
        // a counting sort by hook, which keeps the objects' order; a few with a sort.
        if hits.len() > 32 {
            let (_, order) = group_by_key(hits.iter().map(|h| h.0), hooks_total);
            hits = order.iter().map(|&k| hits[k]).collect();
        } else {
            hits.sort_unstable_by_key(|h| (h.0, h.1, h.2.address));
        }
        let group_end = |from: usize| {
            from + hits[from..]
                .iter()
                .take_while(|h| h.0 == hits[from].0)
                .count()
        };
        // The hooks to consider, with their range of `hits`: when the new objects define no
        // wanted name, only hooks with slots here have anything to do (no original can come
        // from them); otherwise every hook, in order.
        let mut groups: Few<(usize, Range<usize>)> = Few::new();
        let mut at = 0;
        if new_objects && defines.is_empty() {
            while at < hits.len() {
                let end = group_end(at);
                groups.push((hits[at].0, at..end));
                at = end;
            }
        } else {
            for g in 0..hooks_total {
                let end = if hits.get(at).is_some_and(|h| h.0 == g) {
                    group_end(at)
                } else {
                    at
                };
                groups.push((g, at..end));
                at = end;
            }
        }
        // Every hook with work here, and its slots: slots to write, or (none, and no original
        // yet) an original to look for: `work` holds (set id, hook, hash, its range of
        // `found`), `found` (object, slot).
        let mut work: Few<(u64, &Hook, u32, Range<usize>)> = Few::new();
        let mut found: Few<(usize, Slot)> = Few::new();
        found.reserve(hits.len());
        for (g, own) in groups {
            let k = first_hook.partition_point(|&f| f <= g) - 1;
            let (id, hooks, hashes, _) = &sets[k];
            let (hook, hash) = (&hooks[g - first_hook[k]], hashes[g - first_hook[k]]);
            // No slot of this hook here: all there is to do is find its original if it has
            // none. New objects can only provide one they define (each `dlsym` that fails
            // costs the loader ≈ 2,000 instructions).
            if own.is_empty()
                && (hook.original.get() != 0 || (new_objects && !defines.may_hold(hash)))
            {
                continue;
            }
            let start = found.len();
            for h in &hits[own] {
                found.push((h.1, h.2));
            }
            work.push((*id, hook, hash, start..found.len()));
        }
        // Every slot value the plans need, read in one pass (in `found`'s order), then the
        // lazy-resolver word of each object with a `JUMP_SLOT` to write (see `recheck`).
        let mut slots = few(found.iter().map(|f| (f.0, f.1.address)));
        let mut words: Few<(usize, usize)> = Few::new();
        let mut asked: Few<bool> = smallvec::smallvec![false; batch.objects.len()];
        for &(i, slot) in found.iter() {
            if slot.kind == RelocKind::JumpSlot && !asked[i] {
                asked[i] = true;
                if let Some(word) = batch.objects[i].lazy_resolver_word() {
                    words.push((i, word));
                }
            }
        }
        slots.extend_from_slice(&words);
        // One map of page protections for the reads and the writes: a page confirmed readable
        // before its slots are read is not asked about again to be written.
        let maps = match ProtectionMap::for_addresses(found.iter().map(|f| f.1.address)) {
            Ok(m) => m,
            Err(e) => {
                push_bounded(&mut self.diag.unreadable, e.to_string());
                return 0;
            }
        };
        let SlotValues {
            values,
            gone,
            refused,
        } = batch.read_values(&maps, &slots, found.len());
        for i in gone {
            push_name_bounded(
                &mut self.diag.unpinnable,
                batch.objects[i].object.display_name(),
            );
        }
        for (k, f) in refused {
            let (i, address) = slots[k];
            let name = batch.objects[i].object.display_name();
            push_bounded(
                &mut self.diag.unreadable,
                f.into_error(name, address).to_string(),
            );
        }
        // Objects whose loader bound every slot at load time.
        let mut bound_at_load: Few<bool> = smallvec::smallvec![false; batch.objects.len()];
        for (w, v) in words.iter().zip(&values[found.len()..]) {
            bound_at_load[w.0] = *v == Some(0);
        }
        let mut plans: Few<Plan> = Few::new();
        plans.reserve(found.len());
        // The hooks that planned writes so far, by name hash: a hook of another set on the same
        // symbol (a stack) is rare, and looking for one among thousands of plans for each of
        // ≈ 80 hooks was most of an install's string comparisons.
        let mut planned = NameFilter::EMPTY;
        for (id, hook, hash, own) in work {
            let before = plans.len();
            // A lower set of a stack planned this symbol's slots already.
            let stacked =
                planned.may_hold(hash) && plans.iter().any(|p| p.hook.symbol() == hook.symbol());
            let slots = (&found[own.clone()], &values[own]);
            self.plan_hook(id, hook, slots, batch, stacked, &mut plans);
            if plans.len() > before {
                planned = planned | NameFilter::of(hash);
            }
        }
        self.write(&plans, batch, &maps, &bound_at_load)
    }

    /// Plan the writes of one hook's slots (`found`: this hook's (object, slot), `values`: what
    /// each held when read, `None` if its object could not be read); `stacked`: a set below
    /// this one in a stack planned writes to this symbol's slots in this batch.
    fn plan_hook<'h>(
        &mut self,
        set_id: u64,
        hook: &'h Hook,
        (found, values): (&[(usize, Slot)], &[Option<usize>]),
        batch: &Batch,
        stacked: bool,
        plans: &mut Few<Plan<'h>>,
    ) {
        let symbol = hook.symbol();
        let resolver = Resolver::new(hook, batch, &self.canonical, self.known.as_ref());
        // While slots of this hook are patched, its published original is what they call: a
        // different definition found later (another copy of the library) must not replace it;
        // slots bound to that one are conflicts instead.
        let published = hook.original.get();
        let live = published != 0 && self.journal.has_symbol(set_id, hook.shared_symbol());
        let mut original = if live {
            published
        } else {
            resolver.definition(hook.version.as_deref(), None)
        };
        if original == 0 {
            // Not in the global scope (a library loaded RTLD_LOCAL): the scope of an object that
            // defines it knows it.
            original = resolver.in_definers(hook.version.as_deref());
        }
        if !live {
            // Another installed set already hooks this function: stack on top of it.
            original = self.top_of_stack(set_id, hook, original);
        }
        let first = plans.len();
        for (&(i, slot), &read) in found.iter().zip(values) {
            let idx = &batch.objects[i];
            if self.journal.contains(set_id, slot.address) {
                continue;
            }
            // A set below this one in a stack may be about to write this slot: it then holds
            // that set's replacement by the time this plan is written.
            let planned = if stacked {
                plans[..first]
                    .iter()
                    .rev()
                    .find(|p| p.slot.address == slot.address)
                    .map(|p| p.replacement)
            } else {
                None
            };
            let Some(value) = planned.or(read) else {
                continue;
            };
            if hook.leads_here(value) {
                continue;
            }
            let bound = resolver.binding(value, slot, idx, i);
            if original == 0 {
                original = bound;
            }
            // Bound to another definition (another interposer's, another version's): chained,
            // so that the slot's calls go on reaching what it held, unless that is a hook of
            // ours (a stack is planned above) or every chain calls something else already.
            let chained = (bound != original && bound != 0 && planned.is_none())
                .then(|| {
                    let ours = self
                        .sets
                        .iter()
                        .any(|s| s.set.hooks.iter().any(|h| h.leads_here(bound)));
                    (!ours).then(|| hook.chain_for(bound)).flatten()
                })
                .flatten();
            // What the slot gets, and what that calls: the hook and its original, or a chain
            // and what the slot held.
            let (calls, replacement) = match chained {
                Some(replacement) => {
                    self.dirty = true;
                    self.diag.chained_slots += 1;
                    (bound, replacement)
                }
                None if bound != original || bound == 0 => {
                    let c = Conflict {
                        object: idx.object.display_name().to_owned(),
                        symbol: symbol.to_owned(),
                        address: slot.address,
                        bound_to: bound,
                        original,
                    };
                    push_bounded(&mut self.diag.conflicts, c);
                    continue;
                }
                None => (original, hook.replacement),
            };
            plans.push(Plan {
                set_id,
                object: i,
                hook,
                slot,
                expected: value,
                original: calls,
                replacement,
            });
        }
        // Publish the original before any slot can route a call to the replacement.
        if original != 0
            && (plans[first..]
                .iter()
                .any(|p| p.replacement == hook.replacement)
                || hook.original.get() == 0)
            && hook.original.get() != original
        {
            hook.original.set(original);
            self.dirty = true;
        }
    }

    /// Write the plans' slots (`maps`: the protections their reads were confirmed with);
    /// `bound_at_load[i]`: object i has no lazy binding to race with.
    fn write(
        &mut self,
        plans: &[Plan],
        batch: &Batch,
        maps: &ProtectionMap,
        bound_at_load: &[bool],
    ) -> usize {
        if plans.len() > 8 {
            self.journal.reserve(plans.len());
        }
        let mut expected = few(plans.iter().map(|p| p.expected));
        let mut pending = few(0..plans.len());
        let mut fresh = Few::new();
        // One retry: a concurrent lazy-binding resolution may have just filled the slot.
        for attempt in 0..2 {
            let writes: Few<(usize, usize, usize, usize)> = few(pending.iter().map(|&k| {
                let p = &plans[k];
                (p.object, p.slot.address, expected[k], p.replacement)
            }));
            let outcomes = batch.write(maps, &writes, false);
            let mut retry = Few::new();
            for (&k, outcome) in pending.iter().zip(outcomes) {
                let p = &plans[k];
                let name = batch.objects[p.object].object.display_name();
                // A page left writable is reported whatever its slot's own swap found: the
                // page was opened for all its slots, and this one may have lost its race.
                if let Some(Ok((_, Err(left)))) = outcome {
                    left.log(name, p.slot.address);
                }
                match outcome {
                    None => push_name_bounded(&mut self.diag.unpinnable, name),
                    Some(Ok((SlotWrite::Written { protection }, _))) => {
                        let object = &batch.objects[p.object].object;
                        self.journal
                            .record(p.entry(object, expected[k], protection));
                        fresh.push(k);
                    }
                    Some(Ok((SlotWrite::Mismatch { actual }, _))) => {
                        if attempt > 0 || actual == p.replacement {
                            continue;
                        }
                        let rebound =
                            Resolver::new(p.hook, batch, &self.canonical, self.known.as_ref())
                                .binding(actual, p.slot, &batch.objects[p.object], p.object);
                        if rebound == p.original {
                            self.diag.resolver_races += 1;
                            expected[k] = actual;
                            retry.push(k);
                        }
                    }
                    Some(Err(f)) => push_bounded(
                        &mut self.diag.unreadable,
                        f.into_error(name, p.slot.address).to_string(),
                    ),
                }
            }
            pending = retry;
            if pending.is_empty() {
                break;
            }
        }
        self.recheck(plans, &fresh, batch, maps, bound_at_load);
        fresh.len()
    }

    /// A thread already inside the lazy-binding resolver for a slot we just patched writes the
    /// resolved function over our hook when it finishes. Look at the slots of this batch once
    /// more and patch again any that now hold exactly their original.
    fn recheck(
        &mut self,
        plans: &[Plan],
        fresh: &[usize],
        batch: &Batch,
        maps: &ProtectionMap,
        bound_at_load: &[bool],
    ) {
        if fresh.is_empty() {
            return;
        }
        // The original each slot would hold if a resolver overwrote our hook. Only a
        // `JUMP_SLOT` is bound lazily, and only in an object whose resolver word the loader
        // set (a new library opened `RTLD_NOW`, Python's default, has none: nothing to look at).
        let writes: Few<(usize, usize, usize, usize)> = few(fresh
            .iter()
            .filter(|&&k| {
                let p = &plans[k];
                p.slot.kind == RelocKind::JumpSlot && !bound_at_load[p.object]
            })
            .map(|&k| {
                let p = &plans[k];
                (p.object, p.slot.address, p.original, p.replacement)
            })
            .filter(|w| w.2 != 0));
        if writes.is_empty() {
            return;
        }
        self.diag.rechecked_slots += writes.len() as u64;
        // A compare-and-write of original → hook: writes only where the original is back.
        for (w, outcome) in writes.iter().zip(batch.write(maps, &writes, false)) {
            if let Some(Ok((found, restored))) = outcome {
                if matches!(found, SlotWrite::Written { .. }) {
                    self.diag.resolver_races += 1;
                }
                if let Err(left) = restored {
                    left.log(batch.objects[w.0].object.display_name(), w.1);
                }
            }
        }
    }
}
