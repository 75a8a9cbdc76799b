//! `fork()` while another thread writes the process-wide registry (what every hooked allocation
//! and free does): the child must be able to write it too (issue 12, item 5: it used to inherit
//! the writer lock held by a thread that does not exist in the child, and hang).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use crate::registry::{hot, Allocation};

#[test]
#[cfg_attr(miri, ignore = "fork() is a foreign call Miri does not run")]
fn registry_fork_while_another_thread_writes() {
    super::super::global::protect_fork();
    const BASE: usize = 0x5a00_0000_0000;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0usize;
            while !stop.load(Relaxed) {
                let start = BASE + (i % 1024) * 4096;
                hot().insert(Allocation::new(start, 4096, c"cuMemAllocAsync"));
                hot().remove_allocation(start);
                i += 1;
            }
        });
        for round in 0..100 {
            // SAFETY: the child only touches the registry (allocation-free on this path once its
            // slabs exist, and malloc is fork-safe in glibc) and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let start = BASE + (1 << 30);
                hot().insert(Allocation::new(start, 4096, c"child"));
                let ok = hot().remove_allocation(start).is_some();
                // SAFETY: leave the child without running the parent's atexit handlers.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let status = cuhook_fixtures::wait_for(pid, Some(Duration::from_secs(5)));
            if status.is_none() {
                stop.store(true, Relaxed);
            }
            let status = status.unwrap_or_else(|| panic!("child {round} hung"));
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child {round} failed: status {status:#x}"
            );
        }
        stop.store(true, Relaxed);
    });
}

/// The fork handlers' protocol on a registry of the test's own: the parent holds it exclusively
/// (lanes drained), then another thread takes a lane for a moment, to find the gate closed and
/// leave again; the fork lands in between. The child's copy has that lane taken by no thread,
/// and its first exclusive edit waited for it forever (found by `.ci/run` under qemu: "child
/// 58 hung"), until the child's handler freed every lane.
#[test]
#[cfg_attr(miri, ignore = "fork() is a foreign call Miri does not run")]
fn registry_fork_with_a_lane_taken_in_the_parent() {
    let reg = crate::registry::Registry::new();
    reg.insert(Allocation::new(0x7100_0000_0000, 4096, c"before"));
    reg.hold_for_fork();
    let late = &reg.lanes.each()[3];
    assert!(late.take(), "a lane is free while the registry is held");
    // SAFETY: the child only touches the registry (allocation-free on this path: its slabs
    // exist) and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: the child's copy of the registry the parent held just before the fork.
        unsafe { reg.release_in_child() };
        // An exclusive edit (a range over a live one), then shared ones.
        let start = 0x7100_0000_0000;
        reg.insert(Allocation::new(start, 8192, c"child"));
        let ok = reg.remove_allocation(start).is_some();
        // SAFETY: leave the child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    late.leave();
    // SAFETY: taken by `hold_for_fork` above, on this thread.
    unsafe { reg.release_after_fork() };
    let status =
        cuhook_fixtures::wait_for(pid, Some(Duration::from_secs(5))).expect("the child hung");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
}
