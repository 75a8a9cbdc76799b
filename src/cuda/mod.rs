//! The CUDA hook set: allocation, free, teardown and entry-point-lookup hooks for the driver and
//! runtime APIs (`table`), how each call becomes events (`emit`), and the driver queries cuhook
//! makes itself (`query`, through the functions `resolve` finds).

mod abi;
mod capture;
pub mod classify;
mod driver;
mod emit;
mod fatbin;
mod graph;
mod imported;
mod loaded;
mod procaddress;
mod query;
mod resolve;
mod table;

pub use classify::{classify, Classification, Source};
pub(crate) use emit::replay_existing;
pub use emit::stats;
pub use fatbin::ManagedScan;
pub use loaded::set_managed_scan;
pub use procaddress::LookupCounts;
pub use table::{Group, HookInfo, HOOKS};

/// Entry-point lookups (`cuGetProcAddress`, `cudaGetDriverEntryPoint`) seen so far.
pub fn lookup_counts() -> LookupCounts {
    procaddress::counts()
}

use crate::hooks::{self, Hook, HookSet, Installation};
use crate::Result;

/// Name of the CUDA hook set.
pub const SET_NAME: &str = "cuda";

/// The CUDA hook set, ready for [`hooks::install`].
pub fn hook_set() -> Result<HookSet> {
    let hooks = HOOKS
        .iter()
        .map(|h| {
            Hook::new(h.symbol, (h.replacement)(), (h.original)())
                .map(|k| k.with_chains(&(h.chains)()))
        })
        .collect::<Result<Vec<_>>>()?;
    HookSet::new(SET_NAME, hooks)
}

/// Install the CUDA hooks and attach the registry (kept current by the hooks, before any
/// subscriber sees an event). When the last installation of the CUDA set is uninstalled, the
/// registry is detached and emptied: no hook sees frees any more, so it could only go stale.
pub fn install() -> Result<Installation> {
    crate::registry::attach()?;
    Ok(hooks::install(&hook_set()?)?.on_last_uninstall(crate::registry::detach))
}

/// The process-wide installation made by the constructor or the C API (0: none).
static GLOBAL_INSTALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Install once for the whole process (idempotent); what `cuhook_install()` does.
pub fn install_global() -> Result<()> {
    use std::sync::atomic::Ordering;
    if GLOBAL_INSTALL.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    let id = install()?.leak();
    if GLOBAL_INSTALL
        .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        hooks::uninstall_id(id)?;
    }
    Ok(())
}

/// Undo [`install_global`]; `Err(NotInstalled)` when nothing is installed.
///
/// The registry is emptied and stops being updated: with the hooks gone, frees are no longer
/// seen, so anything it kept could turn into memory reported live after it was freed (also
/// after a reinstall). Allocations that outlive the uninstall are answered by classification.
pub fn uninstall_global() -> Result<hooks::UninstallReport> {
    let id = GLOBAL_INSTALL.swap(0, std::sync::atomic::Ordering::AcqRel);
    if id == 0 {
        return Err(crate::Error::NotInstalled);
    }
    uninstall_id(id)
}

/// Undo one installation of the CUDA set by its id; the last one detaches the registry.
pub fn uninstall_id(id: u64) -> Result<hooks::UninstallReport> {
    let report = hooks::uninstall_id(id)?;
    // Another installation of the CUDA set (a Rust `install`, the C API's) keeps the hooks,
    // and so the registry, current.
    if !report.still_referenced {
        crate::registry::detach();
    }
    Ok(report)
}
