//! The hooks' reentrancy guard: only the outermost hooked CUDA call on a thread dispatches.
//!
//! `cudaMallocAsync` (hooked) reaches the driver through `cuMemAllocAsync` (hooked too); without
//! the guard one allocation would produce two events. The state is a const-initialised
//! thread-local `Cell` with no destructor, so it works before `main`, during thread exit and
//! without allocating.
//!
//! A subscriber's callback may itself allocate CUDA memory. Those allocations are real and must be
//! dispatched, so [`super::SubscriberList::dispatch`] suspends the guard around each callback: the
//! callback's hooked calls are outermost again. Recursion is bounded by the dispatch depth limit
//! ([`super::MAX_DEPTH`]), not here.

use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;

thread_local! {
    /// The API name of the outermost hooked call in progress on this thread, if any.
    static OUTERMOST: Cell<Option<&'static CStr>> = const { Cell::new(None) };
}

/// Held by the outermost hooked call on a thread for as long as it runs (original call and
/// dispatch included).
///
/// ```ignore
/// let Some(_guard) = HookGuard::enter(c"cudaMallocAsync") else {
///     return real(args); // nested inside another hook: call through, no event
/// };
/// let rc = real(args);
/// if rc == 0 { events::dispatch(&event); }
/// rc
/// ```
#[must_use = "the guard marks the hooked call as in progress until it is dropped"]
pub struct HookGuard {
    /// The guard describes this thread's state; it must be dropped on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

impl HookGuard {
    /// Marks the start of a hooked call named `api`. `None` if another hooked call is already in
    /// progress on this thread (then call the original and dispatch nothing).
    #[inline]
    pub fn enter(api: &'static CStr) -> Option<HookGuard> {
        OUTERMOST.with(|o| {
            if o.get().is_some() {
                return None;
            }
            o.set(Some(api));
            Some(HookGuard {
                _not_send: PhantomData,
            })
        })
    }

    /// The API name of the outermost hooked call in progress on this thread, e.g. so that a
    /// nested driver hook can tell it was reached from `cudaMallocAsync`.
    #[inline]
    pub fn outermost_api() -> Option<&'static CStr> {
        OUTERMOST.with(Cell::get)
    }
}

impl Drop for HookGuard {
    #[inline]
    fn drop(&mut self) {
        OUTERMOST.with(|o| o.set(None));
    }
}

/// The guard state saved around a callback; see [`suspend`].
pub(crate) struct Suspended(Option<&'static CStr>);

/// Makes the next hooked call on this thread outermost again (for the length of a callback).
#[inline(always)]
pub(crate) fn suspend() -> Suspended {
    Suspended(OUTERMOST.with(|o| o.replace(None)))
}

/// Restores what [`suspend`] saved.
#[inline(always)]
pub(crate) fn resume(saved: Suspended) {
    OUTERMOST.with(|o| o.set(saved.0));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_only_outermost_enters() {
        let outer = HookGuard::enter(c"cudaMalloc").expect("outermost");
        assert!(HookGuard::enter(c"cuMemAlloc_v2").is_none());
        assert_eq!(HookGuard::outermost_api(), Some(c"cudaMalloc"));
        let saved = suspend();
        {
            let inner = HookGuard::enter(c"cuMemAlloc_v2").expect("outermost again in a callback");
            assert_eq!(HookGuard::outermost_api(), Some(c"cuMemAlloc_v2"));
            drop(inner);
        }
        resume(saved);
        assert_eq!(HookGuard::outermost_api(), Some(c"cudaMalloc"));
        drop(outer);
        assert_eq!(HookGuard::outermost_api(), None);
        assert!(HookGuard::enter(c"cudaFree").is_some());
    }
}
