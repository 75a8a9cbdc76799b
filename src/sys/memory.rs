//! Whether memory can be had right now, asked without disturbing the host's allocator.
//!
//! Most of cuhook's work allocates as it goes (indexing the libraries a `dlopen` brought,
//! rendering the exit report), and a failed Rust allocation aborts the process. In a host whose
//! memory is exhausted (`ulimit -v`, `vm.overcommit_memory=2`) that work first asks here for a
//! generous margin, and is put off (the loader's changes are picked up by the next scan) or
//! shortened (the report) when the margin is not there. A margin is a prediction, not a
//! reservation: another thread may take the memory between the question and the work. The
//! registry, on the allocation hooks' path, needs no prediction: it asks its allocator for exact
//! room before every edit (`registry::write`).
//!
//! The question is an anonymous private mapping, writable (so it is charged against the commit
//! limit as the allocator's own would be) and never touched (so it costs no page), unmapped at
//! once. `malloc` and `free` of a large block would do, but would move glibc's dynamic mmap
//! threshold and leave the host's heap larger: the host's allocator is not ours to tune.
#![allow(unsafe_code)]

/// Margin asked for before the engine handles loader changes: comfortably more than indexing a
/// large library takes (a 100,000-symbol object's index is a few MiB).
pub(crate) const LOADER_MARGIN: usize = 16 << 20;

/// Margin asked for before the exit report is rendered.
pub(crate) const REPORT_MARGIN: usize = 4 << 20;

/// Whether `bytes` of memory could be allocated now.
pub(crate) fn available(bytes: usize) -> bool {
    // SAFETY: a fresh anonymous mapping chosen by the kernel, unmapped below before anyone can
    // use it; no existing mapping is touched.
    unsafe {
        let p = libc::mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, bytes);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_margin_is_there_until_the_address_space_runs_out() {
        assert!(available(LOADER_MARGIN));
        // More than any address space holds.
        assert!(!available(usize::MAX / 2));
    }
}
