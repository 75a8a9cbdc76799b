//! Threads as the kernel knows them: the calling thread's id, whether a thread still exists,
//! whether this thread runs with a shadow stack.
#![allow(unsafe_code)]

/// The calling thread's kernel id (`gettid`).
pub(crate) fn id() -> u64 {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// Whether thread `tid` of this process still exists (`tgkill(pid, tid, 0)` does not answer
/// `ESRCH`). A reused id, or a thread the kernel is still reaping, counts as alive.
pub(crate) fn alive(tid: u64) -> bool {
    // Miri has no `tgkill`; "alive" is the answer that only keeps things longer.
    if cfg!(miri) {
        return true;
    }
    // SAFETY: signal 0 only checks that the thread exists; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether this thread runs with a shadow stack (`ARCH_SHSTK_STATUS`, Linux ≥ 6.6); a kernel
/// without the query has none.
#[cfg(target_arch = "x86_64")]
pub(crate) fn shadow_stack_active() -> bool {
    const ARCH_SHSTK_STATUS: libc::c_int = 0x5005;
    let mut features: u64 = 0;
    // SAFETY: ARCH_SHSTK_STATUS writes one u64 of feature bits; older kernels answer EINVAL.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_SHSTK_STATUS, &mut features) };
    rc == 0 && features & 1 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_is_alive_and_others_have_their_own_id() {
        assert!(alive(id()));
        assert_ne!(std::thread::spawn(id).join().unwrap(), id());
    }
}
