//! A sequence latch over two copies of the tree (Linux calls the pattern `seqcount_latch`).
//!
//! Readers use the copy named by the parity of `seq`. A writer edits the *other* copy, publishes
//! it by bumping `seq` (one Release store), then replays the same edit on the copy readers just
//! left. A reader therefore never waits for a writer: whatever the writer is doing, the copy the
//! reader is told to use is complete. A reader whose walk overlapped a bump may have read a copy
//! that was being edited; it notices because `seq` changed, and retries on the other copy.
//!
//! Unlike a plain seqlock (odd = writer inside, readers spin), a writer preempted in the middle of
//! an edit stalls no reader.

use core::sync::atomic::{fence, AtomicU64, Ordering};

pub(super) struct Latch {
    seq: AtomicU64,
}

impl Latch {
    pub(super) const fn new() -> Self {
        Latch {
            seq: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the copy readers should use until it ran without a concurrent publish, and
    /// returns its result. `f` must only load (Relaxed) and copy: its result is meaningless until
    /// this returns it.
    #[inline(always)]
    pub(super) fn read<R>(&self, mut f: impl FnMut(usize) -> R) -> R {
        loop {
            // Acquire: pairs with the Release in `publish`, so the copy we are sent to is complete.
            let s = self.seq.load(Ordering::Acquire);
            let r = f((s & 1) as usize);
            // Acquire fence: if `f` saw any store the writer made after a later `publish`, that
            // publish is visible to the load below (the writer's Release fence pairs with it).
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                return r;
            }
            core::hint::spin_loop();
        }
    }

    /// Writer: the copy readers are not using now (edit it first).
    pub(super) fn spare(&self) -> usize {
        (self.seq.load(Ordering::Relaxed) & 1) as usize ^ 1
    }

    /// Writer: sends readers to the spare copy. Afterwards the other copy is the spare one.
    pub(super) fn publish(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        // Release: the edits of the spare copy happen-before any reader that sees `s + 1`.
        self.seq.store(s.wrapping_add(1), Ordering::Release);
        // Release fence: orders the store above before the writer's next edits, so a reader
        // that observes one of those edits also observes the bump and retries.
        fence(Ordering::Release);
    }
}
