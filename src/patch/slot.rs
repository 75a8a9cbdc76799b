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

use super::protection::{errno_of, ProtectionMap};
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
    let protection = maps.at(address)?;
    // SAFETY: the caller guarantees the slot is aligned and mapped.
    let slot = unsafe { AtomicUsize::from_ptr(address as *mut usize) };
    let swap = || match slot.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => SlotWrite::Written { protection },
        Err(actual) => SlotWrite::Mismatch { actual },
    };
    if protection.contains(Protection::WRITE) {
        return Ok(swap());
    }
    if protection.contains(Protection::EXECUTE) {
        return Err(Error::ExecutableSlotPage {
            object: object.to_owned(),
            address,
        });
    }
    let page = address & !(region::page::size() - 1);
    let fail = |e: region::Error| Error::Protect {
        object: object.to_owned(),
        address,
        errno: errno_of(&e),
    };
    // SAFETY: the page belongs to a mapped object (caller's guarantee); we add only WRITE.
    unsafe { region::protect(page as *const u8, 1, protection | Protection::WRITE) }
        .map_err(fail)?;
    let outcome = swap();
    // SAFETY: restores exactly the protection the page had before.
    if let Err(e) = unsafe { region::protect(page as *const u8, 1, protection) } {
        // The slot was written: report the write (so it is journaled and can be undone) and the
        // page left writable on stderr, rather than lose track of the slot.
        crate::log!(crate::log::Level::Error, "{}", fail(e));
    }
    Ok(outcome)
}
