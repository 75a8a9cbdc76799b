//! Operations on the whole registry in exclusive mode (the writer lock, lanes closed): purges,
//! clear (and the attached flag's switch, which clears on detach), consistent snapshots, and
//! the exclusive mode held across `fork`.

use super::write::{rec, Writer};
use super::{Allocation, Registry};

impl Registry {
    /// Removes every range for which `pred` is true (e.g. those of a destroyed context) and hands
    /// each to `out`; returns how many. Goes from range to range in address order, asking
    /// `pred` and calling `out` without the lock and allocating nothing. A range inserted
    /// meanwhile may or may not be considered; a matched range that was replaced meanwhile (new
    /// `seq`) is kept.
    pub fn purge(
        &self,
        mut pred: impl FnMut(&Allocation) -> bool,
        mut out: impl FnMut(Allocation),
    ) -> usize {
        let mut n = 0;
        let mut from = 0;
        loop {
            let Some(a) = self.next_from(from) else {
                return n;
            };
            if pred(&a) {
                let gone = {
                    let mut guard = self.exclusive();
                    let w = &mut *guard;
                    let gone = w.top_if_any(self).and_then(|top| {
                        let p = w.locate(top, a.start)?;
                        let r = rec(p).get();
                        (r.start == a.start && r.seq == a.seq).then(|| w.drop_range(top, p))
                    });
                    self.publish(w);
                    gone
                };
                if let Some(g) = gone {
                    out(g);
                    n += 1;
                }
            }
            match a.last().checked_add(1) {
                Some(next) => from = next,
                None => return n,
            }
        }
    }

    /// The range with the lowest start among those ending at `from` or later.
    fn next_from(&self, from: usize) -> Option<Allocation> {
        let mut guard = self.exclusive();
        let w = &mut *guard;
        let top = w.top_if_any(self)?;
        Writer::first_meeting(top, from, usize::MAX).map(|p| rec(p).get())
    }

    /// Opens (takes inserts) or closes (drops every range and refuses inserts) the registry,
    /// storing `open` into `flag` in the same step under the writer lock, and returns the flag's
    /// previous value. The process-wide registry's attached flag goes through here, so that an
    /// insert racing with a detach cannot land after the clear (it would stay for good, its free
    /// unseen), and an attach racing with a detach cannot leave it attached but closed.
    pub(crate) fn set_open(&self, flag: &core::sync::atomic::AtomicBool, open: bool) -> bool {
        let mut guard = self.exclusive();
        let was = flag.swap(open, core::sync::atomic::Ordering::AcqRel);
        guard.open = open;
        self.lanes.shut(!open);
        if !open {
            self.clear_locked(&mut guard);
        }
        was
    }

    /// Drops every range at once, without events (what the registry knows stopped being true:
    /// the hooks that keep it current were removed). Returns how many were dropped.
    fn clear_locked(&self, w: &mut Writer) -> usize {
        let Some(top) = w.top_if_any(self) else {
            return 0;
        };
        let mut n = 0;
        let mut from = 0;
        while let Some(p) = Writer::first_meeting(top, from, usize::MAX) {
            let a = w.drop_range(top, p);
            n += 1;
            match a.last().checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        self.publish(w);
        n
    }

    /// Every range, in address order (taken under the writer lock, so it is one consistent state).
    pub fn snapshot(&self) -> Vec<Allocation> {
        let mut all = Vec::new();
        let mut guard = self.exclusive();
        let w = &mut *guard;
        let Some(top) = w.top_if_any(self) else {
            return all;
        };
        let mut from = 0;
        while let Some(p) = Writer::first_meeting(top, from, usize::MAX) {
            let a = rec(p).get();
            all.push(a);
            match a.last().checked_add(1) {
                Some(next) => from = next,
                None => break,
            }
        }
        all
    }

    /// Calls `f` for every range of a [`Self::snapshot`], in address order, without the lock.
    pub fn for_each(&self, f: impl FnMut(Allocation)) {
        self.snapshot().into_iter().for_each(f);
    }
}

/// Loom builds never fork (and loom's lock has no `force_unlock`).
#[cfg(not(loom))]
impl Registry {
    /// Takes the writer lock with the lanes closed and keeps it (the `fork` prepare handler):
    /// no thread is then inside an edit, shared or not.
    pub(super) fn hold_for_fork(&self) {
        core::mem::forget(self.exclusive());
    }

    /// [`Self::release_after_fork`] in the child. Its only thread is the forking one, which
    /// holds no lane: a lane another thread took for a moment after the lanes drained (to find
    /// the gate closed and leave again) stays taken in the copy, by no one, and would hang the
    /// child's first exclusive edit. So every lane is freed first.
    ///
    /// # Safety
    ///
    /// As [`Self::release_after_fork`], in the child.
    pub(super) unsafe fn release_in_child(&self) {
        self.lanes.free_all();
        // SAFETY: the caller's contract.
        unsafe { self.release_after_fork() };
    }

    /// Releases the lock [`Self::hold_for_fork`] took.
    ///
    /// # Safety
    ///
    /// Only after `hold_for_fork` on this thread (or, in a child, in its parent's forking thread).
    pub(super) unsafe fn release_after_fork(&self) {
        // What dropping the forgotten guard would have done: lanes first, then the lock.
        self.lanes.forget_leaves();
        self.lanes.reopen();
        // SAFETY: the caller took the lock with `hold_for_fork` and forgot the guard.
        unsafe { self.writer.force_unlock() };
    }
}
