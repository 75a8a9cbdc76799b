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

use core::sync::atomic::{AtomicU8, Ordering};

/// Margin asked for before the engine handles loader changes: comfortably more than indexing a
/// large library takes (a 100,000-symbol object's index is a few MiB).
pub(crate) const LOADER_MARGIN: usize = 16 << 20;

/// Margin asked for before the exit report is rendered.
pub(crate) const REPORT_MARGIN: usize = 4 << 20;

/// Whether `bytes` of memory could be allocated now. Asked of the kernel only where an
/// allocation can fail at all: under a finite `RLIMIT_AS` or `RLIMIT_DATA`, or with strict
/// overcommit (`vm.overcommit_memory=2`). Otherwise (the usual host, cgroup limits included:
/// there the OOM killer acts, `malloc` does not fail) the answer is yes for two `getrlimit`s,
/// not a map and an unmap on every `dlopen` that loads something.
pub(crate) fn available(bytes: usize) -> bool {
    if !can_fail() {
        return true;
    }
    probe(bytes)
}

/// Whether an allocation of ours can fail in this process now.
fn can_fail() -> bool {
    let finite = |resource| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid resource and a valid out-pointer.
        let rc = unsafe { libc::getrlimit(resource, &mut r) };
        rc != 0 || r.rlim_cur != libc::RLIM_INFINITY
    };
    finite(libc::RLIMIT_AS) || finite(libc::RLIMIT_DATA) || strict_overcommit()
}

/// `vm.overcommit_memory` is 2 (read once; it is a system setting, and unreadable counts as
/// strict). Read without allocating, into a buffer on the stack.
fn strict_overcommit() -> bool {
    const UNKNOWN: u8 = 0;
    const STRICT: u8 = 1;
    const LENIENT: u8 = 2;
    static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
    match MODE.load(Ordering::Relaxed) {
        STRICT => return true,
        LENIENT => return false,
        _ => {}
    }
    let mut buf = [0u8; 8];
    // SAFETY: a NUL-terminated path, a descriptor of ours closed once, a buffer of 8 bytes.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/sys/vm/overcommit_memory".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            -1
        } else {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::close(fd);
            n
        }
    };
    let strict = n < 1 || buf[0] == b'2';
    MODE.store(if strict { STRICT } else { LENIENT }, Ordering::Relaxed);
    strict
}

/// Map `bytes` (writable, so charged to the commit limit; never touched, so no page is used)
/// and unmap them: whether the kernel would give them now.
fn probe(bytes: usize) -> bool {
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
        assert!(probe(LOADER_MARGIN));
        // More than any address space holds.
        assert!(!probe(usize::MAX / 2));
        // Without limits (the test process has none) nothing is mapped to answer.
        if !can_fail() {
            assert!(available(usize::MAX / 2));
        }
    }
}
