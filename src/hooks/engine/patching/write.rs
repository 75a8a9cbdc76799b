//! Writing: each planned slot compare-and-written (retried once after a lazy-binding race),
//! journaled, then the lazily bound slots rechecked.

use crate::elf::RelocKind;
use crate::patch::{ProtectionMap, SlotWrite};

use crate::hooks::batch::{few, Batch, Few};
use crate::hooks::diagnostics::{push_bounded, push_name_bounded};
use crate::hooks::resolver::Resolver;

use super::super::State;
use super::Plan;

impl State {
    /// Write the plans' slots (`maps`: the protections their reads were confirmed with);
    /// `bound_at_load[i]`: object i has no lazy binding to race with.
    pub(super) fn write(
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
