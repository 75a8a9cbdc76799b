//! The classification algorithm over any [`DriverApi`] (Open MPI's, seed 2, improved).
//!
//! 1. At first use the driver is set up once: absent → host until an object is loaded (the
//!    static CUDA runtime loads libcuda only at its first call); no device → host forever,
//!    with no further driver call; not initialised (`cuInit` not called, so no CUDA memory can
//!    exist) → host, asked again next time. Memory-pool support is read once per visible
//!    device: all → the pool handle joins the batched query; none → it is never asked for;
//!    mixed → one warning, and the generic checks: the pool attribute is asked for on its own
//!    for context-less device memory only (in a batch, a device without pools could fail the
//!    whole query).
//! 2. One batched `cuPointerGetAttributes`: memory type, is-managed, device ordinal, context
//!    (and the pool handle). An error → host.
//! 3. Managed → managed. Device memory with a context → device. Device memory without a
//!    context (pool and VMM memory): a current context is ensured (`context.rs`), then the
//!    pool handle from the batch, else the VMM probe (`cuMemRetainAllocationHandle`, handle
//!    released at once), else in mixed mode the pool probe. Host memory the driver knows is
//!    pinned host memory; memory it does not know is pageable host memory.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use super::classification::{Classification, Source};
use super::context;
use super::interface::{
    attr, DriverApi, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS,
    DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST,
};
use crate::events::{flags, MemType};

/// `CU_MEMORYTYPE_UNIFIED`: treated like managed memory.
const MEMORYTYPE_UNIFIED: u32 = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;

/// More devices than any node has; a larger count is a driver bug, not a reason to loop.
const MAX_DEVICES: i32 = 4096;

/// The warning for devices that differ in memory-pool support (one line, written once).
pub const MIXED_POOLS_WARNING: &str = "cuhook: CUDA devices differ in memory-pool support \
     (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED); pointers are classified with the generic \
     pool checks\n";

/// How pool memory is recognised, decided once from the devices' pool support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// Every device supports pools: the pool handle is part of the batched query.
    All,
    /// No device does: the pool attribute is never asked for.
    None,
    /// Devices differ: the pool attribute is asked for on its own, for context-less memory.
    Mixed,
}

// Setup states. Once a `POOLS_*` or `NO_DEVICES` state is stored, it never changes.
const UNINIT: u8 = 0;
const ABSENT: u8 = 1;
const NO_DEVICES: u8 = 2;
const POOLS_ALL: u8 = 3;
const POOLS_NONE: u8 = 4;
const POOLS_MIXED: u8 = 5;

/// Classifies pointers the registry does not know by asking a [`DriverApi`].
/// `const`-constructible, so the process-wide one is a `static`.
pub struct Classifier<D> {
    driver: D,
    state: AtomicU8,
    /// [`DriverApi::load_generation`] when the driver was found absent.
    absent_generation: AtomicU64,
    /// Serialises setup (runs rarely: once, or while the driver is absent or uninitialised).
    setup: Mutex<()>,
    /// Writes one warning line.
    warn: fn(&str),
}

impl<D: DriverApi> Classifier<D> {
    /// A classifier over `driver`; `warn` receives its one-time warnings (a driver that fails in
    /// an unexpected way).
    pub const fn new(driver: D, warn: fn(&str)) -> Self {
        Classifier {
            driver,
            state: AtomicU8::new(UNINIT),
            absent_generation: AtomicU64::new(0),
            setup: Mutex::new(()),
            warn,
        }
    }

    /// The driver this classifier asks.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The pool mode, or `None` while there is nothing to ask (setting up on first use).
    pub fn pool_mode(&self) -> Option<PoolMode> {
        match self.settled() {
            Ok(mode) => mode,
            Err(()) => self.set_up(),
        }
    }

    /// `Ok` when the state answers without setup (`Ok(None)`: answer host, ask nothing).
    fn settled(&self) -> Result<Option<PoolMode>, ()> {
        match self.state.load(Ordering::Acquire) {
            POOLS_ALL => Ok(Some(PoolMode::All)),
            POOLS_NONE => Ok(Some(PoolMode::None)),
            POOLS_MIXED => Ok(Some(PoolMode::Mixed)),
            NO_DEVICES => Ok(None),
            ABSENT
                if self.driver.load_generation()
                    == self.absent_generation.load(Ordering::Relaxed) =>
            {
                Ok(None)
            }
            _ => Err(()),
        }
    }

    #[cold]
    fn set_up(&self) -> Option<PoolMode> {
        let _guard = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(mode) = self.settled() {
            return mode;
        }
        // Read before looking: an object loaded meanwhile makes the next call look again.
        let generation = self.driver.load_generation();
        if !self.driver.resolve() {
            self.absent_generation.store(generation, Ordering::Relaxed);
            self.state.store(ABSENT, Ordering::Release);
            return None;
        }
        let count = match self.driver.device_count() {
            Ok(n) if n > 0 => n.min(MAX_DEVICES),
            Err(CUDA_ERROR_NOT_INITIALIZED) => {
                self.state.store(UNINIT, Ordering::Release);
                return None;
            }
            // Zero devices, CUDA_ERROR_NO_DEVICE, or a driver shutting down: nothing to find.
            _ => {
                self.state.store(NO_DEVICES, Ordering::Release);
                return None;
            }
        };
        let supported = (0..count)
            .filter(|&d| {
                self.driver
                    .device_attribute(DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, d)
                    .is_ok_and(|v| v != 0)
            })
            .count() as i32;
        let (state, mode) = if supported == count {
            (POOLS_ALL, PoolMode::All)
        } else if supported == 0 {
            (POOLS_NONE, PoolMode::None)
        } else {
            (self.warn)(MIXED_POOLS_WARNING);
            (POOLS_MIXED, PoolMode::Mixed)
        };
        self.state.store(state, Ordering::Release);
        Some(mode)
    }

    /// Classify `ptr` by asking the driver (the registry is not consulted).
    pub fn classify(&self, ptr: usize) -> Classification {
        let Some(mode) = self.pool_mode() else {
            return Classification::host(Source::Fallback);
        };
        let attrs = [
            attr::MEMORY_TYPE,
            attr::IS_MANAGED,
            attr::DEVICE_ORDINAL,
            attr::CONTEXT,
            attr::MEMPOOL_HANDLE,
        ];
        let n = if mode == PoolMode::All { 5 } else { 4 };
        let mut v = [0u64; 5];
        if self
            .driver
            .pointer_attributes(ptr, &attrs[..n], &mut v[..n])
            != CUDA_SUCCESS
        {
            return Classification::host(Source::Fallback);
        }
        // 4-byte attributes sit in the low half of their slot.
        let mem_type = v[0] as u32;
        let managed = v[1] as u32 != 0;
        let device = v[2] as u32 as i32;
        let context = v[3] as usize;
        let pool = v[4] as usize;
        if managed || mem_type == MEMORYTYPE_UNIFIED {
            return Classification::from_driver(MemType::CudaManaged, device, context);
        }
        match mem_type {
            MEMORYTYPE_DEVICE if context != 0 => {
                Classification::from_driver(MemType::Cuda, device, context)
            }
            MEMORYTYPE_DEVICE => self.contextless(ptr, device, pool, mode),
            MEMORYTYPE_HOST => {
                let mut c = Classification::from_driver(MemType::Host, device, context);
                c.flags = flags::PINNED_HOST;
                c
            }
            _ => Classification::host(Source::Driver),
        }
    }

    /// Device memory without a context: pool or VMM memory. Pool memory also gets
    /// `STREAM_ORDERED`: pools serve only the stream-ordered allocator, so the memory may be
    /// freed in stream order like the registry's `cuMemAllocAsync` records.
    fn contextless(&self, ptr: usize, device: i32, pool: usize, mode: PoolMode) -> Classification {
        context::ensure_current(&self.driver, self as *const Self as usize, device);
        let mut c = Classification::from_driver(MemType::Cuda, device, 0);
        if pool != 0 {
            c.flags = flags::POOL | flags::STREAM_ORDERED;
            c.pool = pool;
        } else if let Ok(handle) = self.driver.retain_allocation_handle(ptr) {
            self.driver.release(handle);
            c.flags = flags::VMM;
        } else if mode == PoolMode::Mixed {
            let mut v = [0u64];
            let rc = self
                .driver
                .pointer_attributes(ptr, &[attr::MEMPOOL_HANDLE], &mut v);
            if rc == CUDA_SUCCESS && v[0] != 0 {
                c.flags = flags::POOL | flags::STREAM_ORDERED;
                c.pool = v[0] as usize;
            }
        }
        c
    }
}
