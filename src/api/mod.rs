//! The Rust API in one place: install the hooks, subscribe to events, ask the registry.
//!
//! ```
//! use cuhook::events::{mask, MemEvent};
//!
//! fn on_event(ev: &MemEvent, _context: usize) {
//!     eprintln!("{:?} {} bytes at {:#x} by {:?}", ev.kind, ev.size, ev.address, ev.api);
//! }
//!
//! // Patch every loaded object (and every object loaded later) and start the registry.
//! let hooks = cuhook::install()?;
//! // Lower priorities run first; the registry is updated before any subscriber runs.
//! let subscription = cuhook::subscribe(mask::ALL, 0, on_event, 0)?;
//!
//! // ... CUDA work ...
//! if let Some(a) = cuhook::lookup(0x7f00_0000_0000) {
//!     println!("GPU memory of {} bytes from {:?}", a.size, a.api);
//! }
//!
//! drop(subscription); // unsubscribes: `on_event` runs on no thread after this
//! hooks.uninstall()?; // puts every patched slot back
//! # Ok::<(), cuhook::Error>(())
//! ```

use crate::cuda::HookInfo;
use crate::events::{self, Callback, MemEvent, SubscriptionId};
use crate::hooks::Installation;
use crate::registry::{self, Allocation};
use crate::Result;

/// Install the CUDA hook set and the registry. The returned guard uninstalls when dropped
/// (use [`Installation::leak`] to keep the hooks for the life of the process).
pub fn install() -> Result<Installation> {
    crate::cuda::install()
}

/// A live subscription; dropping it unsubscribes, after which the callback runs on no thread.
#[must_use = "dropping the subscription unsubscribes"]
#[derive(Debug)]
pub struct Subscription {
    id: Option<SubscriptionId>,
}

impl Subscription {
    /// Unsubscribe now, reporting errors.
    pub fn unsubscribe(mut self) -> Result<()> {
        match self.id.take() {
            Some(id) => events::unsubscribe_id(id),
            None => Ok(()),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = events::unsubscribe_id(id);
        }
    }
}

/// Call `callback(event, context)` for every event whose kind is in `mask`
/// ([`events::mask`]); lower `priority` runs first, equal priorities in subscription order.
pub fn subscribe(
    mask: u32,
    priority: i32,
    callback: fn(&MemEvent, usize),
    context: usize,
) -> Result<Subscription> {
    let id = events::subscribe(mask, priority, Callback::Rust(callback), context)?;
    Ok(Subscription { id: Some(id) })
}

/// Like [`subscribe`], but first replay every range the registry already holds as an alloc
/// event flagged [`events::flags::EXISTING`].
pub fn subscribe_with_existing(
    mask: u32,
    priority: i32,
    callback: fn(&MemEvent, usize),
    context: usize,
) -> Result<Subscription> {
    let id = events::subscribe_with_replay(
        mask,
        priority,
        Callback::Rust(callback),
        context,
        registry::replay_existing,
    )?;
    Ok(Subscription { id: Some(id) })
}

/// The allocation containing `ptr`, from the registry alone (no driver call).
///
/// ```
/// let on_stack = 0u64;
/// assert!(cuhook::lookup(&on_stack as *const u64 as usize).is_none());
/// ```
///
/// One call from another crate, and inside it the registry's lookup inlined against its static
/// (see [`registry::global`] for why that static is kept out of other crates' reach).
#[inline(never)]
pub fn lookup(ptr: usize) -> Option<Allocation> {
    registry::hot().lookup(ptr)
}

/// The allocation containing all of `[ptr, ptr + len)`, from the registry alone.
#[inline(never)]
pub fn lookup_span(ptr: usize, len: usize) -> Option<Allocation> {
    registry::hot().lookup_span(ptr, len)
}

/// Every hooked CUDA symbol.
///
/// ```
/// let table = cuhook::hook_table();
/// // Each exported variant is its own hook; cuGetProcAddress is asked for the base name.
/// let ptsz = table.iter().find(|h| h.symbol == "cuMemAllocAsync_ptsz").unwrap();
/// assert_eq!(ptsz.base, "cuMemAllocAsync");
/// ```
pub fn hook_table() -> &'static [HookInfo] {
    crate::cuda::HOOKS
}
