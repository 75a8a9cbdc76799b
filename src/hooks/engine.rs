//! The engine: installed hook sets, the journal, the object cache, and the operations that
//! patch and restore slots. One lock (the patch lock) serialises every operation.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::elf::{self, Counters, LoadedObject, ObjectIndex, Slot};
use crate::patch::{
    compare_and_write, Journal, JournalEntry, LeftWritable, ProtectionMap, SlotWrite, WriteFailure,
};
use crate::{Error, Result};

use super::batch::{self, Batch};
use super::diagnostics::{push_bounded, Conflict, Diagnostics, ForeignSlot};
use super::interpose::{dl_hook_set, publish, DL_SET_NAME};
use super::loader::{clear_dlerror, object_at, Pin};
use super::resolver::{matters, Resolver};
use super::set::{Hook, HookSet};
use super::skip::{exclude_list, skip_reason};

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
}

pub(crate) struct State {
    sets: Vec<InstalledSet>,
    pub(crate) journal: Journal,
    /// Every object seen in the loader's list, by load bias (then name).
    known: Option<HashMap<usize, Vec<Known>>>,
    /// link map → load bias of the known object, for `dlclose`.
    by_link_map: Option<HashMap<usize, usize>>,
    /// Indexes with canonical PLT imports (non-PIE executables), which every resolution checks.
    canonical: Vec<Arc<ObjectIndex>>,
    last_counters: Counters,
    pub(crate) diag: Diagnostics,
    next_id: u64,
    /// Installed sets or published originals changed: republish the dlsym substitution table.
    dirty: bool,
    /// Every symbol any set ever hooked (sorted): what object indexes cover.
    wanted: Vec<Vec<u8>>,
}

static STATE: spin::Mutex<State> = spin::Mutex::new(State {
    sets: Vec::new(),
    journal: Journal::new(),
    known: None,
    by_link_map: None,
    canonical: Vec::new(),
    last_counters: Counters { adds: 0, subs: 0 },
    diag: Diagnostics::new(),
    next_id: 1,
    dirty: false,
    wanted: Vec::new(),
});

/// The loader counters of the last scan, readable without the lock.
static SCANNED_ADDS: AtomicU64 = AtomicU64::new(u64::MAX);
static SCANNED_SUBS: AtomicU64 = AtomicU64::new(u64::MAX);

thread_local! {
    /// Set while this thread runs an engine operation: loader calls made by the operation (and
    /// constructors or destructors they run) must not start another one.
    static IN_OPERATION: Cell<bool> = const { Cell::new(false) };
}

/// Exclusive access to the engine for one operation.
pub(crate) struct Operation {
    guard: spin::MutexGuard<'static, State>,
}

/// The fork handlers took the patch lock (and the dlsym table's) for the fork.
static HELD_FOR_FORK: AtomicBool = AtomicBool::new(false);
/// In a child: the patch lock was inherited held by a thread that does not exist here (the
/// fork handlers could not take it in time), so no operation can ever run.
static ORPHANED: AtomicBool = AtomicBool::new(false);
/// How long the fork handler waits for a running operation to end. Operations are short; only
/// a fork from a thread holding the loader lock (a constructor) while an operation waits for
/// that lock reaches it.
const FORK_PATIENCE: Duration = Duration::from_secs(5);

/// Install the fork handlers (once per process), so that a child never inherits the patch lock
/// held by a thread that does not exist in it.
fn protect_fork() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: plain `extern "C"` handlers that never unwind.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::pthread_atfork(Some(prepare_fork), Some(after_fork), Some(after_fork_child))
        };
        if rc != 0 {
            crate::log!(
                crate::log::Level::Warn,
                "pthread_atfork failed ({rc}): a fork during a hook install may leave the child unable to patch"
            );
        }
    });
}

/// Before a fork: wait for a running operation to end and hold the lock across the fork (the
/// child then starts with a consistent engine). Not when this thread is inside an operation:
/// it lives on in the child and finishes it there.
extern "C" fn prepare_fork() {
    if IN_OPERATION.with(|f| f.get()) {
        return;
    }
    let start = Instant::now();
    loop {
        if let Some(guard) = STATE.try_lock() {
            std::mem::forget(guard);
            super::interpose::hold_for_fork();
            HELD_FOR_FORK.store(true, Ordering::Release);
            return;
        }
        if start.elapsed() >= FORK_PATIENCE {
            return;
        }
        std::thread::yield_now();
    }
}

/// After a fork, in the parent: release what `prepare_fork` took.
extern "C" fn after_fork() {
    if HELD_FOR_FORK.swap(false, Ordering::AcqRel) {
        // SAFETY: `prepare_fork` took both locks on this thread just before the fork.
        #[allow(unsafe_code)]
        unsafe {
            super::interpose::release_after_fork();
            STATE.force_unlock();
        }
    }
}

/// After a fork, in the child: as in the parent; a lock the handler could not take belongs to
/// a thread that is gone, so the engine refuses operations instead of waiting forever.
extern "C" fn after_fork_child() {
    let held = HELD_FOR_FORK.load(Ordering::Acquire);
    if !held && STATE.is_locked() && !IN_OPERATION.with(|f| f.get()) {
        ORPHANED.store(true, Ordering::Release);
    }
    after_fork();
}

impl Operation {
    /// Wait for the patch lock; `None` on this thread's re-entry or after `patience` elapsed.
    pub(crate) fn begin(patience: Option<Duration>) -> Option<Operation> {
        if IN_OPERATION.with(|f| f.get()) || ORPHANED.load(Ordering::Acquire) {
            return None;
        }
        protect_fork();
        let guard = match STATE.try_lock() {
            Some(g) => g,
            None => {
                let start = Instant::now();
                loop {
                    std::thread::yield_now();
                    if let Some(g) = STATE.try_lock() {
                        break g;
                    }
                    if patience.is_some_and(|p| start.elapsed() >= p) {
                        return None;
                    }
                }
            }
        };
        IN_OPERATION.with(|f| f.set(true));
        Some(Operation { guard })
    }

    pub(crate) fn state(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        if std::mem::take(&mut self.guard.dirty) {
            publish(self.guard.sets.iter().map(|s| &s.set));
        }
        let c = self.guard.last_counters;
        SCANNED_ADDS.store(c.adds, Ordering::Release);
        SCANNED_SUBS.store(c.subs, Ordering::Release);
        clear_dlerror();
        IN_OPERATION.with(|f| f.set(false));
    }
}

/// Up to this many new objects found by one scan are pinned by name before they are read; more
/// are read from inside walks of the loader's list.
const PIN_BEFORE_INDEX: usize = 64;

/// How long an API call waits for another thread's operation. Bounded, so that a thread that
/// holds the dynamic loader's lock (a library destructor calling cuhook) while another thread's
/// operation waits for that lock gets `Busy` instead of both hanging.
const API_PATIENCE: Duration = Duration::from_secs(10);

fn busy() -> Error {
    Error::Busy
}

/// Install `set` into every loaded object; see [`crate::hooks::install`].
pub(crate) fn install(set: &HookSet) -> Result<u64> {
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
    let dl_set = dl_hook_set();
    st.want(&dl_set);
    st.want(set);
    let (all, _) = st.sync();
    // The loader interposers come with the first set, so later dlopens get patched too. Both
    // sets are applied in one batch: each object is pinned once.
    let mut ids = Vec::with_capacity(2);
    if !st.sets.iter().any(|s| s.set.name == DL_SET_NAME) {
        ids.push(st.add_set(dl_set));
    }
    let id = st.add_set(set.clone());
    ids.push(id);
    st.patch(&ids, &all);
    st.catch_up();
    Ok(id)
}

/// Bring the engine in step with the loader: patch objects loaded since the last scan with every
/// installed set, forget objects that were unloaded. Cheap when nothing changed (one
/// `dl_iterate_phdr` step, no lock). `patience`: how long to wait for a busy engine.
pub(crate) fn rescan(patience: Option<Duration>) -> Result<usize> {
    if unchanged() {
        return Ok(0);
    }
    let Some(mut op) = Operation::begin(patience) else {
        if let Some(mut st) = STATE.try_lock() {
            st.diag.deferred_scans += 1;
        }
        return Err(busy());
    };
    Ok(op.state().catch_up())
}

/// After a successful `dlopen` that returned `handle`: like [`rescan`], but when the loader's
/// counters say exactly one object was added since the last scan and `handle`'s object is
/// unknown, that object is the new one: it is described through the handle and patched
/// while the handle pins it, without walking the list of loaded objects or pinning by name.
///
/// # Safety
/// `handle` must be the live handle the real `dlopen` just returned, not yet handed to the
/// caller (so nobody can close it meanwhile).
#[allow(unsafe_code)]
pub(crate) unsafe fn rescan_opened(
    handle: *mut c_void,
    patience: Option<Duration>,
) -> Result<usize> {
    if unchanged() {
        return Ok(0);
    }
    let mut op = Operation::begin(patience).ok_or_else(busy)?;
    // SAFETY: forwarded from the caller.
    Ok(unsafe { op.state().opened(handle) })
}

/// After a successful `dlclose(handle)`: like [`rescan`], but when exactly one object was
/// removed since the last scan and it is the known object of `handle`, and glibc confirms that
/// nothing is mapped there any more, only that object is forgotten (no walk).
pub(crate) fn rescan_closed(handle: *mut c_void, patience: Option<Duration>) -> Result<usize> {
    if unchanged() {
        return Ok(0);
    }
    let mut op = Operation::begin(patience).ok_or_else(busy)?;
    Ok(op.state().closed(handle as usize))
}

/// Nothing was loaded or unloaded since the last scan (no lock, no allocation).
fn unchanged() -> bool {
    let now = elf::counters();
    now.adds == SCANNED_ADDS.load(Ordering::Acquire)
        && now.subs == SCANNED_SUBS.load(Ordering::Acquire)
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
    st.catch_up();
    Ok(report)
}

/// One slot write decided before any write is made.
struct Plan<'h> {
    set_id: u64,
    /// Position of the object in its batch.
    object: usize,
    hook: &'h Hook,
    slot: Slot,
    expected: usize,
    original: usize,
}

impl State {
    /// Make object indexes cover the symbols of `set`; indexes built without them are dropped
    /// (and rebuilt by the next refresh).
    fn want(&mut self, set: &HookSet) {
        let mut grew = false;
        for h in set.hooks() {
            let name = h.symbol().as_bytes();
            if let Err(at) = self.wanted.binary_search_by(|w| w.as_slice().cmp(name)) {
                self.wanted.insert(at, name.to_vec());
                grew = true;
            }
        }
        if grew {
            self.known = None;
            self.by_link_map = None;
            self.canonical.clear();
        }
    }

    fn add_set(&mut self, set: HookSet) -> u64 {
        self.dirty = true;
        let id = self.next_id;
        self.next_id += 1;
        self.sets.push(InstalledSet { id, set, refs: 1 });
        id
    }

    /// The replacement at the top of the stack of installed hooks on `symbol` that starts at
    /// `definition`: each set installed later on the same symbol calls the one below it.
    fn top_of_stack(&self, set_id: u64, hook: &Hook, definition: usize) -> usize {
        let mut top = definition;
        // Each step moves to another set; a chain cannot be longer than the set list.
        for _ in 0..self.sets.len() {
            let above = self.sets.iter().filter(|s| s.id != set_id).find_map(|s| {
                s.set
                    .hooks
                    .iter()
                    .find(|h| {
                        h.symbol() == hook.symbol()
                            && h.version() == hook.version()
                            && h.original.get() == top
                            && top != 0
                            && self.journal.has_symbol(s.id, h.symbol())
                    })
                    .map(|h| h.replacement)
            });
            match above {
                Some(r) if r != top => top = r,
                _ => break,
            }
        }
        top
    }

    /// Take a leaving set out of the stacks it is part of: a set above it (whose hooks call
    /// this set's replacement) now calls what this set called, and its slots written over this
    /// set's replacement put that back at uninstall. Those slots are handed over (never
    /// restored by this set, which would find them changed and report them foreign).
    fn unstack(&mut self, set_id: u64, leaving: &HookSet) {
        let mut handed_over = HashSet::new();
        for h in leaving.hooks.iter() {
            let below = h.original.get();
            if h.replacement == 0 || below == 0 {
                continue;
            }
            for s in &self.sets {
                for above in s.set.hooks.iter() {
                    if above.symbol() == h.symbol()
                        && above.version() == h.version()
                        && above.original.get() == h.replacement
                    {
                        above.original.set(below);
                        self.dirty = true;
                        handed_over.extend(self.journal.reroute(s.id, h.replacement, below));
                    }
                }
            }
        }
        if !handed_over.is_empty() {
            for e in self.journal.take_set(set_id) {
                if !handed_over.contains(&e.address) {
                    self.journal.record(e);
                }
            }
        }
    }

    /// Put back every slot journaled for `set_id` (compare-and-swap), in objects still loaded.
    fn restore(&mut self, set_id: u64) -> Result<UninstallReport> {
        self.dirty = true;
        let entries = self.journal.take_set(set_id);
        let snap = elf::snapshot();
        let loaded: HashSet<(usize, &str)> = snap
            .objects
            .iter()
            .map(|o| (o.base, o.name.as_str()))
            .collect();
        // One pin per object (entries share their object's `Arc`); `None`: gone or unpinnable.
        let mut pins: HashMap<usize, Option<Pin>> = HashMap::new();
        let mut report = UninstallReport::default();
        let mut writable = Vec::new();
        for e in entries {
            let pinned = pins
                .entry(Arc::as_ptr(&e.object) as usize)
                .or_insert_with(|| {
                    if loaded.contains(&(e.object.base, e.object.name.as_str())) {
                        Pin::object(&e.object)
                    } else {
                        None
                    }
                })
                .is_some();
            if pinned {
                writable.push(e);
            } else {
                report.gone += 1;
            }
        }
        let maps = match ProtectionMap::for_addresses(writable.iter().map(|e| e.address)) {
            Ok(m) => m,
            Err(e) => {
                // Nothing was written: keep the entries, so a later uninstall can retry.
                for entry in writable {
                    self.journal.record(entry);
                }
                return Err(e);
            }
        };
        for e in writable {
            // SAFETY: the object is pinned and the slot was an aligned GOT slot when we patched
            // it; we hold the patch lock.
            #[allow(unsafe_code)]
            let outcome = unsafe {
                compare_and_write(&maps, e.object.display_name(), e.address, e.new, e.old)
            };
            match outcome {
                // One slot failing must not strand the others: report it and go on.
                Err(err) => {
                    push_bounded(&mut self.diag.unreadable, err.to_string());
                    report.failed += 1;
                }
                Ok(SlotWrite::Written { .. }) => report.restored += 1,
                Ok(SlotWrite::Mismatch { actual }) => {
                    let f = ForeignSlot {
                        object: e.object.display_name().to_owned(),
                        symbol: e.symbol.to_string(),
                        address: e.address,
                        found: actual,
                        ours: e.new,
                    };
                    push_bounded(&mut self.diag.foreign, f.clone());
                    report.foreign.push(f);
                }
            }
        }
        drop(pins);
        Ok(report)
    }

    /// The known object with this load bias and name.
    fn find_known(&self, base: usize, name: &str) -> Option<&Known> {
        self.known
            .as_ref()?
            .get(&base)?
            .iter()
            .find(|k| k.object.name == name)
    }

    /// Take a new object into the cache: index it, or note why it is left alone. Returns its
    /// index when it has one.
    fn admit(
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
            return self.enter(obj, link_map, None);
        }
        let built = ObjectIndex::build(obj.clone(), Some(&self.wanted));
        self.enter(obj, link_map, Some(built))
    }

    /// Take a new object into the cache with its index as built (`None`: left alone on
    /// purpose), noting what the diagnostics report about it. Returns its index when it has one.
    fn enter(
        &mut self,
        obj: Arc<LoadedObject>,
        link_map: usize,
        built: Option<Result<ObjectIndex>>,
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
                None
            }
        };
        let base = obj.base;
        self.known
            .get_or_insert_with(HashMap::new)
            .entry(base)
            .or_default()
            .push(Known {
                object: obj,
                index: index.clone(),
                link_map: 0,
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
                .get_or_insert_with(HashMap::new)
                .insert(link_map, base);
        }
    }

    /// Forget an unloaded object: its cache entry and its journal entries (those slots no
    /// longer exist).
    fn forget(&mut self, obj: &Arc<LoadedObject>) {
        if let Some(list) = self.known.as_mut().and_then(|m| m.get_mut(&obj.base)) {
            if let Some(pos) = list.iter().position(|k| Arc::ptr_eq(&k.object, obj)) {
                let k = list.swap_remove(pos);
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

    /// Sync the object cache with the loader's list (a snapshot whose removal counter was
    /// `subs`): drop what was unloaded (and its journal entries), index what is new. Linear in
    /// the number of objects. Returns (all, new, and the pins taken for the new ones).
    ///
    /// No new object is read unless something keeps it mapped. A few (a `dlopen`'s catch-up)
    /// are pinned by name first. Many (the first install into a big process) are read from
    /// inside walks of the loader's list, under its lock, into storage reserved beforehand
    /// (`batch::index_listed`): pinning each by name would cost O(N²). Those no walk could
    /// vouch for are pinned by name, or left alone when they are gone.
    #[allow(clippy::type_complexity)]
    fn refresh(
        &mut self,
        objects: &[Arc<LoadedObject>],
        subs: u64,
    ) -> (
        Vec<Arc<ObjectIndex>>,
        Vec<Arc<ObjectIndex>>,
        Vec<Option<Pin>>,
    ) {
        let mut present: HashSet<usize> = HashSet::with_capacity(objects.len());
        let (mut all, mut fresh) = (Vec::new(), Vec::new());
        for obj in objects {
            if let Some(k) = self.find_known(obj.base, &obj.name) {
                present.insert(Arc::as_ptr(&k.object) as usize);
                all.extend(k.index.clone());
            } else {
                fresh.push(obj.clone());
            }
        }
        let gone: Vec<Arc<LoadedObject>> = self
            .known
            .iter()
            .flat_map(|m| m.values().flatten())
            .filter(|k| !present.contains(&(Arc::as_ptr(&k.object) as usize)))
            .map(|k| k.object.clone())
            .collect();
        for g in &gone {
            self.forget(g);
        }
        let exclude = if fresh.is_empty() {
            Vec::new()
        } else {
            exclude_list()
        };
        let readable: Vec<bool> = fresh
            .iter()
            .map(|o| skip_reason(o, &exclude).is_none())
            .collect();
        // Many new objects: read them from inside walks of the loader's list.
        let mut walked: Vec<Option<Result<ObjectIndex>>> = fresh.iter().map(|_| None).collect();
        if fresh.len() > PIN_BEFORE_INDEX {
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
        let (mut new, mut pins) = (Vec::new(), Vec::new());
        for ((obj, readable), walked) in fresh.into_iter().zip(readable).zip(walked) {
            let (index, pin) = if !readable {
                (self.admit(obj, 0, &exclude), None)
            } else if let Some(built) = walked {
                (self.enter(obj, 0, Some(built)), None)
            } else {
                let Some(pin) = Pin::object(&obj) else {
                    // Gone already, or not reachable by name: never read it.
                    push_bounded(&mut self.diag.unpinnable, obj.display_name().to_owned());
                    continue;
                };
                (self.admit(obj, 0, &exclude), Some(pin))
            };
            if let Some(idx) = index {
                all.push(idx.clone());
                new.push(idx);
                pins.push(pin);
            }
        }
        (all, new, pins)
    }

    /// Patch objects loaded since the last scan until the loader's counters stop moving.
    fn catch_up(&mut self) -> usize {
        let mut patched = 0;
        for _ in 0..16 {
            let counters = elf::counters();
            if counters == self.last_counters {
                break;
            }
            self.diag.rescans += 1;
            patched += self.sync().1;
        }
        patched
    }

    /// The `dlopen` fast path (see [`rescan_opened`]).
    ///
    /// # Safety
    /// As [`rescan_opened`].
    #[allow(unsafe_code)]
    unsafe fn opened(&mut self, handle: *mut c_void) -> usize {
        let now = elf::counters();
        let last = self.last_counters;
        if now.subs == last.subs && now.adds == last.adds.wrapping_add(1) && self.known.is_some() {
            // SAFETY: the caller holds `handle` open for the whole call.
            let pin = unsafe { Pin::borrowed(handle) };
            if let Some((obj, link_map)) = pin.describe() {
                if self.find_known(obj.base, &obj.name).is_none() {
                    // One object was added since the last scan and this one is new: it is that
                    // object.
                    self.diag.quick_scans += 1;
                    self.last_counters = now;
                    let exclude = exclude_list();
                    let patched = match self.admit(Arc::new(obj), link_map, &exclude) {
                        Some(idx) if matters(&idx) => self.patch_new(Batch::pinned(idx, pin)),
                        _ => 0,
                    };
                    return patched + self.catch_up();
                }
            }
        }
        self.catch_up()
    }

    /// The `dlclose` fast path (see [`rescan_closed`]).
    fn closed(&mut self, link_map: usize) -> usize {
        let now = elf::counters();
        let last = self.last_counters;
        if now.adds == last.adds && now.subs == last.subs.wrapping_add(1) {
            let obj = self
                .by_link_map
                .as_ref()
                .and_then(|m| m.get(&link_map))
                .and_then(|&base| self.known.as_ref()?.get(&base))
                .and_then(|v| v.iter().find(|k| k.link_map == link_map))
                .map(|k| k.object.clone());
            if let Some(obj) = obj {
                let probe = obj.segments().next().map(|(start, _, _)| start);
                // Gone when no object covers its first segment any more, or another one does.
                let gone = probe
                    .and_then(object_at)
                    .is_some_and(|found| found != Some(link_map));
                if gone {
                    self.diag.quick_scans += 1;
                    self.forget(&obj);
                    self.last_counters = now;
                }
            }
        }
        self.catch_up()
    }

    /// Take a snapshot of the loaded objects and sync with it: unloaded objects are forgotten,
    /// new ones indexed and patched with every installed set. Returns every known object and
    /// the number of slots patched.
    fn sync(&mut self) -> (Vec<Arc<ObjectIndex>>, usize) {
        let snap = elf::snapshot();
        let (all, new, pins) = self.refresh(&snap.objects, snap.counters.subs);
        self.last_counters = snap.counters;
        // Nothing to apply before the first set is installed.
        if self.sets.is_empty() {
            return (all, 0);
        }
        let (new, pins): (Vec<_>, Vec<_>) = new
            .into_iter()
            .zip(pins)
            .filter(|(i, _)| matters(i))
            .unzip();
        let batch = Batch::with_pins(new, pins, self.last_counters.subs);
        let patched = self.patch_new(batch);
        (all, patched)
    }

    /// The objects that matter to a patch (those with slots, and those that may define a
    /// hooked function: their scope is searched for originals), as a batch touched through
    /// walks of the loader's list (see `batch.rs`).
    fn batch(&self, objects: &[Arc<ObjectIndex>]) -> Batch {
        let objects = objects.iter().filter(|i| matters(i)).cloned().collect();
        Batch::listed(objects, self.last_counters.subs)
    }

    /// Patch objects that appeared since the last scan with every installed set, and note those
    /// whose constructors already ran unhooked.
    fn patch_new(&mut self, mut batch: Batch) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let ids: Vec<u64> = self.sets.iter().map(|s| s.id).collect();
        let mark = self.journal.mark();
        let patched = self.patch_batch(&ids, &mut batch);
        let late: Vec<String> = self
            .journal
            .since(mark)
            .filter(|e| {
                batch
                    .objects
                    .iter()
                    .any(|n| Arc::ptr_eq(&n.object, &e.object) && n.has_constructors)
            })
            .map(|e| e.object.display_name().to_owned())
            .collect();
        for name in late {
            push_bounded(&mut self.diag.constructors_before_patch, name);
        }
        patched
    }

    /// Apply the given sets to the given objects. Errors on single slots are recorded in the
    /// diagnostics and do not stop the other slots.
    fn patch(&mut self, set_ids: &[u64], objects: &[Arc<ObjectIndex>]) -> usize {
        if objects.is_empty() || set_ids.is_empty() {
            return 0;
        }
        let mut batch = self.batch(objects);
        self.patch_batch(set_ids, &mut batch)
    }

    fn patch_batch(&mut self, set_ids: &[u64], batch: &mut Batch) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let sets: Vec<(u64, Arc<[Hook]>)> = set_ids
            .iter()
            .filter_map(|&id| {
                let s = self.sets.iter().find(|s| s.id == id)?;
                Some((id, s.set.hooks.clone()))
            })
            .collect();
        // Every slot value the plans need, read in one pass.
        let names: Vec<(&str, Option<&str>)> = sets
            .iter()
            .flat_map(|(_, hooks)| hooks.iter())
            .map(|h| (h.symbol(), h.version()))
            .collect();
        let slots: Vec<Vec<usize>> = batch
            .objects
            .iter()
            .map(|idx| {
                let mut v: Vec<usize> = names
                    .iter()
                    .flat_map(|&(symbol, version)| idx.slots(symbol, version).map(|s| s.address))
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect();
        for i in batch.read_values(&slots) {
            push_bounded(
                &mut self.diag.unpinnable,
                batch.objects[i].object.display_name().to_owned(),
            );
        }
        let mut plans = Vec::new();
        for (id, hooks) in &sets {
            for hook in hooks.iter() {
                self.plan_hook(*id, hook, batch, &mut plans);
            }
        }
        self.write(plans, batch)
    }

    fn plan_hook<'h>(
        &mut self,
        set_id: u64,
        hook: &'h Hook,
        batch: &Batch,
        plans: &mut Vec<Plan<'h>>,
    ) {
        let (symbol, version) = (hook.symbol(), hook.version());
        let any_slot = batch
            .objects
            .iter()
            .any(|idx| idx.slots(symbol, version).next().is_some());
        if !any_slot && hook.original.get() != 0 {
            return;
        }
        let resolver = Resolver::new(hook, batch, &self.canonical, self.known.as_ref());
        // While slots of this hook are patched, its published original is what they call: a
        // different definition found later (another copy of the library) must not replace it;
        // slots bound to that one are conflicts instead.
        let published = hook.original.get();
        let live = published != 0 && self.journal.has_symbol(set_id, symbol);
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
        let stacked = plans.iter().any(|p| p.hook.symbol() == symbol);
        for (i, idx) in batch.objects.iter().enumerate() {
            for slot in idx.slots(symbol, version) {
                if self.journal.contains(set_id, slot.address) {
                    continue;
                }
                // A set below this one in a stack may be about to write this slot: it then
                // holds that set's replacement by the time this plan is written.
                let planned = if stacked {
                    plans[..first]
                        .iter()
                        .rev()
                        .find(|p| p.slot.address == slot.address)
                        .map(|p| p.hook.replacement)
                } else {
                    None
                };
                let Some(value) = planned.or_else(|| batch.value(slot.address)) else {
                    continue;
                };
                if value == hook.replacement {
                    continue;
                }
                let bound = resolver.binding(value, slot, idx, i);
                if original == 0 {
                    original = bound;
                }
                if bound != original || bound == 0 {
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
                plans.push(Plan {
                    set_id,
                    object: i,
                    hook,
                    slot,
                    expected: value,
                    original,
                });
            }
        }
        // Publish the original before any slot can route a call to the replacement.
        if original != 0
            && (plans.len() > first || hook.original.get() == 0)
            && hook.original.get() != original
        {
            hook.original.set(original);
            self.dirty = true;
        }
    }

    fn write(&mut self, plans: Vec<Plan>, batch: &Batch) -> usize {
        let maps = match ProtectionMap::for_addresses(plans.iter().map(|p| p.slot.address)) {
            Ok(m) => m,
            Err(e) => {
                push_bounded(&mut self.diag.unreadable, e.to_string());
                return 0;
            }
        };
        let mut expected: Vec<usize> = plans.iter().map(|p| p.expected).collect();
        let mut pending: Vec<usize> = (0..plans.len()).collect();
        let mut fresh = Vec::new();
        // One retry: a concurrent lazy-binding resolution may have just filled the slot.
        for attempt in 0..2 {
            let writes: Vec<(usize, usize, usize, usize)> = pending
                .iter()
                .map(|&k| {
                    let p = &plans[k];
                    (p.object, p.slot.address, expected[k], p.hook.replacement)
                })
                .collect();
            let outcomes = batch.write(&maps, &writes);
            let mut retry = Vec::new();
            for (&k, outcome) in pending.iter().zip(outcomes) {
                let p = &plans[k];
                let name = batch.objects[p.object].object.display_name();
                match outcome {
                    None => push_bounded(&mut self.diag.unpinnable, name.to_owned()),
                    Some(Ok((SlotWrite::Written { protection }, restored))) => {
                        if let Err(LeftWritable(errno)) = restored {
                            let e = WriteFailure::Protect(errno).into_error(name, p.slot.address);
                            crate::log!(crate::log::Level::Error, "{e}");
                        }
                        self.journal.record(JournalEntry {
                            set_id: p.set_id,
                            object: batch.objects[p.object].object.clone(),
                            symbol: Arc::from(p.hook.symbol()),
                            address: p.slot.address,
                            kind: p.slot.kind,
                            old: expected[k],
                            new: p.hook.replacement,
                            protection,
                        });
                        fresh.push(k);
                    }
                    Some(Ok((SlotWrite::Mismatch { actual }, _))) => {
                        if attempt > 0 || actual == p.hook.replacement {
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
        self.recheck(&plans, &fresh, batch, &maps);
        fresh.len()
    }

    /// A thread already inside the lazy-binding resolver for a slot we just patched writes the
    /// resolved function over our hook when it finishes. Look at the slots of this batch once
    /// more and patch again any that now hold exactly their original.
    fn recheck(&mut self, plans: &[Plan], fresh: &[usize], batch: &Batch, maps: &ProtectionMap) {
        if fresh.is_empty() {
            return;
        }
        // The original each slot would hold if a resolver overwrote our hook.
        let writes: Vec<(usize, usize, usize, usize)> = fresh
            .iter()
            .map(|&k| {
                let p = &plans[k];
                (
                    p.object,
                    p.slot.address,
                    p.hook.original.get(),
                    p.hook.replacement,
                )
            })
            .filter(|w| w.2 != 0)
            .collect();
        // A compare-and-write of original → hook: writes only where the original is back.
        for outcome in batch.write(maps, &writes).into_iter().flatten() {
            if matches!(outcome, Ok((SlotWrite::Written { .. }, _))) {
                self.diag.resolver_races += 1;
            }
        }
    }

    /// Every live patch.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &JournalEntry> + '_ {
        self.journal.entries()
    }

    pub(crate) fn set_name(&self, id: u64) -> Option<&str> {
        self.sets.iter().find(|s| s.id == id).map(|s| s.set.name())
    }
}

impl Diagnostics {
    pub(crate) const fn new() -> Diagnostics {
        Diagnostics {
            skipped: Vec::new(),
            unpinnable: Vec::new(),
            other_namespaces: Vec::new(),
            unreadable: Vec::new(),
            conflicts: Vec::new(),
            foreign: Vec::new(),
            constructors_before_patch: Vec::new(),
            text_relocations: Vec::new(),
            resolver_races: 0,
            objects_indexed: 0,
            rescans: 0,
            quick_scans: 0,
            deferred_scans: 0,
        }
    }
}

/// Read-only access for listings.
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    let mut op = Operation::begin(Some(API_PATIENCE))?;
    Some(f(op.state()))
}
