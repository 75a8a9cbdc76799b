//! What the engine noticed: objects it skipped, slots it refused to patch, slots someone else
//! re-patched. Bounded lists, so a pathological process cannot grow them without limit.

use super::skip::SkipReason;

/// Most entries kept per list.
pub const MAX_ENTRIES: usize = 256;

/// A slot bound to a different definition than the hook's original: patching it would route
/// that object's calls to the wrong function, so it was left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The object holding the slot.
    pub object: String,
    /// The symbol the slot is for.
    pub symbol: String,
    /// Address of the slot.
    pub address: usize,
    /// What the slot is bound to.
    pub bound_to: usize,
    /// The hook's original.
    pub original: usize,
}

/// A slot that no longer held our replacement at uninstall: someone patched it after us, so it
/// was left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignSlot {
    /// The object holding the slot.
    pub object: String,
    /// The symbol the slot is for.
    pub symbol: String,
    /// Address of the slot.
    pub address: usize,
    /// The value found in the slot.
    pub found: usize,
    /// Our replacement, which it no longer held.
    pub ours: usize,
}

/// Everything the engine reports about its work so far.
#[derive(Debug, Clone, Default)]
pub struct Diagnostics {
    /// Objects never patched, and why.
    pub skipped: Vec<(String, SkipReason)>,
    /// Objects that could not be pinned (for example loaded into another `dlmopen` namespace)
    /// and were therefore not patched.
    pub unpinnable: Vec<String>,
    /// Objects opened into another `dlmopen` namespace. `dl_iterate_phdr` shows a caller only
    /// its own namespace, and such a namespace has its own copies of the libraries, which one
    /// original per hook cannot serve: these objects are not patched.
    pub other_namespaces: Vec<String>,
    /// Objects whose tables could not be read, with the reason.
    pub unreadable: Vec<String>,
    /// Slots left alone because they were bound to another definition.
    pub conflicts: Vec<Conflict>,
    /// Slots someone else re-patched after us, left as found at uninstall.
    pub foreign: Vec<ForeignSlot>,
    /// Objects loaded after install whose constructors ran before their slots were patched
    /// (constructors run inside `dlopen`): calls made by those constructors were not seen. The
    /// first [`MAX_ENTRIES`] names; [`Diagnostics::constructors_before_patch_total`] counts
    /// them all.
    pub constructors_before_patch: Vec<String>,
    /// How many objects [`Diagnostics::constructors_before_patch`] would hold without its
    /// bound: each name once while the list has room, then every further such object (a
    /// library reloaded after the list filled up counts again).
    pub constructors_before_patch_total: u64,
    /// Objects with text relocations (`DT_TEXTREL`) whose code holds addresses of hooked
    /// functions, with how many: code is never made writable, so calls made that way are not
    /// seen (the object's GOT slots are still patched).
    pub text_relocations: Vec<(String, usize)>,
    /// Slots overwritten by a concurrent lazy-binding resolution and patched again.
    pub resolver_races: u64,
    /// Slots looked at once more after being written, for such a race: the `JUMP_SLOT`s of
    /// objects the loader binds lazily (an object bound at load has no resolver to race with).
    pub rechecked_slots: u64,
    /// Objects indexed so far.
    pub objects_indexed: u64,
    /// Incremental scans for new objects (walks of the loader's list).
    pub rescans: u64,
    /// `dlopen`/`dlclose` calls whose one new or removed object was handled through its
    /// handle, without walking the loader's list.
    pub quick_scans: u64,
    /// `dlopen`/`dlclose` calls that added or removed several objects at once (a library and
    /// the new dependencies it brought) handled from the opened or closed object alone: the
    /// objects listed after it, without a copy of the loader's whole list.
    pub group_scans: u64,
    /// New dependencies of such a `dlopen` proven to be in the opened object's scope (its
    /// handle keeps them loaded), patched as it is rather than from inside a walk.
    pub dependencies_in_scope: u64,
    /// Objects a `dlopen` loaded that were patched directly (every hook they import already
    /// live, each slot bound to its original, bound at load time), without the batch planner.
    pub direct_patches: u64,
    /// Slots bound to another definition than their hook's original (another interposer's) and
    /// patched with a chain that calls what they held.
    pub chained_slots: u64,
    /// Loader events that found the engine busy for too long and were left to the running
    /// operation's catch-up scan.
    pub deferred_scans: u64,
    /// Loader changes whose handling was put off because memory was short (the next loader
    /// call or rescan handles them).
    pub deferred_for_memory: u64,
    /// Objects pinned by name (`dlopen` with `RTLD_NOLOAD`) so far in the process: where no walk
    /// of the loader's list could vouch for an object while it was read or written, to look a
    /// hooked function up in the scope of an object that defines it, and by the exit report.
    /// Each such pin makes glibc compare the name with every loaded object, so in a big process
    /// it should stay small: install, rescans and uninstall touch objects from inside walks.
    pub pinned_by_name: u64,
}

pub(crate) fn push_bounded<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if list.len() < MAX_ENTRIES && !list.contains(&item) {
        list.push(item);
    }
}

/// [`push_bounded`] for an object's name, copied only when it is added: a full list, or one
/// that has it, costs no allocation (the `dlopen` path reports into lists that fill up early).
/// Every report of an object's name into a bounded list goes through it.
pub(crate) fn push_name_bounded(list: &mut Vec<String>, name: &str) {
    if list.len() < MAX_ENTRIES && !list.iter().any(|n| n == name) {
        list.push(name.to_owned());
    }
}

/// [`push_name_bounded`] that also counts in `total` what the list leaves out: a name not yet
/// listed (added, or the list is full and cannot tell) counts one.
pub(crate) fn push_name_counted(list: &mut Vec<String>, total: &mut u64, name: &str) {
    if list.len() >= MAX_ENTRIES {
        *total += 1;
    } else if !list.iter().any(|n| n == name) {
        list.push(name.to_owned());
        *total += 1;
    }
}

impl std::fmt::Display for Diagnostics {
    /// One finding per line, `kind detail`, stable for tools to parse.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (object, reason) in &self.skipped {
            writeln!(f, "skipped {reason:?} {object}")?;
        }
        for object in &self.unpinnable {
            writeln!(f, "unpinnable {object}")?;
        }
        for object in &self.other_namespaces {
            writeln!(f, "other_namespace {object}")?;
        }
        for text in &self.unreadable {
            writeln!(f, "unreadable {text}")?;
        }
        for c in &self.conflicts {
            writeln!(
                f,
                "conflict {} {} slot={:#x} bound_to={:#x} original={:#x}",
                c.object, c.symbol, c.address, c.bound_to, c.original
            )?;
        }
        for s in &self.foreign {
            writeln!(
                f,
                "foreign {} {} slot={:#x} found={:#x} ours={:#x}",
                s.object, s.symbol, s.address, s.found, s.ours
            )?;
        }
        for (object, n) in &self.text_relocations {
            writeln!(f, "text_relocations {object} references={n}")?;
        }
        for object in &self.constructors_before_patch {
            writeln!(f, "constructors_before_patch {object}")?;
        }
        writeln!(
            f,
            "counters resolver_races={} rechecked_slots={} objects_indexed={} rescans={} quick_scans={} group_scans={} dependencies_in_scope={} direct_patches={} chained_slots={} deferred_scans={} deferred_for_memory={} pinned_by_name={} constructors_before_patch={}",
            self.resolver_races,
            self.rechecked_slots,
            self.objects_indexed,
            self.rescans,
            self.quick_scans,
            self.group_scans,
            self.dependencies_in_scope,
            self.direct_patches,
            self.chained_slots,
            self.deferred_scans,
            self.deferred_for_memory,
            self.pinned_by_name,
            self.constructors_before_patch_total
        )
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
            constructors_before_patch_total: 0,
            text_relocations: Vec::new(),
            resolver_races: 0,
            rechecked_slots: 0,
            objects_indexed: 0,
            rescans: 0,
            quick_scans: 0,
            group_scans: 0,
            dependencies_in_scope: 0,
            direct_patches: 0,
            chained_slots: 0,
            deferred_scans: 0,
            deferred_for_memory: 0,
            pinned_by_name: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_names_are_listed_once_and_counted_past_the_bound() {
        let (mut list, mut total) = (Vec::new(), 0);
        push_name_counted(&mut list, &mut total, "/a/libx.so");
        push_name_counted(&mut list, &mut total, "/a/libx.so");
        push_name_counted(&mut list, &mut total, "/b/liby.so");
        assert_eq!((list.len(), total), (2, 2));
        for i in 0..MAX_ENTRIES + 10 {
            push_name_counted(&mut list, &mut total, &format!("/c/lib{i}.so"));
        }
        assert_eq!(list.len(), MAX_ENTRIES);
        assert_eq!(total, MAX_ENTRIES as u64 + 12);
    }
}
