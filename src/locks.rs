//! The writer locks of the lock-free structures (registry, subscriber list).
//!
//! Readers of both structures never lock; their writers serialise on one lock per structure.
//! Normal builds get a `spin` lock whose waiters yield, which `fork` handlers hold across a fork
//! and release on both sides (`force_unlock`: `registry/global.rs`, `events/subscribers.rs`; a
//! `std` mutex cannot be released without its guard, and one inherited held hangs the child).
//! Built with `RUSTFLAGS="--cfg loom"`, both are loom's mutex, so the models (`.ci/proofs.sh`)
//! can race two writers and loom schedules who waits. Loom builds never fork, so there
//! `WriterLock` has no `force_unlock`.
#![allow(unsafe_code)]

/// Lock waiters yield: with few cores, spinning against a preempted holder wastes its slice.
#[cfg(not(loom))]
pub(crate) struct Yield;

#[cfg(not(loom))]
impl spin::RelaxStrategy for Yield {
    fn relax() {
        crate::atomics::yield_now();
    }
}

/// A writer lock: a spin lock that yields normally, loom's mutex under loom.
pub(crate) struct WriterLock<T> {
    #[cfg(not(loom))]
    inner: spin::mutex::Mutex<T, Yield>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

/// What [`WriterLock::lock`] returns.
#[cfg(not(loom))]
pub(crate) type WriterGuard<'a, T> = spin::mutex::MutexGuard<'a, T, Yield>;
/// What [`WriterLock::lock`] returns.
#[cfg(loom)]
pub(crate) type WriterGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> WriterLock<T> {
    crate::atomics::const_unless_loom! {
    /// An unlocked lock holding `value`.
    pub(crate) fn new(value: T) -> Self {
        WriterLock {
            #[cfg(not(loom))]
            inner: spin::mutex::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }
    }

    /// Takes the lock, waiting (yielding) while another thread holds it.
    #[inline(always)]
    pub(crate) fn lock(&self) -> WriterGuard<'_, T> {
        #[cfg(not(loom))]
        let guard = self.inner.lock();
        // A model's panic while holding the lock fails the model anyway: no poisoning to handle.
        #[cfg(loom)]
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard
    }

    /// Releases the lock without a guard (the `fork` handlers: the guard was forgotten, or, in
    /// the child, belonged to the parent).
    ///
    /// # Safety
    ///
    /// The lock is held, and its holder will not touch the data or unlock it again.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) unsafe fn force_unlock(&self) {
        // SAFETY: the caller's contract is `spin`'s.
        unsafe { self.inner.force_unlock() };
    }
}
