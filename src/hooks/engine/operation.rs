//! The patch lock: one engine operation at a time, re-entry refused, and fork handlers so
//! that a child never inherits the lock held by a thread that does not exist in it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::hooks::substitution::publish;
use crate::sys::dl::clear_error;
use crate::sys::once::ForkSafeOnce;

use super::{State, STATE, SYNCED_ADDS, SYNCED_SUBS};

thread_local! {
    /// Set while this thread runs an engine operation: loader calls made by the operation (and
    /// constructors or destructors they run) must not start another one.
    static IN_OPERATION: Cell<bool> = const { Cell::new(false) };
}

/// Exclusive access to the engine for one operation.
pub(crate) struct Operation {
    guard: spin::MutexGuard<'static, State>,
    /// The kept maps descriptor is checked once per operation.
    _maps: crate::elf::CheckedSpan,
}

/// The fork handlers took the patch lock for the fork. (The dlsym table's lock they always take:
/// see `prepare_fork`.)
static HELD_FOR_FORK: AtomicBool = AtomicBool::new(false);
/// In a child: the patch lock was inherited held by a thread that does not exist here (the
/// fork handlers could not take it in time), so no operation can ever run.
static ORPHANED: AtomicBool = AtomicBool::new(false);
/// Forks waiting in [`prepare_fork`] for the patch lock. While one is, no operation starts: the
/// lock is not fair, and with operations run back to back (a loop of installs) the thread that
/// ends one takes the lock again before a forking thread, which only tries between yields, gets
/// a turn. On a busy host that starved the fork for the whole of [`FORK_PATIENCE`], and it then
/// went on with the lock held by another thread, possibly inside the loader: its child waited
/// for ever in its first `dlopen`.
static FORKS_WAITING: AtomicUsize = AtomicUsize::new(0);
/// How long an operation lets waiting forks go first before it competes for the lock as before:
/// threads forking back to back (each fork holds the lock across its `fork`) would otherwise
/// keep every operation out, and a new library would stay unpatched.
const FORK_PRIORITY: Duration = Duration::from_millis(500);
/// How long the fork handler waits for a running operation to end. Operations are short; only
/// a fork from a thread holding the loader lock (a constructor) while an operation waits for
/// that lock reaches it.
const FORK_PATIENCE: Duration = Duration::from_secs(5);

/// The fork handlers' registration (a fork-safe once: a `std::sync::Once` left a child forked
/// mid-registration waiting for ever in its first operation).
static REGISTRATION: ForkSafeOnce = ForkSafeOnce::new();

/// Install the fork handlers (once per process), so that a child never inherits the patch lock
/// held by a thread that does not exist in it.
fn protect_fork() {
    REGISTRATION.register_fork_handlers(
        Some(prepare_fork),
        Some(after_fork),
        Some(after_fork_child),
        "a fork during a hook install may leave the child unable to patch",
    );
}

/// Before a fork: wait for a running operation to end and hold the patch lock across the fork
/// (the child then starts with a consistent engine); not when this thread is inside an
/// operation: it lives on in the child and finishes it there. Then, in every case, hold the
/// dlsym table's lock: a leaf lock that readers and the one writer hold for a few instructions,
/// never this thread here, so the wait is short; a child must not inherit it read-locked by
/// another thread's `dlsym` (its operation's end rebuilds the table).
extern "C" fn prepare_fork() {
    // The handlers run, so they are registered: the child must not register them again.
    REGISTRATION.mark_done();
    if !IN_OPERATION.with(|f| f.get()) {
        FORKS_WAITING.fetch_add(1, Ordering::AcqRel);
        let start = Instant::now();
        loop {
            if let Some(guard) = STATE.try_lock() {
                std::mem::forget(guard);
                HELD_FOR_FORK.store(true, Ordering::Release);
                break;
            }
            if start.elapsed() >= FORK_PATIENCE {
                break;
            }
            #[cfg(all(test, not(loom)))]
            tests::note_waiting();
            std::thread::yield_now();
        }
        // Never below zero: a fork made meanwhile by a signal handler on this thread reset the
        // count in its child, which then goes on here.
        let _ =
            FORKS_WAITING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
    crate::hooks::substitution::hold_for_fork();
}

/// After a fork, in the parent: release what `prepare_fork` took.
extern "C" fn after_fork() {
    // SAFETY: `prepare_fork` took the table's lock, and the patch lock when it says so, on this
    // thread just before the fork.
    #[allow(unsafe_code)]
    unsafe {
        crate::hooks::substitution::release_after_fork();
        if HELD_FOR_FORK.swap(false, Ordering::AcqRel) {
            STATE.force_unlock();
        }
    }
}

/// After a fork, in the child: as in the parent; a lock the handler could not take belongs to
/// a thread that is gone, so the engine refuses operations instead of waiting forever.
extern "C" fn after_fork_child() {
    // Forks other threads were waiting for do not happen here (those threads are gone).
    FORKS_WAITING.store(0, Ordering::Release);
    crate::elf::CheckedSpan::recheck_after_fork();
    let held = HELD_FOR_FORK.load(Ordering::Acquire);
    if !held && STATE.is_locked() && !IN_OPERATION.with(|f| f.get()) {
        ORPHANED.store(true, Ordering::Release);
    }
    after_fork();
}

impl Operation {
    /// Wait for the patch lock; `None` on this thread's re-entry or after `patience` elapsed.
    pub(crate) fn begin(patience: Option<Duration>) -> Option<Operation> {
        if IN_OPERATION.with(|f| f.get()) || ORPHANED.load(Ordering::Acquire) {
            return None;
        }
        // The loader functions cuhook calls for itself, read before this operation patches
        // anything (our own object is patched when the crate is part of its host).
        crate::sys::real::capture();
        protect_fork();
        // A waiting fork goes first (`FORKS_WAITING`), for `FORK_PRIORITY` at most. The clock
        // is read only once the lock was not free at the first try.
        let free = |waiting_since: Option<Instant>| {
            let forks_first = FORKS_WAITING.load(Ordering::Acquire) != 0
                && waiting_since.is_none_or(|t| t.elapsed() < FORK_PRIORITY);
            if forks_first {
                None
            } else {
                STATE.try_lock()
            }
        };
        let guard = match free(None) {
            Some(g) => g,
            None => {
                let start = Instant::now();
                loop {
                    std::thread::yield_now();
                    if let Some(g) = free(Some(start)) {
                        break g;
                    }
                    if patience.is_some_and(|p| start.elapsed() >= p) {
                        return None;
                    }
                }
            }
        };
        IN_OPERATION.with(|f| f.set(true));
        Some(Operation {
            guard,
            _maps: crate::elf::CheckedSpan::begin(),
        })
    }

    pub(crate) fn state(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        if std::mem::take(&mut self.guard.dirty) {
            publish(self.guard.sets.iter().map(|s| &s.set));
        }
        let c = self.guard.last_counters;
        SYNCED_ADDS.store(c.adds, Ordering::Release);
        SYNCED_SUBS.store(c.subs, Ordering::Release);
        clear_error();
        IN_OPERATION.with(|f| f.set(false));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::mpsc;

    thread_local! {
        /// Set on the test's forking thread, so that the forks of other tests in this process
        /// (their prepare handlers run too) are not mistaken for it.
        static THE_TEST_FORK: Cell<bool> = const { Cell::new(false) };
    }
    /// The test's fork is waiting in `prepare_fork` (counted in `FORKS_WAITING`).
    static TEST_FORK_WAITING: AtomicBool = AtomicBool::new(false);

    /// Called from `prepare_fork`'s wait loop.
    pub(super) fn note_waiting() {
        if THE_TEST_FORK.with(|f| f.get()) {
            TEST_FORK_WAITING.store(true, Ordering::Release);
        }
    }

    /// Waits for `cond`, failing the test after 20 s instead of hanging.
    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "waited too long for {what}"
            );
            std::thread::yield_now();
        }
    }

    /// A fork waiting for the patch lock gets it when the running operation ends, before an
    /// operation started right after by the same thread (an install loop). Before the gate the
    /// second operation took the lock back at once and the fork waited for it to end too.
    #[test]
    fn a_waiting_fork_goes_before_the_next_operation() {
        static ORDER: AtomicU32 = AtomicU32::new(0);
        let (fork_got, next_got) = (AtomicU32::new(0), AtomicU32::new(0));
        let (release, released) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let (next_got, fork_got) = (&next_got, &fork_got);
            let holder = s.spawn(move || {
                let op = Operation::begin(None).expect("the lock is free");
                released.recv().unwrap();
                drop(op);
                // Straight back in, as a loop of installs does.
                let op = Operation::begin(None).expect("no patience limit");
                next_got.store(ORDER.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                // Held a while: without the gate the fork would wait for this too.
                std::thread::sleep(Duration::from_millis(50));
                drop(op);
            });
            wait_until("the first operation", || STATE.is_locked());
            let fork = s.spawn(move || {
                THE_TEST_FORK.with(|f| f.set(true));
                prepare_fork();
                fork_got.store(ORDER.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                let held = HELD_FOR_FORK.load(Ordering::Acquire);
                // Released before any assertion: a failure must not leave the locks held.
                after_fork();
                THE_TEST_FORK.with(|f| f.set(false));
                assert!(held, "the fork held the lock");
            });
            wait_until("the fork to wait", || {
                TEST_FORK_WAITING.load(Ordering::Acquire)
            });
            release.send(()).unwrap();
            fork.join().unwrap();
            holder.join().unwrap();
        });
        let (f, n) = (fork_got.into_inner(), next_got.into_inner());
        assert!(f != 0 && n != 0);
        assert!(
            f < n,
            "the fork (turn {f}) went after the next operation (turn {n})"
        );
    }
}
