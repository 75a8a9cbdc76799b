//! The process's stack table and whether allocations record their stacks (`CUHOOK_STACKS=N`,
//! `cuhook run --stacks N`, [`enable`]).
//!
//! Off by default, and then the allocation hooks pay one load and a branch ([`here`]). Once
//! enabled the table stays for the life of the process (leaked on purpose: records and reports
//! name its ids, and a hook may be inserting while another thread asks to disable).
//!
//! Unsafe only to free a table that lost the race to be published, and to borrow the
//! published one (never freed).
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::{record, StackId, Table, MAX_FRAMES};

/// Frames recorded per allocation; 0 while stacks are off.
static DEPTH: AtomicUsize = AtomicUsize::new(0);
/// The table, null until the first [`enable`].
static TABLE: AtomicPtr<Table> = AtomicPtr::new(core::ptr::null_mut());
/// cuhook's own code (`[start, end)`), whose frames begin every captured stack: dropped from
/// them. Known only when that code is a library of its own (`libcuhook.so`); in a program that
/// embeds the crate the first frames are cuhook's.
static OWN_START: AtomicUsize = AtomicUsize::new(0);
static OWN_END: AtomicUsize = AtomicUsize::new(0);

/// Frames of cuhook's own a capture allows for above the host's (the hook, its unwind guard and
/// closure, this function), within [`MAX_FRAMES`].
const OWN_FRAMES: usize = 8;

/// Unique stacks the table holds unless told otherwise (`CUHOOK_STACKS_MAX`): 16 frames each
/// take 2.1 MiB for 16,384 stacks.
pub const DEFAULT_CAPACITY: u32 = 16_384;

/// Start recording `depth` frames (1..=[`MAX_FRAMES`]) per allocation into a table of
/// `capacity` unique stacks (allocated now, on the first call; later calls change only the
/// depth, within the first table's). `own_code`: cuhook's own code range, whose frames are
/// dropped from the top of each stack. Call outside any hook.
pub fn enable(depth: usize, capacity: u32, own_code: Option<(usize, usize)>) {
    super::prepare();
    FORK.register_fork_handlers(
        None,
        None,
        Some(child_after_fork),
        "a fork while another thread records a stack may leave that stack unusable in the child",
    );
    if TABLE.load(Ordering::Acquire).is_null() {
        let table = Box::into_raw(Box::new(Table::new(capacity, depth.clamp(1, MAX_FRAMES))));
        if TABLE
            .compare_exchange(
                core::ptr::null_mut(),
                table,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            // Another thread enabled first: ours was never published.
            // SAFETY: made by `Box::into_raw` just above and seen by no one.
            drop(unsafe { Box::from_raw(table) });
        }
    }
    if let Some((start, end)) = own_code {
        OWN_START.store(start, Ordering::Relaxed);
        OWN_END.store(end, Ordering::Relaxed);
    }
    let limit = table().map_or(1, |t| t.stats().depth);
    DEPTH.store(depth.clamp(1, limit), Ordering::Release);
}

/// Stop recording (ranges recorded so far keep their ids, and the table its stacks).
pub fn disable() {
    DEPTH.store(0, Ordering::Release);
}

/// Frames recorded per allocation now (0: off).
pub fn depth() -> usize {
    DEPTH.load(Ordering::Relaxed)
}

/// The table, once stacks were enabled.
pub fn table() -> Option<&'static Table> {
    // SAFETY: published once by `enable` from a leaked box, never freed.
    unsafe { TABLE.load(Ordering::Acquire).as_ref() }
}

/// The frames of stack `id` (return addresses, innermost first), if the table holds it.
pub fn frames(id: StackId) -> Option<&'static [usize]> {
    table()?.frames(id)
}

/// The stack of the calling hook's caller, or [`StackId::NONE`] when stacks are off. Inlined
/// into the allocation hooks: off, it is one load and a branch. Crate-internal: a function
/// other crates could inline would make `DEPTH` a static they can name, loaded through the GOT
/// on every allocation.
#[inline(always)]
pub(crate) fn here() -> StackId {
    let depth = DEPTH.load(Ordering::Relaxed);
    if depth == 0 {
        return StackId::NONE;
    }
    record_here(depth)
}

#[cold]
#[inline(never)]
fn record_here(depth: usize) -> StackId {
    let Some(table) = table() else {
        return StackId::NONE;
    };
    let (start, end) = (
        OWN_START.load(Ordering::Relaxed),
        OWN_END.load(Ordering::Relaxed),
    );
    if start == end {
        return record(table, 0, depth);
    }
    // cuhook's own frames (the hook, its unwind guard, this function) come first: captured
    // too, within the bound, then dropped.
    let mut frames = [0usize; MAX_FRAMES];
    let want = (depth + OWN_FRAMES).min(MAX_FRAMES);
    let n = super::capture(0, &mut frames[..want]);
    let own = frames[..n]
        .iter()
        .take_while(|&&pc| pc >= start && pc < end)
        .count();
    let host = &frames[own..n];
    if host.is_empty() {
        return StackId::NONE;
    }
    table.insert(&host[..host.len().min(depth)])
}

/// Whether allocations record their stacks now (one load; crate-internal for the reason
/// [`here`] gives).
#[inline(always)]
pub(crate) fn recording() -> bool {
    DEPTH.load(Ordering::Relaxed) != 0
}

/// In a forked child: forget inserts that threads of the parent left half done.
pub fn after_fork_in_child() {
    if let Some(t) = table() {
        t.after_fork_in_child();
    }
}

/// The fork handlers are registered once per process (a child inherits them).
static FORK: crate::sys::once::ForkSafeOnce = crate::sys::once::ForkSafeOnce::new();

extern "C" fn child_after_fork() {
    crate::sys::boundary::guarded(after_fork_in_child, || ());
}
