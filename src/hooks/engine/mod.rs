//! The engine: installed hook sets, the journal, the object cache, and the operations that
//! patch and restore slots. One lock (the patch lock) serialises every operation.
//!
//! Rooms: `operation` (the lock, its fork handlers), `sync` (bringing the object cache up to
//! date with the loader's list), `sets` (adding, stacking and restoring hook sets), `patching`
//! (resolving originals, writing slots), `direct` (the common case of one object a `dlopen`
//! loaded, written without the planner). The public operations below are built from them.

mod direct;
mod opened;
mod operation;
mod patching;
mod sets;
mod sync;

use rustc_hash::FxHashMap as HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::elf::{self, IndexRoom, LoadCounters, LoadedObject, ObjectIndex, WantedNames};
use crate::patch::{Journal, JournalEntry};
use crate::{Error, Result};

use super::diagnostics::{push_bounded, Diagnostics, ForeignSlot};
use super::set::HookSet;

pub(crate) use operation::Operation;

/// A hook set as installed: its id, and how many `install` calls of the same set it stands for.
struct InstalledSet {
    id: u64,
    set: HookSet,
    refs: usize,
}

/// An object the engine has seen: indexed, or left alone (skipped, unreadable).
pub(super) struct Known {
    pub object: Arc<LoadedObject>,
    pub index: Option<Arc<ObjectIndex>>,
    /// Its `struct link_map`, once learnt (0 until then): what `dlclose` hands us.
    link_map: usize,
    /// Left unindexed (excluded, or unreadable) although it may define a hooked function: while
    /// such an object is loaded, new objects' patches look for every missing original.
    hides: bool,
    /// The link maps of the objects that arrived with this one in its `dlopen` (its new
    /// dependencies, and anything another thread loaded meanwhile), for the `dlclose` that
    /// removes them together (each confirmed gone before it is forgotten); empty for most.
    arrived_with: Box<[usize]>,
}

/// The known objects at one load bias: nearly always one (kept inline, no allocation per
/// object), several only while a reloaded object's old entry is still being replaced.
pub(crate) type KnownAt = smallvec::SmallVec<[Known; 1]>;

/// Everything the engine knows, behind the patch lock ([`Operation`]).
pub(crate) struct State {
    /// Installed sets, oldest first (a later set stacks on an earlier one's hooks).
    sets: Vec<InstalledSet>,
    /// Every slot written: where, what was there, which set wrote it (for restore and listings).
    pub(crate) journal: Journal,
    /// Every object seen in the loader's list, by load bias (then name).
    known: Option<HashMap<usize, KnownAt>>,
    /// link map → load bias of the known object, for `dlclose`.
    by_link_map: Option<HashMap<usize, usize>>,
    /// Indexes with canonical PLT imports (non-PIE executables), which every resolution checks.
    canonical: Vec<Arc<ObjectIndex>>,
    /// Known objects that hide what they define ([`Known::hides`]).
    hiding: usize,
    /// The loader's add/remove counters at the last sync: a change means the cache is stale.
    last_counters: LoadCounters,
    /// What the diagnostics report (skipped objects, conflicts, counters).
    pub(crate) diag: Diagnostics,
    /// The id the next installed set gets.
    next_id: u64,
    /// Installed sets or published originals changed: republish the dlsym substitution table.
    dirty: bool,
    /// Every symbol any set ever hooked: what object indexes cover.
    wanted: WantedNames,
    /// Storage new objects are indexed in, kept from one object to the next.
    room: IndexRoom,
}

static STATE: spin::Mutex<State> = spin::Mutex::new(State {
    sets: Vec::new(),
    journal: Journal::new(),
    known: None,
    by_link_map: None,
    canonical: Vec::new(),
    hiding: 0,
    last_counters: LoadCounters { adds: 0, subs: 0 },
    diag: Diagnostics::new(),
    next_id: 1,
    dirty: false,
    wanted: WantedNames::new(),
    room: IndexRoom::growable(),
});

/// The loader counters of the last sync, readable without the lock.
static SYNCED_ADDS: AtomicU64 = AtomicU64::new(u64::MAX);
static SYNCED_SUBS: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long an API call waits for another thread's operation. Bounded, so that a thread that
/// holds the dynamic loader's lock (a library destructor calling cuhook) while another thread's
/// operation waits for that lock gets `Busy` instead of both hanging.
pub(crate) const API_PATIENCE: Duration = Duration::from_secs(10);

fn busy() -> Error {
    Error::Busy
}

/// Name of the internal hook set: the loader interposers.
pub const DL_SET_NAME: &str = "cuhook-dl";

/// Install `set` into every loaded object; see [`crate::hooks::install`]. `loader_set` makes
/// the loader interposers' set (named [`DL_SET_NAME`]), installed with the first set.
pub(crate) fn install(set: &HookSet, loader_set: fn() -> HookSet) -> Result<u64> {
    if set.name == DL_SET_NAME {
        return Err(Error::InvalidHookSet {
            reason: format!(
                "the set name `{DL_SET_NAME}` is reserved for cuhook's loader interposers"
            ),
        });
    }
    let mut op = Operation::begin(Some(API_PATIENCE)).ok_or_else(busy)?;
    let st = op.state();
    if let Some(s) = st.sets.iter_mut().find(|s| s.set.same_as(set)) {
        s.refs += 1;
        return Ok(s.id);
    }
    let dl_set = loader_set();
    st.want(&dl_set);
    st.want(set);
    let all = st.sync(true, elf::counters()).all;
    // The loader interposers come with the first set, so later dlopens get patched too. Both
    // sets are applied in one batch: each object is pinned once.
    let mut ids = Vec::with_capacity(2);
    if !st.sets.iter().any(|s| s.set.name == DL_SET_NAME) {
        ids.push(st.add_set(dl_set));
    }
    let id = st.add_set(set.clone());
    ids.push(id);
    st.patch(&ids, &all);
    st.sync_until_stable();
    Ok(id)
}

/// Bring the engine in step with the loader: patch objects loaded since the last sync with every
/// installed set, forget objects that were unloaded. Cheap when nothing changed (one
/// `dl_iterate_phdr` step, no lock). `patience`: how long to wait for a busy engine.
pub(crate) fn sync(patience: Option<Duration>) -> Result<usize> {
    if loader_changed().is_none() {
        return Ok(0);
    }
    let Some(mut op) = Operation::begin(patience) else {
        if let Some(mut st) = STATE.try_lock() {
            st.diag.deferred_scans += 1;
        }
        return Err(busy());
    };
    Ok(op.state().sync_until_stable())
}

/// After a successful `dlopen` that returned `handle`: like [`sync`], but when the loader's
/// counters say exactly one object was added since the last sync and `handle`'s object is
/// unknown, that object is the new one: it is described through the handle and patched
/// while the handle pins it, without walking the list of loaded objects or pinning by name.
/// `now`: the loader's counters, as [`loader_changed`] returned them.
///
/// # Safety
/// `handle` must be the live handle the real `dlopen` just returned, not yet handed to the
/// caller (so nobody can close it meanwhile).
#[allow(unsafe_code)]
#[inline(never)]
pub(crate) unsafe fn sync_opened(
    handle: *mut c_void,
    now: LoadCounters,
    patience: Option<Duration>,
) -> Result<usize> {
    let mut op = Operation::begin(patience).ok_or_else(busy)?;
    // SAFETY: forwarded from the caller.
    Ok(unsafe { op.state().sync_opened(handle, now) })
}

/// After a successful `dlclose(handle)`: like [`sync`], but when exactly one object was
/// removed since the last sync and it is the known object of `handle`, and glibc confirms that
/// nothing is mapped there any more, only that object is forgotten (no walk). `now`: as for
/// [`sync_opened`].
#[inline(never)]
pub(crate) fn sync_closed(
    handle: *mut c_void,
    now: LoadCounters,
    patience: Option<Duration>,
) -> Result<usize> {
    let mut op = Operation::begin(patience).ok_or_else(busy)?;
    Ok(op.state().sync_closed(handle as usize, now))
}

/// The loader's counters now, if something was loaded or unloaded since the last sync; `None`
/// when nothing was (no lock, no allocation). Inlined into the loader interposers, so that a
/// `dlopen` or `dlclose` that changed nothing (an already-loaded library) costs this and
/// nothing more: the engine's entry points, with their large frames, are not called.
#[inline]
pub(crate) fn loader_changed() -> Option<LoadCounters> {
    let now = elf::counters();
    let same = now.adds == SYNCED_ADDS.load(Ordering::Acquire)
        && now.subs == SYNCED_SUBS.load(Ordering::Acquire);
    (!same).then_some(now)
}

/// Record that `object` was opened into another namespace and is not patched.
pub(crate) fn note_other_namespace(object: String, patience: Option<Duration>) {
    if let Some(mut op) = Operation::begin(patience) {
        push_bounded(&mut op.state().diag.other_namespaces, object);
    }
}

/// Result of an uninstall.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallReport {
    /// Slots put back to their pre-install value.
    pub restored: usize,
    /// Slots that held someone else's value and were left alone.
    pub foreign: Vec<ForeignSlot>,
    /// Slots in objects that were unloaded meanwhile (nothing to write).
    pub gone: usize,
    /// Slots that could not be written (page protection could not be changed); see the
    /// diagnostics.
    pub failed: usize,
    /// The set is still installed by other installations (install was called more than once).
    pub still_referenced: bool,
}

pub(crate) fn uninstall(id: u64) -> Result<UninstallReport> {
    let mut op = Operation::begin(Some(API_PATIENCE)).ok_or_else(busy)?;
    let st = op.state();
    let pos = st
        .sets
        .iter()
        .position(|s| s.id == id && s.set.name != DL_SET_NAME)
        .ok_or(Error::NotInstalled)?;
    st.sets[pos].refs -= 1;
    if st.sets[pos].refs > 0 {
        return Ok(UninstallReport {
            still_referenced: true,
            ..Default::default()
        });
    }
    let removed = st.sets.remove(pos);
    st.unstack(id, &removed.set);
    let report = st.restore(id)?;
    // The loader interposers leave with the last set.
    if st.sets.iter().all(|s| s.set.name == DL_SET_NAME) {
        if let Some(dl) = st.sets.iter().position(|s| s.set.name == DL_SET_NAME) {
            let dl_id = st.sets.remove(dl).id;
            st.restore(dl_id)?;
        }
    }
    // Dropping our pins may have been the last reference of an object closed meanwhile.
    st.sync_until_stable();
    Ok(report)
}

impl State {
    /// Every live patch.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &JournalEntry> + '_ {
        self.journal.entries()
    }

    pub(crate) fn set_name(&self, id: u64) -> Option<&str> {
        self.sets.iter().find(|s| s.id == id).map(|s| s.set.name())
    }
}
/// Read-only access for listings.
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    let mut op = Operation::begin(Some(API_PATIENCE))?;
    Some(f(op.state()))
}
