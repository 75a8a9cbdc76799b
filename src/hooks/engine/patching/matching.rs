//! The first phases of a patch: every slot of every hook in a batch, found from the objects'
//! side, and the hooks with work there (slots to write, or an original to look for).

use std::ops::Range;

use crate::elf::{NameFilter, Slot};
use crate::hooks::batch::{group_by_key, Batch, Few};
use crate::hooks::set::{hooks_for_import, Hook};

use super::super::State;
use super::SetHooks;

/// A hook with work in a batch: its set's id, the hook, its name's hash, and its range of the
/// found slots.
pub(super) type Work<'s> = (u64, &'s Hook, u32, Range<usize>);

/// Every slot of every hook of some sets in one batch. Hooks are numbered across the sets, in
/// order.
pub(super) struct Hits {
    /// The number of each set's first hook.
    first_hook: Few<usize>,
    /// The number of hooks in all the sets.
    hooks_total: usize,
    /// (hook number, object, slot), by hook, then object.
    hits: Few<(usize, usize, Slot)>,
}

impl State {
    /// The installed sets of `set_ids` as a patch takes them (shared).
    pub(super) fn set_hooks(&self, set_ids: &[u64]) -> Few<SetHooks> {
        set_ids
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
            .collect()
    }
}

impl Hits {
    /// Every slot of every hook, found from the objects' side: each slot's name hash leads to
    /// the hooks with that hash (a binary search per set), and only an equal name (and version,
    /// for a versioned hook) counts.
    pub(super) fn find(sets: &[SetHooks], batch: &Batch) -> Hits {
        let mut first_hook: Few<usize> = Few::new();
        let mut hooks_total = 0;
        for (_, hooks, _, _) in sets {
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
        Hits {
            first_hook,
            hooks_total,
            hits,
        }
    }

    /// The end of the group of hits of one hook that starts at `from`.
    fn group_end(&self, from: usize) -> usize {
        let hits = &self.hits;
        from + hits[from..]
            .iter()
            .take_while(|h| h.0 == hits[from].0)
            .count()
    }

    /// The hooks to consider, with their range of the hits: `only_hit`, only hooks with slots
    /// here; otherwise every hook, in order.
    pub(super) fn groups(&self, only_hit: bool) -> Few<(usize, Range<usize>)> {
        let hits = &self.hits;
        let mut groups: Few<(usize, Range<usize>)> = Few::new();
        let mut at = 0;
        if only_hit {
            while at < hits.len() {
                let end = self.group_end(at);
                groups.push((hits[at].0, at..end));
                at = end;
            }
        } else {
            for g in 0..self.hooks_total {
                let end = if hits.get(at).is_some_and(|h| h.0 == g) {
                    self.group_end(at)
                } else {
                    at
                };
                groups.push((g, at..end));
                at = end;
            }
        }
        groups
    }

    /// Every hook of `groups` with work here, and its slots: slots to write, or (none, and no
    /// original yet) an original to look for. The work with its range of the found slots
    /// (object, slot). `new_objects`, `defines`: as [`State::patch_batch`] has them.
    pub(super) fn work<'s>(
        &self,
        sets: &'s [SetHooks],
        groups: Few<(usize, Range<usize>)>,
        new_objects: bool,
        defines: NameFilter,
    ) -> (Few<Work<'s>>, Few<(usize, Slot)>) {
        let first_hook = &self.first_hook;
        let mut work: Few<Work<'s>> = Few::new();
        let mut found: Few<(usize, Slot)> = Few::new();
        found.reserve(self.hits.len());
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
            for h in &self.hits[own] {
                found.push((h.1, h.2));
            }
            work.push((*id, hook, hash, start..found.len()));
        }
        (work, found)
    }
}
