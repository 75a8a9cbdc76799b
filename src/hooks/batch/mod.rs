//! The objects one engine operation reads and writes, and how it may touch them.
//!
//! An object handed over with a pin (the handle `dlopen` just returned) is touched directly.
//! The others are touched without a reference of their own, from inside one walk of the
//! loader's list per phase (`loader::visit`): pinning each by name would make glibc compare
//! its name with every object before it, O(N²) for an install into N objects. An object that
//! the walk cannot vouch for (removed meanwhile, or anything unloaded since the snapshot) is
//! then pinned by name, the old way, or left alone when it is gone.
//!
//! Work done inside a walk runs under the loader's list lock: it reads slot values or writes
//! slots (atomic operations, `mprotect`, the `PROCMAP_QUERY` ioctl) into storage reserved
//! beforehand, and never allocates, locks or calls the loader.
#![allow(unsafe_code)]

use std::cell::OnceCell;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::elf::{LoadedObject, ObjectIndex};
use crate::patch::{
    compare_and_write_page, page_start, read_slot, read_slot_confirmed, LeftWritable,
    ProtectionMap, SlotWrite, WriteFailure,
};
use crate::Result;

use super::loader::{visit, Pin};

mod index;
pub(crate) use index::{index_after, index_listed, IndexedAfter};

/// What a raw slot write found.
pub(crate) type Outcome = Result<(SlotWrite, Result<(), LeftWritable>), WriteFailure>;

/// A list with room for what one object's operation needs (a `dlopen` of one library patches
/// a handful of slots) kept inline: that path allocates nothing for its bookkeeping. Longer
/// lists (an install into many objects) live on the heap as a `Vec` would.
pub(crate) type Few<T> = SmallVec<[T; FEW]>;
/// The inline room of a [`Few`].
const FEW: usize = 8;

/// What [`Batch::read_values`] found.
pub(crate) struct SlotValues {
    /// Each slot's value, in the order asked; `None` when it could not be read.
    pub values: Few<Option<usize>>,
    /// Objects that could not be touched (unloaded meanwhile, or never pinnable).
    pub gone: Few<usize>,
    /// Slots whose page could not be confirmed readable (position among those asked, why).
    pub refused: Few<(usize, WriteFailure)>,
}

/// Collect into a [`Few`]: inline when it fits; a longer list through a `Vec`, which fills from
/// a sized iterator in place (`SmallVec` would push element by element past its inline room).
pub(crate) fn few<T>(items: impl Iterator<Item = T>) -> Few<T> {
    match items.size_hint() {
        (_, Some(n)) if n <= FEW => {
            // One push each: `SmallVec`'s `collect` costs ≈ 100 instructions even for a few.
            let mut list = Few::new();
            for item in items {
                list.push(item);
            }
            list
        }
        _ => SmallVec::from_vec(items.collect()),
    }
}

/// What a batch holds for each object: something that names the object as the loader listed
/// it. Patching holds object indexes; restoring slots at uninstall needs the objects alone.
pub(crate) trait BatchObject {
    fn loaded(&self) -> &LoadedObject;
}

impl BatchObject for Arc<ObjectIndex> {
    fn loaded(&self) -> &LoadedObject {
        &self.object
    }
}

impl BatchObject for Arc<LoadedObject> {
    fn loaded(&self) -> &LoadedObject {
        self
    }
}

pub(crate) struct Batch<O = Arc<ObjectIndex>> {
    pub objects: SmallVec<[O; 1]>,
    /// A reference per object, taken lazily (for scope lookups, or when a walk could not
    /// vouch for the object); `Some(None)`: pinning failed, the object is gone.
    pins: SmallVec<[OnceCell<Option<Pin>>; 1]>,
    /// Loader removals at the snapshot the objects come from.
    subs: u64,
    /// The objects that may define hooked functions (see [`Batch::definers`]), found once.
    definers: OnceCell<Few<usize>>,
}

impl<O: BatchObject> Batch<O> {
    /// Objects from a snapshot whose loader removal counter was `subs`; none pinned yet.
    pub fn listed(objects: Vec<O>, subs: u64) -> Batch<O> {
        let pins = objects.iter().map(|_| OnceCell::new()).collect();
        Batch {
            objects: SmallVec::from_vec(objects),
            pins,
            subs,
            definers: OnceCell::new(),
        }
    }

    /// Objects from a snapshot, some already pinned (`pins[i]`).
    pub fn with_pins(objects: Vec<O>, pins: Vec<Option<Pin>>, subs: u64) -> Batch<O> {
        let mut batch = Batch::listed(objects, subs);
        for (cell, pin) in batch.pins.iter_mut().zip(pins) {
            if let Some(pin) = pin {
                let _ = cell.set(Some(pin));
            }
        }
        batch
    }

    /// One object with the pin its caller holds.
    pub fn pinned(object: O, pin: Pin) -> Batch<O> {
        let cell = OnceCell::new();
        let _ = cell.set(Some(pin));
        Batch {
            objects: smallvec::smallvec![object],
            pins: smallvec::smallvec![cell],
            subs: 0,
            definers: OnceCell::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// A reference to object `i`, pinning it by name on first use; `None` when it is gone.
    pub fn pin(&self, i: usize) -> Option<&Pin> {
        self.pins[i]
            .get_or_init(|| Pin::object(self.objects[i].loaded()))
            .as_ref()
    }

    fn has_pin(&self, i: usize) -> bool {
        self.pins[i].get().is_some_and(|p| p.is_some())
    }

    /// Run `work(i)` for every needed object while it may be touched: pinned ones directly,
    /// the rest from one walk of the loader's list, and those the walk missed after pinning
    /// them by name. Returns which objects were touched.
    /// Objects whose `needed` entry is false are skipped (and reported touched).
    pub fn touch(&self, needed: &[bool], work: &mut dyn FnMut(usize)) -> Few<bool> {
        if self.objects.len() == 1 && self.has_pin(0) {
            // One object its caller pins (a `dlopen`): nothing to walk or pin.
            if needed[0] {
                work(0);
            }
            return smallvec::smallvec![true];
        }
        let mut done = few(needed.iter().map(|n| !n));
        let (mut listed, mut at): (Few<&crate::elf::LoadedObject>, Few<usize>) =
            (Few::new(), Few::new());
        for (i, d) in done.iter_mut().enumerate() {
            if *d {
                continue;
            }
            if self.has_pin(i) {
                work(i);
                *d = true;
            } else if self.pins[i].get().is_none() {
                listed.push(self.objects[i].loaded());
                at.push(i);
            }
        }
        if !listed.is_empty() {
            let reached = visit(&listed, self.subs, &mut |k| work(at[k]));
            for (k, r) in reached.into_iter().enumerate() {
                done[at[k]] = r;
            }
        }
        for (i, d) in done.iter_mut().enumerate() {
            if !*d && self.pins[i].get().is_none() && self.pin(i).is_some() {
                work(i);
                *d = true;
            }
        }
        done
    }

    /// Read the current value of every given slot (`(object, address)`), in the order given,
    /// each once its page is confirmed readable with `maps`: `None` for a slot whose object
    /// could not be touched (gone) or whose page could not be read. Also returns those objects,
    /// and the slots refused (position in `slots`, why). Words from `confirmed` on were found
    /// readable when their object was indexed, and are read without asking again.
    pub fn read_values(
        &self,
        maps: &ProtectionMap,
        slots: &[(usize, usize)],
        confirmed: usize,
    ) -> SlotValues {
        let n = self.objects.len();
        let (starts, order) = group_by_key(slots.iter().map(|s| s.0), n);
        let needed = few((0..n).map(|i| starts[i] < starts[i + 1]));
        let mut values: Few<Option<usize>> = smallvec::smallvec![None; slots.len()];
        let mut refused = Few::new();
        // Inside a walk nothing may allocate: room for every mapping and refusal up front.
        maps.reserve(slots.len() + 8);
        refused.reserve(slots.len());
        let done = self.touch(&needed, &mut |i| {
            for &k in &order[starts[i]..starts[i + 1]] {
                // Slots the index validated (aligned, inside the object), read while the object
                // is pinned or listed under the loader's lock.
                let read = if k >= confirmed {
                    // SAFETY: as above; its page was confirmed readable at indexing.
                    Ok(unsafe { read_slot(slots[k].1) })
                } else {
                    // SAFETY: as above; the page is confirmed readable first.
                    unsafe { read_slot_confirmed(maps, slots[k].1) }
                };
                match read {
                    Ok(v) => values[k] = Some(v),
                    Err(f) => refused.push((k, f)),
                }
            }
        });
        let gone = (0..n).filter(|&i| needed[i] && !done[i]).collect();
        SlotValues {
            values,
            gone,
            refused,
        }
    }

    /// Compare-and-write each `(object, address, expected, new)`; `None` for writes whose
    /// object could not be touched. Slots sharing a page are written under one change of its
    /// protection.
    ///
    /// `stale_ok`: the slots may no longer be readable (restoring journal entries, whose object
    /// may have been replaced since they were written): each page is confirmed readable with
    /// the kernel before its slots are read, and one that is not fails as `Unreadable`. Slots
    /// whose values a plan has just read need no such check.
    pub fn write(
        &self,
        maps: &ProtectionMap,
        writes: &[(usize, usize, usize, usize)],
        stale_ok: bool,
    ) -> Few<Option<Outcome>> {
        maps.reserve(writes.len() + 8);
        let n = self.objects.len();
        let (starts, order) = write_order(writes, n);
        let needed = few((0..n).map(|i| starts[i] < starts[i + 1]));
        let mut outcomes: Few<Option<Outcome>> = smallvec::smallvec![None; writes.len()];
        let page_size = region::page::size();
        let same_page = |&a: &usize, &b: &usize| {
            page_start(writes[a].1, page_size) == page_start(writes[b].1, page_size)
        };
        self.touch(&needed, &mut |i| {
            for group in order[starts[i]..starts[i + 1]].chunk_by(same_page) {
                let slot = |j: usize| {
                    let (_, address, expected, new) = writes[group[j]];
                    (address, expected, new)
                };
                // SAFETY: validated slots (aligned, inside the object, readable as when their
                // values were read for the plan, or confirmed readable first when `stale_ok`)
                // of one object pinned or listed under the loader's lock, all on one page; the
                // caller holds the patch lock; `maps` has room, so nothing allocates.
                let done = unsafe {
                    compare_and_write_page(maps, group.len(), stale_ok, slot, |j, found| {
                        outcomes[group[j]] = Some(Ok((found, Ok(()))));
                    })
                };
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(left)) => {
                        for &k in group {
                            if let Some(Ok((_, restored))) = &mut outcomes[k] {
                                *restored = Err(left);
                            }
                        }
                    }
                    Err(failure) => {
                        for &k in group {
                            outcomes[k] = Some(Err(failure));
                        }
                    }
                }
            }
        });
        outcomes
    }
}

impl Batch<Arc<ObjectIndex>> {
    /// The objects (other than the main program) that define some wanted name: where a hook's
    /// original can be found when the global scope does not have it. Usually a handful among
    /// thousands, so each hook's search looks at these alone.
    pub fn definers(&self) -> &[usize] {
        self.definers.get_or_init(|| {
            (0..self.objects.len())
                .filter(|&i| {
                    let o = &self.objects[i];
                    o.defines_wanted() && o.object.position != 0
                })
                .collect()
        })
    }
}

/// The order to make `writes` (`(object, address, expected, new)`, objects below `objects`)
/// in: by object (`order[starts[i]..starts[i + 1]]` are object i's), each object's by address,
/// so that slots on one page follow each other. Writes to one address (stacked sets on one
/// slot) keep their plan order: the lower set's write comes first, and the next one expects
/// its value.
fn write_order(
    writes: &[(usize, usize, usize, usize)],
    objects: usize,
) -> (Few<usize>, Few<usize>) {
    let (starts, mut order) = group_by_key(writes.iter().map(|w| w.0), objects);
    for i in 0..objects {
        let run = &mut order[starts[i]..starts[i + 1]];
        if run.len() > 1 {
            run.sort_unstable_by_key(|&k| (writes[k].1, k));
        }
    }
    (starts, order)
}

/// Group items by key with a counting sort (`keys`: each item's key, all below `count`: an
/// object, or a hook): `order[starts[i]..starts[i + 1]]` are key i's items, in their given
/// order.
pub(crate) fn group_by_key(
    keys: impl Iterator<Item = usize> + Clone,
    count: usize,
) -> (Few<usize>, Few<usize>) {
    let mut starts: Few<usize> = smallvec::smallvec![0; count + 1];
    let mut items = 0;
    for o in keys.clone() {
        starts[o + 1] += 1;
        items += 1;
    }
    for i in 0..count {
        starts[i + 1] += starts[i];
    }
    let mut order: Few<usize> = smallvec::smallvec![0; items];
    let mut next = starts.clone();
    for (k, o) in keys.enumerate() {
        order[next[o]] = k;
        next[o] += 1;
    }
    (starts, order)
}

#[cfg(test)]
mod tests;
