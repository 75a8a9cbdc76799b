//! Addresses turned into functions.
//!
//! The loader, the CUDA driver's `cuGetProcAddress` and our own hook tables hand out functions
//! as addresses. [`fn_at`] is the only place one becomes a callable pointer; [`TypedFn`] keeps
//! such an address with its signature, so a caller cannot call it through another type.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The function at `address`, as type `F` (an `unsafe extern "C" fn(..) -> ..` pointer type).
///
/// # Safety
/// `address` must be non-zero and the entry point of a function whose ABI and signature are
/// exactly `F`, and stay valid (its object loaded) for as long as the result is used.
#[inline(always)]
pub(crate) unsafe fn fn_at<F: Copy>(address: usize) -> F {
    const {
        assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>());
    }
    debug_assert!(address != 0);
    // SAFETY: `F` is a function pointer type of the size of an address (checked above); the
    // caller vouches that `address` is such a function.
    unsafe { std::mem::transmute_copy::<usize, F>(&address) }
}

/// A function address with its signature, set once it is known (resolved lazily, published
/// by another thread): 0 means unknown.
pub(crate) struct TypedFn<F> {
    address: AtomicUsize,
    signature: PhantomData<F>,
}

impl<F: Copy> TypedFn<F> {
    /// No function yet.
    pub(crate) const fn unknown() -> TypedFn<F> {
        TypedFn {
            address: AtomicUsize::new(0),
            signature: PhantomData,
        }
    }

    /// Record the function's address (0: unknown again).
    ///
    /// # Safety
    /// `address` must be 0 or a function of signature `F` that stays valid while it is stored
    /// (a function of an object that is never unloaded: the driver, glibc, our own code).
    pub(crate) unsafe fn set(&self, address: usize) {
        self.address.store(address, Ordering::Release);
    }

    /// The function, when known.
    pub(crate) fn get(&self) -> Option<F> {
        let address = self.address.load(Ordering::Acquire);
        // SAFETY: only `set` stores here, whose caller vouched for the signature.
        (address != 0).then(|| unsafe { fn_at::<F>(address) })
    }

    /// The address stored (0: unknown).
    pub(crate) fn address(&self) -> usize {
        self.address.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn add_one(x: i32) -> i32 {
        x + 1
    }

    #[test]
    fn an_address_calls_the_function_it_came_from() {
        type F = extern "C" fn(i32) -> i32;
        let slot: TypedFn<F> = TypedFn::unknown();
        assert!(slot.get().is_none());
        // SAFETY: `add_one` has signature F and lives as long as the program.
        unsafe { slot.set(add_one as F as usize) };
        assert_eq!(slot.get().map(|f| f(41)), Some(42));
        assert_eq!(slot.address(), add_one as F as usize);
    }
}
