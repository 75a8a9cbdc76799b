//! The direct patch of one object a `dlopen` just loaded, in the common case: every hook it
//! imports already has a live original, no two sets hook one of its slots, each slot is bound to
//! that original, the loader bound its slots at load time (no lazy resolver to race with), and
//! it defines no hooked name (it cannot provide an original some hook lacks). Then each slot's
//! plan is "original → replacement", decided while reading the slots, and written straight
//! away, without the batch planner's per-phase lists (a quarter of a hooked new-library
//! `dlopen`'s instructions). Anything else (a conflict, a stack, lazy binding, a failed or raced
//! write) is left to the batch planner, which makes the same decisions in general; slots written
//! here are in the journal by then, so it skips them.
#![allow(unsafe_code)]

use std::sync::Arc;

use smallvec::SmallVec;

use crate::elf::{ObjectIndex, RelocKind, Slot};
use crate::patch::{
    compare_and_write_page, page_start, read_slot, Journal, JournalEntry, ProtectionMap,
};
use crate::patch::{LeftWritable, SlotWrite};

use crate::hooks::batch::Batch;
use crate::hooks::diagnostics::push_name_bounded;
use crate::hooks::loader::Pin;
use crate::hooks::set::Hook;

use super::{InstalledSet, State};

/// One slot to write: its hook (of set `set_id`) and the original it is bound to.
struct Write<'h> {
    set_id: u64,
    hook: &'h Hook,
    slot: Slot,
    original: usize,
}

/// Most slots a direct patch writes (a library importing more hooked functions, rare, goes
/// through the batch planner); kept inline, so deciding allocates nothing.
const MOST: usize = 16;

/// What the direct path did.
enum Direct {
    /// Every slot there was to write is written (how many).
    Done(usize),
    /// Not the common case, or a write did not go as read (how many were written first): the
    /// batch planner decides the rest.
    Planner(usize),
}

impl State {
    /// Patch the one new object of a `dlopen` (`idx`, held by the caller's handle `pin`) with
    /// every installed set: directly when it is the common case, else through the planner.
    pub(super) fn patch_opened(&mut self, idx: Arc<ObjectIndex>, pin: Pin) -> usize {
        let mark = self.journal.mark();
        let patched = match self.patch_direct(&idx) {
            Direct::Done(n) => {
                self.diag.direct_patches += 1;
                n
            }
            Direct::Planner(n) => {
                let mut batch = Batch::pinned(idx.clone(), pin);
                n + self.patch_batch_new(&mut batch, true)
            }
        };
        if idx.has_constructors && self.journal.has_entries_since(&idx.object, mark) {
            let late = &mut self.diag.constructors_before_patch;
            push_name_bounded(late, idx.object.display_name());
        }
        patched
    }

    /// Decide and write the common case (see the module doc).
    fn patch_direct(&mut self, idx: &Arc<ObjectIndex>) -> Direct {
        // It may provide an original some hook still lacks: the planner looks for it.
        if idx.defines_wanted() {
            return Direct::Planner(0);
        }
        let found = direct_writes(&self.sets, &self.journal, &self.canonical, idx);
        let Some(mut writes) = found else {
            return Direct::Planner(0);
        };
        if writes.is_empty() {
            return Direct::Done(0);
        }
        let Ok(maps) = ProtectionMap::for_addresses(writes.iter().map(|w| w.slot.address)) else {
            return Direct::Planner(0);
        };
        writes.sort_unstable_by_key(|w| w.slot.address);
        let page_size = region::page::size();
        let name = idx.object.display_name();
        let (mut written, mut as_read) = (0, true);
        let mut rest = &writes[..];
        while let Some(first) = rest.first() {
            let page = page_start(first.slot.address, page_size);
            let n = rest
                .iter()
                .take_while(|w| page_start(w.slot.address, page_size) == page)
                .count();
            let (group, after) = rest.split_at(n);
            rest = after;
            let slot = |j: usize| {
                let w = &group[j];
                (w.slot.address, w.original, w.hook.replacement)
            };
            let journal = &mut self.journal;
            let record = |j: usize, found: SlotWrite| match found {
                SlotWrite::Written { protection } => {
                    let w = &group[j];
                    journal.record(JournalEntry {
                        set_id: w.set_id,
                        object: idx.object.clone(),
                        symbol: w.hook.shared_symbol().clone(),
                        address: w.slot.address,
                        kind: w.slot.kind,
                        old: w.original,
                        new: w.hook.replacement,
                        protection,
                    });
                    written += 1;
                }
                SlotWrite::Mismatch { .. } => as_read = false,
            };
            // SAFETY: slots the index validated (aligned, inside the object), all on one page,
            // of an object the caller's handle keeps loaded (and readable: they were just read);
            // the caller holds the patch lock.
            match unsafe { compare_and_write_page(&maps, n, false, slot, record) } {
                Ok(Ok(())) => {}
                Ok(Err(left)) => log_left(left, name, group),
                // The planner tries this page again and reports why it cannot be written.
                Err(_) => as_read = false,
            }
        }
        if as_read {
            Direct::Done(written)
        } else {
            Direct::Planner(written)
        }
    }
}

/// The writes of the common case, read from the slots themselves; `None` when the object
/// is not the common case.
fn direct_writes<'s>(
    sets: &'s [InstalledSet],
    journal: &Journal,
    canonical: &[Arc<ObjectIndex>],
    idx: &ObjectIndex,
) -> Option<SmallVec<[Write<'s>; MOST]>> {
    let mut writes: SmallVec<[Write<'s>; MOST]> = SmallVec::new();
    let mut bound_at_load = None;
    for (hash, name, version, slot) in idx.named_slots() {
        for set in sets {
            let by_hash = &set.set.by_hash;
            let from = by_hash.partition_point(|e| e.0 < hash);
            for &(_, j) in by_hash[from..].iter().take_while(|e| e.0 == hash) {
                let hook = &set.set.hooks[j as usize];
                let named = hook.symbol.as_bytes() == name
                    && hook
                        .version
                        .as_ref()
                        .is_none_or(|v| Some(v.as_bytes()) == version);
                if !named || journal.contains(set.id, slot.address) {
                    continue;
                }
                // Two sets on one slot (a stack), or a hook whose original is not live.
                let original = hook.original.get();
                let stacked = writes.iter().any(|w| w.slot.address == slot.address);
                if stacked
                    || writes.len() == MOST
                    || original == 0
                    || !journal.has_symbol(set.id, hook.symbol())
                {
                    return None;
                }
                // SAFETY: a slot the index validated, of an object the caller's handle
                // keeps loaded.
                let value = unsafe { read_slot(slot.address) };
                if value == hook.replacement {
                    continue;
                }
                // Bound elsewhere (a conflict), or to something the resolver must look
                // behind (a lazy stub inside the object, a canonical PLT entry).
                if value != original
                    || idx.object.contains(value)
                    || is_canonical(canonical, hook, value)
                {
                    return None;
                }
                if slot.kind == RelocKind::JumpSlot
                    && !*bound_at_load.get_or_insert_with(|| bound_at_load_time(idx))
                {
                    return None;
                }
                writes.push(Write {
                    set_id: set.id,
                    hook,
                    slot,
                    original,
                });
            }
        }
    }
    Some(writes)
}

/// Whether `value` is a non-PIE executable's canonical PLT entry for `hook`'s symbol.
fn is_canonical(canonical: &[Arc<ObjectIndex>], hook: &Hook, value: usize) -> bool {
    canonical.iter().any(|i| {
        i.slots(hook.symbol(), None)
            .any(|s| s.canonical_plt == Some(value))
    })
}

/// Whether the loader bound every `JUMP_SLOT` of `idx` at load time (its lazy-resolver word is
/// zero); an object without that word is taken as lazily bound.
fn bound_at_load_time(idx: &ObjectIndex) -> bool {
    // SAFETY: the word lies inside the object (the index checked it), which the caller's handle
    // keeps loaded.
    idx.lazy_resolver_word()
        .is_some_and(|word| unsafe { read_slot(word) } == 0)
}

/// A page whose protection could not be put back: logged for each slot written on it.
fn log_left(left: LeftWritable, object: &str, group: &[Write<'_>]) {
    for w in group {
        left.log(object, w.slot.address);
    }
}
