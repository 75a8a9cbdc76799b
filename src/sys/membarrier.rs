//! A full memory barrier on every running thread of the process, issued by one thread:
//! Linux `membarrier(PRIVATE_EXPEDITED)`, and a fallback for when a sandbox denies it after
//! registration (`events::grace` decides which to use).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier(cmd, flags = 0, cpu_id = 0) takes no pointers.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Whether the kernel has `PRIVATE_EXPEDITED` and this process is now registered for it.
pub(crate) fn register_private_expedited() -> bool {
    let supported = membarrier(MEMBARRIER_CMD_QUERY);
    supported > 0
        && supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
}

/// A full fence on every running thread of the process; false when the kernel refused (then
/// `errno` says why).
pub(crate) fn private_expedited() -> bool {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0
}

/// A full fence on every thread of the process now running, without `membarrier`: a
/// page-protection change, whose TLB shootdown interrupts every CPU running the process on
/// x86-64; on other architectures, where TLB invalidations are broadcast without interrupts,
/// also a wait of a few milliseconds, past which no store of a running thread is still
/// unpublished.
#[cold]
pub(crate) fn process_wide_fence() {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let page = region::page::size();
    let mut at = PAGE.load(Ordering::Acquire);
    if at == 0 {
        // SAFETY: a fresh private anonymous page of ours; never unmapped.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if fresh != libc::MAP_FAILED {
            at = match PAGE.compare_exchange(0, fresh as usize, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => fresh as usize,
                Err(other) => {
                    // SAFETY: our own mapping, never published.
                    unsafe { libc::munmap(fresh, page) };
                    other
                }
            };
        }
    }
    if at != 0 {
        // Dirty the page so that the protection change must shoot its translation down on every
        // CPU that may hold it: on x86-64, an interrupt (a serialising event) on each CPU now
        // running a thread of the process.
        // SAFETY: our own page, writable until the first mprotect below, restored after it.
        unsafe {
            std::ptr::write_volatile(at as *mut u8, 1);
            libc::mprotect(at as *mut libc::c_void, page, libc::PROT_READ);
            libc::mprotect(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
            );
        }
    }
    if !cfg!(target_arch = "x86_64") || at == 0 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
