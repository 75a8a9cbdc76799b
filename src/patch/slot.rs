//! Writing one GOT slot.
//!
//! # Safety
//! Writing to another object's GOT is inherently unsafe. The caller guarantees that `address` is
//! an 8-byte aligned slot inside an object that stays mapped for the duration of the call (the
//! engine pins objects with `dlopen(RTLD_NOLOAD)` while it writes). The slot is stored with one
//! atomic compare-and-swap, so threads calling through it see either the old or the new target.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use region::Protection;

use crate::elf::{errno_of, ProtectionMap};
use crate::{Error, Result};

/// What a compare-and-swap on a slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWrite {
    /// The slot held `expected` and now holds the new value. `protection` is the page's
    /// protection before and after the write.
    Written { protection: Protection },
    /// The slot held something else; nothing was written.
    Mismatch { actual: usize },
}

/// Read a slot's current value.
///
/// # Safety
/// `address` must be an aligned, mapped, readable 8-byte slot.
pub unsafe fn read_slot(address: usize) -> usize {
    // SAFETY: guaranteed by the caller; an atomic load matches the atomic stores of writers.
    unsafe { AtomicUsize::from_ptr(address as *mut usize) }.load(Ordering::Acquire)
}

/// Why a slot could not be written, without allocating (see [`compare_and_write_raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFailure {
    /// The page's protection could not be asked (errno).
    Query(i32),
    /// The page is executable: it is never made writable.
    Executable,
    /// `mprotect` refused to make the page writable (errno).
    Protect(i32),
}

impl WriteFailure {
    /// The error, naming the object.
    pub fn into_error(self, object: &str, address: usize) -> Error {
        match self {
            WriteFailure::Query(errno) => Error::QueryProtection { address, errno },
            WriteFailure::Executable => Error::ExecutableSlotPage {
                object: object.to_owned(),
                address,
            },
            WriteFailure::Protect(errno) => Error::Protect {
                object: object.to_owned(),
                address,
                errno,
            },
        }
    }
}

/// A successful write that could not put the page's protection back (errno): the slot is
/// written (journal it) but the page was left writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftWritable(pub i32);

/// Replace `expected` by `new` in the slot at `address`: make its page writable if it is not,
/// swap atomically, and put the page's original protection back. Never makes a page W+X.
///
/// # Safety
/// `address` must be an aligned 8-byte GOT/data slot of an object that stays mapped during the
/// call, and the caller must hold the engine's patch lock (two writers must never race on one
/// page's protection).
pub unsafe fn compare_and_write(
    maps: &ProtectionMap,
    object: &str,
    address: usize,
    expected: usize,
    new: usize,
) -> Result<SlotWrite> {
    // SAFETY: forwarded from the caller.
    match unsafe { compare_and_write_raw(maps, address, expected, new) } {
        Ok((outcome, restored)) => {
            if let Err(LeftWritable(errno)) = restored {
                // The slot was written: report the write (so it is journaled and can be undone)
                // and the page left writable on stderr, rather than lose track of the slot.
                let e = WriteFailure::Protect(errno).into_error(object, address);
                crate::log!(crate::log::Level::Error, "{e}");
            }
            Ok(outcome)
        }
        Err(f) => Err(f.into_error(object, address)),
    }
}

/// [`compare_and_write`] that allocates nothing (it may run inside a `dl_iterate_phdr`
/// callback, given a `maps` with room reserved): failures come back as codes.
///
/// # Safety
/// As [`compare_and_write`].
pub unsafe fn compare_and_write_raw(
    maps: &ProtectionMap,
    address: usize,
    expected: usize,
    new: usize,
) -> std::result::Result<(SlotWrite, std::result::Result<(), LeftWritable>), WriteFailure> {
    let protection = maps.at(address).map_err(|e| match e {
        Error::QueryProtection { errno, .. } => WriteFailure::Query(errno),
        _ => WriteFailure::Query(libc::EINVAL),
    })?;
    // SAFETY: the caller guarantees the slot is aligned and mapped.
    let slot = unsafe { AtomicUsize::from_ptr(address as *mut usize) };
    let swap = || match slot.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => SlotWrite::Written { protection },
        Err(actual) => SlotWrite::Mismatch { actual },
    };
    if protection.contains(Protection::WRITE) {
        return Ok((swap(), Ok(())));
    }
    if protection.contains(Protection::EXECUTE) {
        return Err(WriteFailure::Executable);
    }
    let size = region::page::size();
    let page = page_start(address, size);
    // SAFETY: the page belongs to a mapped object (caller's guarantee); we add only WRITE.
    unsafe { region::protect(page as *const u8, size, protection | Protection::WRITE) }
        .map_err(|e| WriteFailure::Protect(errno_of(&e)))?;
    let outcome = swap();
    // SAFETY: restores exactly the protection the page had before.
    let restored = unsafe { region::protect(page as *const u8, size, protection) }
        .map_err(|e| LeftWritable(errno_of(&e)));
    Ok((outcome, restored))
}

/// The start of the page of `page_size` bytes (a power of two) that holds `address`. Writers pass
/// the system's page size (`region`'s, from `sysconf`): 4 KiB on x86-64, 4, 16 or 64 KiB on
/// aarch64 kernels; never a constant.
pub(crate) fn page_start(address: usize, page_size: usize) -> usize {
    debug_assert!(page_size.is_power_of_two());
    address & !(page_size - 1)
}
