//! Grace periods: how a writer learns that no dispatching thread still reads an old snapshot or
//! still runs a removed callback, while readers write only their own [`Announcement`].
//!
//! Two announcements per reader, each answered by a writer with a Dekker-style handshake
//! (reader: store announcement, barrier, load shared state; writer: store shared state, barrier,
//! load announcements — at least one side sees the other's store):
//! * **snapshot**: on entering its outermost dispatch a thread stores the current global epoch in
//!   its slot, then loads the list head. A writer that swapped the head and then advanced the
//!   epoch to `E` may free the old snapshot once every slot holds 0 or an epoch `>= E`.
//! * **callback**: before each call a thread stores the subscription's token and the event's kind
//!   bit in its slot, then re-checks that the token is still live for that kind. `unsubscribe`
//!   clears the kinds, then waits until no *other* thread's slot shows a call of them. Waiting per
//!   callback and kind (not for whole dispatches) is what lets two threads each unsubscribe their
//!   own callback from inside it without waiting on each other.
//!
//! The reader's barrier is the hot path. Where Linux `membarrier(PRIVATE_EXPEDITED)` works, the
//! reader needs only a compiler fence and the writer issues the syscall, which executes a full
//! fence on every running thread of the process (the asymmetric scheme of liburcu's "memb"
//! flavour). Elsewhere both sides use `fence(SeqCst)` (an `mfence`, ~3 ns on the dev VM).
//!
//! A sandbox may deny `membarrier` after it was registered (a seccomp filter a program installs
//! once it has started). Then nothing aborts: new sections fence fully from then on, and each
//! writer barrier, which may still meet readers that entered with a compiler fence only, makes
//! every running thread of the process pass a full fence another way
//! ([`membarrier::process_wide_fence`]: a page-protection change, whose TLB shootdown
//! interrupts every CPU running the process on x86-64; on other architectures, where TLB
//! invalidations are broadcast without interrupts, also a wait of a few milliseconds, past which
//! no store of a running reader is still unpublished). `cuhook::events::asymmetric_barriers()` is then false.
//!
//! The system calls (`membarrier`, the fallback's page) are `crate::sys::membarrier`'s.

use std::sync::atomic::{compiler_fence, AtomicBool};

use crate::atomics::{fence, AtomicU64, Ordering};

use super::announcements::{self, backoff, Announcement, ANNOUNCEMENTS, MAX_DEPTH};
use crate::sys::membarrier;

/// Advanced by writers after each head swap; starts at 1 because 0 means "not dispatching".
#[cfg(not(loom))]
static EPOCH: AtomicU64 = AtomicU64::new(1);
#[cfg(loom)]
loom::lazy_static! {
    static ref EPOCH: AtomicU64 = AtomicU64::new(1);
}

/// True once `membarrier` is registered; back to false only if it is denied later (then
/// [`DEGRADED`] is set first). Not an atomic of the modelled protocol: under loom (and Miri) it
/// stays false.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);
/// Set when `membarrier` failed after registration: every writer barrier from then on uses
/// [`membarrier::process_wide_fence`] (a reader may still be in a section it entered with a
/// compiler fence).
static DEGRADED: AtomicBool = AtomicBool::new(false);
/// Fork-safe: `init_writer` may wait on `membarrier` registration for milliseconds, and a child
/// forked meanwhile must not wait for ever on a `std::sync::Once` (registering again is harmless).
static MODE: crate::sys::once::ForkSafeOnce = crate::sys::once::ForkSafeOnce::new();

/// Chooses the barrier scheme; every writer calls this before touching shared state.
/// `CUHOOK_NO_MEMBARRIER=1` forces the symmetric fences (for comparison, or where the IPIs of
/// `membarrier` would disturb other work on the machine).
///
/// Why this is safe to switch at run time: `ASYMMETRIC` is set inside the `Once`, and every writer
/// passes the `Once` before its first barrier, so once any reader can see `true`, every writer
/// already uses `membarrier`. A reader that still sees `false` fences fully, which is correct
/// against either writer barrier.
pub(crate) fn init_writer() {
    MODE.call_once(|| {
        // Loom and Miri cannot model or run `membarrier`: they check the fence scheme.
        if cfg!(loom)
            || cfg!(miri)
            || std::env::var_os("CUHOOK_NO_MEMBARRIER").is_some_and(|v| v == "1")
        {
            return;
        }
        if membarrier::register_private_expedited() {
            ASYMMETRIC.store(true, Ordering::SeqCst);
        }
    });
}

/// Whether readers get away with a compiler fence (for the docs and the benchmark report).
/// Not inlinable into other crates, so that `ASYMMETRIC` stays out of their reach (and out of
/// the GOT the dispatching hooks would otherwise read it through).
#[inline(never)]
pub fn asymmetric_barriers() -> bool {
    init_writer();
    ASYMMETRIC.load(Ordering::Relaxed)
}

/// Orders the reader's announcement store before its following loads.
#[inline(always)]
fn reader_barrier(asymmetric: bool) {
    if asymmetric {
        // The writer's membarrier supplies the hardware fence; only stop the compiler.
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// Orders the writer's preceding stores before its following loads of every slot.
fn writer_barrier() {
    fence(Ordering::SeqCst);
    if DEGRADED.load(Ordering::Acquire) {
        membarrier::process_wide_fence();
    } else if ASYMMETRIC.load(Ordering::Relaxed) && !membarrier::private_expedited() {
        degrade();
    }
    fence(Ordering::SeqCst);
}

/// `membarrier` failed after registration: readers fence fully from now on, and this and every
/// later writer barrier use [`membarrier::process_wide_fence`].
#[cold]
fn degrade() {
    if !DEGRADED.swap(true, Ordering::SeqCst) {
        ASYMMETRIC.store(false, Ordering::SeqCst);
        crate::log!(
            crate::log::Level::Warn,
            "membarrier failed after registration ({}): subscriber lists fall back to full fences",
            std::io::Error::last_os_error()
        );
    }
    membarrier::process_wide_fence();
}

/// One dispatch level on this thread. While the outermost `Section` lives, no snapshot loaded
/// after its creation is freed.
pub(crate) struct Section {
    slot: &'static Announcement,
    level: usize,
    /// The slot was borrowed for this outermost level (see `announcements.rs`).
    borrowed: bool,
    /// `ASYMMETRIC`, read once per level (it only ever turns true, so a stale false is safe).
    asymmetric: bool,
    /// Sections are per-thread; keep them off other threads.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Section {
    /// Enters a dispatch level; `None` when the thread is already [`announcements::MAX_DEPTH`] deep.
    #[inline]
    pub(crate) fn enter() -> Option<Section> {
        let l = announcements::enter_level()?;
        let asymmetric = ASYMMETRIC.load(Ordering::Relaxed);
        if l.level == 0 {
            // Acquire pairs with the writer's epoch advance: seeing epoch E means seeing the
            // head swap that preceded it. The store is Relaxed; reader_barrier orders it before
            // the caller's head load (StoreLoad), which is the half of the handshake that matters.
            l.slot
                .epoch
                .store(EPOCH.load(Ordering::Acquire), Ordering::Relaxed);
            reader_barrier(asymmetric);
        }
        Some(Section {
            slot: l.slot,
            // Below MAX_DEPTH by construction; the modulo only spares the bounds checks.
            level: l.level % MAX_DEPTH,
            asymmetric,
            borrowed: l.borrowed,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Announces that a callback is about to run (`call` is its token and the event's kind bit,
    /// as `subscribers::live_word` packs them); the caller must then check that the token is
    /// still live for that kind and call [`Section::end_call`] afterwards.
    #[inline(always)]
    pub(crate) fn begin_call(&self, call: u64) {
        self.slot.active[self.level].store(call, Ordering::Relaxed);
        reader_barrier(self.asymmetric);
    }

    /// Ends the announced call. Release: everything the callback did to its context happens
    /// before a writer that sees 0 here returns from `unsubscribe` (and the caller frees it).
    #[inline(always)]
    pub(crate) fn end_call(&self) {
        self.slot.active[self.level].store(0, Ordering::Release);
    }
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        if self.level == 0 {
            // Release: our reads of the snapshot happen before a writer that sees 0 frees it.
            self.slot.epoch.store(0, Ordering::Release);
        }
        announcements::exit_level(self.level, self.borrowed);
    }
}

/// Called by a writer right after swapping the list head; returns the epoch that readers of the
/// new head announce at least (an old snapshot retired with it is free once no slot is older).
pub(crate) fn advance_epoch() -> u64 {
    EPOCH.fetch_add(1, Ordering::SeqCst) + 1
}

/// The oldest epoch announced by any thread now inside a dispatch (this one included: its outer
/// dispatch may still be iterating an old snapshot), or `u64::MAX` if none is. A snapshot retired
/// at epoch `E` can be freed when `E <= oldest_reader_epoch()`. Never blocks.
pub(crate) fn oldest_reader_epoch() -> u64 {
    writer_barrier();
    ANNOUNCEMENTS
        .iter()
        .map(|s| s.epoch.load(Ordering::Acquire))
        .filter(|&e| e != 0)
        .min()
        .unwrap_or(u64::MAX)
}

/// Blocks until no thread other than the caller is running a call of one of `removed`: pairs of
/// a token and the kind bits taken from it (already cleared from the list's live table).
pub(crate) fn wait_for_calls(removed: &[(u64, u32)]) {
    if removed.is_empty() {
        return;
    }
    let matches = |call: u64| {
        removed
            .iter()
            .any(|&(token, bits)| call >> 8 == token && call & u64::from(bits) != 0)
    };
    writer_barrier();
    let mine = announcements::current_announcement();
    for slot in ANNOUNCEMENTS.iter() {
        if mine.is_some_and(|m| std::ptr::eq(m, slot)) {
            // The caller's own in-progress calls complete after it returns; waiting would hang.
            continue;
        }
        let mut spins = 0u32;
        while slot
            .active
            .iter()
            .any(|a| matches(a.load(Ordering::Acquire)))
        {
            backoff(&mut spins);
            // A thread that died inside a callback never clears its slot.
            if spins.is_multiple_of(4096) && announcements::reclaim_if_dead(slot) {
                break;
            }
        }
    }
}
