//! The `dlsym` substitution table: original function → hook, for every installed hook.
//!
//! Read by every interposed `dlsym`, written only at the end of engine operations. It is a leaf
//! lock (nothing is called while it is held), so `dlsym` never waits on the patch lock, which
//! may be held across loader calls.

use super::set::HookSet;

#[derive(Clone, Copy)]
struct Substitution {
    original: usize,
    replacement: usize,
}

/// Waiters yield the CPU (a `dlsym` may wait while the table is rebuilt).
static TABLE: spin::rwlock::RwLock<Vec<Substitution>, spin::relax::Yield> =
    spin::rwlock::RwLock::new(Vec::new());

/// Rebuild the table from the installed sets.
pub(crate) fn publish<'a>(sets: impl Iterator<Item = &'a HookSet>) {
    // A hook's chains too: a lookup that finds what a chained slot held (another interposer's
    // definition) gets the chain that calls it.
    let table: Vec<Substitution> = sets
        .flat_map(|s| s.hooks.iter())
        .flat_map(|h| {
            let chains = h.chains.iter().map(|c| (c.original.get(), c.replacement));
            std::iter::once((h.original.get(), h.replacement)).chain(chains)
        })
        .filter(|&(original, _)| original != 0)
        .map(|(original, replacement)| Substitution {
            original,
            replacement,
        })
        .collect();
    *TABLE.write() = table;
}

/// The hook to hand out for a lookup result: only when the result *is* the original a hook
/// calls. A lookup that reaches past us (an interposer using `RTLD_NEXT`) gets the real function,
/// so no cycle can form.
pub fn substitute(found: usize) -> usize {
    if found == 0 {
        return 0;
    }
    let table = TABLE.read();
    // Hooks stacked on one function form a chain (each one's original is the replacement
    // below it): hand out the top. Bounded by the table's length, so no cycle can spin.
    let mut top = found;
    for _ in 0..table.len() {
        match table.iter().find(|s| s.original == top) {
            Some(s) => top = s.replacement,
            None => break,
        }
    }
    top
}

/// Hold the table's write lock across a fork (see the engine's fork handlers), so a child never
/// inherits it held by a thread that is gone.
pub(crate) fn hold_for_fork() {
    std::mem::forget(TABLE.write());
}

/// Release the lock [`hold_for_fork`] took.
///
/// # Safety
/// Only after `hold_for_fork` on this thread (in a child: in the parent's forking thread).
#[allow(unsafe_code)]
pub(crate) unsafe fn release_after_fork() {
    // SAFETY: the caller took the write lock with `hold_for_fork` and forgot the guard.
    unsafe { TABLE.force_write_unlock() };
}
