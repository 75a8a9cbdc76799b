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

/// The calling thread's thread pointer: a value of its own for as long as the thread lives,
/// read with one instruction (the registry picks the thread's lane from it: the stack pointer it
/// used before changed with the call's depth, so one thread's allocations and frees could land in
/// different lanes). Miri, which runs no inline assembly, and other architectures ask
/// `pthread_self`, which is the same pointer under glibc.
#[inline(always)]
pub(crate) fn pointer() -> usize {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let tp: usize;
        // SAFETY: the x86-64 TLS ABI keeps the thread control block's own address at %fs:0
        // (glibc and musl alike); one load, nothing written.
        unsafe {
            core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
        }
        tp
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    {
        let tp: usize;
        // SAFETY: TPIDR_EL0 is the thread pointer register (readable at EL0); no memory is used.
        unsafe {
            core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
        }
        tp
    }
    #[cfg(any(miri, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    {
        // SAFETY: no arguments; cannot fail.
        unsafe { libc::pthread_self() as usize }
    }
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
    fn the_thread_pointer_is_the_threads_own_at_any_depth() {
        fn deep(n: usize) -> usize {
            let pad = std::hint::black_box([0u8; 16 << 10]);
            if n == 0 {
                pointer() + usize::from(pad[0])
            } else {
                deep(n - 1)
            }
        }
        let here = pointer();
        // 160 KiB deeper in the stack: still the same thread's value.
        assert_eq!(deep(10), here);
        let other = std::thread::spawn(pointer).join().unwrap();
        assert_ne!(other, here);
        assert_ne!(here, 0);
    }

    #[test]
    fn this_thread_is_alive_and_others_have_their_own_id() {
        assert!(alive(id()));
        assert_ne!(std::thread::spawn(id).join().unwrap(), id());
    }
}
