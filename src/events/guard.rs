//! The hooks' reentrancy guard: only the outermost hooked CUDA call on a thread dispatches.
//!
//! `cudaMallocAsync` (hooked) reaches the driver through `cuMemAllocAsync` (hooked too); without
//! the guard one allocation would produce two events. The state lives in the destructor-free
//! thread-local of `thread.rs`, so the guard works before `main`, during thread exit and without
//! allocating.
//!
//! A subscriber's callback may itself allocate CUDA memory. Those allocations are real and must
//! be dispatched, so "outermost" is judged per dispatch level: the guard keeps one bit per level,
//! and a hooked call made from a callback (one level deeper) is outermost again. That
//! costs dispatch nothing per callback (entering a level is all it takes); recursion is bounded by
//! the dispatch depth limit ([`super::MAX_DEPTH`]), not here.
//!
//! Unsafe code: one line, rebuilding the API name from the thin pointer the guard stores (one
//! store per hooked call instead of a fat pointer's two); only `&'static CStr`s are stored.

use std::ffi::CStr;
use std::marker::PhantomData;

use super::thread::{HOOK_API_SLOTS, THREAD};

/// Held by the outermost hooked call of a dispatch level for as long as it runs (original call
/// and dispatch included).
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
    /// The dispatch level this guard holds.
    level: u32,
    /// The guard describes this thread's state; it must be dropped on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

impl HookGuard {
    /// Marks the start of a hooked call named `api`. `None` if another hooked call is already in
    /// progress at this dispatch level of this thread (then call the original and dispatch
    /// nothing).
    #[inline]
    pub fn enter(api: &'static CStr) -> Option<HookGuard> {
        THREAD.with(|t| {
            // At most MAX_DEPTH: dispatch refuses to go deeper, so callbacks never run deeper.
            let level = t.depth.get();
            let bit = 1u32 << level;
            let levels = t.hook_levels.get();
            if levels & bit != 0 {
                return None;
            }
            t.hook_levels.set(levels | bit);
            t.hook_api[level as usize & (HOOK_API_SLOTS - 1)].set(api.as_ptr());
            Some(HookGuard {
                level,
                _not_send: PhantomData,
            })
        })
    }

    /// The API name of the outermost hooked call in progress at this thread's current dispatch
    /// level, e.g. so that a nested driver hook can tell it was reached from `cudaMallocAsync`.
    #[inline]
    #[allow(unsafe_code)]
    pub fn outermost_api() -> Option<&'static CStr> {
        THREAD.with(|t| {
            let level = t.depth.get();
            if t.hook_levels.get() & (1 << level) == 0 {
                return None;
            }
            let p = t.hook_api[level as usize & (HOOK_API_SLOTS - 1)].get();
            // SAFETY: `enter` stores only the pointers of `&'static CStr`s, and sets the level's
            // bit (checked above) with them: a NUL-terminated string that lives forever.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
        })
    }
}

impl Drop for HookGuard {
    #[inline]
    fn drop(&mut self) {
        THREAD.with(|t| t.hook_levels.set(t.hook_levels.get() & !(1 << self.level)));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::announcements;
    use super::*;

    #[test]
    fn guard_only_outermost_enters() {
        let outer = HookGuard::enter(c"cudaMalloc").expect("outermost");
        assert!(HookGuard::enter(c"cuMemAlloc_v2").is_none());
        assert_eq!(HookGuard::outermost_api(), Some(c"cudaMalloc"));
        // One dispatch level deeper (inside a callback) a hooked call is outermost again.
        let _level = announcements::enter_level().expect("level 0");
        {
            let inner = HookGuard::enter(c"cuMemAlloc_v2").expect("outermost in a callback");
            assert_eq!(HookGuard::outermost_api(), Some(c"cuMemAlloc_v2"));
            assert!(HookGuard::enter(c"cuMemAlloc_v2").is_none());
            drop(inner);
        }
        announcements::exit_level(0, false);
        assert_eq!(HookGuard::outermost_api(), Some(c"cudaMalloc"));
        drop(outer);
        assert_eq!(HookGuard::outermost_api(), None);
        assert!(HookGuard::enter(c"cudaFree").is_some());
    }
}
