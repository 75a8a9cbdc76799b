//! A scripted [`DriverApi`] for unit tests: a list of allocations answered like the real driver
//! (pool and VMM memory without a context), a current context, and a log of every call.

use std::sync::Mutex;

use super::interface::{
    attr, DriverApi, DriverResult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS, MEMORYTYPE_DEVICE,
    MEMORYTYPE_HOST,
};
use crate::cuda::abi::CUresult;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    Pool,
    Vmm,
    PinnedHost,
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub start: usize,
    pub size: usize,
    pub kind: Kind,
    pub device: i32,
    /// The context it was allocated in (reported only for kinds that have one).
    pub ctx: usize,
    pub pool: usize,
}

/// One call the classifier made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Resolve,
    DeviceCount,
    DeviceAttribute(i32, i32),
    PointerAttributes(usize, Vec<u32>),
    RetainAllocationHandle(usize),
    Release(u64),
    CtxGetCurrent,
    CtxSetCurrent(usize),
    PrimaryCtxRetain(i32),
}

/// The primary context handle the mock gives device `d`.
pub const fn primary(d: i32) -> usize {
    0xC000 + d as usize
}

#[derive(Default)]
struct State {
    current: usize,
    calls: Vec<Call>,
    generation: u64,
    /// VMM handles retained and not yet released.
    open_handles: i64,
}

pub struct Mock {
    pub present: bool,
    pub device_count: DriverResult<i32>,
    /// Pool support per device.
    pub pools: Vec<bool>,
    pub allocs: Vec<Alloc>,
    /// When set, every pointer query fails with this code.
    pub query_error: Option<CUresult>,
    state: Mutex<State>,
}

impl Mock {
    /// A driver with `pools.len()` devices, each supporting pools or not.
    pub fn new(pools: &[bool]) -> Mock {
        Mock {
            present: true,
            device_count: Ok(pools.len() as i32),
            pools: pools.to_vec(),
            allocs: Vec::new(),
            query_error: None,
            state: Mutex::new(State::default()),
        }
    }

    pub fn with(mut self, a: Alloc) -> Mock {
        self.allocs.push(a);
        self
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn log(&self, c: Call) {
        self.st().calls.push(c);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.st().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.st().calls.clear();
    }

    /// The application changes the current context behind the classifier's back.
    pub fn set_current(&self, ctx: usize) {
        self.st().current = ctx;
    }

    pub fn current(&self) -> usize {
        self.st().current
    }

    /// Objects were loaded.
    pub fn bump_generation(&self) {
        self.st().generation += 1;
    }

    pub fn open_handles(&self) -> i64 {
        self.st().open_handles
    }

    fn find(&self, ptr: usize) -> Option<&Alloc> {
        self.allocs
            .iter()
            .find(|a| ptr >= a.start && ptr - a.start < a.size)
    }

    fn value(a: &Alloc, attribute: u32) -> u64 {
        let contextless = matches!(a.kind, Kind::Pool | Kind::Vmm);
        match attribute {
            attr::MEMORY_TYPE if a.kind == Kind::PinnedHost => MEMORYTYPE_HOST as u64,
            attr::MEMORY_TYPE => MEMORYTYPE_DEVICE as u64,
            attr::IS_MANAGED => (a.kind == Kind::Managed) as u64,
            attr::DEVICE_ORDINAL => a.device as u32 as u64,
            attr::CONTEXT if contextless => 0,
            attr::CONTEXT => a.ctx as u64,
            attr::MEMPOOL_HANDLE if a.kind == Kind::Pool => a.pool as u64,
            _ => 0,
        }
    }
}

impl DriverApi for Mock {
    fn resolve(&self) -> bool {
        self.log(Call::Resolve);
        self.present
    }

    fn load_generation(&self) -> u64 {
        self.st().generation
    }

    fn device_count(&self) -> DriverResult<i32> {
        self.log(Call::DeviceCount);
        self.device_count
    }

    fn device_attribute(&self, attribute: i32, device: i32) -> DriverResult<i32> {
        self.log(Call::DeviceAttribute(attribute, device));
        self.pools
            .get(device as usize)
            .map(|&p| p as i32)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn pointer_attributes(&self, ptr: usize, attributes: &[u32], values: &mut [u64]) -> CUresult {
        self.log(Call::PointerAttributes(ptr, attributes.to_vec()));
        if let Some(e) = self.query_error {
            return e;
        }
        // Unknown pointers: success with every value 0, as the real driver does.
        for (v, &a) in values.iter_mut().zip(attributes) {
            *v = self.find(ptr).map_or(0, |al| Self::value(al, a));
        }
        CUDA_SUCCESS
    }

    fn retain_allocation_handle(&self, ptr: usize) -> DriverResult<u64> {
        self.log(Call::RetainAllocationHandle(ptr));
        match self.find(ptr) {
            Some(a) if a.kind == Kind::Vmm => {
                self.st().open_handles += 1;
                Ok(0x4a00 + a.start as u64)
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn release(&self, handle: u64) -> CUresult {
        self.log(Call::Release(handle));
        self.st().open_handles -= 1;
        CUDA_SUCCESS
    }

    fn ctx_get_current(&self) -> DriverResult<usize> {
        self.log(Call::CtxGetCurrent);
        Ok(self.st().current)
    }

    fn ctx_set_current(&self, ctx: usize) -> CUresult {
        self.log(Call::CtxSetCurrent(ctx));
        self.st().current = ctx;
        CUDA_SUCCESS
    }

    fn primary_ctx_retain(&self, device: i32) -> DriverResult<usize> {
        self.log(Call::PrimaryCtxRetain(device));
        if device >= 0 && (device as usize) < self.pools.len() {
            Ok(primary(device))
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}
