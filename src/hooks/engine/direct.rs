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

use crate::elf::{ObjectIndex, RelocKind};
use crate::patch::SlotWrite;
use crate::patch::{
    compare_and_write_page, page_start, read_slot, read_slot_confirmed, Journal, ProtectionMap,
};

use crate::hooks::batch::Batch;
use crate::hooks::loader::{visit, Pin};
use crate::hooks::resolver::canonical_entries;
use crate::hooks::set::hooks_for_import;

use super::patching::Plan;
use super::{InstalledSet, State};

/// Most slots a direct patch writes (a library importing more hooked functions, rare, goes
/// through the batch planner); kept inline, so deciding allocates nothing.
const MOST: usize = 16;

/// What the direct path did.
pub(super) enum Direct {
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
        self.note_late_constructors(std::slice::from_ref(&idx), mark);
        patched
    }

    /// Whether `idx` can take the direct path at all, before anything of it is read.
    fn direct_case(&self, idx: &ObjectIndex) -> Case {
        // It may provide an original some hook still lacks: the planner looks for it.
        if idx.defines_wanted() {
            return Case::Planner;
        }
        // While an object that hides what it defines is loaded, a missing original may be in
        // the global scope through it: the planner looks for every one.
        if self.hiding > 0
            && self
                .sets
                .iter()
                .any(|s| s.set.hooks.iter().any(|h| h.original.get() == 0))
        {
            return Case::Planner;
        }
        // Imports nothing hooked (most libraries a program opens): nothing to ask or read.
        if idx.is_empty() {
            return Case::Nothing;
        }
        Case::Slots
    }

    /// Decide and write the common case (see the module doc).
    pub(super) fn patch_direct(&mut self, idx: &Arc<ObjectIndex>) -> Direct {
        match self.direct_case(idx) {
            Case::Planner => return Direct::Planner(0),
            Case::Nothing => return Direct::Done(0),
            Case::Slots => {}
        }
        // Asked before any slot is read (a page the object made unreadable is the planner's
        // to report); the writes reuse the answers.
        let addresses = idx.named_slots().map(|(.., slot)| slot.address);
        let Ok(maps) = ProtectionMap::for_addresses(addresses) else {
            return Direct::Planner(0);
        };
        let mut done = DirectWrites::default();
        write_direct(
            &self.sets,
            &self.journal,
            &self.canonical,
            &maps,
            idx,
            &mut done,
        );
        finish_direct(&mut self.journal, idx, done)
    }

    /// The direct patch of the new dependencies a `dlopen` brought (`objects`, no reference of
    /// ours: listed at the loader's removal count `subs`), all from inside one walk of the
    /// loader's list. Returns the slots written and which objects the planner must still see
    /// (not the common case, not reached by the walk, or a write that did not go as read).
    pub(super) fn patch_followers_direct(
        &mut self,
        objects: &[Arc<ObjectIndex>],
        subs: u64,
    ) -> (usize, Vec<bool>) {
        let mut planner: Vec<bool> = objects
            .iter()
            .map(|o| self.direct_case(o) == Case::Planner)
            .collect();
        let slots = |i: usize| -> bool { !planner[i] && !objects[i].is_empty() };
        let touched: Vec<usize> = (0..objects.len()).filter(|&i| slots(i)).collect();
        if touched.is_empty() {
            return (0, planner);
        }
        let addresses = touched
            .iter()
            .flat_map(|&i| objects[i].named_slots().map(|(.., slot)| slot.address));
        let Ok(maps) = ProtectionMap::for_addresses(addresses) else {
            for &i in &touched {
                planner[i] = true;
            }
            return (0, planner);
        };
        // Inside the walk nothing may allocate: every answer and result has its room now.
        let count: usize = touched
            .iter()
            .map(|&i| objects[i].named_slots().count())
            .sum();
        maps.reserve(count + 8);
        let mut results: Vec<DirectWrites<'_>> =
            touched.iter().map(|_| DirectWrites::default()).collect();
        let listed: Vec<&crate::elf::LoadedObject> =
            touched.iter().map(|&i| &*objects[i].object).collect();
        let (sets, journal, canonical) = (&self.sets, &self.journal, &self.canonical);
        let reached = visit(&listed, subs, &mut |k| {
            write_direct(
                sets,
                journal,
                canonical,
                &maps,
                &objects[touched[k]],
                &mut results[k],
            );
        });
        let mut written = 0;
        for ((k, &i), done) in touched.iter().enumerate().zip(results) {
            if !reached[k] {
                planner[i] = true;
                continue;
            }
            match finish_direct(&mut self.journal, &objects[i], done) {
                Direct::Done(n) => {
                    self.diag.direct_patches += 1;
                    written += n;
                }
                Direct::Planner(n) => {
                    planner[i] = true;
                    written += n;
                }
            }
        }
        (written, planner)
    }
}

/// Journal what [`write_direct`] wrote into `idx`, and report pages left writable.
fn finish_direct(journal: &mut Journal, idx: &Arc<ObjectIndex>, done: DirectWrites<'_>) -> Direct {
    for (w, protection) in &done.written {
        journal.record(w.entry(&idx.object, w.expected, *protection));
    }
    for (left, address) in done.left_writable {
        left.log(idx.object.display_name(), address);
    }
    let n = done.written.len();
    if done.planner {
        Direct::Planner(n)
    } else {
        Direct::Done(n)
    }
}

/// What [`State::direct_case`] found.
#[derive(PartialEq, Eq)]
enum Case {
    /// The batch planner must decide.
    Planner,
    /// Nothing hooked is imported: nothing to write.
    Nothing,
    /// Slots to read and decide.
    Slots,
}

/// What [`write_direct`] did to one object, kept inline (it runs inside loader walks, where
/// nothing may allocate): the plans written with the protection of their page, the pages left
/// writable, and whether the planner must see the object after all.
#[derive(Default)]
struct DirectWrites<'s> {
    written: SmallVec<[(Plan<'s>, region::Protection); MOST]>,
    left_writable: SmallVec<[(crate::patch::LeftWritable, usize); MOST]>,
    planner: bool,
}

/// Read, decide and write the common case of `idx` (see the module doc) into `done`, without
/// allocating: the object is pinned, or listed under the loader's lock (inside a walk).
fn write_direct<'s>(
    sets: &'s [InstalledSet],
    journal: &Journal,
    canonical: &[Arc<ObjectIndex>],
    maps: &ProtectionMap,
    idx: &ObjectIndex,
    done: &mut DirectWrites<'s>,
) {
    // Filled in place: a list of `MOST` plans moved out of a call is a kilobyte copied.
    let mut writes = SmallVec::<[Plan<'s>; MOST]>::new();
    if !direct_writes(sets, journal, canonical, maps, idx, &mut writes) {
        done.planner = true;
        return;
    }
    writes.sort_unstable_by_key(|w| w.slot.address);
    let page_size = region::page::size();
    let same_page = |a: &Plan, b: &Plan| {
        page_start(a.slot.address, page_size) == page_start(b.slot.address, page_size)
    };
    for group in writes.chunk_by(same_page) {
        let slot = |j: usize| {
            let w = &group[j];
            (w.slot.address, w.expected, w.replacement)
        };
        let mut as_read = true;
        let record = |j: usize, found: SlotWrite| match found {
            SlotWrite::Written { protection } => done.written.push((group[j], protection)),
            SlotWrite::Mismatch { .. } => as_read = false,
        };
        // SAFETY: slots the index validated (aligned, inside the object), all on one page, of
        // an object pinned or listed under the loader's lock (and readable: they were just
        // read); the caller holds the patch lock.
        match unsafe { compare_and_write_page(maps, group.len(), false, slot, record) } {
            Ok(Ok(())) => {}
            Ok(Err(left)) => done
                .left_writable
                .extend(group.iter().map(|w| (left, w.slot.address))),
            // The planner tries this page again and reports why it cannot be written.
            Err(_) => as_read = false,
        }
        done.planner |= !as_read;
    }
}

/// The writes of the common case into `writes`, read from the slots themselves (each page
/// confirmed readable with `maps` first); false when the object is not the common case.
fn direct_writes<'s>(
    sets: &'s [InstalledSet],
    journal: &Journal,
    canonical: &[Arc<ObjectIndex>],
    maps: &ProtectionMap,
    idx: &ObjectIndex,
    writes: &mut SmallVec<[Plan<'s>; MOST]>,
) -> bool {
    let mut bound_at_load = None;
    for (hash, name, version, slot) in idx.named_slots() {
        for set in sets {
            let (hooks, by_hash) = (&set.set.hooks[..], &set.set.by_hash[..]);
            for (_, hook) in hooks_for_import(hooks, by_hash, (hash, name, version)) {
                if journal.contains(set.id, slot.address) {
                    continue;
                }
                // Two sets on one slot (a stack), or a hook whose original is not live.
                let original = hook.original.get();
                let stacked = writes.iter().any(|w| w.slot.address == slot.address);
                if stacked
                    || writes.len() == MOST
                    || original == 0
                    || !journal.has_symbol(set.id, hook.shared_symbol())
                {
                    return false;
                }
                // SAFETY: a slot the index validated, of an object the caller's handle
                // keeps loaded.
                let Ok(value) = (unsafe { read_slot_confirmed(maps, slot.address) }) else {
                    return false;
                };
                if hook.leads_here(value) {
                    continue;
                }
                // Bound elsewhere (a conflict), or to something the resolver must look
                // behind (a lazy stub inside the object, a canonical PLT entry).
                if value != original
                    || idx.object.contains(value)
                    || canonical_entries(canonical, hook.symbol()).any(|c| c == value)
                {
                    return false;
                }
                if slot.kind == RelocKind::JumpSlot
                    && !*bound_at_load.get_or_insert_with(|| bound_at_load_time(idx))
                {
                    return false;
                }
                writes.push(Plan {
                    set_id: set.id,
                    object: 0,
                    hook,
                    slot,
                    expected: value,
                    original,
                    replacement: hook.replacement,
                });
            }
        }
    }
    true
}

/// Whether the loader bound every `JUMP_SLOT` of `idx` at load time (its lazy-resolver word is
/// zero); an object without that word is taken as lazily bound.
fn bound_at_load_time(idx: &ObjectIndex) -> bool {
    // SAFETY: the word lies inside the object, on a page the index confirmed readable, and the
    // caller's handle keeps the object loaded.
    idx.lazy_resolver_word()
        .is_some_and(|word| unsafe { read_slot(word) } == 0)
}
