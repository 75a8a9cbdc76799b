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
use crate::Error;

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

/// Read a slot once the page holding it is confirmed readable (with `maps`: the kernel's
/// answer, which the write of that page then reuses). An object may have made its own GOT page
/// unreadable after the loader bound it (a packer, a hardening tool); reading it would fault in
/// the host.
///
/// # Safety
/// `address` must be an aligned 8-byte slot inside an object that stays mapped during the call.
pub unsafe fn read_slot_confirmed(
    maps: &ProtectionMap,
    address: usize,
) -> Result<usize, WriteFailure> {
    confirm_readable(maps, address)?;
    // SAFETY: aligned and mapped (caller), readable (just confirmed).
    Ok(unsafe { read_slot(address) })
}

/// `Ok` when the page holding `address` is readable now; `Unreadable` when it is not or nothing
/// is mapped there.
fn confirm_readable(maps: &ProtectionMap, address: usize) -> Result<(), WriteFailure> {
    match protection_of(maps, address) {
        Ok(p) if p.contains(Protection::READ) => Ok(()),
        Ok(_) | Err(WriteFailure::Query(libc::ENOMEM)) => Err(WriteFailure::Unreadable),
        Err(f) => Err(f),
    }
}

/// Why a slot could not be written, without allocating (see [`compare_and_write_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFailure {
    /// The page's protection could not be asked (errno).
    Query(i32),
    /// The page is executable: it is never made writable.
    Executable,
    /// `mprotect` refused to make the page writable (errno).
    Protect(i32),
    /// The page is not readable (asked before reading a slot that may be stale).
    Unreadable,
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
            WriteFailure::Unreadable => Error::UnreadableSlot {
                object: object.to_owned(),
                address,
            },
        }
    }
}

/// A successful write that could not put the page's protection back (errno): the slot is
/// written (journal it) but the page was left writable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftWritable(pub i32);

impl LeftWritable {
    /// Report it on the log: the page of `object` holding the slot at `address` stays writable.
    pub fn log(self, object: &str, address: usize) {
        let e = WriteFailure::Protect(self.0).into_error(object, address);
        crate::log!(crate::log::Level::Error, "{e}");
    }
}

/// Replace `expected` by `new` in the slot at `address`: make its page writable if it is not,
/// swap atomically, and put the page's original protection back. Never makes a page W+X. The
/// engine writes through [`compare_and_write_page`] (from inside loader walks); this one-slot
/// form is what the page tests drive.
///
/// # Safety
/// `address` must be an aligned 8-byte GOT/data slot of an object that stays mapped during the
/// call, and the caller must hold the engine's patch lock (two writers must never race on one
/// page's protection).
#[cfg(test)]
pub unsafe fn compare_and_write(
    maps: &ProtectionMap,
    object: &str,
    address: usize,
    expected: usize,
    new: usize,
) -> crate::Result<SlotWrite> {
    // SAFETY: forwarded from the caller; the one slot written is on the page opened.
    let written =
        unsafe { on_writable_page(maps, address, |page| page.swap(address, expected, new)) };
    match written {
        Ok((outcome, restored)) => {
            if let Err(left) = restored {
                // The slot was written: report the write (so it is journaled and can be undone)
                // and the page left writable on stderr, rather than lose track of the slot.
                left.log(object, address);
            }
            Ok(outcome)
        }
        Err(f) => Err(f.into_error(object, address)),
    }
}

/// The page of a GOT made writable for [`on_writable_page`]'s work.
#[derive(Debug)]
struct WritablePage {
    page: usize,
    size: usize,
    protection: Protection,
}

impl WritablePage {
    /// Compare-and-swap the slot at `address`.
    ///
    /// # Safety
    /// `address` is an aligned 8-byte slot on this page (which [`on_writable_page`] holds
    /// writable).
    unsafe fn swap(&self, address: usize, expected: usize, new: usize) -> SlotWrite {
        debug_assert_eq!(page_start(address, self.size), self.page);
        // SAFETY: aligned and on the page (caller), which is mapped and writable now.
        let slot = unsafe { AtomicUsize::from_ptr(address as *mut usize) };
        match slot.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => SlotWrite::Written {
                protection: self.protection,
            },
            Err(actual) => SlotWrite::Mismatch { actual },
        }
    }
}

/// Make the page holding `address` writable if it is not (never W+X), run `work` with it, and
/// put the page's protection back: one `mprotect` pair for every slot `work` writes on that
/// page (a GOT of a dozen hooked imports usually fits in one), instead of a pair per slot.
/// Returns `work`'s result and whether the protection could be put back.
///
/// # Safety
/// `address` lies in an object that stays mapped during the call, and the caller holds the
/// engine's patch lock (two writers must never race on one page's protection).
unsafe fn on_writable_page<R>(
    maps: &ProtectionMap,
    address: usize,
    work: impl FnOnce(&WritablePage) -> R,
) -> std::result::Result<(R, std::result::Result<(), LeftWritable>), WriteFailure> {
    let protection = protection_of(maps, address)?;
    let size = region::page::size();
    let page = WritablePage {
        page: page_start(address, size),
        size,
        protection,
    };
    if protection.contains(Protection::WRITE) {
        return Ok((work(&page), Ok(())));
    }
    if protection.contains(Protection::EXECUTE) {
        return Err(WriteFailure::Executable);
    }
    let start = page.page as *const u8;
    // SAFETY: the page belongs to a mapped object (caller's guarantee); we add only WRITE.
    unsafe { region::protect(start, size, protection | Protection::WRITE) }
        .map_err(|e| WriteFailure::Protect(errno_of(&e)))?;
    let result = work(&page);
    // SAFETY: restores exactly the protection the page had before.
    let restored =
        unsafe { region::protect(start, size, protection) }.map_err(|e| LeftWritable(errno_of(&e)));
    Ok((result, restored))
}

/// The protection of the page holding `address`.
fn protection_of(maps: &ProtectionMap, address: usize) -> Result<Protection, WriteFailure> {
    maps.at(address).map_err(|e| match e {
        Error::QueryProtection { errno, .. } => WriteFailure::Query(errno),
        _ => WriteFailure::Query(libc::EINVAL),
    })
}

/// Compare-and-write `n` slots that share one page (`slot(i)`: address, expected, new), under
/// one change of the page's protection; `each(i, found)` is told what each swap found. When no
/// slot holds its expected value there is nothing to write, and the page's protection is not
/// touched at all (the recheck after a patch, nearly always). `stale`: the slots may no longer
/// be readable (journal entries of an object that may have been replaced since they were
/// written), so the page is confirmed readable with the kernel before they are read, and fails
/// as `Unreadable` if it is not. Returns whether the protection was put back, or why the page
/// could not be written (then no slot was).
///
/// # Safety
/// Every address is an aligned 8-byte slot on one page of an object that stays mapped during
/// the call, readable unless `stale`; the caller holds the engine's patch lock.
pub unsafe fn compare_and_write_page(
    maps: &ProtectionMap,
    n: usize,
    stale: bool,
    slot: impl Fn(usize) -> (usize, usize, usize),
    mut each: impl FnMut(usize, SlotWrite),
) -> std::result::Result<std::result::Result<(), LeftWritable>, WriteFailure> {
    if n == 0 {
        return Ok(Ok(()));
    }
    if stale {
        confirm_readable(maps, slot(0).0)?;
    }
    // SAFETY: readable slots (the caller's promise).
    let actual = |i: usize| unsafe { read_slot(slot(i).0) };
    if (0..n).all(|i| actual(i) != slot(i).1) {
        for i in 0..n {
            each(i, SlotWrite::Mismatch { actual: actual(i) });
        }
        return Ok(Ok(()));
    }
    let work = |page: &WritablePage| {
        for i in 0..n {
            let (address, expected, new) = slot(i);
            // SAFETY: an aligned slot (caller's promise) on the page held writable.
            each(i, unsafe { page.swap(address, expected, new) });
        }
    };
    // SAFETY: forwarded from the caller; every slot is on the page of the first.
    let written = unsafe { on_writable_page(maps, slot(0).0, work) };
    written.map(|((), restored)| restored)
}

/// The start of the page of `page_size` bytes (a power of two) that holds `address`. Writers pass
/// the system's page size (`region`'s, from `sysconf`): 4 KiB on x86-64, 4, 16 or 64 KiB on
/// aarch64 kernels; never a constant.
pub(crate) fn page_start(address: usize, page_size: usize) -> usize {
    debug_assert!(page_size.is_power_of_two());
    address & !(page_size - 1)
}
