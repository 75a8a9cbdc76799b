//! The atomics the lock-free structures (registry, subscriber list) are built from.
//!
//! Normal builds get `core`'s atomics through plain re-exports, so the hot paths compile exactly
//! as if they named `core::sync::atomic` directly. Built with `RUSTFLAGS="--cfg loom"` (only for
//! `cargo test`; `.ci/proofs.sh`), the same names are loom's instrumented types, and the loom
//! models in `registry/tests/loom.rs` and `events/tests/loom.rs` run the real code under the
//! model checker. Loom's atomics cannot be built in `const` context, hence the two macros.

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicPtr, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU64, AtomicUsize};

pub(crate) use core::sync::atomic::Ordering;

/// A busy-wait hint. Under loom it yields to the model's scheduler, which must see spin loops
/// as such (otherwise it explores them until its branch limit).
#[inline(always)]
pub(crate) fn spin_loop() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Gives the core away while waiting (loom: lets the awaited model thread run).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// An array of `$n` copies of the atomic `$e`: a `const` block normally (usable in `const fn`
/// and statics), one constructor call per element under loom.
macro_rules! atomic_array {
    ($e:expr; $n:expr) => {{
        #[cfg(not(loom))]
        let a = [const { $e }; $n];
        #[cfg(loom)]
        let a = core::array::from_fn::<_, { $n }, _>(|_| $e);
        a
    }};
}
pub(crate) use atomic_array;

/// A constructor that is `const fn` normally and a plain `fn` under loom.
macro_rules! const_unless_loom {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        #[cfg(not(loom))]
        $(#[$m])*
        $vis const fn $name($($arg: $ty),*) -> $ret $body
        #[cfg(loom)]
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) -> $ret $body
    };
}
pub(crate) use const_unless_loom;
