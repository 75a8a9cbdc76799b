//! Turning a hooked call into registry updates and events: what an alloc, a free, an unmap and a
//! teardown do.
//!
//! The registry (when attached) is updated in the hook itself, before the event is dispatched:
//! an allocation is inserted after the real call succeeded, a free removes its record first and
//! the free event is built from that record (one registry operation per free), before the real
//! free runs. Only successful calls change the registry: a free the driver refuses puts the
//! record back, an unmap puts back exactly the pieces it took. A free of a pointer the registry
//! never saw (made before install) is described by the driver (`cuMemGetAddressRange_v2` in the
//! pointer's own context) and announced before the real free with the driver's size, type and
//! device; only when the driver cannot tell is it dispatched after the real free succeeded, with
//! size 0; likewise an unmap of a span the registry holds nothing of.
//!
//! Registrations that no allocation call makes (globals, imported memory, graph nodes) are in
//! `globals.rs`, away from the hot path.

mod globals;

use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::events::{self, flags, EventKind, MemEvent, MemType};
use crate::registry::{self, Allocation, RemovedRecord};
use crate::stacks::StackId;

use super::query;

pub use globals::{global, graph_alloc, imported, unload_before, Announce, Global};

/// Frees of pointers the registry never held, counted while the registry is attached or a
/// subscriber listens (a free nobody observes is not looked into).
static UNKNOWN_FREES: AtomicU64 = AtomicU64::new(0);
/// Frees the driver refused after they were announced.
static FAILED_FREES: AtomicU64 = AtomicU64::new(0);

/// A free of a pointer the registry never saw (allocated before install).
#[cold]
fn note_unknown_free() {
    UNKNOWN_FREES.fetch_add(1, Ordering::Relaxed);
}

/// A free that was announced but then refused by the driver.
#[cold]
fn note_failed_free() {
    FAILED_FREES.fetch_add(1, Ordering::Relaxed);
}

/// The counters of the whole process: the registry's own, and the frees counted here.
pub fn stats() -> registry::RegistryStats {
    registry::RegistryStats {
        unknown_frees: UNKNOWN_FREES.load(Ordering::Relaxed),
        failed_frees: FAILED_FREES.load(Ordering::Relaxed),
        ..registry::own_stats()
    }
}

/// Feeds every range the registry holds to `emit` as an alloc event: the replay a new subscriber
/// that asks for existing allocations receives (flagged EXISTING by the subscriber list).
pub fn replay_existing(emit: &mut dyn FnMut(&MemEvent)) {
    registry::global().for_each(|a| emit(&MemEvent::alloc(a)));
}

/// What a hook must finish after the real call.
#[derive(Debug)]
pub enum Pending {
    Nothing,
    /// A free was announced and its record removed; if the real free fails, it is put back and
    /// announced again. Kept encoded: most frees succeed and never decode it. Always `Some`:
    /// the registry's `Option` is moved in whole, which the compiler does without another copy
    /// of the record (unwrapped, it was copied twice more: 15 instructions per free).
    Announced(Option<RemovedRecord>),
    /// An unmap was announced; the span leaves the registry if it succeeds, and is announced
    /// again if it fails.
    AnnouncedSpan(MemEvent),
    /// A free of an unknown pointer (size 0) or an unmap of a span starting in no known mapping,
    /// to announce once the real call succeeded.
    Unknown(MemEvent),
    /// A teardown's ranges, announced freed and removed; if the teardown fails they are put back
    /// and announced again (flagged EXISTING), like a refused free. `ManuallyDrop` keeps drop
    /// glue off every hook's `Pending` (≈ 60 instructions per alloc+free pair); `settle` drops
    /// the list (a panic before it would leak it).
    Purged(ManuallyDrop<Vec<Allocation>>),
}

/// Announce an allocation that succeeded. Inlined into the allocation hooks (the hot path:
/// left to the compiler it was a call in some builds and not in others).
#[inline(always)]
pub fn alloc(
    api: &'static CStr,
    mem_type: MemType,
    address: usize,
    size: usize,
    extra_flags: u32,
    stream: usize,
    pool: usize,
) {
    if crate::stacks::recording() {
        return alloc_with_stack(api, mem_type, address, size, extra_flags, stream, pool);
    }
    announce(
        api,
        mem_type,
        address,
        size,
        (extra_flags, stream, pool),
        StackId::NONE,
    );
}

/// [`alloc`] with the call stack that made the allocation (stacks recorded). A copy of its own,
/// out of line: with the stack id carried through the hooks' one body, they spilled registers
/// and built the range in memory, 20 more instructions per pair with stacks off.
#[cold]
#[inline(never)]
fn alloc_with_stack(
    api: &'static CStr,
    mem_type: MemType,
    address: usize,
    size: usize,
    extra_flags: u32,
    stream: usize,
    pool: usize,
) {
    let stack = crate::stacks::here();
    announce(
        api,
        mem_type,
        address,
        size,
        (extra_flags, stream, pool),
        stack,
    );
}

/// Builds the new range once, registers it and tells the subscribers (with the registry's
/// number for it). `(flags, stream, pool)` as [`alloc`] takes them.
#[inline(always)]
fn announce(
    api: &'static CStr,
    mem_type: MemType,
    address: usize,
    size: usize,
    (extra_flags, stream, pool): (u32, usize, usize),
    stack: StackId,
) {
    if address == 0 || size == 0 {
        return;
    }
    let attached = registry::attached_hot();
    let subscribed = events::list().has_subscribers();
    if !attached && !subscribed {
        return;
    }
    // A measurement build (`--cfg cuhook_diag="no_context"`, docs/performance.md) leaves the
    // context query out, to tell its cost apart on the real driver.
    #[cfg(not(cuhook_diag = "no_context"))]
    let (ctx, device) = query::context_of_stream(stream);
    #[cfg(cuhook_diag = "no_context")]
    let (ctx, device) = (std::ptr::null_mut::<std::ffi::c_void>(), -1);
    let a = Allocation {
        start: address,
        size,
        mem_type,
        device,
        flags: extra_flags,
        pool,
        stream,
        context: ctx as usize,
        api,
        stack,
        seq: 0,
    };
    // A measurement build (`--cfg cuhook_diag="no_registry"`) leaves the registry's write
    // out, to tell its cost apart on the real driver.
    let seq = if attached && cfg!(not(cuhook_diag = "no_registry")) {
        registry::hot().insert_seq(a)
    } else {
        0
    };
    if subscribed {
        events::list().dispatch(&MemEvent::alloc(Allocation { seq, ..a }));
    }
}

/// A free to announce before it happens: what a free hook's `before` names. The hook then has
/// it prepared into its own `Pending` (`prepare`), so the removed record is copied out of the
/// registry straight into the place it is kept until the real call returns (returned by value
/// from a function with several exits, it was copied once more on every free).
pub struct FreeBefore {
    api: &'static CStr,
    address: usize,
    extra_flags: u32,
    stream: usize,
}

/// Announce a free before it happens (known pointer: its record is removed now), or prepare to
/// announce it after: see [`FreeBefore`].
#[inline(always)]
pub fn free_before(
    api: &'static CStr,
    address: usize,
    extra_flags: u32,
    stream: usize,
) -> FreeBefore {
    FreeBefore {
        api,
        address,
        extra_flags,
        stream,
    }
}

// What a hook's `before` hands it is *prepared* into the `Pending` the hook keeps across the real
// call. `prepare` returns whether [`settle`] can skip reading it back after a successful call
// (nothing pending, or a known free's record): decided here, where the compiler still knows
// which it is, and not by the `Pending`'s tag, which it must reload after the real call. Inherent
// methods of one name, not a trait: a trait's impls count as reachable from other crates, and
// the statics their inlined bodies touch were then reached through the GOT (three more loads).

impl Pending {
    /// See above; the `Pending` moved into place as it is.
    #[inline(always)]
    pub(crate) fn prepare(self, pending: &mut Pending) -> bool {
        let quiet = matches!(self, Pending::Nothing);
        *pending = self;
        quiet
    }
}

impl FreeBefore {
    /// See above. Inlined into every free hook (the hot path; with more free hooks the compiler
    /// stopped inlining it on its own, costing a call per free).
    #[inline(always)]
    pub(crate) fn prepare(self, pending: &mut Pending) -> bool {
        let FreeBefore {
            api,
            address,
            extra_flags,
            stream,
        } = self;
        if address == 0 || cfg!(cuhook_diag = "no_registry") {
            return true;
        }
        *pending = Pending::Announced(None);
        let Pending::Announced(removed) = pending else {
            return true;
        };
        let found =
            registry::attached_hot() && registry::hot().remove_record_into(address, removed);
        if !found {
            *pending = unknown_free(api, address, extra_flags, stream);
            return false;
        }
        if events::list().has_subscribers() {
            announce_free(api, removed, extra_flags, stream);
        }
        true
    }

    /// The `Pending` on its own, for a caller that decides first whether there is a free at all
    /// (a graph node); not for the free hooks themselves, which prepare their own.
    #[inline(never)]
    pub fn pending(self) -> Pending {
        let mut pending = Pending::Nothing;
        let _ = self.prepare(&mut pending);
        pending
    }
}

/// Tells the subscribers of a known range's free (out of line: the record is decoded only here
/// and in [`refused`]).
#[cold]
#[inline(never)]
fn announce_free(
    api: &'static CStr,
    removed: &Option<RemovedRecord>,
    extra_flags: u32,
    stream: usize,
) {
    if let Some(record) = removed {
        let range = flagged(&record.allocation(), extra_flags, stream);
        events::list().dispatch(&MemEvent::free(api, range));
    }
}

/// A free of a pointer the registry does not know (allocated before install, or never through
/// a hooked call): the driver is asked for the allocation's size and kind, so the free is still
/// announced before the memory goes. If the real free is refused, the allocation is announced
/// again (flagged EXISTING) and registered, as for a known pointer. Only when the driver cannot
/// tell is the free dispatched after it succeeded, with size 0.
#[cold]
fn unknown_free(api: &'static CStr, address: usize, extra_flags: u32, stream: usize) -> Pending {
    // No registry to update and nobody to tell: asking the driver what the pointer was (two
    // calls) would serve no one.
    if !registry::attached_hot() && !events::list().has_subscribers() {
        return Pending::Nothing;
    }
    if let Some(d) = query::describe(address) {
        let mut record = Allocation::new(d.base, d.size, api);
        record.mem_type = d.mem_type;
        record.device = d.device;
        record.context = d.context;
        if d.mem_type == MemType::Host {
            record.flags = flags::PINNED_HOST;
        }
        note_unknown_free();
        if events::list().has_subscribers() {
            events::list().dispatch(&MemEvent::free(api, flagged(&record, extra_flags, stream)));
        }
        return Pending::Announced(Some(RemovedRecord::from(&record)));
    }
    let mut range = Allocation::new(address, 0, api);
    range.flags = extra_flags;
    range.stream = stream;
    Pending::Unknown(MemEvent::free(api, range))
}

/// Announce the removal of `[address, address+size)` (a VMM unmap, possibly of part of a
/// mapping), with the metadata of the mapping it starts in. The span leaves the registry only
/// once the driver has unmapped it: the driver refuses unmaps that do not cover whole mappings,
/// and a refused call must change nothing. A span that starts in no registered mapping is
/// announced only after the unmap succeeded.
pub fn unmap_before(api: &'static CStr, address: usize, size: usize) -> Pending {
    if address == 0 || size == 0 {
        return Pending::Nothing;
    }
    match registry::hot().lookup(address) {
        Some(r) => {
            let span = Allocation {
                start: address,
                size,
                ..flagged(&r, flags::VMM, 0)
            };
            let ev = MemEvent::free(api, span);
            events::list().dispatch(&ev);
            Pending::AnnouncedSpan(ev)
        }
        None => {
            let mut span = Allocation::new(address, size, api);
            span.mem_type = MemType::Cuda;
            span.flags = flags::VMM;
            Pending::Unknown(MemEvent::free(api, span))
        }
    }
}

/// The range a free event carries: what was known of it, with the free's own flags, and the
/// free's stream when it names one.
#[inline(always)]
fn flagged(r: &Allocation, extra_flags: u32, stream: usize) -> Allocation {
    Allocation {
        flags: r.flags | extra_flags,
        stream: if stream != 0 { stream } else { r.stream },
        ..*r
    }
}

/// Teardown: remove every range matching `pred` and announce a free for each (VMM mappings
/// survive context teardown and are never purged). They are kept in the returned pending
/// value: a teardown the driver refuses (a primary context passed to `cuCtxDestroy`) frees
/// nothing, and they go back.
pub fn purge_before(api: &'static CStr, pred: impl Fn(&Allocation) -> bool) -> Pending {
    query::contexts_changed();
    if registry::hot().is_empty() {
        return Pending::Nothing;
    }
    let mut purged = Vec::new();
    registry::hot().purge(
        |a| a.flags & flags::VMM == 0 && pred(a),
        |a| {
            events::list().dispatch(&MemEvent::free(api, flagged(&a, flags::PURGED, 0)));
            // Kept to be put back if the driver refuses; without the memory to keep it, a
            // refusal leaves it out of the registry, counted untracked.
            if purged.try_reserve(1).is_ok() {
                purged.push(a);
            } else {
                registry::note_untracked();
            }
        },
    );
    Pending::Purged(ManuallyDrop::new(purged))
}

/// Finish after the real call: nothing to read when the call succeeded and `quiet` (what
/// `prepare` returned), else the `Pending` decides (out of line).
#[inline(always)]
pub fn settle(pending: &mut Pending, quiet: bool, ok: bool) {
    if !(quiet && ok) {
        settle_pending(pending, ok);
    }
}

/// [`settle`] by the `Pending`'s kind.
#[inline(never)]
fn settle_pending(pending: &mut Pending, ok: bool) {
    match pending {
        Pending::Nothing => {}
        // The driver refused the free: the memory is still allocated. The record goes back,
        // and subscribers, who heard the free, hear the allocation again (flagged EXISTING).
        Pending::Announced(record) => {
            if let (false, Some(record)) = (ok, record) {
                refused(&record.allocation());
            }
        }
        Pending::AnnouncedSpan(free) => {
            if ok {
                unmapped(free);
            } else {
                note_failed_free();
                let mut ev = *free;
                ev.kind = EventKind::Alloc;
                ev.range.flags |= flags::EXISTING;
                events::list().dispatch(&ev);
            }
        }
        Pending::Unknown(ev) => {
            if ok {
                unmapped(ev);
                note_unknown_free();
                events::list().dispatch(ev);
            }
        }
        // Taken out (an empty list, which owns nothing, is left behind).
        Pending::Purged(ranges) => purged(core::mem::take(&mut **ranges), ok),
    }
}

/// After a successful unmap (a span event, size > 0), the span leaves the registry.
fn unmapped(ev: &MemEvent) {
    if ev.range.flags & flags::VMM != 0 && ev.range.size != 0 && registry::attached_hot() {
        registry::hot().remove(ev.range.start, ev.range.size);
    }
}

/// After a teardown: its ranges go back if the driver refused it. Out of line, so `settle` stays
/// small enough to be inlined into every hook.
#[cold]
#[inline(never)]
fn purged(ranges: Vec<Allocation>, ok: bool) {
    if !ok {
        ranges.iter().for_each(refused);
    }
}

/// Puts back a range whose free the driver refused, and announces it again.
#[cold]
fn refused(record: &Allocation) {
    note_failed_free();
    if registry::attached_hot() {
        registry::hot().insert(*record);
    }
    events::list().dispatch(&MemEvent::alloc(flagged(record, flags::EXISTING, 0)));
}
