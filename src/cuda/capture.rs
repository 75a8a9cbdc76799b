//! Stream capture: a stream-ordered allocation or free issued on a stream that is being captured
//! into a graph creates a graph memory node instead of allocating now; its events carry
//! [`flags::GRAPH`].
//!
//! Asking the driver on every `cuMemAllocAsync` would tax the hot path, so the capture entry
//! points are hooked instead (`cuStreamBeginCapture*`, `cuStreamBeginCaptureToGraph*`,
//! `cuStreamEndCapture*`; the runtime reaches them through `cuGetProcAddress`, which cuhook
//! maps) and a process-wide count of captures begun and not yet ended is kept. While it is zero
//! a stream-ordered hook pays one relaxed load; only while it is non-zero does the hook ask the
//! driver (`cuStreamIsCapturing`, the original function, never a hook) about its own stream.
//!
//! Limit: a capture begun before cuhook was installed is not counted, so allocations on it are
//! not flagged until some capture begins after install.
//!
//! # Safety
//! The driver function comes from the driver table (`driver.rs`), which keeps it with its C
//! signature.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use super::abi::{CUresult, CUDA_SUCCESS};
use super::driver;
use crate::events::flags;

/// Captures begun (successfully, after install) and not yet ended.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture ended, in error.
const CAPTURE_INVALIDATED: CUresult = 901;

/// After a `cuStreamBeginCapture*` call.
pub fn began(rc: CUresult) {
    if rc == CUDA_SUCCESS {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
    }
}

/// After a `cuStreamEndCapture*` call: the capture is over when it succeeded or ended
/// invalidated. Saturates at zero (a capture begun before install ends uncounted).
pub fn ended(rc: CUresult) {
    if rc == CUDA_SUCCESS || rc == CAPTURE_INVALIDATED {
        let _ = ACTIVE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// Captures currently counted.
#[cfg(test)]
pub fn active() -> usize {
    ACTIVE.load(Ordering::Acquire)
}

/// [`flags::GRAPH`] when `stream` is being captured, else 0. `per_thread`: the call was a
/// `_ptsz` variant (stream 0 there is the per-thread default stream).
#[inline]
pub fn flag(stream: usize, per_thread: bool) -> u32 {
    if ACTIVE.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    ask(stream, per_thread)
}

#[cold]
fn ask(stream: usize, per_thread: bool) -> u32 {
    let entry = if per_thread {
        &driver::STREAM_IS_CAPTURING_PTSZ
    } else {
        &driver::STREAM_IS_CAPTURING
    };
    let Some(f) = entry.get().or_else(|| driver::STREAM_IS_CAPTURING.get()) else {
        return 0;
    };
    let mut status: u32 = 0;
    // SAFETY: the driver's `cuStreamIsCapturing` (the table's type), with a stream handle the
    // caller passed to a hooked function and an out-pointer to a local.
    let rc = unsafe { f(stream, &mut status) };
    // CU_STREAM_CAPTURE_STATUS_ACTIVE (1) or _INVALIDATED (2): either way, no memory now.
    if rc == CUDA_SUCCESS && status != 0 {
        flags::GRAPH
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_follows_begin_and_end_and_saturates() {
        let before = active();
        began(CUDA_SUCCESS);
        began(999); // a refused begin starts nothing
        assert_eq!(active(), before + 1);
        ended(401); // ILLEGAL_STATE: no capture was ended
        assert_eq!(active(), before + 1);
        ended(CAPTURE_INVALIDATED);
        assert_eq!(active(), before);
        if before == 0 {
            ended(CUDA_SUCCESS); // begun before install: never below zero
            assert_eq!(active(), 0);
        }
    }
}
