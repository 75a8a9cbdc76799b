//! Planning: the slots' values read in one pass, then each hook's writes decided before any is
//! made (its original resolved, stacked on a lower set's hook, chained to another definition,
//! or a conflict reported).

use crate::elf::{NameFilter, RelocKind, Slot};
use crate::patch::ProtectionMap;

use crate::hooks::batch::{few, Batch, Few, SlotValues};
use crate::hooks::diagnostics::{push_bounded, push_name_bounded, Conflict};
use crate::hooks::resolver::Resolver;
use crate::hooks::set::Hook;

use super::super::State;
use super::matching::Work;
use super::Plan;

/// What the read phase of a patch found.
pub(super) struct Read {
    /// The page protections the reads were confirmed with (the writes reuse them).
    pub maps: ProtectionMap,
    /// The value of each found slot, in order (`None` where it could not be read), then those
    /// of the lazy-resolver words.
    pub values: Few<Option<usize>>,
    /// Objects whose loader bound every slot at load time.
    pub bound_at_load: Few<bool>,
}

impl State {
    /// Every slot value the plans need (`found`: (object, slot)), read in one pass, then the
    /// lazy-resolver word of each object with a `JUMP_SLOT` to write (see `recheck`). `None`
    /// when the page protections cannot be read (reported).
    pub(super) fn read_slots(&mut self, batch: &Batch, found: &[(usize, Slot)]) -> Option<Read> {
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
                return None;
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
        Some(Read {
            maps,
            values,
            bound_at_load,
        })
    }

    /// The plans of every hook with work (`found`, `values`: the slots and what they held).
    pub(super) fn plan<'h>(
        &mut self,
        work: Few<Work<'h>>,
        found: &[(usize, Slot)],
        values: &[Option<usize>],
        batch: &Batch,
    ) -> Few<Plan<'h>> {
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
        plans
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
}
