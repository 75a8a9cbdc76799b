//! Call stacks of allocations (issue 37): where a range came from.
//!
//! Two halves that never meet on one thread's path:
//!
//! - **Inside the hooks** ([`capture`], [`Table::insert`]): the calling thread's return
//!   addresses, unwound from the loaded objects' `.eh_frame` (programs built without frame
//!   pointers are the common case), then deduplicated into a [`StackId`]. Neither allocates,
//!   takes a lock or can fault on a corrupt stack: every stack word read is checked against
//!   the thread's stack mapping (`bounds`), the frame count is bounded by the caller's buffer
//!   (at most [`MAX_FRAMES`]), and the table is preallocated and claimed by compare-and-swap.
//! - **At report time** ([`module`], [`symbolize`]): a frame becomes (module, load bias,
//!   offset, build-id), then `function (file:line)` from the module's DWARF. These allocate,
//!   open files and may call the loader; the hook path never parses DWARF.
//!
//! [`prepare`] must run once outside the hook path (at enable time) before [`capture`] can
//! use the unwind tables: it looks up glibc's `_dl_find_object` with `dlsym`, which takes the
//! loader's lock. Until then, and on glibc before 2.35, [`capture`] follows frame pointers
//! only.

mod bounds;
mod global;
pub mod module;
pub mod symbolize;
mod table;
mod unwind;

#[cfg(test)]
mod tests;

pub use global::{after_fork_in_child, depth, disable, enable, frames, table, DEFAULT_CAPACITY};
pub(crate) use global::{here, recording};
pub use table::{Table, TableStats};
pub use unwind::{capture, capture_from, forget_unwind_rules, Registers, MAX_FRAMES};

/// A unique call stack in a [`Table`]. `0` ([`StackId::NONE`]) is "not recorded" (stacks
/// off), `1` ([`StackId::OTHER`]) "recorded, but beyond the table's bound" (counted by the
/// table); real stacks are numbered from 2, densely, in insertion order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct StackId(pub u32);

impl StackId {
    /// No stack recorded.
    pub const NONE: StackId = StackId(0);
    /// A stack the table had no room for (or could not compare in time): counted as "other".
    pub const OTHER: StackId = StackId(1);
    /// The first id of a real stack.
    pub(crate) const FIRST: u32 = 2;

    /// Whether this names a stack whose frames the table holds.
    pub fn is_stack(self) -> bool {
        self.0 >= Self::FIRST
    }
}

/// Make the unwind tables usable from [`capture`]: looks up `_dl_find_object` (glibc ≥ 2.35)
/// once, and decides how stack mappings are asked for. Call it outside any hook (it may take
/// the loader's lock and allocate); calling it again costs one load. Returns whether the
/// unwind tables will be used (`false`: frame pointers only).
pub fn prepare() -> bool {
    bounds::prepare();
    crate::sys::dl::can_find_objects()
}

/// Capture the calling thread's stack (skipping `skip` frames above the caller of this
/// function) and insert it into `table`: one call for a hook. `depth` frames at most (clamped
/// to [`MAX_FRAMES`]). No allocation, no lock; [`StackId::OTHER`] when the table is full, and
/// [`StackId::NONE`] when nothing could be captured.
#[inline(never)]
pub fn record(table: &Table, skip: usize, depth: usize) -> StackId {
    let mut frames = [0usize; MAX_FRAMES];
    let depth = depth.min(MAX_FRAMES);
    // One more frame to skip: this function's own.
    let n = capture(skip + 1, &mut frames[..depth]);
    if n == 0 {
        return StackId::NONE;
    }
    table.insert(&frames[..n])
}
