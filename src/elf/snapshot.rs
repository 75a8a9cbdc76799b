//! A copy of the loader's list of objects, taken with `dl_iterate_phdr`.
//!
//! What the walk shows is valid only during it, so each object is copied into storage reserved
//! *before* the walk: nothing allocates while the loader's lock is held (UCX #3517 deadlocked
//! doing otherwise). [`listed_after`] reads the public `l_next` links of the loader's list from
//! inside its walk (where the list cannot change): its one `unsafe` block.

use std::ops::ControlFlow;
use std::sync::Arc;

use libc::Elf64_Phdr;

use super::loaded::{kept, path_text, LoadedObject};
use crate::sys::dl::{self, Listed};

/// The loaded objects at one moment, with the loader's add/remove counters of that moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub objects: Vec<Arc<LoadedObject>>,
    pub counters: LoadCounters,
}

/// `dlpi_adds` / `dlpi_subs`: how many objects were ever added to / removed from the process.
/// Equal counters mean the list did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadCounters {
    pub adds: u64,
    pub subs: u64,
}

/// Raw facts copied out of the callback.
#[derive(Clone, Copy)]
struct RawEntry {
    /// Position in the loader's list.
    position: usize,
    base: usize,
    name_off: usize,
    name_len: usize,
    phdr_off: usize,
    phnum: usize,
}

/// Storage reserved before the walk; the callback only pushes within capacity.
struct Collector {
    entries: Vec<RawEntry>,
    names: Vec<u8>,
    phdrs: Vec<Elf64_Phdr>,
    counters: LoadCounters,
    overflow: bool,
    /// Objects the walk listed (copied or not).
    listed: usize,
}

impl Collector {
    /// Storage for `objects` objects whose names and program headers take at most these.
    fn with_room(objects: usize, name_bytes: usize, phdrs: usize) -> Collector {
        Collector {
            entries: Vec::with_capacity(objects),
            names: Vec::with_capacity(name_bytes),
            phdrs: Vec::with_capacity(phdrs),
            counters: LoadCounters::default(),
            overflow: false,
            listed: 0,
        }
    }

    /// Entry `position`'s name as the loader spelled it.
    fn name(&self, e: &RawEntry) -> &[u8] {
        &self.names[e.name_off..e.name_off + e.name_len]
    }
}

/// The loader's list as one walk copied it, not yet made into [`LoadedObject`]s: a sync
/// compares each entry with the objects it knows and builds objects only for the new ones (a
/// process with a thousand libraries otherwise allocated and freed three times per library on
/// every `dlopen` it could not handle from the opened object).
pub struct Listing {
    c: Collector,
}

impl Listing {
    /// The loader's add/remove counters when the list was copied.
    pub fn counters(&self) -> LoadCounters {
        self.c.counters
    }

    /// How many objects were copied (all listed ones, or those [`listing_unknown`] did not
    /// recognise).
    pub fn len(&self) -> usize {
        self.c.entries.len()
    }

    /// Whether none was copied.
    pub fn is_empty(&self) -> bool {
        self.c.entries.is_empty()
    }

    /// Copied object `i` (not necessarily at position `i` of the loader's list: see
    /// [`LoadedObject::position`]) as a [`LoadedObject`].
    pub fn object(&self, i: usize) -> LoadedObject {
        let e = &self.c.entries[i];
        LoadedObject {
            base: e.base,
            name: path_text(self.c.name(e)),
            phdrs: self.c.phdrs[e.phdr_off..e.phdr_off + e.phnum].to_vec(),
            position: e.position,
        }
    }
}

/// Sizes measured by a counting walk.
#[derive(Default)]
struct Sizes {
    objects: usize,
    name_bytes: usize,
    phdrs: usize,
}

/// Copy one listed object into the reserved storage; `Break` when it does not fit.
fn collect(c: &mut Collector, o: &Listed<'_>) -> ControlFlow<()> {
    note_counters(c, o);
    let position = c.listed;
    c.listed += 1;
    let name = o.name();
    let phdrs = o.program_headers();
    let fits = c.entries.len() < c.entries.capacity()
        && c.names.capacity() - c.names.len() >= name.len()
        && c.phdrs.capacity() - c.phdrs.len() >= phdrs.len();
    if !fits {
        c.overflow = true;
        return ControlFlow::Break(());
    }
    let phdr_off = c.phdrs.len();
    c.phdrs.extend(phdrs.iter().filter(|p| kept(p)).copied());
    c.entries.push(RawEntry {
        position,
        base: o.info.dlpi_addr as usize,
        name_off: c.names.len(),
        name_len: name.len(),
        phdr_off,
        phnum: c.phdrs.len() - phdr_off,
    });
    c.names.extend_from_slice(name);
    ControlFlow::Continue(())
}

/// The loader's counters, read at the walk's first object (every object of one walk shows the
/// same).
fn note_counters(c: &mut Collector, o: &Listed<'_>) {
    if c.listed == 0 && o.has_counters {
        c.counters = LoadCounters {
            adds: o.info.dlpi_adds,
            subs: o.info.dlpi_subs,
        };
    }
}

/// The loader's add/remove counters: a cheap "did anything change" test.
pub fn counters() -> LoadCounters {
    let mut out = LoadCounters::default();
    let _ = dl::iterate(&mut |o: &Listed<'_>| {
        if o.has_counters {
            out = LoadCounters {
                adds: o.info.dlpi_adds,
                subs: o.info.dlpi_subs,
            };
        }
        ControlFlow::Break(())
    });
    out
}

/// Copy the loader's list of objects.
pub fn snapshot() -> Snapshot {
    let listing = listing();
    Snapshot {
        objects: (0..listing.len())
            .map(|i| Arc::new(listing.object(i)))
            .collect(),
        counters: listing.counters(),
    }
}

/// Copy the loader's whole list, leaving the objects to be built on demand ([`Listing`]).
fn listing() -> Listing {
    loop {
        let mut sizes = Sizes::default();
        let _ = dl::iterate(&mut |o: &Listed<'_>| {
            sizes.objects += 1;
            sizes.name_bytes += o.name().len();
            sizes.phdrs += o.info.dlpi_phnum as usize;
            ControlFlow::Continue(())
        });
        // Slack absorbs objects loaded between the two walks; on overflow we simply retry.
        let mut c = Collector::with_room(
            sizes.objects + 16,
            sizes.name_bytes + 16 * 256,
            sizes.phdrs + 16 * 16,
        );
        let _ = dl::iterate(&mut |o: &Listed<'_>| collect(&mut c, o));
        if !c.overflow {
            return Listing { c };
        }
    }
}

/// Copy the objects of the loader's list that `known` does not recognise, for a sync (which
/// only looks at the others): one walk, copying nothing of a known object. `known(base, name)`
/// runs inside the walk for each listed object (the walk's rules hold: no allocation, lock or
/// loader call) and says whether the caller knows it. `room`: how many
/// unknown objects to make room for. `None` when more came (the caller makes more room and
/// walks again, undoing what `known` noted).
pub fn listing_unknown(
    room: usize,
    known: &mut dyn FnMut(usize, &[u8]) -> bool,
) -> Option<Listing> {
    let mut c = Collector::with_room(room, room * UNKNOWN_NAME_BYTES, room * UNKNOWN_PHDRS);
    // As for a snapshot, a walk that stopped early (a panic inside it) gives what it copied.
    let _ = dl::iterate(&mut |o: &Listed<'_>| {
        if known(o.info.dlpi_addr as usize, o.name()) {
            note_counters(&mut c, o);
            c.listed += 1;
            return ControlFlow::Continue(());
        }
        collect(&mut c, o)
    });
    (!c.overflow).then_some(Listing { c })
}

/// Room per unknown object [`listing_unknown`] reserves for its name and program headers (a
/// longer name or more headers make it walk again with more room).
const UNKNOWN_NAME_BYTES: usize = 512;
const UNKNOWN_PHDRS: usize = 16;

/// Room per object for [`listed_after`]'s copies: a longer name or more program headers make
/// it give up (the caller then takes a whole snapshot).
const AFTER_NAME_BYTES: usize = 1024;
const AFTER_PHDRS: usize = 24;

/// The `count` objects the loader lists right after the object whose `struct link_map` is
/// `link_map`, each with its link map, when they end that namespace's list (what one `dlopen`
/// added after the object it opened: its new dependencies). Copied inside one walk, which
/// reads nothing but the loader's public list and the entries themselves, so the cost does not
/// grow with what else is loaded beyond the walk's step per object. `work(i, object)` runs
/// inside that walk for each object as soon as it is copied (the object stays mapped while it
/// runs; the walk's rules hold: no allocation, lock or loader call). `None` when the list does
/// not end with exactly `count` objects after it, an object was removed since the loader's
/// removal counter read `subs`, or a copy does not fit the room reserved for it.
///
/// # Safety
/// `link_map` is the link map of an object that stays loaded while this runs (a handle the
/// caller holds).
#[allow(unsafe_code)]
pub unsafe fn listed_after(
    link_map: usize,
    count: usize,
    subs: u64,
    work: &mut dyn FnMut(usize, &LoadedObject),
) -> Option<Vec<(LoadedObject, usize)>> {
    let mut chain: Vec<dl::Next> = Vec::with_capacity(count);
    let mut objects: Vec<LoadedObject> = (0..count)
        .map(|_| LoadedObject {
            base: 0,
            name: String::with_capacity(AFTER_NAME_BYTES),
            phdrs: Vec::with_capacity(AFTER_PHDRS),
            position: LoadedObject::UNKNOWN_POSITION,
        })
        .collect();
    let (mut listed, mut copied) = (None, 0);
    let _ = dl::iterate(&mut |o: &Listed<'_>| {
        if listed.is_none() {
            // SAFETY: inside the walk, with the caller's object pinned (this function's
            // contract); `chain` has room for `count`.
            let ok = o.has_counters
                && o.info.dlpi_subs == subs
                && unsafe { dl::listed_after(link_map as *const dl::LinkMap, count, &mut chain) };
            listed = Some(ok);
            if !ok {
                return ControlFlow::Break(());
            }
        }
        let Some(next) = chain.get(copied) else {
            return ControlFlow::Break(());
        };
        // The walk passes each entry's own name pointer: the same entry, not a namesake.
        if o.info.dlpi_addr as usize != next.base || o.info.dlpi_name != next.name {
            return ControlFlow::Continue(());
        }
        let obj = &mut objects[copied];
        let name = std::str::from_utf8(o.name()).ok();
        let phdrs = o.program_headers().iter().filter(|p| kept(p));
        let fits = name.is_some_and(|n| n.len() <= obj.name.capacity())
            && phdrs.clone().count() <= obj.phdrs.capacity();
        if !fits {
            return ControlFlow::Break(());
        }
        // Within the capacities reserved above: nothing allocates.
        obj.base = next.base;
        obj.name.push_str(name.unwrap_or_default());
        obj.phdrs.extend(phdrs.copied());
        work(copied, obj);
        copied += 1;
        if copied == count {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if listed != Some(true) || copied != count {
        return None;
    }
    Some(
        objects
            .into_iter()
            .zip(chain.iter().map(|n| n.map))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_unknown_copies_only_what_the_caller_does_not_know() {
        let all = snapshot();
        let libc_at = all
            .objects
            .iter()
            .position(|o| o.name.contains("libc.so"))
            .expect("libc listed");
        // Everything known but libc: only libc is copied, with its position in the list.
        let mut asked = 0;
        let listing = listing_unknown(4, &mut |base, name| {
            let o = &all.objects[asked];
            asked += 1;
            assert!(o.is(base, name), "position {} is {o:?}", asked - 1);
            asked - 1 != libc_at
        })
        .expect("room for one");
        assert_eq!(asked, all.objects.len());
        assert_eq!(listing.len(), 1);
        let libc = listing.object(0);
        assert_eq!(libc.position, libc_at);
        assert_eq!(libc.name, all.objects[libc_at].name);
        assert_eq!(libc.phdrs.len(), all.objects[libc_at].phdrs.len());
        assert_eq!(listing.counters(), all.counters);
        // Nothing known, room for one: the walk asks for more room.
        assert!(listing_unknown(1, &mut |_, _| false).is_none());
        let every = listing_unknown(all.objects.len() + 1, &mut |_, _| false).expect("room");
        assert_eq!(every.len(), all.objects.len());
    }

    #[test]
    fn snapshot_lists_main_program_and_libc() {
        let snap = snapshot();
        assert!(snap.objects.len() >= 3, "{:?}", snap.objects.len());
        assert_eq!(snap.objects[0].position, 0);
        let main_fn = snapshot as *const () as usize;
        assert!(
            snap.objects.iter().any(|o| o.contains(main_fn)),
            "no object contains our own code"
        );
        assert!(snap.objects.iter().any(|o| o.name.contains("libc.so")));
        assert!(snap.counters.adds >= snap.objects.len() as u64);
        assert_eq!(counters(), snap.counters);
    }
}
