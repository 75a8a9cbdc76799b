//! One-time initialisation that a `fork` cannot wedge.
//!
//! `std::sync::Once` (and `spin::Once`) record "running" in memory: a child forked while another
//! thread runs the closure inherits that state, but not the thread, and its first caller waits
//! for ever. cuhook registers fork handlers and chooses its barrier scheme this way, from hook
//! paths of the host's threads, so a host that forks often (a Python worker pool) hit it: one
//! child in ≈ 18,000 hung under qemu before the engine's registration was rewritten like this.
//!
//! Here "running" is the pid of the process whose thread runs the closure. A caller that sees
//! its own pid waits (a sibling thread will finish soon); one that sees another pid is in a
//! child whose parent forked mid-way, and runs the closure itself. The closure must therefore
//! tolerate running again after a partial run in the parent. For `pthread_atfork`
//! registrations, where a second run would register the handlers twice, the handlers call
//! [`ForkSafeOnce::mark_done`]: if the registration was complete enough for them to run at the
//! fork, the child sees it done.
//!
//! # Safety
//! [`ForkSafeOnce::register_fork_handlers`] calls `pthread_atfork` with `extern "C"` handlers
//! its callers promise never unwind and live as long as the process.

use std::sync::atomic::{AtomicI32, Ordering};

const NEW: i32 = 0;
const DONE: i32 = -1;

/// A `Once` whose in-progress state does not survive into a forked child (see the module doc).
#[derive(Debug)]
pub(crate) struct ForkSafeOnce(AtomicI32);

impl ForkSafeOnce {
    pub(crate) const fn new() -> ForkSafeOnce {
        ForkSafeOnce(AtomicI32::new(NEW))
    }

    /// Run `f` unless it ran (or is running) in this process; returns once it has run.
    pub(crate) fn call_once(&self, f: impl FnOnce()) {
        if self.0.load(Ordering::Acquire) == DONE {
            return;
        }
        self.slow(f);
    }

    #[cold]
    fn slow(&self, f: impl FnOnce()) {
        let pid = std::process::id() as i32;
        loop {
            let seen = self.0.load(Ordering::Acquire);
            if seen == DONE {
                return;
            }
            if seen == pid {
                // A sibling thread runs it now: it will not be long.
                std::thread::yield_now();
                continue;
            }
            // Never run, or inherited running from a parent that forked mid-way: ours to run.
            if self
                .0
                .compare_exchange(seen, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                f();
                self.0.store(DONE, Ordering::Release);
                return;
            }
        }
    }

    /// Record it as done (from a fork handler it registered: the handlers run, so they are
    /// registered, and a child must not register them again).
    pub(crate) fn mark_done(&self) {
        self.0.store(DONE, Ordering::Release);
    }

    /// Register `pthread_atfork` handlers once per process. One of them must call
    /// [`Self::mark_done`] (the one that runs on the side where registering again would be
    /// wrong). A failed registration (ENOMEM) is logged with `unprotected`, what it leaves open.
    pub(crate) fn register_fork_handlers(
        &self,
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
        unprotected: &str,
    ) {
        self.call_once(|| {
            // SAFETY: the callers pass plain `extern "C"` functions that never unwind and live as
            // long as the process.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::pthread_atfork(prepare, parent, child) };
            if rc != 0 {
                crate::log!(
                    crate::log::Level::Warn,
                    "pthread_atfork failed ({rc}): {unprotected}"
                );
            }
        });
    }
}

#[cfg(all(test, not(miri), not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// A child forked while another thread runs the closure runs it itself instead of waiting
    /// for a thread it does not have. With `std::sync::Once` here the child hangs (the alarm
    /// kills it).
    #[test]
    fn a_child_forked_mid_run_runs_it_itself() {
        static ONCE: ForkSafeOnce = ForkSafeOnce::new();
        static STARTED: AtomicBool = AtomicBool::new(false);
        let runner = std::thread::spawn(|| {
            ONCE.call_once(|| {
                STARTED.store(true, Ordering::Release);
                std::thread::sleep(Duration::from_millis(300));
            })
        });
        while !STARTED.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let child_ran_it = cuhook_fixtures::forked(5, || {
            let mut ran = false;
            ONCE.call_once(|| ran = true);
            ONCE.call_once(|| ran = false);
            ran
        });
        assert!(child_ran_it, "the child did not run the closure (or hung)");
        runner.join().unwrap();
        // In the parent it ran once, in the runner.
        let mut again = false;
        ONCE.call_once(|| again = true);
        assert!(!again);
    }

    #[test]
    fn marked_done_never_runs() {
        let once = ForkSafeOnce::new();
        once.mark_done();
        once.call_once(|| panic!("ran after mark_done"));
    }
}
