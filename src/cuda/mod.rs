//! The CUDA hook set: allocation, free, teardown and entry-point-lookup hooks for the driver and
//! runtime APIs (`table`), how each call becomes events (`emit`), and the driver calls cuhook
//! makes itself (`driver`).

mod abi;
pub mod classify;
mod driver;
mod emit;
mod procaddress;
mod table;

pub use classify::{classify, Classification, Source};
pub use table::{Group, HookInfo, HOOKS};

use crate::hooks::{self, Hook, HookSet, Installation};
use crate::Result;

/// Name of the CUDA hook set.
pub const SET_NAME: &str = "cuda";

/// The CUDA hook set, ready for [`hooks::install`].
pub fn hook_set() -> Result<HookSet> {
    let hooks = HOOKS
        .iter()
        .map(|h| Hook::new(h.symbol, (h.replacement)(), h.original))
        .collect::<Result<Vec<_>>>()?;
    HookSet::new(SET_NAME, hooks)
}

/// Install the CUDA hooks and the registry (the registry subscribes first, so every later
/// subscriber can already look up the range an event names).
pub fn install() -> Result<Installation> {
    crate::registry::attach()?;
    hooks::install(&hook_set()?)
}
