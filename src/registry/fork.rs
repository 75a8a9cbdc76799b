//! `fork()` safety of the process-wide registry's writer lock.
//!
//! Only the forking thread survives in the child. Had another thread been inside a registry write
//! (any hooked allocation or free), the child would inherit the lock held by a thread that no
//! longer exists, and its first hooked allocation would spin forever. So the lock is taken before
//! the fork (which also means the child gets a table no writer was halfway through) and released
//! on both sides after it.
//!
//! # Safety
//!
//! `pthread_atfork` with three `extern "C"` handlers that never unwind. The release handlers
//! unlock a lock the prepare handler took on the same thread (in the child: the copy of it).
#![allow(unsafe_code)]

use std::sync::Once;

use super::global::global;

static REGISTERED: Once = Once::new();

/// Install the fork handlers (once per process).
pub(super) fn protect() {
    REGISTERED.call_once(|| {
        // SAFETY: the handlers are plain `extern "C"` functions that never unwind.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
        if rc != 0 {
            crate::log!(
                crate::log::Level::Warn,
                "pthread_atfork failed ({rc}): a fork during a hooked allocation may hang the child"
            );
        }
    });
}

extern "C" fn prepare() {
    global().hold_for_fork();
}

extern "C" fn release() {
    // SAFETY: `prepare` took the lock on this thread just before the fork.
    unsafe { global().release_after_fork() };
}
