//! Thread cancellation deferred across code of the host's that runs inside cuhook's frames.
//!
//! glibc cancels a thread (`pthread_cancel`) by unwinding its stack with a forced unwind. Rust
//! frames that would be crossed hold unwind guards (`catch_unwind`, which keeps a panic of ours
//! from unwinding into C) and pending destructors; a forced unwind through them is undefined
//! behaviour, and in practice glibc aborts the process ("FATAL: exception not rethrown") once
//! the guard has caught it. So where cuhook calls back into host code that may reach a
//! cancellation point — subscribers' callbacks, and the constructors and destructors a hooked
//! `dlopen`/`dlclose` runs — cancellation is disabled for the call: a `pthread_cancel` aimed at
//! the thread meanwhile stays pending and takes effect at the thread's next cancellation point
//! after cuhook's frames are gone. (Without cuhook a cancellation inside a constructor leaves
//! glibc's loader lock held for good; deferred, the `dlopen` finishes first.)
//!
//! A thread with *asynchronous* cancellation enabled that calls a hooked function is outside
//! POSIX already (only async-cancel-safe functions may run so); re-enabling acts on a pending
//! request at once there, and nothing is promised for it.
#![allow(unsafe_code)]

use libc::c_int;

// Not in the `libc` crate for Linux. Values from glibc's <pthread.h> (the same on every
// architecture).
const PTHREAD_CANCEL_ENABLE: c_int = 0;
const PTHREAD_CANCEL_DISABLE: c_int = 1;
extern "C" {
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}

/// Cancellation disabled on this thread until dropped, then put back as it was.
pub(crate) struct Deferred {
    old: c_int,
}

impl Deferred {
    /// Disables cancellation on this thread (cheap: a flag in the thread's descriptor).
    #[inline]
    pub(crate) fn begin() -> Deferred {
        let mut old = PTHREAD_CANCEL_ENABLE;
        // SAFETY: a valid state constant and a valid out-pointer to this frame's variable.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        Deferred { old }
    }
}

impl Drop for Deferred {
    #[inline]
    fn drop(&mut self) {
        if self.old != PTHREAD_CANCEL_DISABLE {
            // SAFETY: the state read by `begin`; the old-state pointer may be null.
            unsafe { pthread_setcancelstate(self.old, core::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> c_int {
        let mut now = 0;
        // SAFETY: reads the state by setting it to itself (there is no getter).
        unsafe {
            pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut now);
            pthread_setcancelstate(now, core::ptr::null_mut());
        }
        now
    }

    #[test]
    fn deferred_nests_and_puts_the_state_back() {
        assert_eq!(state(), PTHREAD_CANCEL_ENABLE);
        {
            let _outer = Deferred::begin();
            assert_eq!(state(), PTHREAD_CANCEL_DISABLE);
            {
                let _inner = Deferred::begin();
                assert_eq!(state(), PTHREAD_CANCEL_DISABLE);
            }
            assert_eq!(state(), PTHREAD_CANCEL_DISABLE, "the inner one re-enabled");
        }
        assert_eq!(state(), PTHREAD_CANCEL_ENABLE);
    }
}
