//! The unsubscribe guarantee under concurrent dispatch, and unsubscribing from inside callbacks.
//! Iteration counts are fixed; nothing asserts on time (only the deadlock watchdog uses it).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Barrier;
use std::thread;

use super::*;
use crate::Error;

const MAGIC: u64 = 0x0c0f_fee0_c0ff_ee00;
const DEAD: u64 = 0xdead_dead_dead_dead;

/// A heap context that is poisoned and freed as soon as unsubscribe returns.
struct Canary {
    magic: AtomicU64,
    hits: AtomicU64,
}

static CANARY_VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// Checks the canary twice, around a short delay that widens the race window.
fn check_canary(_: &MemEvent, context: usize) {
    let c: &Canary = ctx(context);
    for _ in 0..2 {
        if c.magic.load(Ordering::Relaxed) != MAGIC {
            CANARY_VIOLATIONS.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
    c.hits.fetch_add(1, Ordering::Relaxed);
}

/// Round-by-round handshake between the writer and one dispatcher per round.
struct Rounds {
    /// The round whose canary is subscribed; dispatchers put it in the event's address.
    current: AtomicU64,
    /// The round in which a dispatcher is parked in [`hold_old_snapshot`].
    holder: AtomicU64,
    /// The last round whose canary has been unsubscribed and freed.
    freed: AtomicU64,
}

/// Runs before the canary. In each round, one dispatcher whose event was created after the
/// canary was subscribed (so its snapshot lists the canary) parks here until the canary has been
/// unsubscribed and freed, then goes on to the canary's entry in that old snapshot: exactly the
/// late call that the live re-check must prevent.
fn hold_old_snapshot(ev: &MemEvent, context: usize) {
    let r: &Rounds = ctx(context);
    let round = ev.range.start as u64;
    if round == 0
        || r.holder
            .compare_exchange(round - 1, round, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    while r.freed.load(Ordering::Acquire) < round {
        thread::yield_now();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "unsubscribes by fn address (not unique under Miri); loom models it"
)]
fn unsubscribe_guarantee_under_threads() {
    guarantee_rounds(2000);
}

/// The guarantee still holds, and nothing aborts, when a sandbox denies `membarrier` after it
/// was registered (a seccomp filter installed once the program started): the writer barriers
/// fall back, readers fence fully. (Before, the next unsubscribe aborted the process: "membarrier
/// failed after registration".) In a child of its own: the filter is process-wide and final.
#[test]
#[cfg(not(miri))]
fn a_denied_membarrier_degrades_instead_of_aborting() {
    if cuhook_fixtures::skip_when_cross("qemu-user filters its own host system calls") {
        return;
    }
    assert!(cuhook_fixtures::forked(120, || {
        if !crate::events::asymmetric_barriers() {
            return true; // no membarrier here: nothing to deny
        }
        assert!(cuhook_fixtures::deny_syscalls(
            &[libc::SYS_membarrier],
            libc::EPERM
        ));
        guarantee_rounds(300);
        !crate::events::asymmetric_barriers()
    }));
}

/// Rounds of subscribe, dispatch on other threads, unsubscribe and free: no callback may run
/// on a freed context.
fn guarantee_rounds(rounds_wanted: u64) {
    let rounds_total = rounds_wanted;
    const DISPATCHERS: usize = 3;
    let list = SubscriberList::new();
    let stop = AtomicBool::new(false);
    let rounds = leak(Rounds {
        current: AtomicU64::new(0),
        holder: AtomicU64::new(0),
        freed: AtomicU64::new(0),
    });
    let mut total_hits = 0;
    let mut fillers = Vec::with_capacity(rounds_total as usize);
    list.subscribe(
        mask::ALL,
        -10,
        Callback::Rust(hold_old_snapshot),
        addr(rounds),
    )
    .unwrap();
    thread::scope(|s| {
        for _ in 0..DISPATCHERS {
            s.spawn(|| {
                let mut i = 0usize;
                while !stop.load(Ordering::Acquire) {
                    let round = rounds.current.load(Ordering::Acquire) as usize;
                    list.dispatch(&if i.is_multiple_of(2) {
                        alloc(round)
                    } else {
                        free(round)
                    });
                    i += 1;
                }
            });
        }
        for round in 1..=rounds_total {
            let raw = Box::into_raw(Box::new(Canary {
                magic: AtomicU64::new(MAGIC),
                hits: AtomicU64::new(0),
            }));
            let context = raw as usize;
            let priority = round as i32 % 3;
            let id = list.subscribe(mask::ALL, priority, Callback::Rust(check_canary), context);
            let id = id.unwrap();
            rounds.current.store(round, Ordering::Release);
            // Wait (for progress, not time) until a dispatcher holds a snapshot listing it.
            while rounds.holder.load(Ordering::Acquire) < round {
                thread::yield_now();
            }
            let cb = Callback::Rust(check_canary);
            match round % 3 {
                0 => list.unsubscribe(mask::ALL, cb, context).unwrap(),
                1 => list.unsubscribe_id(id).unwrap(),
                _ => {
                    // One kind at a time: the subscription lives on for the other in between.
                    list.unsubscribe(mask::FREE, cb, context).unwrap();
                    list.unsubscribe(mask::ALLOC, cb, context).unwrap();
                }
            }
            total_hits += ctx::<Canary>(context).hits.load(Ordering::Relaxed);
            ctx::<Canary>(context).magic.store(DEAD, Ordering::Relaxed);
            // SAFETY: from Box::into_raw above; unsubscribe returned, so no callback uses it.
            drop(unsafe { Box::from_raw(raw) });
            // Occupy the freed block with a poisoned canary (malloc hands it out again at once);
            // otherwise the next round's canary would sit at the same address and hide a late
            // call behind its intact magic.
            fillers.push(Box::new(Canary {
                magic: AtomicU64::new(DEAD),
                hits: AtomicU64::new(0),
            }));
            rounds.freed.store(round, Ordering::Release);
        }
        stop.store(true, Ordering::Release);
    });
    assert_eq!(
        CANARY_VIOLATIONS.load(Ordering::Relaxed),
        0,
        "a callback ran after unsubscribe"
    );
    assert!(
        total_hits > 0,
        "the callback under test never ran; the test proved nothing"
    );
    assert_eq!(list.stats().panics, 0);
}

struct SelfRemover {
    list: &'static SubscriberList,
    removed: AtomicU32,
    errors: AtomicU32,
}

/// Unsubscribes itself; a second thread racing to do the same finds it gone.
fn remove_self(_: &MemEvent, context: usize) {
    let r: &SelfRemover = ctx(context);
    match r
        .list
        .unsubscribe(mask::ALL, Callback::Rust(remove_self), context)
    {
        Ok(()) => r.removed.fetch_add(1, Ordering::Relaxed),
        Err(Error::NoSuchSubscriber) => 0,
        Err(_) => r.errors.fetch_add(1, Ordering::Relaxed),
    };
}

#[test]
#[cfg_attr(
    miri,
    ignore = "unsubscribes by fn address (not unique under Miri); loom models it"
)]
fn unsubscribe_from_own_callback_does_not_deadlock() {
    let _watchdog = Watchdog::start("unsubscribe_from_own_callback_does_not_deadlock");
    let list = leak(SubscriberList::new());
    for _ in 0..100 {
        let r = leak(SelfRemover {
            list,
            removed: AtomicU32::new(0),
            errors: AtomicU32::new(0),
        });
        list.subscribe(mask::ALL, 0, Callback::Rust(remove_self), addr(r))
            .unwrap();
        // Two threads dispatch until it is gone; both may be inside the callback at once.
        thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !list.is_empty() {
                        list.dispatch(&alloc(1));
                    }
                });
            }
        });
        assert_eq!(r.removed.load(Ordering::Relaxed), 1);
        assert_eq!(r.errors.load(Ordering::Relaxed), 0);
    }
}

thread_local! {
    static ROLE: Cell<u32> = const { Cell::new(0) };
}

struct Meeting {
    list: &'static SubscriberList,
    barrier: &'static Barrier,
    role: u32,
    removed: AtomicU32,
}

/// On the thread of its role: wait until the other thread is inside *its* callback too, then
/// unsubscribe itself. Waiting for whole dispatches (rather than per callback) would deadlock.
fn meet_then_remove_self(_: &MemEvent, context: usize) {
    let m: &Meeting = ctx(context);
    if ROLE.get() != m.role {
        return;
    }
    m.barrier.wait();
    m.list
        .unsubscribe(mask::ALL, Callback::Rust(meet_then_remove_self), context)
        .unwrap();
    m.removed.fetch_add(1, Ordering::Relaxed);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "unsubscribes by fn address (not unique under Miri); loom models it"
)]
fn two_threads_unsubscribe_themselves_from_inside_at_once() {
    let _watchdog = Watchdog::start("two_threads_unsubscribe_themselves_from_inside_at_once");
    let list = leak(SubscriberList::new());
    let barrier = leak(Barrier::new(2));
    let meetings: Vec<&'static Meeting> = (1..=2)
        .map(|role| {
            leak(Meeting {
                list,
                barrier,
                role,
                removed: AtomicU32::new(0),
            })
        })
        .collect();
    for (i, m) in meetings.iter().enumerate() {
        let cb = Callback::Rust(meet_then_remove_self);
        list.subscribe(mask::ALL, i as i32, cb, addr(*m)).unwrap();
    }
    thread::scope(|s| {
        for role in 1..=2 {
            s.spawn(move || {
                ROLE.set(role);
                list.dispatch(&alloc(role as usize));
            });
        }
    });
    assert!(meetings
        .iter()
        .all(|m| m.removed.load(Ordering::Relaxed) == 1));
    assert!(list.is_empty());
}

struct HalfRemover {
    list: &'static SubscriberList,
    barrier: &'static Barrier,
}

/// Inside its call for one kind, waits for the other thread to be inside its call for the other
/// kind, then unsubscribes the kind it is running.
fn meet_then_remove_own_kind(ev: &MemEvent, context: usize) {
    let h: &HalfRemover = ctx(context);
    h.barrier.wait();
    let cb = Callback::Rust(meet_then_remove_own_kind);
    h.list.unsubscribe(ev.kind.mask(), cb, context).unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "unsubscribes by fn address (not unique under Miri); loom models it"
)]
fn two_threads_unsubscribe_different_kinds_of_one_callback_from_inside_it() {
    let _watchdog = Watchdog::start("two_threads_unsubscribe_different_kinds_of_one_callback");
    let list = leak(SubscriberList::new());
    let h = leak(HalfRemover {
        list,
        barrier: leak(Barrier::new(2)),
    });
    let cb = Callback::Rust(meet_then_remove_own_kind);
    list.subscribe(mask::ALL, 0, cb, addr(h)).unwrap();
    // Each waits only for calls of the kind it removes, so neither waits for the other.
    thread::scope(|s| {
        s.spawn(|| list.dispatch(&alloc(1)));
        s.spawn(|| list.dispatch(&free(1)));
    });
    assert!(list.is_empty());
}

fn count_call(_: &MemEvent, context: usize) {
    ctx::<AtomicU64>(context).fetch_add(1, Ordering::Relaxed);
}

#[test]
#[cfg_attr(miri, ignore = "hundreds of threads and tgkill: not for Miri")]
fn threads_beyond_the_slots_borrow_and_dead_slots_are_reclaimed() {
    use crate::events::announcements::{current_announcement, ANNOUNCEMENT_COUNT};
    let _watchdog = Watchdog::start("threads_beyond_the_slots_borrow_and_dead_slots_are_reclaimed");
    let list = leak(SubscriberList::new());
    let calls = leak(AtomicU64::new(0));
    list.subscribe(mask::ALL, 0, Callback::Rust(count_call), addr(calls))
        .unwrap();
    // More live threads than slots: the last ones to dispatch must borrow a spare per dispatch.
    let n = ANNOUNCEMENT_COUNT + 8;
    let all_in = leak(Barrier::new(n));
    let borrowers: u32 = (0..n)
        .map(|_| {
            thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    list.dispatch(&alloc(1));
                    all_in.wait();
                    list.dispatch(&free(1));
                    // Outside dispatch, only an owner still has a slot.
                    u32::from(current_announcement().is_none())
                })
                .unwrap()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum();
    assert!(borrowers >= 8, "{borrowers} threads borrowed");
    assert_eq!(calls.load(Ordering::Relaxed), 2 * n as u64);
    // Those threads are gone: a new thread claims a slot of its own again, once the kernel has
    // finished reaping one of them (progress, not time: it ends after a few tries).
    let mut tries = 0;
    while thread::spawn(move || {
        list.dispatch(&alloc(2));
        current_announcement().is_none()
    })
    .join()
    .unwrap()
    {
        tries += 1;
        assert!(tries < 10_000, "no slot was ever reclaimed");
    }
}

struct Parker {
    entered: AtomicBool,
    release: AtomicBool,
}

fn park(_: &MemEvent, context: usize) {
    let p: &Parker = ctx(context);
    p.entered.store(true, Ordering::Release);
    while !p.release.load(Ordering::Acquire) {
        thread::yield_now();
    }
}

#[test]
#[cfg_attr(miri, ignore = "fork() is a foreign call Miri does not run")]
fn fork_child_keeps_its_slot_and_does_not_wait_for_threads_of_the_parent() {
    use crate::events::announcements::{current_announcement, reclaim_if_dead};
    let list = leak(SubscriberList::new());
    let parker = leak(Parker {
        entered: AtomicBool::new(false),
        release: AtomicBool::new(false),
    });
    list.subscribe(mask::ALL, 0, Callback::Rust(park), addr(parker))
        .unwrap();
    // A thread of the parent sits inside the callback while the process forks; in the child
    // that thread does not exist, so unsubscribe must not wait for it.
    let parked = thread::spawn(move || list.dispatch(&alloc(1)));
    while !parker.entered.load(Ordering::Acquire) {
        thread::yield_now();
    }
    // The forking thread owns a slot too.
    let other = leak(SubscriberList::new());
    other
        .subscribe(mask::ALL, 0, Callback::Rust(record_other), 0)
        .unwrap();
    other.dispatch(&alloc(1));
    // SAFETY: the child calls only unsubscribe (its mutex is not held by the parked thread;
    // glibc's malloc is fork-safe) and leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system call; SIGALRM's default action ends a hung child.
        unsafe { libc::alarm(20) };
        // In the child this thread has a new id; its slot must not look like a dead thread's.
        let code = match current_announcement() {
            None => 2,
            Some(mine) if reclaim_if_dead(mine) => 3,
            Some(_) => match list.unsubscribe(mask::ALL, Callback::Rust(park), addr(parker)) {
                Ok(()) => 0,
                Err(_) => 1,
            },
        };
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    parker.release.store(true, Ordering::Release);
    parked.join().unwrap();
    let status = cuhook_fixtures::wait_for(pid, Some(std::time::Duration::from_secs(30)))
        .expect("the child hung (killed)");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 3: its own slot was taken for a dead thread's; SIGALRM: hung)"
    );
}

/// A thread that borrowed a spare slot and died inside a callback leaves its announcement set
/// for ever. `unsubscribe` of that callback must not wait for it: the spare records its
/// borrower, whom the liveness check finds dead (before, a lent spare was never reclaimed and
/// this waited for ever). The dead borrower is staged: a spare marked lent to an exited thread,
/// announcing a call of the subscription.
#[test]
#[cfg_attr(miri, ignore = "needs tgkill, which Miri does not have")]
fn unsubscribe_does_not_wait_for_a_borrower_that_died_in_a_callback() {
    use crate::events::announce::LENT;
    use crate::events::announcements::{ANNOUNCEMENTS, ANNOUNCEMENT_COUNT};
    let list = leak(SubscriberList::new());
    let id = list
        .subscribe(mask::ALL, 0, Callback::Rust(record_other), 0)
        .unwrap();
    // SAFETY: gettid takes no arguments.
    let dead = thread::spawn(|| unsafe { libc::syscall(libc::SYS_gettid) } as u64)
        .join()
        .unwrap();
    let spare = ANNOUNCEMENTS[ANNOUNCEMENT_COUNT - 16..]
        .iter()
        .find(|s| {
            s.owner
                .compare_exchange(0, LENT | dead, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
        .expect("a free spare slot");
    spare.active[0].store(
        id.0.get() << 8 | u64::from(mask::ALL.bits()),
        Ordering::Release,
    );
    let unsubscribe = thread::spawn(move || list.unsubscribe_id(id));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !unsubscribe.is_finished() && std::time::Instant::now() < deadline {
        thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        unsubscribe.is_finished(),
        "unsubscribe still waits for the dead borrower after 30 s"
    );
    unsubscribe.join().unwrap().unwrap();
    assert_eq!(
        spare.owner.load(Ordering::Acquire),
        0,
        "the spare was not reclaimed"
    );
}
