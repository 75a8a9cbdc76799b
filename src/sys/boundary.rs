//! The `extern "C"` boundary: a panic in cuhook code called from C (a hook, an interposer, the
//! C API, the constructor) must never unwind into the host, which would abort it.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run `f`; on a panic (a bug in cuhook), return `fallback()` instead.
#[inline(always)]
pub(crate) fn guarded<R>(f: impl FnOnce() -> R, fallback: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fallback() {
        assert_eq!(guarded(|| 1, || 2), 1);
        assert_eq!(guarded(|| -> i32 { panic!("bug") }, || 2), 2);
    }
}
