//! One allocation record: its range and metadata, readable by lock-free readers while the writer
//! may be recycling it.
//!
//! Records are type-stable (`slab.rs`) and guarded by their own sequence count: the writer makes
//! the count odd, rewrites the fields, makes it even again. A reader copies the fields between two
//! loads of the count and keeps the copy only if both loads saw the same even value. The writer
//! only ever rewrites a record that no slot of the page table links any more, so a reader that
//! sees an odd or changed count simply starts its lookup again from the root (where it finds the
//! record's successor, or nothing): it never waits for the writer to finish.
//!
//! # Safety
//!
//! A [`RawRecord`] is turned into an [`Allocation`] only once it is known consistent: validated
//! by the count (readers), or read under the writer lock (writer). `api_ptr`/length then come
//! from one `&'static CStr`.
#![allow(unsafe_code)]

use crate::atomics::{
    fence, AtomicPtr, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use core::ffi::CStr;
use core::ptr;

use super::slab::Fresh;
use super::Allocation;
use crate::events::MemType;

/// Metadata of one range. 80 bytes; immutable while any slot links it.
#[repr(C, align(16))]
pub(super) struct Record {
    /// Odd while the writer rewrites the fields.
    pub(super) version: AtomicU64,
    start: AtomicUsize,
    size: AtomicUsize,
    seq: AtomicU64,
    pool: AtomicUsize,
    stream: AtomicUsize,
    context: AtomicUsize,
    api_ptr: AtomicPtr<u8>,
    /// `stack id << 32 | api length with NUL << 8 | mem_type`.
    api_len_type: AtomicUsize,
    /// `device as u32 | flags << 32`.
    dev_flags: AtomicU64,
}

impl Fresh for Record {
    fn fresh() -> Self {
        Record {
            version: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            size: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            pool: AtomicUsize::new(0),
            stream: AtomicUsize::new(0),
            context: AtomicUsize::new(0),
            api_ptr: AtomicPtr::new(ptr::null_mut()),
            api_len_type: AtomicUsize::new(0),
            dev_flags: AtomicU64::new(0),
        }
    }
}

/// A plain copy of a record's fields; meaningless until validated.
#[derive(Clone, Copy)]
pub(super) struct RawRecord {
    /// The record's version this copy was validated against (0 for a writer's copy).
    pub(super) version: u64,
    pub(super) start: usize,
    pub(super) size: usize,
    seq: u64,
    pool: usize,
    stream: usize,
    context: usize,
    api_ptr: *const u8,
    api_len_type: usize,
    dev_flags: u64,
}

impl Record {
    #[inline(always)]
    fn load(&self) -> RawRecord {
        RawRecord {
            version: 0,
            start: self.start.load(Relaxed),
            size: self.size.load(Relaxed),
            seq: self.seq.load(Relaxed),
            pool: self.pool.load(Relaxed),
            stream: self.stream.load(Relaxed),
            context: self.context.load(Relaxed),
            api_ptr: self.api_ptr.load(Relaxed),
            api_len_type: self.api_len_type.load(Relaxed),
            dev_flags: self.dev_flags.load(Relaxed),
        }
    }

    /// Reader: a consistent copy, or `None` when the writer rewrote the record meanwhile (start
    /// the lookup again).
    #[inline(always)]
    pub(super) fn read(&self) -> Option<RawRecord> {
        // Acquire: pairs with the Release that ended the last rewrite.
        let v = self.version.load(Acquire);
        if v & 1 != 0 {
            return None;
        }
        let raw = RawRecord {
            version: v,
            ..self.load()
        };
        // Acquire fence: if a load above saw a store of a later rewrite, the version bump that
        // began it (ordered before it by the writer's Release fence) is visible below.
        fence(Acquire);
        (self.version.load(Relaxed) == v).then_some(raw)
    }

    /// Writer: the range, read under the writer lock.
    pub(super) fn span(&self) -> (usize, usize) {
        let start = self.start.load(Relaxed);
        (start, start + (self.size.load(Relaxed) - 1))
    }

    /// Writer: the size, read under the writer lock.
    #[inline(always)]
    pub(super) fn span_size(&self) -> usize {
        self.size.load(Relaxed)
    }

    /// Writer: the allocation, read under the writer lock.
    pub(super) fn get(&self) -> Allocation {
        self.take().allocation()
    }

    /// Writer: the record's fields as they are, read while no one may rewrite them (under the
    /// writer lock, or in the lane that just unlinked it), left encoded: the free hooks copy
    /// the words and decode them only if someone asks.
    #[inline(always)]
    pub(super) fn take(&self) -> RemovedRecord {
        RemovedRecord(self.load())
    }

    /// Writer: fills a record that no slot links (readers holding a stale pointer to it will see
    /// the version change). Always inlined: the pool-case insert fills it from the allocation
    /// hook's registers.
    #[inline(always)]
    pub(super) fn store(&self, a: &Allocation) {
        let raw = RawRecord::of(a);
        let v = self.version.load(Relaxed);
        self.version.store(v.wrapping_add(1), Relaxed);
        // Release fence: the odd version is visible before any field store below.
        fence(Release);
        self.start.store(raw.start, Relaxed);
        self.size.store(raw.size, Relaxed);
        self.seq.store(raw.seq, Relaxed);
        self.pool.store(raw.pool, Relaxed);
        self.stream.store(raw.stream, Relaxed);
        self.context.store(raw.context, Relaxed);
        self.api_ptr.store(raw.api_ptr.cast_mut(), Relaxed);
        self.api_len_type.store(raw.api_len_type, Relaxed);
        self.dev_flags.store(raw.dev_flags, Relaxed);
        self.version.store(v.wrapping_add(2), Release);
    }
}

/// A removed allocation's record, copied word for word and not yet decoded: what a free hook
/// keeps across the real call (to put the range back if the driver refuses the free, and to
/// tell subscribers), decoded only when one of those happens. Copying the decoded
/// [`Allocation`] instead moved it through registers and the stack three times per free.
#[derive(Clone, Copy)]
pub(crate) struct RemovedRecord(RawRecord);

impl RemovedRecord {
    /// The allocation the record held.
    #[inline]
    pub(crate) fn allocation(&self) -> Allocation {
        // SAFETY: a `RemovedRecord` is made only from a record read while no one could rewrite
        // it ([`Record::take`]) or from an allocation ([`RemovedRecord::from`]): consistent, and
        // filled as `Record::store` fills one.
        unsafe { self.0.into_allocation() }
    }
}

impl From<&Allocation> for RemovedRecord {
    fn from(a: &Allocation) -> Self {
        RemovedRecord(RawRecord::of(a))
    }
}

impl core::fmt::Debug for RemovedRecord {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("RemovedRecord")
            .field(&self.allocation())
            .finish()
    }
}

impl RawRecord {
    /// `a` encoded as a record holds it (the version left 0).
    #[inline(always)]
    fn of(a: &Allocation) -> Self {
        let api = a.api.to_bytes_with_nul();
        let mem_type = a.mem_type as i32 as u8 as usize;
        let stack = (a.stack.0 as usize) << 32;
        RawRecord {
            version: 0,
            start: a.start,
            size: a.size,
            seq: a.seq,
            pool: a.pool,
            stream: a.stream,
            context: a.context,
            api_ptr: api.as_ptr(),
            api_len_type: stack | (api.len() as u32 as usize) << 8 | mem_type,
            dev_flags: a.device as u32 as u64 | (a.flags as u64) << 32,
        }
    }

    /// Whether the range holds `ptr`.
    #[inline(always)]
    pub(super) fn contains(&self, ptr: usize) -> bool {
        ptr.wrapping_sub(self.start) < self.size
    }

    /// Rebuilds the allocation.
    ///
    /// # Safety
    ///
    /// `self` must be a consistent copy (validated by [`Record::read`], or loaded under the
    /// writer lock) of a record filled by [`Record::store`].
    #[inline(always)]
    pub(super) unsafe fn into_allocation(self) -> Allocation {
        // 24 bits of length (API names are short), then the stack id.
        let len = (self.api_len_type as u32 >> 8) as usize;
        // SAFETY: per the contract, (api_ptr, len) came from `to_bytes_with_nul` of a
        // `&'static CStr`: valid for 'static, NUL-terminated, no interior NUL.
        let api = unsafe {
            CStr::from_bytes_with_nul_unchecked(core::slice::from_raw_parts(self.api_ptr, len))
        };
        let mem_type = match self.api_len_type & 0xff {
            0 => MemType::Host,
            1 => MemType::Cuda,
            2 => MemType::CudaManaged,
            _ => MemType::Unknown,
        };
        Allocation {
            start: self.start,
            size: self.size,
            mem_type,
            device: self.dev_flags as u32 as i32,
            flags: (self.dev_flags >> 32) as u32,
            pool: self.pool,
            stream: self.stream,
            context: self.context,
            api,
            stack: crate::stacks::StackId((self.api_len_type >> 32) as u32),
            seq: self.seq,
        }
    }
}
