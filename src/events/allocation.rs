//! The range an allocation covers and what is known about it.

use core::ffi::CStr;

use crate::stacks::StackId;

#[allow(unused_imports)] // doc links
use super::types::{MemEvent, MemType};

/// One allocated range and everything known about it: the one value a hooked call builds, the
/// registry records, and every event carries ([`MemEvent::range`]). Built once per call, copied
/// (it is `Copy`, 80 bytes), never converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// First byte of the range.
    pub start: usize,
    /// At least 1 for any registered range.
    pub size: usize,
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for host or unknown.
    pub device: i32,
    /// [`crate::events::flags`] bits.
    pub flags: u32,
    /// `CUmemoryPool` handle; the owning `CUmodule`/`CUlibrary` for a
    /// [`crate::events::flags::GLOBAL`] range; else 0.
    pub pool: usize,
    /// Stream of a stream-ordered allocation, else 0.
    pub stream: usize,
    /// `CUcontext` where known, else 0.
    pub context: usize,
    /// The API that allocated it (in a free event, [`MemEvent::api`] is the call that frees it).
    pub api: &'static CStr,
    /// The call stack that allocated it, when stacks are recorded (`CUHOOK_STACKS`;
    /// [`crate::stacks::frames`] gives its frames); [`StackId::NONE`] otherwise.
    pub stack: StackId,
    /// Assigned by the registry when it records the range, increasing from 1 (pieces of a
    /// split range keep it); 0 for a range it never recorded.
    pub seq: u64,
}

impl Allocation {
    /// A range with every optional field empty.
    pub const fn new(start: usize, size: usize, api: &'static CStr) -> Self {
        Allocation {
            start,
            size,
            mem_type: MemType::Unknown,
            device: -1,
            flags: 0,
            pool: 0,
            stream: 0,
            context: 0,
            api,
            stack: StackId::NONE,
            seq: 0,
        }
    }

    /// Last byte of the range (inclusive, so a range may end at `usize::MAX`).
    pub const fn last(&self) -> usize {
        self.start.saturating_add(self.size.saturating_sub(1))
    }

    /// Whether `ptr` lies in the range.
    pub const fn contains(&self, ptr: usize) -> bool {
        self.size != 0 && ptr >= self.start && ptr - self.start < self.size
    }
}
