//! What one row of the hook table says, for `cuhook symbols` and the API's hook table: the
//! hook's family, its symbol, and where its original and chains are published. Plain data,
//! apart from the macro in `mod.rs` that generates the hooks and the rows.

/// Which family a hook belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    /// Synchronous driver allocation and free (`cuMemAlloc`, `cuMemFree`, ...).
    DriverSync,
    /// Stream-ordered driver calls and pools (`cuMemAllocAsync`, `cuMemFreeAsync`, ...).
    DriverStreamOrdered,
    /// Virtual memory management (`cuMemMap`, `cuMemUnmap`).
    DriverVmm,
    /// Pinned and registered host memory (`cuMemHostAlloc`, `cuMemHostRegister`, ...).
    DriverHost,
    /// Context and device teardown, which frees every range it owned.
    DriverTeardown,
    /// Module and library globals: handed out by `cuModuleGetGlobal`, ..., gone at unload.
    DriverModule,
    /// Module and library loads: the `__managed__` variables of the code they load.
    DriverLoad,
    /// Memory of another process opened or imported here (`cuIpcOpenMemHandle`, ...).
    DriverImport,
    /// Stream capture begin and end: counted, so stream-ordered hooks know when to ask.
    DriverCapture,
    /// Stream destruction: the handle may come back for a stream of another context, so the
    /// hooks forget what they cached about streams (`query::streams_changed`).
    DriverStream,
    /// Graph memory nodes added explicitly (`cuGraphAddMemAllocNode`, `cuGraphAddNode`, ...).
    DriverGraph,
    /// The CUDA runtime (`cudaMalloc`, `cudaMallocAsync`, ...).
    Runtime,
    /// Entry-point lookups (`cuGetProcAddress`, `cudaGetDriverEntryPoint`).
    Resolution,
}

impl Group {
    /// The group's name as `cuhook symbols` prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Group::DriverSync => "driver sync",
            Group::DriverStreamOrdered => "driver stream-ordered",
            Group::DriverVmm => "driver VMM",
            Group::DriverHost => "driver host",
            Group::DriverTeardown => "driver teardown",
            Group::DriverModule => "driver module globals",
            Group::DriverLoad => "driver module loads",
            Group::DriverImport => "driver imported memory",
            Group::DriverCapture => "driver stream capture",
            Group::DriverStream => "driver stream lifetime",
            Group::DriverGraph => "driver graph memory nodes",
            Group::Runtime => "runtime",
            Group::Resolution => "resolution",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct HookInfo {
    /// The exported symbol, e.g. `cuMemAllocAsync_ptsz`.
    pub symbol: &'static str,
    /// The name callers ask `cuGetProcAddress` for, e.g. `cuMemAllocAsync`.
    pub base: &'static str,
    /// Which family the hook belongs to.
    pub group: Group,
    /// Address of the hook function.
    pub replacement: fn() -> usize,
    /// Where the engine publishes the original. A function rather than the reference itself:
    /// a static that another crate could reach through this table gets a GOT entry, and the
    /// hook would load its original's address from there, one more cache line per call
    /// (`benches/footprint.sh`).
    pub original: fn() -> &'static std::sync::atomic::AtomicUsize,
    /// The hook's chains (`Hook::with_chains`): replacements that behave as the hook but call
    /// the definition their store holds, for slots bound to another definition than the
    /// original (a quota shim's wrapper in one object, the driver's own in another).
    pub chains: fn() -> [(usize, &'static std::sync::atomic::AtomicUsize); CHAINS],
}

/// Chains per CUDA hook: as many other definitions of one function as a process can bind at
/// once and still have every call seen.
pub const CHAINS: usize = 2;
