//! Protections from the kernel query against the maps text, and the span descriptor's life.
//! The tests map pages and handle descriptors themselves to have something to ask about, hence
//! unsafe code.
#![allow(unsafe_code)]

use super::*;

use std::sync::atomic::AtomicU64;

/// Some tests change process-wide state (in children of their own); one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pages of every kind this process has: code (r-x), read-only data, RELRO (r--),
/// writable data (rw-), and fresh anonymous pages whose protection we set ourselves.
#[test]
fn kernel_query_agrees_with_the_maps_text() {
    let _serial = serial();
    static DATA: AtomicU64 = AtomicU64::new(1);
    // Fenced, so that qemu-user's maps text cannot leave them out (see `FencedPages`).
    let pages = cuhook_fixtures::FencedPages::new(3);
    let (anon, page) = (pages.start(), pages.page());
    pages.protect(1, 1, libc::PROT_READ);
    let probes = [
        kernel_query_agrees_with_the_maps_text as *const () as usize,
        "a string literal".as_ptr() as usize,
        &DATA as *const AtomicU64 as usize,
        anon,
        anon + page + 8,
        anon + 2 * page + 16,
    ];
    let lazy = ProtectionMap::for_addresses(probes.iter().copied()).unwrap();
    if !lazy.uses_kernel_query() {
        eprintln!(
            "PROCMAP_QUERY unavailable (kernel {}): only the text path was checked",
            release()
        );
    }
    for &a in &probes {
        let text = ProtectionMap::read_text(a, a + 8).unwrap().at(a).unwrap();
        assert_eq!(lazy.at(a).unwrap(), text, "address {a:#x}");
    }
    assert_eq!(lazy.at(anon + page).unwrap(), Protection::READ);
    assert_eq!(lazy.at(anon).unwrap(), Protection::READ_WRITE);
    drop(pages);
    // Unmapped now: the kernel query must say so rather than answer from anything stale.
    let fresh = ProtectionMap::for_addresses(std::iter::once(anon)).unwrap();
    assert!(fresh.at(anon + page).is_err());
}

/// Where `PROCMAP_QUERY` exists (Linux ≥ 6.11), it is what the engine uses.
#[test]
fn kernel_query_used_where_the_kernel_has_it() {
    let _serial = serial();
    let (major, minor) = kernel_version();
    let map = ProtectionMap::for_addresses(std::iter::once(0x1000)).unwrap();
    // qemu-user reports the host's kernel but does not pass the ioctl through.
    if cuhook_fixtures::skip_when_cross("qemu-user has no PROCMAP_QUERY") {
        return;
    }
    if (major, minor) >= (6, 11) && std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_none() {
        assert!(map.uses_kernel_query(), "kernel {}", release());
    }
}

/// Descriptors of this process now.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// No descriptor of ours outlives an engine operation (a span) or a query outside one:
/// a host that uses every descriptor its limit leaves must find them all free. (Before, the
/// descriptor was kept open for good.) In a child: other tests open files meanwhile.
#[test]
fn no_descriptor_is_held_between_operations() {
    let _serial = serial();
    in_child(
        || {
            let probe = open_descriptors as *const () as usize;
            let before = open_descriptors();
            let outside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
            assert_eq!(outside.at(probe).unwrap(), Protection::READ_EXECUTE);
            drop(outside);
            assert_eq!(
                open_descriptors(),
                before,
                "kept after a query outside a span"
            );
            let span = CheckedSpan::begin();
            let inside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
            assert_eq!(inside.at(probe).unwrap(), Protection::READ_EXECUTE);
            let again = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
            assert_eq!(again.at(probe).unwrap(), Protection::READ_EXECUTE);
            assert!(open_descriptors() <= before + 1, "one per span at most");
            drop((inside, again, span));
            assert_eq!(open_descriptors(), before, "kept after the span");
        },
        "a descriptor was kept",
    );
}

/// The program closing the span's descriptor and reusing its number: queries fail (the
/// object counts as unreadable), never answer from its file, and the span's end leaves the
/// program's file open.
#[test]
fn a_replaced_span_descriptor_never_answers_and_is_not_closed() {
    let _serial = serial();
    in_child(descriptor_swap_check, "the descriptor checks failed");
}

/// A query the kernel refuses (a seccomp filter denying `ioctl` after start-up) is answered
/// from the text, and so is every later one; reads of an object fall back to its declared
/// segments. (Before, the object was "unreadable" and a plugin loaded later stayed unhooked.)
#[test]
fn a_refused_kernel_query_falls_back_to_the_text() {
    let _serial = serial();
    if cuhook_fixtures::skip_when_cross("qemu-user filters its own host system calls") {
        return;
    }
    in_child(
        || {
            let probe = open_descriptors as *const () as usize;
            let span = CheckedSpan::begin();
            let map = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
            if !map.uses_kernel_query() {
                return; // nothing to refuse here
            }
            assert!(cuhook_fixtures::deny_syscalls(
                &[libc::SYS_ioctl],
                libc::EPERM
            ));
            assert_eq!(map.at(probe).unwrap(), Protection::READ_EXECUTE);
            assert!(kernel_query_refused());
            let page = read_only_page();
            assert_eq!(map.at(page).unwrap(), Protection::READ);
            drop(span);
            let later = ProtectionMap::for_addresses(std::iter::once(page)).unwrap();
            assert!(!later.uses_kernel_query());
            assert_eq!(later.at(page).unwrap(), Protection::READ);
        },
        "a refused query was not answered from the text",
    );
}

/// A thread that forks inside a checked span (a subscriber called during an engine
/// operation may) must not go on asking its parent's map in the child: the engine's
/// child fork handler calls [`CheckedSpan::recheck_after_fork`].
#[test]
fn a_child_forked_inside_a_span_asks_its_own_map() {
    let _serial = serial();
    in_child(fork_inside_span_check, "the child asked its parent's map");
}

fn fork_inside_span_check() {
    let probe = fork_inside_span_check as *const () as usize;
    let span = CheckedSpan::begin();
    let Ok(map) = ProtectionMap::for_addresses(std::iter::once(probe)) else {
        return;
    };
    if !map.uses_kernel_query() {
        return; // no kept descriptor to go stale
    }
    assert_eq!(map.at(probe).unwrap(), Protection::READ_EXECUTE);
    in_child(
        || {
            let page = read_only_page();
            // Still checked: the parent's map, which has no such page.
            assert!(
                protection_of(page).is_none(),
                "answered from the parent's map"
            );
            CheckedSpan::recheck_after_fork();
            assert_eq!(protection_of(page), Some(Protection::READ));
        },
        "the child asked its parent's map",
    );
    drop(span);
}

/// A fresh read-only page of this process, fenced (never unmapped: the tests using it end their
/// process soon).
fn read_only_page() -> usize {
    let page = cuhook_fixtures::FencedPages::new(1);
    page.protect(0, 1, libc::PROT_READ);
    page.leak()
}

/// The protection a fresh map finds at `addr`.
fn protection_of(addr: usize) -> Option<Protection> {
    ProtectionMap::for_addresses(std::iter::once(addr))
        .and_then(|m| m.at(addr))
        .ok()
}

/// Run `check` in a forked child; fail with `what` unless it passes there.
fn in_child(check: fn(), what: &str) {
    assert!(
        cuhook_fixtures::forked(60, || {
            check();
            true
        }),
        "{what} (its panic is printed above)"
    );
}

fn descriptor_swap_check() {
    let probe = descriptor_swap_check as *const () as usize;
    let span = CheckedSpan::begin();
    let inside = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
    if !inside.uses_kernel_query() {
        return;
    }
    assert_eq!(inside.at(probe).unwrap(), Protection::READ_EXECUTE);
    let fd = maps::span_descriptor().unwrap_or(-1);
    assert!(fd >= 0);
    // SAFETY: the span's descriptor, replaced by /dev/null under the same number (what a
    // program that closes descriptors it does not own would do).
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        assert!(null >= 0);
        assert_eq!(libc::dup2(null, fd), fd);
        libc::close(null);
    }
    let swapped = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
    assert!(swapped.at(probe).is_err(), "a query on /dev/null answered");
    assert!(!kernel_query_refused(), "a foreign file is no refusal");
    drop((inside, swapped, span));
    // SAFETY: F_GETFD only asks whether the descriptor is open.
    let still_open = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    assert!(still_open, "closed the program's file");
    // SAFETY: the /dev/null descriptor is ours to close (it stood in for the program's).
    unsafe { libc::close(fd) };
    let after = ProtectionMap::for_addresses(std::iter::once(probe)).unwrap();
    assert_eq!(after.at(probe).unwrap(), Protection::READ_EXECUTE);
}

fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
}

fn kernel_version() -> (u32, u32) {
    let r = release();
    let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
    let major = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    (major, minor)
}
