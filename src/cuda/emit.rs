//! Turning a hooked call into events: what an alloc, a free, an unmap and a teardown dispatch.
//!
//! Alloc events are built after the real call succeeded; free events before the real free runs,
//! with the size from the registry's record. A free of a pointer the registry never saw (made
//! before install) cannot be announced in advance without knowing it is valid: it is dispatched
//! after the real free succeeded, with size 0.

use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::events::{self, flags, EventKind, MemEvent, MemType};
use crate::registry::{self, Allocation};

use super::driver;

/// What a hook must finish after the real call.
#[derive(Debug)]
pub enum Pending {
    Nothing,
    /// A free was announced; if the real free fails, the allocation is announced again.
    Announced(Allocation),
    /// An unmap of a span was announced; if it fails, the span is announced again.
    AnnouncedSpan(MemEvent),
    /// A free of an unknown pointer, to announce once the real free succeeded.
    Unknown(MemEvent),
}

/// Run event code so that a bug in it can never unwind into the C caller.
pub fn guarded<R>(f: impl FnOnce() -> R, fallback: R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Announce an allocation that succeeded.
pub fn alloc(
    api: &'static CStr,
    mem_type: MemType,
    address: usize,
    size: usize,
    extra_flags: u32,
    stream: usize,
    pool: usize,
) {
    if address == 0 || size == 0 {
        return;
    }
    let mut ev = MemEvent::new(EventKind::Alloc, address, size, api);
    ev.mem_type = mem_type;
    ev.flags = extra_flags;
    ev.stream = stream;
    ev.pool = pool;
    let ctx = driver::current_context();
    ev.context = ctx as usize;
    ev.device = driver::device_of(ctx);
    events::dispatch(&ev);
}

/// Announce a free before it happens (known pointer), or prepare to announce it after.
pub fn free_before(api: &'static CStr, address: usize, extra_flags: u32, stream: usize) -> Pending {
    if address == 0 {
        return Pending::Nothing;
    }
    match registry::global()
        .lookup(address)
        .filter(|a| a.start == address)
    {
        Some(record) => {
            events::dispatch(&free_event(
                api,
                &record,
                record.start,
                record.size,
                extra_flags,
                stream,
            ));
            Pending::Announced(record)
        }
        None => {
            let mut ev = MemEvent::new(EventKind::Free, address, 0, api);
            ev.flags = extra_flags;
            ev.stream = stream;
            Pending::Unknown(ev)
        }
    }
}

/// Announce the removal of `[address, address+size)` (a VMM unmap, possibly of part of a
/// mapping), with the metadata of the mapping it lies in.
pub fn unmap_before(api: &'static CStr, address: usize, size: usize) -> Pending {
    if address == 0 || size == 0 {
        return Pending::Nothing;
    }
    let record = registry::global().lookup(address);
    let ev = match record {
        Some(r) => free_event(api, &r, address, size, flags::VMM, 0),
        None => {
            let mut ev = MemEvent::new(EventKind::Free, address, size, api);
            ev.mem_type = MemType::Cuda;
            ev.flags = flags::VMM;
            ev
        }
    };
    events::dispatch(&ev);
    Pending::AnnouncedSpan(ev)
}

fn free_event(
    api: &'static CStr,
    r: &Allocation,
    address: usize,
    size: usize,
    extra_flags: u32,
    stream: usize,
) -> MemEvent {
    let mut ev = r.to_event();
    ev.kind = EventKind::Free;
    ev.address = address;
    ev.size = size;
    ev.api = api;
    ev.flags |= extra_flags;
    if stream != 0 {
        ev.stream = stream;
    }
    ev
}

/// Teardown: announce a free for every range matching `pred` (VMM mappings survive context
/// teardown and are never purged).
pub fn purge_before(api: &'static CStr, pred: impl Fn(&Allocation) -> bool) -> Pending {
    driver::contexts_changed();
    if registry::global().is_empty() {
        return Pending::Nothing;
    }
    let mut doomed = Vec::new();
    registry::global().for_each(|a| {
        if a.flags & flags::VMM == 0 && pred(&a) {
            doomed.push(a);
        }
    });
    for a in doomed {
        events::dispatch(&free_event(api, &a, a.start, a.size, flags::PURGED, 0));
    }
    Pending::Nothing
}

/// Finish after the real call.
pub fn settle(pending: Pending, ok: bool) {
    match pending {
        Pending::Nothing => {}
        Pending::Announced(record) => {
            if !ok {
                // The driver refused the free: the memory is still allocated. Subscribers heard
                // the free, so they hear the allocation again (flagged EXISTING); the registry
                // takes it back from that event.
                registry::note_failed_free();
                let mut ev = record.to_event();
                ev.flags |= flags::EXISTING;
                events::dispatch(&ev);
            }
        }
        Pending::AnnouncedSpan(free) => {
            if !ok {
                registry::note_failed_free();
                let mut ev = free;
                ev.kind = EventKind::Alloc;
                ev.flags |= flags::EXISTING;
                events::dispatch(&ev);
            }
        }
        Pending::Unknown(ev) => {
            if ok {
                registry::note_unknown_free();
                events::dispatch(&ev);
            }
        }
    }
}
