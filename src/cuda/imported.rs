//! VMM handles imported from another process (`cuMemImportFromShareableHandle`), so that their
//! `cuMemMap` is flagged IMPORTED, until `cuMemRelease`.
//!
//! A fixed table of atomics: no allocation and no lock on hook paths, and `cuMemMap` of an
//! ordinary handle costs one load while no import is live. A process with more than
//! [`CAPACITY`] imported handles live at once gets the excess mapped without the flag.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::events::flags;

/// How many imported handles are tracked at once.
pub const CAPACITY: usize = 64;

static HANDLES: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// `cuMemImportFromShareableHandle` returned `handle`.
pub fn imported(handle: usize) {
    let h = handle as u64;
    if h == 0 {
        return;
    }
    for slot in &HANDLES {
        if slot
            .compare_exchange(0, h, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            LIVE.fetch_add(1, Ordering::AcqRel);
            return;
        }
    }
}

/// `cuMemRelease(handle)` succeeded.
pub fn released(handle: u64) {
    if handle == 0 || LIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in &HANDLES {
        if slot
            .compare_exchange(handle, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            LIVE.fetch_sub(1, Ordering::AcqRel);
            return;
        }
    }
}

/// [`flags::IMPORTED`] when `handle` came from an import, else 0.
#[inline]
pub fn flag_of(handle: u64) -> u32 {
    if handle == 0 || LIVE.load(Ordering::Acquire) == 0 {
        return 0;
    }
    if HANDLES.iter().any(|s| s.load(Ordering::Acquire) == handle) {
        flags::IMPORTED
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imported_handles_flagged_until_released() {
        assert_eq!(flag_of(0x1234), 0);
        imported(0x1234);
        imported(0x5678);
        assert_eq!(flag_of(0x1234), flags::IMPORTED);
        assert_eq!(flag_of(0x9999), 0);
        released(0x1234);
        assert_eq!(flag_of(0x1234), 0);
        assert_eq!(flag_of(0x5678), flags::IMPORTED);
        released(0x5678);
        assert_eq!(LIVE.load(Ordering::Relaxed), 0);
    }
}
