//! The writer locks of the lock-free structures (registry, subscriber list).
//!
//! Readers of both structures never lock; their writers serialise on one lock per structure.
//! Normal builds get a spin lock whose waiters spin briefly and then yield, which `fork`
//! handlers hold across a fork and release on both sides (`force_unlock`:
//! `registry/global.rs`, `events/subscribers.rs`; a `std` mutex cannot be released without its
//! guard, and one inherited held hangs the child). It takes no allocation and no thread-local,
//! so it works before `main` and during thread exit.
//! Built with `RUSTFLAGS="--cfg loom"`, both are loom's mutex, so the models (`.ci/proofs.sh`)
//! can race two writers and loom schedules who waits. Loom builds never fork, so there
//! `WriterLock` has no `force_unlock`.
#![allow(unsafe_code)]

/// Attempts a waiter makes spinning (a `pause` each) before it starts yielding: enough to cover
/// a registry edit (≈ 100–200 ns) without a system call, few enough that a waiter whose holder
/// was preempted on a two-core machine gives its core up within a few microseconds. Yielding at
/// once, as the lock used to, turned every contended edit into a `sched_yield`: with 16 threads
/// allocating, the registry's writer lock cost more than its edits.
#[cfg(not(loom))]
const SPINS_BEFORE_YIELD: u32 = 128;

/// A writer lock: a test-and-test-and-set spin lock whose waiters spin briefly, then yield;
/// loom's mutex under loom.
pub(crate) struct WriterLock<T> {
    #[cfg(not(loom))]
    locked: core::sync::atomic::AtomicBool,
    #[cfg(not(loom))]
    value: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

// SAFETY: the value is only reached through a guard, which the lock hands to one thread at a
// time (the `locked` flag, taken with Acquire and released with Release); like `Mutex<T>`, the
// lock is `Sync` when `T` may move between threads.
#[cfg(not(loom))]
unsafe impl<T: Send> Sync for WriterLock<T> {}

/// What [`WriterLock::lock`] returns: the value, until it is dropped.
#[cfg(not(loom))]
pub(crate) struct WriterGuard<'a, T> {
    lock: &'a WriterLock<T>,
}
/// What [`WriterLock::lock`] returns.
#[cfg(loom)]
pub(crate) type WriterGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

#[cfg(not(loom))]
impl<T> core::ops::Deref for WriterGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> core::ops::DerefMut for WriterGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard exists only while this thread holds the lock, and `&mut self`
        // makes this the only reference through it.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(not(loom))]
impl<T> Drop for WriterGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock
            .locked
            .store(false, core::sync::atomic::Ordering::Release);
    }
}

impl<T> WriterLock<T> {
    crate::atomics::const_unless_loom! {
    /// An unlocked lock holding `value`.
    pub(crate) fn new(value: T) -> Self {
        WriterLock {
            #[cfg(not(loom))]
            locked: core::sync::atomic::AtomicBool::new(false),
            #[cfg(not(loom))]
            value: core::cell::UnsafeCell::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }
    }

    /// Takes the lock, waiting (spinning, then yielding) while another thread holds it.
    #[inline(always)]
    pub(crate) fn lock(&self) -> WriterGuard<'_, T> {
        #[cfg(not(loom))]
        {
            use core::sync::atomic::Ordering::{Acquire, Relaxed};
            if self
                .locked
                .compare_exchange_weak(false, true, Acquire, Relaxed)
                .is_err()
            {
                self.wait();
            }
            WriterGuard { lock: self }
        }
        // A model's panic while holding the lock fails the model anyway: no poisoning to handle.
        #[cfg(loom)]
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The contended case of [`Self::lock`], out of line: returns holding the lock.
    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    fn wait(&self) {
        use core::sync::atomic::Ordering::{Acquire, Relaxed};
        let mut spins = 0u32;
        loop {
            // Read-only while held, so waiters do not bounce the line away from the holder.
            while self.locked.load(Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    core::hint::spin_loop();
                } else {
                    crate::atomics::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Acquire, Relaxed)
                .is_ok()
            {
                return;
            }
        }
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
        self.locked
            .store(false, core::sync::atomic::Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::WriterLock;

    /// Every increment made under the lock survives: waiters that spin and those that yield
    /// (more threads than cores) all get it exclusively.
    #[test]
    fn contended_increments_are_all_kept() {
        static LOCK: WriterLock<u64> = WriterLock::new(0);
        let threads = 8;
        let per_thread = 20_000;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        let mut g = LOCK.lock();
                        // A read and a separate write: lost updates show if two threads overlap.
                        let v = *g;
                        std::hint::black_box(());
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*LOCK.lock(), threads * per_thread);
    }

    /// The fork path: a guard forgotten, the lock released without it, then taken again.
    #[test]
    fn force_unlock_releases_a_forgotten_guard() {
        let lock = WriterLock::new(5u32);
        core::mem::forget(lock.lock());
        // SAFETY: held by the forgotten guard above, whose holder (this test) never touches it.
        unsafe { lock.force_unlock() };
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 6);
    }
}
