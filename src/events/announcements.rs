//! Per-thread announcements: where a dispatching thread says "I am reading a snapshot since
//! epoch E" and "I am running the callback with token T", without writing any shared cache line.
//!
//! Every thread claims one slot for good on its first dispatch (a reference to it lives in the
//! destructor-free thread-local of `thread.rs`). Slots of exited threads are reclaimed by a
//! liveness check (`tgkill(pid, tid, 0)` answers `ESRCH`) when the owned slots run out, or while
//! a writer waits on a slot. A liveness check was chosen over a `pthread_key_create` destructor
//! because it cannot run after this library is unloaded, does not race with other TLS
//! destructors that free CUDA memory (and so dispatch) after ours would have run, and needs no
//! per-thread registration. A reused thread id only makes a dead slot look alive (it is kept
//! longer), never the reverse; so does a thread the kernel is still reaping.
//!
//! A thread that finds every owned slot taken by a live thread borrows one of `SPARE` slots for
//! the length of each outermost dispatch (a shared CAS: slower, still correct). If all spares
//! are lent, it waits for one. A lent slot records its borrower's thread id, so the spare of a
//! borrower that died inside a callback is reclaimed like an owned slot (before, it stayed lent
//! for ever, and an `unsubscribe` of that callback waited for it for ever).
//!
//! After `fork`, the child holds only the forking thread: a `pthread_atfork` child handler frees
//! every other slot (their owners do not exist there) and re-stamps the caller's with its new id.
//!
//! Thread ids and the liveness check are `crate::sys::thread`'s; the atfork registration is
//! `crate::sys::once`'s.

use crate::atomics::{spin_loop, yield_now, Ordering};
use crate::sys::thread;

pub(crate) use super::announce::Announcement;
pub use super::announce::MAX_DEPTH;
use super::announce::{lent_to, FREE, LENT, RECLAIMING};
use super::thread::{ThreadState, THREAD};

/// All slots. 512 × 128 bytes = 64 KiB of zero-initialised memory, touched only as used.
#[cfg(not(loom))]
pub(crate) const ANNOUNCEMENT_COUNT: usize = 512;
#[cfg(loom)]
pub(crate) const ANNOUNCEMENT_COUNT: usize = 4;
/// Slots at the end kept free for threads that have no owned slot; lent per outermost dispatch.
#[cfg(not(loom))]
const SPARE: usize = 16;
#[cfg(loom)]
const SPARE: usize = 1;
/// Slots that threads own until they exit.
const OWNED: usize = ANNOUNCEMENT_COUNT - SPARE;

#[cfg(not(loom))]
pub(crate) static ANNOUNCEMENTS: [Announcement; ANNOUNCEMENT_COUNT] =
    [const { Announcement::new() }; ANNOUNCEMENT_COUNT];
#[cfg(loom)]
loom::lazy_static! {
    pub(crate) static ref ANNOUNCEMENTS: [Announcement; ANNOUNCEMENT_COUNT] = core::array::from_fn(|_| Announcement::new());
}

/// Where a new dispatch level of this thread announces itself.
pub(crate) struct Level {
    pub(crate) slot: &'static Announcement,
    /// 0 for the outermost dispatch.
    pub(crate) level: usize,
    /// The slot was borrowed for this (outermost) level and goes back at its exit.
    pub(crate) borrowed: bool,
}

/// Enters one dispatch level on this thread; `None` beyond [`MAX_DEPTH`]. The outermost level
/// of a thread without a slot claims or borrows one.
#[inline]
pub(crate) fn enter_level() -> Option<Level> {
    THREAD.with(|t| {
        let depth = t.depth.get() as usize;
        if depth >= MAX_DEPTH {
            return None;
        }
        // Only an owning thread has a slot at depth 0; a borrower gets one per dispatch.
        let (slot, borrowed) = match t.slot.get() {
            Some(slot) => (slot, false),
            None => outermost_slot_slow(t),
        };
        t.depth.set(depth as u32 + 1);
        Some(Level {
            slot,
            level: depth,
            borrowed,
        })
    })
}

/// Leaves `level`, the level entered last, and gives a `borrowed` slot back. (Storing the known
/// level instead of decrementing saves a load that would wait on the store made at entry.)
#[inline]
pub(crate) fn exit_level(level: usize, borrowed: bool) {
    THREAD.with(|t| {
        t.depth.set(level as u32);
        if borrowed {
            if let Some(slot) = t.slot.take() {
                // Release: our announcements (already cleared) happen before the next borrower's.
                slot.owner.store(FREE, Ordering::Release);
            }
        }
    })
}

/// The slot this thread is using now, if it is inside a dispatch or owns one.
pub(crate) fn current_announcement() -> Option<&'static Announcement> {
    THREAD.with(|t| t.slot.get())
}

/// The first dispatch of a thread claims a slot; later ones get here only if that failed.
/// Returns the slot and whether it is borrowed.
#[cold]
fn outermost_slot_slow(t: &ThreadState) -> (&'static Announcement, bool) {
    if !t.tried_to_claim.replace(true) {
        if let Some(slot) = claim_owned() {
            t.slot.set(Some(slot));
            return (slot, false);
        }
    }
    let slot = borrow_spare();
    t.slot.set(Some(slot));
    (slot, true)
}

/// The child handler's registration, fork-safe: with a `std::sync::Once` a child forked while
/// another thread registered it waited for ever in its first dispatch.
static ATFORK: crate::sys::once::ForkSafeOnce = crate::sys::once::ForkSafeOnce::new();

fn claim_owned() -> Option<&'static Announcement> {
    // A failed registration (ENOMEM) only loses the post-fork clean-up, which is best effort.
    ATFORK.register_fork_handlers(
        None,
        None,
        Some(after_fork_child),
        "a forked child keeps its parent's event slots",
    );
    let me = thread::id();
    for pass in 0..2 {
        for slot in &ANNOUNCEMENTS[..OWNED] {
            if slot.owner.load(Ordering::Relaxed) == FREE
                && slot
                    .owner
                    .compare_exchange(FREE, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(slot);
            }
        }
        if pass == 0 {
            reclaim_dead();
        }
    }
    None
}

/// Borrows a spare slot; spins only while every spare is lent to a thread that is dispatching,
/// which ends when those dispatches return.
fn borrow_spare() -> &'static Announcement {
    let lent = LENT | thread::id();
    let mut spins = 0u32;
    loop {
        for slot in &ANNOUNCEMENTS[OWNED..] {
            if slot.owner.load(Ordering::Relaxed) == FREE
                && slot
                    .owner
                    .compare_exchange(FREE, lent, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return slot;
            }
        }
        backoff(&mut spins);
        // A borrower that died inside a callback never gives its spare back.
        if spins.is_multiple_of(4096) {
            ANNOUNCEMENTS[OWNED..].iter().for_each(|s| {
                reclaim_if_dead(s);
            });
        }
    }
}

/// Frees the owned slots of threads that no longer exist.
fn reclaim_dead() {
    for slot in &ANNOUNCEMENTS[..OWNED] {
        reclaim_if_dead(slot);
    }
}

/// Frees `slot` if its owner thread is gone (it may have died inside a callback, leaving its
/// announcements set). Returns whether it did.
pub(crate) fn reclaim_if_dead(slot: &Announcement) -> bool {
    let owner = slot.owner.load(Ordering::Acquire);
    if owner == FREE || owner == RECLAIMING || thread::alive(lent_to(owner).unwrap_or(owner)) {
        return false;
    }
    if slot
        .owner
        .compare_exchange(owner, RECLAIMING, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    slot.clear();
    slot.owner.store(FREE, Ordering::Release);
    true
}

/// Spin briefly, then yield: waiters on a 2-core machine must let the awaited thread run.
pub(crate) fn backoff(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins < 64 {
        spin_loop();
    } else {
        yield_now();
    }
}

/// In the child after `fork`, only the forking thread exists: free every other slot (including
/// ones whose owners were mid-dispatch, which would otherwise block writers forever) and give the
/// caller's slot its new thread id.
extern "C" fn after_fork_child() {
    // It runs, so it is registered: the child must not register it again.
    ATFORK.mark_done();
    let mine = current_announcement();
    for slot in ANNOUNCEMENTS.iter() {
        if mine.is_some_and(|m| std::ptr::eq(m, slot)) {
            let lent = lent_to(slot.owner.load(Ordering::Relaxed)).is_some();
            let tid = thread::id();
            slot.owner
                .store(if lent { LENT | tid } else { tid }, Ordering::Relaxed);
        } else {
            slot.clear();
            slot.owner.store(FREE, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slot_is_claimed_once_and_levels_nest() {
        std::thread::spawn(|| {
            let a = enter_level().expect("level 0");
            assert_eq!(a.level, 0);
            let b = enter_level().expect("level 1");
            assert_eq!(b.level, 1);
            assert!(std::ptr::eq(a.slot, b.slot));
            exit_level(1, false);
            exit_level(0, false);
            let first = current_announcement().expect("owns a slot");
            let c = enter_level().expect("level 0 again");
            assert!(std::ptr::eq(c.slot, first));
            assert_eq!(c.level, 0);
            exit_level(0, false);
        })
        .join()
        .unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "needs tgkill, which Miri does not have")]
    fn slot_of_exited_thread_is_reclaimed() {
        let (slot, tid) = std::thread::spawn(|| {
            let _ = enter_level();
            exit_level(0, false);
            (current_announcement().unwrap(), thread::id())
        })
        .join()
        .unwrap();
        // The thread has been joined; the kernel forgets its id a moment later (it clears the
        // joiner's futex before it finishes exiting). Another thread may also have reclaimed
        // (and even re-claimed) the slot first; then its owner changed.
        let mut spins = 0;
        while !reclaim_if_dead(slot) && slot.owner.load(Ordering::Relaxed) == tid {
            backoff(&mut spins);
        }
    }

    #[test]
    fn depth_limit() {
        std::thread::spawn(|| {
            for _ in 0..MAX_DEPTH {
                assert!(enter_level().is_some());
            }
            assert!(enter_level().is_none());
            for level in (0..MAX_DEPTH).rev() {
                exit_level(level, false);
            }
        })
        .join()
        .unwrap();
    }
}
