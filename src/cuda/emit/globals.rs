//! Registrations that are no allocation call: module and library globals handed out by the
//! driver, memory imported from another process, graph memory nodes, and unloads that end
//! globals. All cold, kept apart from the alloc/free hot path in `mod.rs`.

use std::ffi::CStr;

use crate::events::{self, flags, MemEvent, MemType};
use crate::registry::{self, Allocation};

use super::super::query;
use super::{alloc, flagged, Pending};

/// Who handed a global out, which decides its memory type and what ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Global {
    /// A module's global (`cuModuleGetGlobal*`), or a library's device global
    /// (`cuLibraryGetGlobal`): managed when the driver says so; it lives in the current
    /// context, so that context's destruction or reset ends it.
    InContext,
    /// A module's `__managed__` variable (the module was loaded into the current context).
    ModuleManaged,
    /// A library's `__managed__` variable: a library belongs to no context, and its managed
    /// variables keep their memory (and contents) through a reset of the device's primary
    /// context (measured on the H200, `docs/gpu-results.md`), so it is registered without a
    /// context and only the library's unload ends it.
    LibraryManaged,
}

/// Whether a registration is dispatched to subscribers too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Announce {
    /// Registered and dispatched (the outermost hooked call of its thread).
    Dispatch,
    /// Registered only: found inside another hooked call (the runtime loading its code inside
    /// `cudaMalloc`, say), where a subscriber's callback could re-enter a runtime that is
    /// initialising itself. Subscribers see the range through lookups and replays.
    RegistryOnly,
}

/// Announce a module or library global whose address the driver just handed out, once: a
/// repeated query of the same global (same start and size, flagged GLOBAL) changes nothing and
/// dispatches nothing. `owner` (recorded as the range's `pool`) is the module or library whose
/// unload removes it.
#[cold]
pub fn global(
    api: &'static CStr,
    address: usize,
    size: usize,
    owner: usize,
    kind: Global,
    announce: Announce,
) {
    if address == 0 || !registry::attached_hot() {
        return;
    }
    // The caller may pass no size output: then the driver's range of the address tells.
    let size = match size {
        0 => match query::describe(address) {
            Some(d) => d.size,
            None => return,
        },
        s => s,
    };
    if let Some(known) = registry::hot().lookup(address) {
        if known.start == address && known.size == size && known.flags & flags::GLOBAL != 0 {
            return;
        }
    }
    let mut range = Allocation::new(address, size, api);
    range.flags = flags::GLOBAL;
    range.pool = owner;
    range.mem_type = match kind {
        Global::InContext if !query::is_managed(address) => MemType::Cuda,
        _ => MemType::CudaManaged,
    };
    if kind != Global::LibraryManaged {
        let ctx = query::current_context();
        range.context = ctx as usize;
        range.device = query::device_of(ctx);
    }
    range.seq = registry::hot().insert(range).seq.unwrap_or(0);
    if announce == Announce::Dispatch && events::list().has_subscribers() {
        events::list().dispatch(&MemEvent::alloc(range));
    }
}

/// Announce memory another process exported, now opened or imported here: its size, type and
/// device come from the driver (the opening call does not say), flagged IMPORTED. Without the
/// driver's answer nothing is registered (the range's size is unknown).
#[cold]
pub fn imported(api: &'static CStr, address: usize, extra_flags: u32, pool: usize) {
    if address == 0 {
        return;
    }
    if let Some(d) = query::describe(address) {
        alloc(
            api,
            d.mem_type,
            address,
            d.size,
            flags::IMPORTED | extra_flags,
            0,
            pool,
        );
    }
}

/// Announce a graph memory node made explicitly: the address the graph's allocation keeps on
/// every launch, flagged GRAPH (no stream), on the device the node names (its pool properties'
/// location; the current context's device when it names none). The context is the current one
/// when it is on that device, else unknown (0): graph memory belongs to a device.
///
/// Its body repeats `alloc`'s on purpose: sharing one (a device parameter, or the check and
/// the publishing as helpers) made the hot path 6–7 instructions longer per pair, counted
/// three ways with `benches/callgrind.sh`.
#[cold]
pub fn graph_alloc(api: &'static CStr, address: usize, size: usize, device: Option<i32>) {
    if address == 0 || size == 0 {
        return;
    }
    let attached = registry::attached_hot();
    let subscribed = events::list().has_subscribers();
    if !attached && !subscribed {
        return;
    }
    let mut range = Allocation::new(address, size, api);
    range.mem_type = MemType::Cuda;
    range.flags = flags::GRAPH;
    let ctx = query::current_context();
    let ctx_device = query::device_of(ctx);
    range.device = device.unwrap_or(ctx_device);
    range.context = if range.device == ctx_device {
        ctx as usize
    } else {
        0
    };
    if attached {
        range.seq = registry::hot().insert(range).seq.unwrap_or(0);
    }
    if subscribed {
        events::list().dispatch(&MemEvent::alloc(range));
    }
}

/// A module or library is unloaded: the globals it handed out leave the registry, each
/// announced as a free (flagged GLOBAL and PURGED) before the unload.
#[cold]
pub fn unload_before(api: &'static CStr, owner: usize) -> Pending {
    if owner != 0 && !registry::hot().is_empty() {
        registry::hot().purge(
            |a| a.flags & flags::GLOBAL != 0 && a.pool == owner,
            |a| events::list().dispatch(&MemEvent::free(api, flagged(&a, flags::PURGED, 0))),
        );
    }
    Pending::Nothing
}
