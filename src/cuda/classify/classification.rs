//! What classification answers.

use crate::events::{flags, MemType};
use crate::registry::Allocation;

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The registry holds the allocation (seen by the hooks); here is its record.
    Registry(Allocation),
    /// The driver classified the pointer.
    Driver,
    /// No usable driver answer: no driver loaded, no device, the driver not initialised yet, or
    /// the query failed. Host memory is assumed (no CUDA memory can exist in those cases).
    Fallback,
}

/// The kind of memory a pointer points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for pageable host memory or unknown.
    pub device: i32,
    /// [`crate::events::flags`] bits: `VMM`, `POOL | STREAM_ORDERED`, `PINNED_HOST`, ...
    pub flags: u32,
    /// `CUcontext` the memory belongs to, 0 for none (pool and VMM memory) or unknown.
    pub context: usize,
    /// `CUmemoryPool` handle of pool memory, else 0.
    pub pool: usize,
    /// Where the answer came from.
    pub source: Source,
}

impl Classification {
    /// Host memory with nothing else known.
    pub const fn host(source: Source) -> Self {
        Classification {
            mem_type: MemType::Host,
            device: -1,
            flags: 0,
            context: 0,
            pool: 0,
            source,
        }
    }

    /// Memory the driver reported, with no flags yet.
    pub(super) const fn from_driver(mem_type: MemType, device: i32, context: usize) -> Self {
        Classification {
            mem_type,
            device,
            flags: 0,
            context,
            pool: 0,
            source: Source::Driver,
        }
    }

    /// What the registry knows about an allocation.
    pub const fn from_allocation(a: Allocation) -> Self {
        Classification {
            mem_type: a.mem_type,
            device: a.device,
            flags: a.flags,
            context: a.context,
            pool: a.pool,
            source: Source::Registry(a),
        }
    }

    /// Whether this is device-accessible CUDA memory (device or managed).
    pub const fn is_cuda(&self) -> bool {
        matches!(self.mem_type, MemType::Cuda | MemType::CudaManaged)
    }

    /// Whether the memory is known to come from a memory pool (`POOL`: the driver reported a
    /// pool handle, or the hooks saw `cuMemAllocFromPoolAsync`; the registry's records of
    /// `cuMemAllocAsync` carry only `STREAM_ORDERED`).
    pub const fn is_pool(&self) -> bool {
        self.flags & flags::POOL != 0
    }

    /// Whether the memory is a VMM mapping.
    pub const fn is_vmm(&self) -> bool {
        self.flags & flags::VMM != 0
    }
}
