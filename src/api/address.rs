//! What a lookup accepts: anything that names an address.

use std::ptr::NonNull;

/// A value that names one address: `usize`, a raw pointer, a `NonNull`, or a CUDA device
/// pointer (`CUdeviceptr`, a `u64`, as cudarc hands it out).
///
/// ```
/// let x = 0u32;
/// assert!(cuhook::lookup(&x as *const u32).is_none());
/// assert!(cuhook::lookup(0x1000usize).is_none());
/// assert!(cuhook::lookup(0x1000u64).is_none()); // a CUdeviceptr
/// ```
pub trait Address {
    /// The address.
    fn address(&self) -> usize;
}

impl Address for usize {
    fn address(&self) -> usize {
        *self
    }
}

/// A `CUdeviceptr` (cudarc's `sys::CUdeviceptr`); on the 64-bit targets cuhook supports it
/// always fits.
impl Address for u64 {
    fn address(&self) -> usize {
        *self as usize
    }
}

impl<T: ?Sized> Address for *const T {
    fn address(&self) -> usize {
        self.cast::<u8>() as usize
    }
}

impl<T: ?Sized> Address for *mut T {
    fn address(&self) -> usize {
        self.cast::<u8>() as usize
    }
}

impl<T: ?Sized> Address for NonNull<T> {
    fn address(&self) -> usize {
        self.as_ptr().cast::<u8>() as usize
    }
}
