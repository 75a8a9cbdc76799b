//! Bringing the object cache up to date with the loader's list ("sync"): forget what was
//! unloaded, index what is new (never reading an object nothing keeps mapped), and patch the
//! new objects with every installed set. The `dlopen`/`dlclose` fast paths (`opened.rs`) handle
//! what one call changed without a copy of the loader's list, and fall back to this.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

use crate::elf::{self, LoadedObject, ObjectIndex};
use crate::Result;

use crate::hooks::batch::{self, Batch};
use crate::hooks::diagnostics::{push_bounded, push_name_bounded};
use crate::hooks::loader::{registered_at, Pin};
use crate::hooks::resolver::matters;
use crate::hooks::skip::{exclude_list, skip_reason, SkipReason};

use super::{Known, KnownAt, State};

/// What a sync found.
pub(super) struct Synced {
    /// Every known object's index.
    pub all: Vec<Arc<ObjectIndex>>,
    /// The indexes of the objects new since the last sync, and the pins taken for them.
    pub new: Vec<Arc<ObjectIndex>>,
    pub pins: Vec<Option<Pin>>,
    /// Every new object was indexed (none left alone, unreadable or gone before it was read).
    pub complete: bool,
    /// The loader's counters the list was read at.
    pub counters: elf::LoadCounters,
    /// The link maps of every object new since the last sync, indexed or not (0 where glibc
    /// has none registered yet).
    pub arrived: Vec<usize>,
}

/// What [`State::sync`] did.
pub(super) struct SyncDone {
    /// Every known object's index, when asked for.
    pub all: Vec<Arc<ObjectIndex>>,
    /// Slots patched.
    pub patched: usize,
    /// As [`Synced::arrived`].
    pub arrived: Vec<usize>,
}

/// What [`State::admit_new`] took in: the new objects' indexes, and the pins taken for them.
pub(super) struct Admitted {
    pub new: Vec<Arc<ObjectIndex>>,
    pub pins: Vec<Option<Pin>>,
    /// Every object was indexed (none left alone, unreadable or gone before it was read).
    pub complete: bool,
}

/// How [`State::admit_new`] reads new objects.
pub(super) enum Reading {
    /// From inside walks of the loader's list (`batch::index_listed`, no reference of our own;
    /// those no walk vouches for are pinned by name).
    InWalks,
    /// Already indexed (`batch::index_after`); `None` entries are pinned by name.
    Indexed(Vec<Option<Result<ObjectIndex>>>),
}

/// Where among the known objects at `base` is the one the loader lists with the name bytes
/// `name` (it only reads: a sync asks inside its walk of the loader's list).
fn known_at(known: &Option<HashMap<usize, KnownAt>>, base: usize, name: &[u8]) -> Option<usize> {
    known
        .as_ref()?
        .get(&base)?
        .iter()
        .position(|k| k.object.is(base, name))
}

impl State {
    /// The known object with this load bias and name.
    pub(super) fn find_known(&self, base: usize, name: &str) -> Option<&Known> {
        let at = known_at(&self.known, base, name.as_bytes())?;
        self.known.as_ref()?.get(&base)?.get(at)
    }

    /// Take a new object into the cache: index it, or note why it is left alone. Returns its
    /// index when it has one.
    pub(super) fn admit(
        &mut self,
        obj: Arc<LoadedObject>,
        link_map: usize,
        exclude: &[String],
    ) -> Option<Arc<ObjectIndex>> {
        if let Some(reason) = skip_reason(&obj, exclude) {
            push_bounded(
                &mut self.diag.skipped,
                (obj.display_name().to_owned(), reason),
            );
            // cuhook's own object, the vDSO and the loader are there from the first sync, whose
            // install looks for every original; an excluded library may come later.
            let hides = reason == SkipReason::Excluded;
            return self.enter(obj, link_map, None, hides);
        }
        let built = ObjectIndex::build_in(obj.clone(), Some(&self.wanted), &mut self.room);
        self.enter(obj, link_map, Some(built), false)
    }

    /// Take a new object into the cache with its index as built (`None`: left alone on
    /// purpose; `hides`: it may define hooked functions all the same), noting what the
    /// diagnostics report about it. Returns its index when it has one.
    pub(super) fn enter(
        &mut self,
        obj: Arc<LoadedObject>,
        link_map: usize,
        built: Option<Result<ObjectIndex>>,
        mut hides: bool,
    ) -> Option<Arc<ObjectIndex>> {
        let index = match built {
            None => None,
            Some(Ok(idx)) => {
                let idx = Arc::new(idx);
                self.diag.objects_indexed += 1;
                if idx.text_references > 0 {
                    let name = obj.display_name().to_owned();
                    crate::log!(
                            crate::log::Level::Warn,
                            "{name} has {} text relocation(s) of hooked functions: code is never made writable, so calls made through them are not seen",
                            idx.text_references
                        );
                    push_bounded(&mut self.diag.text_relocations, (name, idx.text_references));
                }
                if idx.has_canonical_plt() {
                    self.canonical.push(idx.clone());
                }
                Some(idx)
            }
            Some(Err(e)) => {
                push_bounded(&mut self.diag.unreadable, e.to_string());
                hides = true;
                None
            }
        };
        self.hiding += usize::from(hides);
        let base = obj.base;
        self.known
            .get_or_insert_with(HashMap::default)
            .entry(base)
            .or_default()
            .push(Known {
                object: obj,
                index: index.clone(),
                link_map: 0,
                hides,
                arrived_with: Box::default(),
            });
        if link_map != 0 {
            self.learn_link_map(base, link_map);
        }
        index
    }

    /// Remember which link map the known object at `base` has (the last one admitted there).
    fn learn_link_map(&mut self, base: usize, link_map: usize) {
        if let Some(k) = self
            .known
            .as_mut()
            .and_then(|m| m.get_mut(&base))
            .and_then(|v| v.last_mut())
        {
            k.link_map = link_map;
            self.by_link_map
                .get_or_insert_with(HashMap::default)
                .insert(link_map, base);
        }
    }

    /// Forget an unloaded object: its cache entry and its journal entries (those slots no
    /// longer exist).
    pub(super) fn forget(&mut self, obj: &Arc<LoadedObject>) {
        if let Some(list) = self.known.as_mut().and_then(|m| m.get_mut(&obj.base)) {
            if let Some(pos) = list.iter().position(|k| Arc::ptr_eq(&k.object, obj)) {
                let k = list.swap_remove(pos);
                self.hiding = self.hiding.saturating_sub(usize::from(k.hides));
                if list.is_empty() {
                    self.known.as_mut().map(|m| m.remove(&obj.base));
                }
                if k.link_map != 0 {
                    if let Some(m) = &mut self.by_link_map {
                        if m.get(&k.link_map) == Some(&obj.base) {
                            m.remove(&k.link_map);
                        }
                    }
                }
                if k.index.as_ref().is_some_and(|i| i.has_canonical_plt()) {
                    self.canonical.retain(|c| !Arc::ptr_eq(&c.object, obj));
                }
            }
        }
        self.journal.forget_object(obj);
    }

    /// Sync the object cache with the loader's list: drop what was unloaded (and its journal
    /// entries), index what is new. Linear in the number of objects, and one walk of the list
    /// that copies only what is new (`elf::listing_unknown`): the known objects are recognised
    /// inside it. Returns the synced counters too.
    ///
    /// No new object is read unless something keeps it mapped: they are read from inside
    /// walks of the loader's list, under its lock, into storage reserved beforehand
    /// (`batch::index_listed`), not pinned by name, which costs O(N) each (glibc compares the
    /// name with every loaded one, and closing the pin of a dependency runs its unload pass
    /// over every object): two pins were a third of a two-object `dlopen` at N = 1,000. Those
    /// no walk could vouch for (not relocated yet, gone) are pinned by name, or left alone when
    /// they are gone.
    ///
    /// `want_all`: fill [`Synced::all`] (an install patches every object; a sync after a loader
    /// call only the new ones, and the known objects are then merely recognised). `now`: the
    /// loader's counters read just before (they size the room for new objects).
    pub(super) fn sync_cache(&mut self, want_all: bool, now: elf::LoadCounters) -> Synced {
        let known_count = self
            .known
            .as_ref()
            .map_or(0, |m| m.values().map(|v| v.len()).sum());
        // Room for the objects added since the last sync, and some (at most a few thousand:
        // each takes half a kilobyte of names); more make the walk start again with twice the
        // room.
        let added = now.adds.wrapping_sub(self.last_counters.adds);
        let mut room = (added.min(4096) as usize) + 16;
        // The known objects the walk saw, in list order: each one's load bias and place among
        // the known objects there. Reserved for every known object: nothing allocates inside.
        let mut seen: Vec<(usize, usize)> = Vec::with_capacity(known_count);
        let listing = loop {
            seen.clear();
            let known = &self.known;
            let found = elf::listing_unknown(room, &mut |base, name| {
                let Some(at) = known_at(known, base, name) else {
                    return false;
                };
                if seen.len() < seen.capacity() {
                    seen.push((base, at));
                    return true;
                }
                // A known object listed twice would be: copy it, as new (never happens).
                false
            });
            match found {
                Some(listing) => break listing,
                None => room = room.saturating_mul(2),
            }
        };
        // Read while the map is as the walk saw it (nothing is forgotten or entered before).
        let mut all: Vec<Arc<ObjectIndex>> = match (&self.known, want_all) {
            (Some(m), true) => seen
                .iter()
                .filter_map(|&(base, at)| m.get(&base)?.get(at)?.index.clone())
                .collect(),
            _ => Vec::new(),
        };
        let fresh: Vec<Arc<LoadedObject>> = (0..listing.len())
            .map(|i| Arc::new(listing.object(i)))
            .collect();
        let subs = listing.counters().subs;
        // Every known object listed again (the common case after a `dlopen`): none is gone.
        let gone: Vec<Arc<LoadedObject>> = if seen.len() == known_count {
            Vec::new()
        } else {
            let present: HashSet<(usize, usize)> = seen.iter().copied().collect();
            self.known
                .iter()
                .flatten()
                .flat_map(|(&base, at)| at.iter().enumerate().map(move |(i, k)| (base, i, k)))
                .filter(|(base, i, _)| !present.contains(&(*base, *i)))
                .map(|(.., k)| k.object.clone())
                .collect()
        };
        for g in &gone {
            self.forget(g);
        }
        // Each new object's link map, where glibc has registered it (it is relocated): the
        // `dlclose` that removes it can then be handled without a sync (`opened.rs`).
        // 0 where there is none (not relocated yet, gone, or a glibc before 2.35).
        let arrived: Vec<usize> = fresh
            .iter()
            .map(|o| registered_at(o).flatten().unwrap_or(0))
            .collect();
        let Admitted {
            new,
            pins,
            complete,
        } = self.admit_new(fresh, &arrived, subs, Reading::InWalks);
        all.extend(new.iter().cloned());
        Synced {
            all,
            new,
            pins,
            complete,
            counters: listing.counters(),
            arrived,
        }
    }

    /// Take objects new since the last sync into the cache: index each, or note why it is left
    /// alone. `link_maps[i]`: object `i`'s link map when known. `reading` says how they are
    /// read (see [`Reading`]); an object no walk could vouch for is pinned by name, and left
    /// alone when it is gone. `subs`: the loader's removal counter the objects were listed at.
    pub(super) fn admit_new(
        &mut self,
        fresh: Vec<Arc<LoadedObject>>,
        link_maps: &[usize],
        subs: u64,
        reading: Reading,
    ) -> Admitted {
        let exclude = if fresh.is_empty() {
            Vec::new()
        } else {
            exclude_list()
        };
        let readable: Vec<bool> = fresh
            .iter()
            .map(|o| skip_reason(o, &exclude).is_none())
            .collect();
        let in_walks = matches!(reading, Reading::InWalks);
        let mut walked: Vec<Option<Result<ObjectIndex>>> = match reading {
            Reading::Indexed(given) => given,
            _ => fresh.iter().map(|_| None).collect(),
        };
        if in_walks {
            let listed: Vec<Arc<LoadedObject>> = fresh
                .iter()
                .zip(&readable)
                .filter(|(_, r)| **r)
                .map(|(o, _)| o.clone())
                .collect();
            let mut read = batch::index_listed(&listed, &self.wanted, subs).into_iter();
            for (w, r) in walked.iter_mut().zip(&readable) {
                if *r {
                    *w = read.next().flatten();
                }
            }
        }
        let (mut new, mut pins, mut complete) = (Vec::new(), Vec::new(), true);
        for (i, ((obj, readable), walked)) in
            fresh.into_iter().zip(readable).zip(walked).enumerate()
        {
            let link_map = link_maps.get(i).copied().unwrap_or(0);
            let (index, pin) = if !readable {
                (self.admit(obj, link_map, &exclude), None)
            } else if let Some(built) = walked {
                (self.enter(obj, link_map, Some(built), false), None)
            } else {
                let Some(pin) = Pin::object(&obj) else {
                    // Gone already, or not reachable by name: never read it.
                    push_name_bounded(&mut self.diag.unpinnable, obj.display_name());
                    complete = false;
                    continue;
                };
                (self.admit(obj, link_map, &exclude), Some(pin))
            };
            match index {
                Some(idx) => {
                    new.push(idx);
                    pins.push(pin);
                }
                None => complete = false,
            }
        }
        Admitted {
            new,
            pins,
            complete,
        }
    }

    /// Whether the loader's changes can be handled now. Handling them allocates as it goes
    /// (the objects' indexes), and a failed allocation would abort the host: with memory short
    /// they are put off (counted, warned once), and since the synced counters do not move,
    /// the next loader call or sync picks them up.
    pub(super) fn room_to_sync(&mut self) -> bool {
        if crate::sys::memory::available(crate::sys::memory::LOADER_MARGIN) {
            return true;
        }
        self.diag.deferred_for_memory += 1;
        if self.diag.deferred_for_memory == 1 {
            crate::log!(
                crate::log::Level::Warn,
                "memory is short: libraries loaded from now on are patched once it is back"
            );
        }
        false
    }

    /// Patch objects loaded since the last sync until the loader's counters stop moving.
    pub(super) fn sync_until_stable(&mut self) -> usize {
        self.sync_until_stable_noting(None)
    }

    /// [`Self::sync_until_stable`], adding the link maps of the objects that arrived meanwhile
    /// to `arrived` (see [`Synced::arrived`]).
    pub(super) fn sync_until_stable_noting(
        &mut self,
        mut arrived: Option<&mut Vec<usize>>,
    ) -> usize {
        let mut patched = 0;
        for _ in 0..16 {
            let counters = elf::counters();
            if counters == self.last_counters || !self.room_to_sync() {
                break;
            }
            self.diag.rescans += 1;
            let done = self.sync(false, counters);
            patched += done.patched;
            if let Some(a) = arrived.as_deref_mut() {
                a.extend(done.arrived);
            }
        }
        patched
    }

    /// Sync with the loader's list: unloaded objects are forgotten, new ones indexed and
    /// patched with every installed set. Returns every known object (only when `want_all`:
    /// empty otherwise), the number of slots patched and what arrived. `now`: the loader's
    /// counters, just read.
    pub(super) fn sync(&mut self, want_all: bool, now: elf::LoadCounters) -> SyncDone {
        let Synced {
            all,
            new,
            pins,
            complete,
            counters,
            arrived,
        } = self.sync_cache(want_all, now);
        self.last_counters = counters;
        // Nothing to apply before the first set is installed.
        if self.sets.is_empty() {
            return SyncDone {
                all,
                patched: 0,
                arrived,
            };
        }
        let (new, pins): (Vec<_>, Vec<_>) = new
            .into_iter()
            .zip(pins)
            .filter(|(i, _)| matters(i))
            .unzip();
        let batch = Batch::with_pins(new, pins, self.last_counters.subs);
        let patched = self.patch_new(batch, complete);
        SyncDone {
            all,
            patched,
            arrived,
        }
    }
}
