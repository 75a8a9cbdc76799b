//! The data an event carries. Plain `Copy` values: dispatch never allocates.

use core::ffi::CStr;

use crate::stacks::StackId;

/// What kind of memory a range is. The discriminants are the C API's `CUHOOK_MEM_TYPE_*` values.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemType {
    /// Pageable or pinned host memory (pinned host allocations carry [`flags::PINNED_HOST`]).
    Host = 0,
    /// Device memory (`cuMemAlloc`, stream-ordered, pools, VMM).
    Cuda = 1,
    /// Managed (unified) memory.
    CudaManaged = 2,
    /// Not known (never classified).
    #[default]
    Unknown = 3,
}

impl MemType {
    /// The lower-case name used in traces and reports.
    pub const fn name(self) -> &'static str {
        match self {
            MemType::Host => "host",
            MemType::Cuda => "cuda",
            MemType::CudaManaged => "managed",
            MemType::Unknown => "unknown",
        }
    }
}

/// Bit flags of an allocation (`MemEvent::flags`, `Allocation::flags`).
pub mod flags {
    /// Allocated or freed in stream order (`cuMemAllocAsync`, `cudaFreeAsync`, ...).
    pub const STREAM_ORDERED: u32 = 1 << 0;
    /// Came from an explicit memory pool (`cuMemAllocFromPoolAsync`).
    pub const POOL: u32 = 1 << 1;
    /// A virtual-memory-management mapping (`cuMemMap`).
    pub const VMM: u32 = 1 << 2;
    /// Page-locked host memory (`cuMemHostAlloc`, `cuMemHostRegister`, ...).
    pub const PINNED_HOST: u32 = 1 << 3;
    /// Host memory registered with the driver rather than allocated by it.
    pub const REGISTERED: u32 = 1 << 4;
    /// Delivered to a new subscriber as a replay of a range that already existed.
    pub const EXISTING: u32 = 1 << 5;
    /// A free produced by teardown (context destroy, primary context reset, device reset).
    pub const PURGED: u32 = 1 << 6;
    /// A module or library global (`__device__`, `__constant__`, `__managed__` variable) whose
    /// address the driver handed out (`cuModuleGetGlobal_v2`, `cuLibraryGetGlobal`, ...), or a
    /// `__managed__` one found in code as it was loaded (`cuLibraryLoadData`, ...). Its `pool`
    /// field holds the owning `CUmodule`/`CUlibrary`; it leaves with that module or library
    /// (unload), or with its context (a library's managed variable has none).
    pub const GLOBAL: u32 = 1 << 7;
    /// Memory another process exported, opened or imported here (`cuIpcOpenMemHandle`,
    /// `cuMemPoolImportPointer`, a `cuMemMap` of a handle from `cuMemImportFromShareableHandle`).
    pub const IMPORTED: u32 = 1 << 8;
    /// A graph memory node, not memory that exists now: a stream-ordered allocation or free
    /// issued while its stream was being captured into a graph, or a memory node added to a
    /// graph explicitly (`cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`, `cuGraphAddNode`).
    /// A free of such a range carries the flag too.
    pub const GRAPH: u32 = 1 << 9;
}

/// Which way an event goes.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A successful allocation (dispatched after the real call returned success).
    Alloc = 1,
    /// A free (dispatched before the real free runs).
    Free = 2,
}

impl EventKind {
    /// The bit of this kind in a subscription mask.
    pub const fn mask(self) -> u32 {
        self as u32
    }
}

/// A set of event kinds: what a subscriber wants to hear about.
///
/// ```
/// use cuhook::events::{EventKind, EventMask};
/// let both = EventMask::ALLOC | EventMask::FREE;
/// assert_eq!(both, EventMask::ALL);
/// assert!(both.contains(EventKind::Free));
/// assert!(!EventMask::ALLOC.contains(EventKind::Free));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EventMask(u32);

impl EventMask {
    /// No event.
    pub const NONE: EventMask = EventMask(0);
    /// Alloc events.
    pub const ALLOC: EventMask = EventMask(EventKind::Alloc as u32);
    /// Free events.
    pub const FREE: EventMask = EventMask(EventKind::Free as u32);
    /// Both.
    pub const ALL: EventMask = EventMask(Self::ALLOC.0 | Self::FREE.0);

    /// The bits (as the C API spells them: `CUHOOK_EVENT_MEM_TYPE_*`).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The set these bits name; `None` when a bit names no event kind.
    pub const fn from_bits(bits: u32) -> Option<EventMask> {
        if bits & !Self::ALL.0 == 0 {
            Some(EventMask(bits))
        } else {
            None
        }
    }

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: EventKind) -> bool {
        self.0 & kind as u32 != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, other: EventMask) -> EventMask {
        EventMask(self.0 | other.0)
    }
}

impl std::ops::BitOrAssign for EventMask {
    fn bitor_assign(&mut self, other: EventMask) {
        self.0 |= other.0;
    }
}

impl From<EventKind> for EventMask {
    fn from(kind: EventKind) -> EventMask {
        EventMask(kind as u32)
    }
}

impl From<EventMask> for u32 {
    fn from(mask: EventMask) -> u32 {
        mask.0
    }
}

/// The [`EventMask`] constants under short names (`mask::FREE`).
pub mod mask {
    use super::EventMask;
    /// Alloc events.
    pub const ALLOC: EventMask = EventMask::ALLOC;
    /// Free events.
    pub const FREE: EventMask = EventMask::FREE;
    /// Both.
    pub const ALL: EventMask = EventMask::ALL;
}

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

/// One memory event: which way, the call that made it, and the range — the same
/// [`Allocation`] value the hook built and the registry records, carried without conversion.
///
/// In an alloc event `range` is the new allocation (`range.size` the size asked for, its `seq`
/// the registry's number when the registry is attached). In a free event it is what was known of
/// the allocation when it went — the registry's record, or the driver's description of a
/// pointer the registry never held — with the free's own flags added; `range.size` is 0 when
/// nothing knew the pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemEvent {
    /// Allocation or free.
    pub kind: EventKind,
    /// The API entry point the application called (the outermost hooked call), e.g.
    /// `cudaFreeAsync` for a free of a range `cudaMallocAsync` made (`range.api`).
    pub api: &'static CStr,
    /// The range and everything known about it.
    pub range: Allocation,
}

impl MemEvent {
    /// The alloc event of `range` (made by `range.api`).
    pub const fn alloc(range: Allocation) -> Self {
        MemEvent {
            kind: EventKind::Alloc,
            api: range.api,
            range,
        }
    }

    /// The free event of `range`, freed by `api`.
    pub const fn free(api: &'static CStr, range: Allocation) -> Self {
        MemEvent {
            kind: EventKind::Free,
            api,
            range,
        }
    }
}
