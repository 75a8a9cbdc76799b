//! The engine: installed hook sets, the journal, the object cache, and the operations that
//! patch and restore slots. One lock (the patch lock) serialises every operation.

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::elf::{self, Counters, LoadedObject, ObjectIndex, Slot};
use crate::patch::{compare_and_write, read_slot, Journal, JournalEntry, ProtectionMap, SlotWrite};
use crate::{Error, Result};

use super::diagnostics::{push_bounded, Conflict, Diagnostics, ForeignSlot};
use super::interpose::{dl_hook_set, publish, DL_SET_NAME};
use super::loader::{clear_dlerror, lookup_global, Pin};
use super::set::{Hook, HookSet};
use super::skip::{exclude_list, skip_reason};

struct InstalledSet {
    id: u64,
    set: HookSet,
    refs: usize,
}

pub(crate) struct State {
    sets: Vec<InstalledSet>,
    pub(crate) journal: Journal,
    known: Vec<Arc<ObjectIndex>>,
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
    known: Vec::new(),
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

impl Operation {
    /// Wait for the patch lock; `None` on this thread's re-entry or after `patience` elapsed.
    pub(crate) fn begin(patience: Option<Duration>) -> Option<Operation> {
        if IN_OPERATION.with(|f| f.get()) {
            return None;
        }
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
    // The loader interposers come with the first set, so later dlopens get patched too.
    if !st.sets.iter().any(|s| s.set.name == DL_SET_NAME) {
        let dl = st.add_set(dl_set);
        st.patch(&[dl], &all);
    }
    let id = st.add_set(set.clone());
    st.patch(&[id], &all);
    st.catch_up();
    Ok(id)
}

/// Bring the engine in step with the loader: patch objects loaded since the last scan with every
/// installed set, forget objects that were unloaded. Cheap when nothing changed (one
/// `dl_iterate_phdr` step, no lock). `patience`: how long to wait for a busy engine.
pub(crate) fn rescan(patience: Option<Duration>) -> Result<usize> {
    // Fast path: nothing was loaded or unloaded since the last scan (no lock, no allocation).
    let now = elf::counters();
    if now.adds == SCANNED_ADDS.load(Ordering::Acquire)
        && now.subs == SCANNED_SUBS.load(Ordering::Acquire)
    {
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
    st.sets.remove(pos);
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

fn protection_map(addresses: impl Iterator<Item = usize>) -> Result<ProtectionMap> {
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for a in addresses {
        lo = lo.min(a);
        hi = hi.max(a + 8);
    }
    if lo >= hi {
        return Ok(ProtectionMap::default());
    }
    ProtectionMap::read(lo, hi)
}

/// One slot write decided before any write is made.
struct Plan {
    set_id: u64,
    index: Arc<ObjectIndex>,
    hook: Hook,
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
            self.known.clear();
        }
    }

    fn add_set(&mut self, set: HookSet) -> u64 {
        self.dirty = true;
        let id = self.next_id;
        self.next_id += 1;
        self.sets.push(InstalledSet { id, set, refs: 1 });
        id
    }

    /// Put back every slot journaled for `set_id` (compare-and-swap), in objects still loaded.
    fn restore(&mut self, set_id: u64) -> Result<UninstallReport> {
        self.dirty = true;
        let entries = self.journal.take_set(set_id);
        let snap = elf::snapshot();
        let loaded = |o: &LoadedObject| {
            snap.objects
                .iter()
                .any(|s| s.base == o.base && s.name == o.name)
        };
        let mut pins: Vec<(usize, String, Pin)> = Vec::new();
        let mut report = UninstallReport::default();
        let mut writable = Vec::new();
        for e in entries {
            let pinned = pins
                .iter()
                .any(|(b, n, _)| *b == e.object.base && *n == e.object.name)
                || (loaded(&e.object)
                    && Pin::object(&e.object)
                        .map(|p| pins.push((e.object.base, e.object.name.clone(), p)))
                        .is_some());
            if pinned {
                writable.push(e);
            } else {
                report.gone += 1;
            }
        }
        let maps = match protection_map(writable.iter().map(|e| e.address)) {
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

    /// Sync the object cache with the loader's list: drop what was unloaded (and its journal
    /// entries: those slots no longer exist), index what is new. Returns (all, new).
    fn refresh(
        &mut self,
        objects: &[Arc<LoadedObject>],
    ) -> (Vec<Arc<ObjectIndex>>, Vec<Arc<ObjectIndex>>) {
        let same = |a: &LoadedObject, b: &LoadedObject| a.base == b.base && a.name == b.name;
        self.known
            .retain(|k| objects.iter().any(|o| same(o, &k.object)));
        self.journal
            .forget_objects(|o| !objects.iter().any(|s| same(s, o)));
        let exclude = exclude_list();
        let (mut all, mut new) = (Vec::new(), Vec::new());
        for obj in objects {
            if let Some(k) = self.known.iter().find(|k| same(&k.object, obj)) {
                all.push(k.clone());
                continue;
            }
            if let Some(reason) = skip_reason(obj, &exclude) {
                push_bounded(
                    &mut self.diag.skipped,
                    (obj.display_name().to_owned(), reason),
                );
                continue;
            }
            let wanted = &self.wanted;
            match ObjectIndex::build(obj.clone(), &|n| {
                wanted.binary_search_by(|w| w.as_slice().cmp(n)).is_ok()
            }) {
                Ok(idx) => {
                    let idx = Arc::new(idx);
                    self.diag.objects_indexed += 1;
                    self.known.push(idx.clone());
                    all.push(idx.clone());
                    new.push(idx);
                }
                Err(e) => push_bounded(&mut self.diag.unreadable, e.to_string()),
            }
        }
        (all, new)
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

    /// Take a snapshot of the loaded objects and sync with it: unloaded objects are forgotten,
    /// new ones indexed and patched with every installed set. Returns every known object and
    /// the number of slots patched.
    fn sync(&mut self) -> (Vec<Arc<ObjectIndex>>, usize) {
        let snap = elf::snapshot();
        let (all, new) = self.refresh(&snap.objects);
        self.last_counters = snap.counters;
        let patched = self.patch_new(&new);
        (all, patched)
    }

    /// Patch objects that appeared since the last scan with every installed set, and note those
    /// whose constructors already ran unhooked.
    fn patch_new(&mut self, new: &[Arc<ObjectIndex>]) -> usize {
        if new.is_empty() {
            return 0;
        }
        let ids: Vec<u64> = self.sets.iter().map(|s| s.id).collect();
        let journal_before = self.journal.entries().len();
        let patched = self.patch(&ids, new);
        let late: Vec<String> = self.journal.entries()
            [journal_before.min(self.journal.entries().len())..]
            .iter()
            .filter(|e| {
                new.iter()
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
        let mut pinned: Vec<(Arc<ObjectIndex>, Pin)> = Vec::new();
        for idx in objects {
            match Pin::object(&idx.object) {
                Some(pin) => pinned.push((idx.clone(), pin)),
                None => push_bounded(
                    &mut self.diag.unpinnable,
                    idx.object.display_name().to_owned(),
                ),
            }
        }
        let mut plans = Vec::new();
        for &id in set_ids {
            let Some(hooks) = self
                .sets
                .iter()
                .find(|s| s.id == id)
                .map(|s| s.set.hooks.clone())
            else {
                continue;
            };
            for hook in &hooks {
                self.plan_hook(id, hook, &pinned, &mut plans);
            }
        }
        self.write(plans, &pinned)
    }

    fn plan_hook(
        &mut self,
        set_id: u64,
        hook: &Hook,
        pinned: &[(Arc<ObjectIndex>, Pin)],
        plans: &mut Vec<Plan>,
    ) {
        let any_slot = pinned
            .iter()
            .any(|(idx, _)| idx.slots(hook.symbol(), hook.version()).next().is_some());
        if !any_slot && hook.original.get() != 0 {
            return;
        }
        let resolver = Resolver::new(hook, pinned, &self.known);
        let mut original = resolver.definition(hook.version.as_deref(), None);
        if original == 0 {
            // Not in the global scope (a library loaded RTLD_LOCAL): its own scope knows it.
            original = pinned
                .iter()
                .map(|(_, p)| p.lookup(&hook.symbol, hook.version.as_deref()))
                .find(|&a| a != 0 && !resolver.canonical.contains(&a))
                .unwrap_or(0);
        }
        // While slots of this hook are patched, its published original is what they call: a
        // different definition found later (another copy of the library) must not replace it;
        // slots bound to that one are conflicts instead.
        let published = hook.original.get();
        let live = self
            .journal
            .entries()
            .iter()
            .any(|e| e.set_id == set_id && &*e.symbol == hook.symbol());
        if published != 0 && live {
            original = published;
        }
        let first = plans.len();
        for (idx, pin) in pinned {
            for slot in idx.slots(hook.symbol(), hook.version()) {
                if self.journal.contains(set_id, slot.address) {
                    continue;
                }
                // SAFETY: the slot lies in a pinned object and was validated by the index.
                #[allow(unsafe_code)]
                let value = unsafe { read_slot(slot.address) };
                if value == hook.replacement {
                    continue;
                }
                let bound = resolver.binding(value, slot, idx, pin);
                if original == 0 {
                    original = bound;
                }
                if bound != original || bound == 0 {
                    let c = Conflict {
                        object: idx.object.display_name().to_owned(),
                        symbol: hook.symbol().to_owned(),
                        address: slot.address,
                        bound_to: bound,
                        original,
                    };
                    push_bounded(&mut self.diag.conflicts, c);
                    continue;
                }
                plans.push(Plan {
                    set_id,
                    index: idx.clone(),
                    hook: hook.clone(),
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

    fn write(&mut self, plans: Vec<Plan>, pinned: &[(Arc<ObjectIndex>, Pin)]) -> usize {
        let maps = match protection_map(plans.iter().map(|p| p.slot.address)) {
            Ok(m) => m,
            Err(e) => {
                push_bounded(&mut self.diag.unreadable, e.to_string());
                return 0;
            }
        };
        let mut written = 0;
        let batch_start = self.journal.entries().len();
        for p in plans {
            let name = p.index.object.display_name();
            let mut expected = p.expected;
            // One retry: a concurrent lazy-binding resolution may have just filled the slot.
            for _ in 0..2 {
                // SAFETY: pinned object, validated aligned slot, patch lock held.
                #[allow(unsafe_code)]
                let outcome = unsafe {
                    compare_and_write(&maps, name, p.slot.address, expected, p.hook.replacement)
                };
                match outcome {
                    Ok(SlotWrite::Written { protection }) => {
                        self.journal.record(JournalEntry {
                            set_id: p.set_id,
                            object: p.index.object.clone(),
                            symbol: Arc::from(p.hook.symbol()),
                            address: p.slot.address,
                            kind: p.slot.kind,
                            old: expected,
                            new: p.hook.replacement,
                            protection,
                        });
                        written += 1;
                        break;
                    }
                    Ok(SlotWrite::Mismatch { actual }) => {
                        let pin = pinned
                            .iter()
                            .find(|(i, _)| Arc::ptr_eq(i, &p.index))
                            .map(|(_, pin)| pin);
                        let rebound = pin.map(|pin| {
                            Resolver::new(&p.hook, pinned, &self.known)
                                .binding(actual, p.slot, &p.index, pin)
                        });
                        if actual == p.hook.replacement || rebound != Some(p.original) {
                            break;
                        }
                        self.diag.resolver_races += 1;
                        expected = actual;
                    }
                    Err(e) => {
                        push_bounded(&mut self.diag.unreadable, e.to_string());
                        break;
                    }
                }
            }
        }
        self.recheck(batch_start, &maps);
        written
    }

    /// A thread already inside the lazy-binding resolver for a slot we just patched writes the
    /// resolved function over our hook when it finishes. Look at the slots of this batch once
    /// more and patch again any that now hold exactly their original.
    fn recheck(&mut self, batch_start: usize, maps: &ProtectionMap) {
        let end = self.journal.entries().len();
        for i in batch_start..end {
            let e = self.journal.entries()[i].clone();
            // SAFETY: the object is still pinned by the caller and the slot was just written.
            #[allow(unsafe_code)]
            let now = unsafe { read_slot(e.address) };
            if now == e.new {
                continue;
            }
            let original = self.sets.iter().find(|s| s.id == e.set_id).and_then(|s| {
                s.set
                    .hooks
                    .iter()
                    .find(|h| h.symbol() == &*e.symbol)
                    .map(|h| h.original.get())
            });
            if original == Some(now) {
                // SAFETY: as above; patch lock held.
                #[allow(unsafe_code)]
                let again = unsafe {
                    compare_and_write(maps, e.object.display_name(), e.address, now, e.new)
                };
                if matches!(again, Ok(SlotWrite::Written { .. })) {
                    self.diag.resolver_races += 1;
                }
            }
        }
    }

    /// Every live patch.
    pub(crate) fn entries(&self) -> &[JournalEntry] {
        self.journal.entries()
    }

    pub(crate) fn set_name(&self, id: u64) -> Option<&str> {
        self.sets.iter().find(|s| s.id == id).map(|s| s.set.name())
    }
}

/// Finds the function a symbol really resolves to, never a PLT stub.
struct Resolver<'a> {
    symbol: &'a CStr,
    pinned: &'a [(Arc<ObjectIndex>, Pin)],
    /// Canonical PLT entries (non-PIE executables) of this symbol: addresses that *look* like
    /// the function but jump through a GOT slot we may have patched.
    canonical: Vec<usize>,
}

impl<'a> Resolver<'a> {
    fn new(
        hook: &'a Hook,
        pinned: &'a [(Arc<ObjectIndex>, Pin)],
        known: &[Arc<ObjectIndex>],
    ) -> Self {
        let canonical = known
            .iter()
            .flat_map(|i| {
                i.slots(hook.symbol(), None)
                    .filter_map(|s| s.canonical_plt)
                    .collect::<Vec<_>>()
            })
            .collect();
        Resolver {
            symbol: &hook.symbol,
            pinned,
            canonical,
        }
    }

    /// The definition the loader would bind: global scope first, then the importer's own
    /// scope (objects loaded `RTLD_LOCAL`), skipping canonical PLT entries.
    fn definition(&self, version: Option<&CStr>, importer: Option<&Pin>) -> usize {
        let mut found = lookup_global(self.symbol, version);
        if found == 0 {
            if let Some(pin) = importer {
                found = pin.lookup(self.symbol, version);
            }
        }
        if found != 0 && self.canonical.contains(&found) {
            found = self
                .pinned
                .iter()
                .filter(|(i, _)| i.object.position != 0)
                .map(|(_, p)| p.lookup(self.symbol, version))
                .find(|&a| a != 0 && !self.canonical.contains(&a))
                .unwrap_or(0);
        }
        found
    }

    /// What a slot holding `value` is bound to. A value inside the importer itself is its
    /// lazy PLT stub (or its own canonical entry): resolve in the importer's scope instead.
    fn binding(&self, value: usize, slot: Slot, importer: &ObjectIndex, pin: &Pin) -> usize {
        if importer.object.contains(value) || self.canonical.contains(&value) {
            let version = importer
                .version_of(slot.address)
                .and_then(|v| std::ffi::CString::new(v).ok());
            self.definition(version.as_deref(), Some(pin))
        } else {
            value
        }
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
            resolver_races: 0,
            objects_indexed: 0,
            rescans: 0,
            deferred_scans: 0,
        }
    }
}

/// Read-only access for listings.
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    let mut op = Operation::begin(Some(API_PATIENCE))?;
    Some(f(op.state()))
}
