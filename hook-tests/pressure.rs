//! A guest under pressure (issue 40): the host sandboxes itself with seccomp after start-up, or
//! runs with a tight descriptor limit. This program embeds cuhook; each test runs in a child
//! process of its own (a seccomp filter and a resource limit are process-wide and final), and
//! the host's own calls are compared with what they do without cuhook.

mod common;
mod support;

use std::sync::Arc;

use support::*;

/// A program that denies `ioctl` and `membarrier` to itself after cuhook installed and a
/// subscriber registered: a library it loads afterwards is still patched (the maps text stands
/// in for the refused `PROCMAP_QUERY`), its allocations are seen, and unsubscribing does not
/// abort the process. (Before: the runtime stayed unhooked, its tables "unreadable", and the
/// unsubscribe aborted with "membarrier failed after registration".)
#[test]
fn a_host_that_sandboxes_itself_after_start_up() {
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "a_host_that_sandboxes_itself_after_start_up",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let hooks = cuhook::install().unwrap();
    let heard = Arc::new(Heard::default());
    let first = listen(&heard);
    assert!(cuhook_fixtures::deny_syscalls(
        &[libc::SYS_ioctl, libc::SYS_membarrier],
        libc::EPERM
    ));
    // Loaded now: the runtime, and the driver it loads itself.
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    runtime_round_trip(runtime, &heard, 1 << 20);
    drop(first); // a writer barrier: membarrier is denied now
    let again = listen(&heard);
    runtime_round_trip(runtime, &heard, 4096);
    drop(again);
    assert!(!cuhook::events::asymmetric_barriers());
    hooks.uninstall().unwrap();
}

/// Descriptors this process can still open (each opened, counted, closed).
fn free_descriptors() -> usize {
    let mut opened = Vec::new();
    loop {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            break;
        }
        opened.push(fd);
    }
    for &fd in &opened {
        // SAFETY: our own descriptors.
        unsafe { libc::close(fd) };
    }
    opened.len()
}

/// Set the soft descriptor limit so that exactly `free` more descriptors can be opened (new
/// descriptors take the lowest unused numbers below the limit).
fn leave_free(free: usize) {
    // SAFETY: F_GETFD only asks whether a descriptor number is open.
    let is_open = |fd: usize| unsafe { libc::fcntl(fd as i32, libc::F_GETFD) } >= 0;
    let (mut limit, mut unused) = (0usize, 0usize);
    while unused < free || is_open(limit) {
        if !is_open(limit) {
            unused += 1;
        }
        limit += 1;
    }
    let limit = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let limit = libc::rlimit {
            rlim_max: old.rlim_max,
            ..limit
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// Under limits that leave 1, 2, 5 and 61 descriptors (the limits 4, 5, 8 and 64 for a
/// program with three open), the host gets every one of them after cuhook installed and patched
/// a library it loaded: cuhook holds none between its operations. (Before, the kept
/// `/proc/self/maps` descriptor took one: EMFILE one open early.)
#[test]
fn a_tight_descriptor_limit_leaves_the_host_every_descriptor() {
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "a_tight_descriptor_limit_leaves_the_host_every_descriptor",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let heard = Arc::new(Heard::default());
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    for free in [61, 5, 2, 1] {
        leave_free(free);
        let plain = free_descriptors();
        assert_eq!(plain, free, "the limit as set");
        let hooks = cuhook::install().unwrap();
        let sub = listen(&heard);
        runtime_round_trip(runtime, &heard, 4096 * free);
        assert_eq!(
            free_descriptors(),
            plain,
            "cuhook kept a descriptor (limit leaving {free})"
        );
        drop(sub);
        hooks.uninstall().unwrap();
        assert_eq!(free_descriptors(), plain);
    }
}

/// No descriptor free at all (`RLIMIT_NOFILE` = the descriptors already open, 3 for most
/// programs): cuhook cannot read page protections, so it patches nothing new and says so; the
/// host runs as without it (its calls succeed, nothing crashes), and a lookup still answers.
#[test]
fn no_free_descriptor_degrades_to_patching_nothing() {
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "no_free_descriptor_degrades_to_patching_nothing",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    let malloc: CudaMalloc = as_fn(program_dlsym(runtime, "cudaMalloc"));
    let free: CudaFree = as_fn(program_dlsym(runtime, "cudaFree"));
    // The runtime loads the driver at its first call: before the limit, as the host would.
    let mut p = std::ptr::null_mut();
    // SAFETY: as below.
    unsafe {
        assert_eq!(malloc(&mut p, 64), 0);
        assert_eq!(free(p), 0);
    }
    leave_free(0);
    assert_eq!(free_descriptors(), 0);
    let hooks = cuhook::install();
    // Whatever install answered, the host's own calls behave as without cuhook.
    // SAFETY: the fake runtime's calls with a valid out-pointer, freeing our allocation.
    unsafe {
        assert_eq!(malloc(&mut p, 4096), 0);
        let _ = cuhook::lookup(p);
        assert_eq!(free(p), 0);
    }
    let diagnostics = cuhook::hooks::diagnostics().to_string();
    assert!(
        hooks.is_err()
            || diagnostics.contains("unreadable")
            || cuhook::hooks::patched_slots().is_empty(),
        "{diagnostics}"
    );
    drop(hooks);
    assert_eq!(free_descriptors(), 0);
}
