//! One thread's announcement (what grace periods wait on), and the nesting bound it is sized
//! for. Below both the announcement table (`announcements.rs`) and the per-thread state
//! (`thread.rs`). Called "slots" before: renamed so that "slot" means a GOT slot (and the
//! registry's page-table slots), never this.

use crate::atomics::{atomic_array, AtomicU64, Ordering};

/// How many nested dispatch levels a thread may have (callback → allocation → dispatch → …).
/// Deeper dispatches are dropped and counted, so a callback that allocates on every event
/// terminates.
#[cfg(not(loom))]
pub const MAX_DEPTH: usize = 8;
/// Under loom, fewer levels and slots: the models' threads need few, and every atomic created
/// costs the model checker.
#[cfg(loom)]
pub const MAX_DEPTH: usize = 2;

pub(super) const FREE: u64 = 0;
/// Owner value of a spare slot while lent, or-ed with the borrower's thread id (`LENT | tid`;
/// thread ids fit in 32 bits), so that a borrower that died inside a callback can be found.
pub(super) const LENT: u64 = 1 << 63;

/// The borrower's thread id, if `owner` marks a lent spare.
pub(super) fn lent_to(owner: u64) -> Option<u64> {
    (owner & !0xffff_ffff == LENT).then_some(owner & 0xffff_ffff)
}
/// Owner value while a dead thread's slot is being cleared.
pub(super) const RECLAIMING: u64 = u64::MAX - 1;

/// One thread's announcements. 128-byte aligned so neighbours never share a cache line (nor the
/// adjacent line that the spatial prefetcher pulls in with it).
#[repr(C, align(128))]
pub(crate) struct Announcement {
    /// `FREE`, `LENT | borrower`, `RECLAIMING`, or the owner's kernel thread id. Written only on
    /// claim, lend, return and reclaim.
    pub(super) owner: AtomicU64,
    /// Global epoch read when the thread entered its outermost dispatch; 0 outside dispatch.
    pub(crate) epoch: AtomicU64,
    /// The call in progress at each nesting level (token and event kind, packed like the live
    /// table's words); 0 where none runs.
    pub(crate) active: [AtomicU64; MAX_DEPTH],
}

impl Announcement {
    crate::atomics::const_unless_loom! {
    pub(super) fn new() -> Announcement {
        Announcement {
            owner: AtomicU64::new(FREE),
            epoch: AtomicU64::new(0),
            active: atomic_array![AtomicU64::new(0); MAX_DEPTH],
        }
    }
    }

    pub(super) fn clear(&self) {
        self.epoch.store(0, Ordering::Relaxed);
        for a in &self.active {
            a.store(0, Ordering::Relaxed);
        }
    }
}
