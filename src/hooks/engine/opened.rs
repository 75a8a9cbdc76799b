//! The `dlopen`/`dlclose` fast paths: what one call added or removed, handled from the object
//! it opened or closed (its handle, the objects the loader listed after it, the objects that
//! arrived with it), without a copy of the loader's whole list. Anything they cannot vouch for
//! takes a whole sync (`sync.rs`).

use std::ffi::c_void;
use std::sync::Arc;

use crate::elf::{self, LoadedObject, ObjectIndex};

use crate::hooks::batch::{self, Batch};
use crate::hooks::loader::{registered_at, Pin};
use crate::hooks::resolver::matters;
use crate::hooks::skip::{exclude_list, skip_reason};
use crate::Result;

use super::direct::Direct;
use super::sync::{Admitted, Reading};
use super::{Known, State};

/// A `dlopen` or `dlclose` that added or removed up to this many objects is handled from the
/// object it opened or closed (see [`State::sync_opened`]); more take a whole sync.
const MAX_GROUP: u64 = 256;

/// Loaded objects per new dependency above which proving the dependencies are in the opened
/// object's scope (a `dlsym` or two each) is cheaper than walking the loader's list for them.
const PROOF_PER_OBJECT: usize = 24;

impl State {
    /// The `dlopen` fast path (see [`super::sync_opened`]). `now`: the loader's counters
    /// read after the real `dlopen` returned (before this operation began: a lower bound of
    /// the present ones, which is all the fast path needs). Taken, it does not walk the list
    /// again for objects added since `now`: those were loaded by other threads, whose own
    /// loader calls sync once this operation ends, or past the interposers, which the next
    /// loader call or sync sees (as it would have had they been loaded a moment later).
    ///
    /// # Safety
    /// As [`super::sync_opened`].
    #[allow(unsafe_code)]
    pub(super) unsafe fn sync_opened(
        &mut self,
        handle: *mut c_void,
        now: elf::LoadCounters,
    ) -> usize {
        let last = self.last_counters;
        if !self.room_to_sync() {
            return 0;
        }
        let added = now.adds.wrapping_sub(last.adds);
        if now.subs == last.subs && (1..=MAX_GROUP).contains(&added) && self.known.is_some() {
            // SAFETY: the caller holds `handle` open for the whole call.
            let pin = unsafe { Pin::borrowed(handle) };
            if let Some((obj, link_map)) = pin.describe() {
                if self.find_known(obj.base, &obj.name).is_none() {
                    if added == 1 {
                        // One object was added since the last sync and this one is new: it is
                        // that object.
                        self.diag.quick_scans += 1;
                        self.last_counters = now;
                        let exclude = exclude_list();
                        return match self.admit(Arc::new(obj), link_map, &exclude) {
                            Some(idx) if matters(&idx) => self.patch_opened(idx, pin),
                            _ => 0,
                        };
                    }
                    // Several: the group path (on unless turned off: `hooks::group_dlopen`),
                    // which finds and indexes nothing else first, or else a whole sync.
                    if !crate::hooks::group_dlopen() {
                        return self.sync_whole_opened(link_map);
                    }
                    // The opened object was added first, its new dependencies after it, at the
                    // end of its namespace's list. When exactly `added - 1` new objects follow
                    // it there, they are the rest.
                    let count = added as usize - 1;
                    // SAFETY: the caller holds `handle`, hence its link map, live.
                    let rest = unsafe {
                        batch::index_after(
                            link_map,
                            count,
                            &self.wanted,
                            now.subs,
                            self.worth_proving(count),
                        )
                    };
                    let Some(rest) = rest.filter(|rest| {
                        rest.objects
                            .iter()
                            .all(|(o, _)| self.find_known(o.base, &o.name).is_none())
                    }) else {
                        return self.sync_until_stable();
                    };
                    // A group in which a new object may define a hooked name (or could not be
                    // read) takes a whole sync: resolving originals among several new definers
                    // (PyTorch's CUDA libraries) stays on the path the real driver has checked.
                    let head = Arc::new(obj);
                    let built = (skip_reason(&head, &exclude_list()).is_none()).then(|| {
                        ObjectIndex::build_in(head.clone(), Some(&self.wanted), &mut self.room)
                    });
                    let defines_none = |i: &Option<Result<ObjectIndex>>| matches!(i, Some(Ok(i)) if !i.defines_wanted());
                    if defines_none(&built) && rest.indexes.iter().all(defines_none) {
                        return self.opened_group(head, built, link_map, pin, rest, now);
                    }
                }
            }
        }
        self.sync_until_stable()
    }

    /// A `dlopen` that added several objects with the group path off: a whole sync, after which the
    /// opened object (`link_map`) remembers the others that arrived in it, so that the `dlclose`
    /// removing them together forgets them without another ([`State::sync_closed`]).
    fn sync_whole_opened(&mut self, link_map: usize) -> usize {
        let mut arrived = Vec::new();
        let patched = self.sync_until_stable_noting(Some(&mut arrived));
        if !arrived.contains(&link_map) {
            return patched;
        }
        let base = self
            .by_link_map
            .as_ref()
            .and_then(|m| m.get(&link_map))
            .copied();
        if let Some(k) = base.and_then(|b| self.known_by_link_map(b, link_map)) {
            arrived.retain(|&m| m != 0 && m != link_map);
            k.arrived_with = arrived.into_boxed_slice();
        }
        patched
    }

    /// The `dlopen` fast path for several new objects: `first` (opened through `pin`, whose
    /// link map is `link_map`, indexed as `built`) and `after`, the objects the loader listed
    /// after it, all new, as `batch::index_after` found and indexed them. Those proven to be in
    /// the opened object's scope (its dependencies, which its handle keeps loaded) are patched
    /// as it is; the rest, with no reference of ours, from inside one walk of the loader's list.
    fn opened_group(
        &mut self,
        first: Arc<LoadedObject>,
        built: Option<Result<ObjectIndex>>,
        link_map: usize,
        pin: Pin,
        after: batch::IndexedAfter,
        now: elf::LoadCounters,
    ) -> usize {
        let batch::IndexedAfter {
            objects: rest,
            indexes,
            exported,
        } = after;
        self.diag.group_scans += 1;
        self.last_counters = now;
        let base = first.base;
        let head = self.enter(first, link_map, built, false);
        let (rest, maps): (Vec<_>, Vec<usize>) = rest.into_iter().unzip();
        // Which of them the opened object's handle keeps loaded: a `dlsym` through it of a
        // name one exports that lands in that object (an object earlier in the scope may define
        // the name too: then the next name is tried, and without one the object is walked).
        let in_scope: Vec<*const LoadedObject> = rest
            .iter()
            .zip(&exported)
            .filter(|(o, names)| names.iter().any(|n| o.contains(pin.lookup(n, None))))
            .map(|(o, _)| Arc::as_ptr(o))
            .collect();
        self.diag.dependencies_in_scope += in_scope.len() as u64;
        if let Some(k) = self.known_by_link_map(base, link_map) {
            k.arrived_with = maps.clone().into_boxed_slice();
        }
        let Admitted {
            new,
            pins,
            mut complete,
        } = self.admit_new(rest, &maps, now.subs, Reading::Indexed(indexes));
        if self.sets.is_empty() {
            return 0;
        }
        if head.is_none() {
            complete = false;
        }
        // The opened object through its handle, the dependencies proven in its scope the same
        // way, the rest from inside one walk; each directly when it is the common case. The
        // planner gets what is left, in load order (the order a whole sync gives it: where two
        // new objects define one hooked name, the first loaded provides the original, as the
        // loader would bind it), with the pins there are.
        let mark = self.journal.mark();
        let mut patched = 0;
        let mut direct = |st: &mut Self, idx: &Arc<ObjectIndex>| match st.patch_direct(idx) {
            Direct::Done(n) => {
                st.diag.direct_patches += 1;
                patched += n;
                false
            }
            Direct::Planner(n) => {
                patched += n;
                true
            }
        };
        let head = head.filter(|i| matters(i));
        let head_to_planner = head.as_ref().is_some_and(|idx| direct(self, idx));
        let followers: Vec<(Arc<ObjectIndex>, Option<Pin>)> = new
            .into_iter()
            .zip(pins)
            .filter(|(i, _)| matters(i))
            .collect();
        let scoped: Vec<bool> = followers
            .iter()
            .map(|(i, _)| in_scope.contains(&Arc::as_ptr(&i.object)))
            .collect();
        let mut to_planner = vec![false; followers.len()];
        for (i, (idx, _)) in followers.iter().enumerate() {
            if scoped[i] {
                to_planner[i] = direct(self, idx);
            }
        }
        let walked: Vec<usize> = (0..followers.len()).filter(|&i| !scoped[i]).collect();
        let listed: Vec<Arc<ObjectIndex>> =
            walked.iter().map(|&i| followers[i].0.clone()).collect();
        let (n, planner) = self.patch_followers_direct(&listed, now.subs);
        patched += n;
        for (k, &i) in walked.iter().enumerate() {
            to_planner[i] = planner[k];
        }
        let (mut leftover, mut held) = (Vec::new(), Vec::new());
        let mut touched = Vec::with_capacity(followers.len() + 1);
        if let Some(idx) = head {
            if head_to_planner {
                leftover.push(idx.clone());
                held.push(Some(pin));
            }
            touched.push(idx);
        }
        for (i, (idx, pin)) in followers.into_iter().enumerate() {
            if to_planner[i] {
                leftover.push(idx.clone());
                // A proven one's reference is the opened object's handle, whose scope is not
                // its own: the planner pins it itself if it needs a scope.
                held.push(if scoped[i] { None } else { pin });
            }
            touched.push(idx);
        }
        if !leftover.is_empty() {
            let mut batch = Batch::with_pins(leftover, held, now.subs);
            patched += self.patch_batch_new(&mut batch, complete);
        }
        self.note_late_constructors(&touched, mark);
        patched
    }

    /// Whether proving that `count` new dependencies are in the opened object's scope is worth
    /// it: only where the walk it saves costs more (a walk steps through every loaded object,
    /// ≈ 25 ns each; a proof is a `dlsym` or two per dependency, ≈ 0.6 µs).
    fn worth_proving(&self, count: usize) -> bool {
        let loaded = self.known.as_ref().map_or(0, |m| m.len());
        loaded > PROOF_PER_OBJECT * count
    }

    /// The known object at `base` whose link map is `link_map`.
    fn known_by_link_map(&mut self, base: usize, link_map: usize) -> Option<&mut Known> {
        self.known
            .as_mut()?
            .get_mut(&base)?
            .iter_mut()
            .find(|k| k.link_map == link_map)
    }

    /// The `dlclose` fast path (see [`super::sync_closed`]); `now` as for
    /// [`State::sync_opened`], read after the real `dlclose` returned. Taken, it does not walk
    /// the list again either.
    pub(super) fn sync_closed(&mut self, link_map: usize, now: elf::LoadCounters) -> usize {
        let last = self.last_counters;
        let removed = now.subs.wrapping_sub(last.subs);
        if now.adds == last.adds && (1..=MAX_GROUP).contains(&removed) {
            if let Some((obj, arrived_with)) = self.gone_by_link_map(link_map) {
                // It and, when several went, those that arrived with it and are gone too.
                let mut gone: smallvec::SmallVec<[Arc<LoadedObject>; 4]> = smallvec::smallvec![obj];
                if removed > 1 {
                    gone.extend(
                        arrived_with
                            .iter()
                            .filter_map(|&m| self.gone_by_link_map(m).map(|(o, _)| o)),
                    );
                }
                if gone.len() as u64 == removed {
                    if removed == 1 {
                        self.diag.quick_scans += 1;
                    } else {
                        self.diag.group_scans += 1;
                    }
                    for obj in &gone {
                        self.forget(obj);
                    }
                    self.last_counters = now;
                    return 0;
                }
            }
        }
        self.sync_until_stable()
    }

    /// The known object whose link map is `link_map`, with the link maps of those that arrived
    /// with it, when glibc confirms it is unloaded: no object covers its first segment any
    /// more, or another one does.
    fn gone_by_link_map(&self, link_map: usize) -> Option<(Arc<LoadedObject>, Box<[usize]>)> {
        let k = self
            .by_link_map
            .as_ref()
            .and_then(|m| m.get(&link_map))
            .and_then(|&base| self.known.as_ref()?.get(&base))
            .and_then(|v| v.iter().find(|k| k.link_map == link_map))?;
        let gone = registered_at(&k.object).is_some_and(|found| found != Some(link_map));
        gone.then(|| (k.object.clone(), k.arrived_with.clone()))
    }
}
