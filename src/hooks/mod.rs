//! WHAT to patch: hook sets, installing them into every loaded object, putting everything back.
//!
//! ```no_run
//! use std::sync::atomic::AtomicUsize;
//! static REAL_GETPID: AtomicUsize = AtomicUsize::new(0);
//! extern "C" fn my_getpid() -> libc::pid_t {
//!     let real: extern "C" fn() -> libc::pid_t =
//!         unsafe { std::mem::transmute(REAL_GETPID.load(std::sync::atomic::Ordering::Acquire)) };
//!     real()
//! }
//! let hook = cuhook::hooks::Hook::new("getpid", my_getpid as usize, &REAL_GETPID).unwrap();
//! let set = cuhook::hooks::HookSet::new("demo", vec![hook]).unwrap();
//! let installed = cuhook::hooks::install(&set).unwrap();
//! // ... every object that imports getpid now calls my_getpid ...
//! installed.uninstall().unwrap();
//! ```
//!
//! Lock order: the patch lock is taken first and may be held while calling the dynamic loader
//! (`dlopen(RTLD_NOLOAD)` pins, `dlsym`). Loader interposers therefore never wait for it
//! without a time limit, and an operation started on a thread that is already inside one is
//! refused with [`Error::Busy`](crate::Error::Busy) instead of deadlocking.

mod batch;
mod diagnostics;
mod engine;
mod group_dlopen;
mod interpose;
mod loader;
mod resolver;
mod set;
mod skip;
mod substitution;

use std::time::Duration;

pub use diagnostics::{Conflict, Diagnostics, ForeignSlot};
pub use engine::UninstallReport;
pub use engine::DL_SET_NAME;

/// Run `read` on `object` while it is pinned (a concurrent `dlclose` cannot unmap it meanwhile);
/// `None` when it is already gone or cannot be pinned. For readers outside the engine (the exit
/// report) that scan the loaded objects.
pub(crate) fn while_pinned<T>(
    object: &crate::elf::LoadedObject,
    read: impl FnOnce() -> T,
) -> Option<T> {
    let pin = loader::Pin::object(object)?;
    let result = read();
    drop(pin);
    Some(result)
}

/// The hook to hand out for a function address: the replacement of an installed hook whose
/// original is `address`, else `address` itself. This is what `dlsym` and `cuGetProcAddress`
/// return through cuhook.
pub fn substitute(address: usize) -> usize {
    substitution::substitute(address)
}
pub use group_dlopen::{group_dlopen, set_group_dlopen};
pub use set::{Hook, HookSet, OriginalStore};
pub use skip::{exclude_list, set_exclude_list, skip_reason, SkipReason};
pub(crate) use skip::{own_code_range, own_object_is_the_c_library};

use crate::elf::RelocKind;
use crate::Result;

/// A live installation of a hook set. Dropping it uninstalls (errors are then ignored: call
/// [`Installation::uninstall`] to see them).
#[must_use = "dropping the installation uninstalls the hooks"]
#[derive(Debug)]
pub struct Installation {
    id: u64,
    active: bool,
    /// Called once the set is uninstalled for good (not when other installations still hold
    /// it): what an installer above this layer must undo with it (the CUDA install detaches the
    /// registry, which no hook keeps current any more).
    on_last_uninstall: Option<fn()>,
}

impl Installation {
    /// The installation's id, usable with [`uninstall_id`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Put back every slot this set patched (compare-and-swap: slots re-patched by someone else
    /// are left alone and reported).
    pub fn uninstall(mut self) -> Result<UninstallReport> {
        self.finish()
    }

    fn finish(&mut self) -> Result<UninstallReport> {
        self.active = false;
        let report = engine::uninstall(self.id);
        if let (Ok(r), Some(f)) = (&report, self.on_last_uninstall) {
            if !r.still_referenced {
                f();
            }
        }
        report
    }

    /// Run `f` when this installation's uninstall removes the set for good.
    pub(crate) fn on_last_uninstall(mut self, f: fn()) -> Self {
        self.on_last_uninstall = Some(f);
        self
    }

    /// Keep the hooks installed for the rest of the process; returns the id.
    pub fn leak(mut self) -> u64 {
        self.active = false;
        self.id
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        if self.active {
            let _ = self.finish();
        }
    }
}

/// Install `set` into every loaded object (except cuhook's own object, the vDSO, the loader and
/// excluded objects). Installing a set equal to an installed one only adds a reference.
pub fn install(set: &HookSet) -> Result<Installation> {
    engine::install(set, interpose::dl_hook_set).map(|id| Installation {
        id,
        active: true,
        on_last_uninstall: None,
    })
}

/// Uninstall by id (for C callers that keep ids rather than guards).
pub fn uninstall_id(id: u64) -> Result<UninstallReport> {
    engine::uninstall(id)
}

pub(crate) use engine::API_PATIENCE;

/// Patch objects loaded since the last scan with every installed set, and forget objects that
/// were unloaded (nothing is ever written to them again). Returns how many slots were patched.
/// `patience`: how long to wait if another thread is patching (None: forever).
pub fn rescan(patience: Option<Duration>) -> Result<usize> {
    engine::sync(patience)
}

/// One patched slot, for diagnostics and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchedSlot {
    /// Name of the hook set that patched it.
    pub set: String,
    /// The object holding the slot.
    pub object: String,
    /// The symbol the slot is for.
    pub symbol: String,
    /// Address of the slot.
    pub address: usize,
    /// Relocation type of the slot.
    pub kind: RelocKind,
    /// Value before the patch.
    pub old: usize,
    /// Value written (the replacement).
    pub new: usize,
    /// Page protection around the slot, `rwx` letters as in `/proc/self/maps`.
    pub protection: String,
}

/// Every slot currently patched, in patch order.
pub fn patched_slots() -> Vec<PatchedSlot> {
    engine::with_state(|st| {
        st.entries()
            .map(|e| PatchedSlot {
                set: st.set_name(e.set_id).unwrap_or("?").to_owned(),
                object: e.object.display_name().to_owned(),
                symbol: e.symbol.to_string(),
                address: e.address,
                kind: e.kind,
                old: e.old,
                new: e.new,
                protection: crate::patch::letters(e.protection),
            })
            .collect()
    })
    .unwrap_or_default()
}

/// What the engine noticed so far (skipped objects, conflicts, foreign re-patches, ...).
pub fn diagnostics() -> Diagnostics {
    let mut d = engine::with_state(|st| st.diag.clone()).unwrap_or_default();
    d.pinned_by_name = loader::pinned_by_name();
    d
}
