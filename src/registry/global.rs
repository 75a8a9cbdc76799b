//! The process-wide registry and the subscriber that keeps it in step with the events.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Allocation, Registry};
use crate::events::{self, mask, Callback, EventKind, MemEvent};
use crate::Result;

static GLOBAL: Registry = Registry::new();
static ATTACHED: AtomicBool = AtomicBool::new(false);
static UNKNOWN_FREES: AtomicU64 = AtomicU64::new(0);
static FAILED_FREES: AtomicU64 = AtomicU64::new(0);

/// The registry the CUDA hooks maintain.
pub fn global() -> &'static Registry {
    &GLOBAL
}

/// The registry runs before every other subscriber: on an alloc they can already look the range
/// up; on a free the event itself carries the record's size and metadata.
pub const PRIORITY: i32 = -1000;

fn on_event(ev: &MemEvent, _context: usize) {
    match ev.kind {
        EventKind::Alloc => {
            GLOBAL.insert(Allocation::from_event(ev));
        }
        EventKind::Free => {
            if ev.size == 0 {
                return;
            }
            // A free names a whole allocation by its start: one exact descent. A VMM unmap may
            // cover part of a mapping (split) or several mappings: a span removal.
            let whole = ev.flags & crate::events::flags::VMM == 0
                && GLOBAL
                    .remove_allocation(ev.address)
                    .is_some_and(|a| a.size == ev.size);
            if !whole {
                GLOBAL.remove(ev.address, ev.size);
            }
        }
    }
}

/// Subscribe the registry (once).
pub fn attach() -> Result<()> {
    if ATTACHED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    if let Err(e) = events::subscribe(mask::ALL, PRIORITY, Callback::Rust(on_event), 0) {
        ATTACHED.store(false, Ordering::Release);
        return Err(e);
    }
    Ok(())
}

/// Feed every range the registry holds to `emit` as an alloc event: the replay a new subscriber
/// that asks for existing allocations receives.
pub fn replay_existing(emit: &mut dyn FnMut(&crate::events::MemEvent)) {
    GLOBAL.for_each(|a| emit(&a.to_event()));
}

/// A free of a pointer the registry never saw (allocated before install).
pub fn note_unknown_free() {
    UNKNOWN_FREES.fetch_add(1, Ordering::Relaxed);
}

/// A free that was announced but then refused by the driver.
pub fn note_failed_free() {
    FAILED_FREES.fetch_add(1, Ordering::Relaxed);
}

/// Counters for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Ranges registered now.
    pub live: usize,
    /// Bytes of those ranges.
    pub live_bytes: usize,
    /// Inserts over a live range (a pool handed the address out again without a seen free).
    pub missed_frees: u64,
    /// Frees of pointers the registry never held.
    pub unknown_frees: u64,
    /// Frees the driver refused after they were announced.
    pub failed_frees: u64,
}

/// The global registry's counters now.
pub fn stats() -> RegistryStats {
    RegistryStats {
        live: GLOBAL.len(),
        live_bytes: GLOBAL.live_bytes(),
        missed_frees: GLOBAL.missed_frees(),
        unknown_frees: UNKNOWN_FREES.load(Ordering::Relaxed),
        failed_frees: FAILED_FREES.load(Ordering::Relaxed),
    }
}
