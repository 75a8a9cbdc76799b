//! Single-threaded behaviour of one list: order, masks, removal, capacity, panics, replay.

use super::*;
use crate::Error;

#[test]
fn priority_order_and_ties() {
    let list = SubscriberList::new();
    let log = new_log();
    for (tag, prio) in [(0, 5), (1, -3), (2, 5), (3, 0), (4, -3)] {
        list.subscribe(mask::ALL, prio, Callback::Rust(record), recorder(tag, log))
            .unwrap();
    }
    list.dispatch(&alloc(0x1000));
    assert_eq!(tags(log), [1, 4, 3, 0, 2]);
}

#[test]
fn mask_filtering() {
    let list = SubscriberList::new();
    let log = new_log();
    list.subscribe(mask::ALLOC, 0, Callback::Rust(record), recorder(1, log))
        .unwrap();
    list.subscribe(mask::FREE, 0, Callback::Rust(record), recorder(2, log))
        .unwrap();
    list.subscribe(mask::ALL, 0, Callback::Rust(record), recorder(3, log))
        .unwrap();
    list.dispatch(&alloc(0x1000));
    assert_eq!(tags(log), [1, 3]);
    log.lock().unwrap().clear();
    list.dispatch(&free(0x1000));
    assert_eq!(tags(log), [2, 3]);
}

#[test]
fn invalid_mask_is_rejected() {
    let list = SubscriberList::new();
    for m in [0, 4, mask::ALL.bits() | 8] {
        let r = list.subscribe(m, 0, Callback::Rust(record), 0);
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{m}: {r:?}"
        );
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri gives one fn several addresses; unsubscribe compares them"
)]
fn unsubscribe_by_mask_callback_and_context() {
    let list = SubscriberList::new();
    let log = new_log();
    let (a, b) = (recorder(1, log), recorder(2, log));
    list.subscribe(mask::ALL, 0, Callback::Rust(record), a)
        .unwrap();
    list.subscribe(mask::ALL, 0, Callback::Rust(record), b)
        .unwrap();

    list.unsubscribe(mask::ALL, Callback::Rust(record), a)
        .unwrap();
    list.dispatch(&alloc(1));
    assert_eq!(tags(log), [2]);
    assert_eq!(
        list.unsubscribe(mask::ALL, Callback::Rust(record), a),
        Err(Error::NoSuchSubscriber)
    );
    // A different callback with b's context is a different subscription.
    assert_eq!(
        list.unsubscribe(mask::ALL, Callback::Rust(record_other), b),
        Err(Error::NoSuchSubscriber)
    );

    // ucm semantics: removing some bits keeps the subscription for the others.
    list.unsubscribe(mask::FREE, Callback::Rust(record), b)
        .unwrap();
    log.lock().unwrap().clear();
    list.dispatch(&free(1));
    list.dispatch(&alloc(2));
    assert_eq!(
        *log.lock().unwrap(),
        [Seen {
            tag: 2,
            kind: EventKind::Alloc,
            address: 2,
            flags: 0
        }]
    );
    assert_eq!(
        list.unsubscribe(mask::FREE, Callback::Rust(record), b),
        Err(Error::NoSuchSubscriber)
    );
    list.unsubscribe(mask::ALLOC, Callback::Rust(record), b)
        .unwrap();
    assert!(list.is_empty());
}

#[test]
fn unsubscribe_by_id() {
    let list = SubscriberList::new();
    let log = new_log();
    let ctx = recorder(7, log);
    let first = list
        .subscribe(mask::ALL, 0, Callback::Rust(record), ctx)
        .unwrap();
    let second = list
        .subscribe(mask::ALL, 1, Callback::Rust(record), ctx)
        .unwrap();
    list.unsubscribe_id(first).unwrap();
    assert_eq!(list.unsubscribe_id(first), Err(Error::NoSuchSubscriber));
    list.dispatch(&alloc(1));
    assert_eq!(tags(log), [7]);
    list.unsubscribe_id(second).unwrap();
    assert!(list.is_empty());
}

#[test]
fn capacity_is_enforced_and_freed_slots_are_reused() {
    let list = SubscriberList::new();
    let mut ids = Vec::new();
    for i in 0..CAPACITY {
        ids.push(
            list.subscribe(mask::ALL, 0, Callback::Rust(record_other), i)
                .unwrap(),
        );
    }
    assert_eq!(
        list.subscribe(mask::ALL, 0, Callback::Rust(record_other), CAPACITY),
        Err(Error::CapacityExceeded {
            what: "event subscribers",
            limit: CAPACITY
        })
    );
    list.unsubscribe_id(ids[10]).unwrap();
    list.subscribe(mask::ALL, 0, Callback::Rust(record_other), CAPACITY)
        .unwrap();
    assert_eq!(list.len(), CAPACITY);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri gives one fn several addresses; unsubscribe compares them"
)]
fn foreign_callback_is_called_and_identified_by_target() {
    fn adapter(target: usize, ev: &MemEvent, context: usize) {
        // A C adapter would cast `target` to the C function type here.
        let r: &Recorder = ctx(context);
        r.log.lock().unwrap().push(Seen {
            tag: target as u32,
            kind: ev.kind,
            address: 0,
            flags: 0,
        });
    }
    let list = SubscriberList::new();
    let log = new_log();
    let c = recorder(0, log);
    let foreign = |target| Callback::Foreign { adapter, target };
    list.subscribe(mask::ALL, 0, foreign(11), c).unwrap();
    list.subscribe(mask::ALL, 0, foreign(12), c).unwrap();
    list.unsubscribe(mask::ALL, foreign(11), c).unwrap();
    list.dispatch(&alloc(1));
    assert_eq!(tags(log), [12]);
}

#[test]
fn panic_in_callback_is_contained() {
    fn boom(_: &MemEvent, _: usize) {
        panic!("subscriber bug (expected by the test)");
    }
    let list = SubscriberList::new();
    let log = new_log();
    list.subscribe(mask::ALL, 0, Callback::Rust(boom), 0)
        .unwrap();
    list.subscribe(mask::ALL, 1, Callback::Rust(record), recorder(2, log))
        .unwrap();
    list.dispatch(&alloc(1));
    list.dispatch(&free(1));
    assert_eq!(tags(log), [2, 2]);
    assert_eq!(list.stats().panics, 2);
    // The guard state survived the unwinding.
    assert_eq!(HookGuard::outermost_api(), None);
}

#[test]
fn replay_delivers_existing_ranges_before_live_events() {
    let list = SubscriberList::new();
    let log = new_log();
    list.subscribe_with_replay(
        mask::ALLOC,
        0,
        Callback::Rust(record),
        recorder(1, log),
        |emit| {
            for a in [0x1000, 0x2000, 0x3000] {
                emit(&alloc(a));
            }
            emit(&free(0x9000)); // not in the mask: not delivered
        },
    )
    .unwrap();
    list.dispatch(&alloc(0x4000));
    let seen: Vec<(usize, u32)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.address, s.flags))
        .collect();
    assert_eq!(
        seen,
        [
            (0x1000, flags::EXISTING),
            (0x2000, flags::EXISTING),
            (0x3000, flags::EXISTING),
            (0x4000, 0)
        ]
    );
}

#[test]
fn replay_reaches_only_the_new_subscriber() {
    let list = SubscriberList::new();
    let log = new_log();
    list.subscribe(mask::ALL, -1000, Callback::Rust(record), recorder(1, log))
        .unwrap();
    list.subscribe_with_replay(
        mask::ALL,
        0,
        Callback::Rust(record),
        recorder(2, log),
        |emit| emit(&alloc(0x1000)),
    )
    .unwrap();
    assert_eq!(tags(log), [2]);
}

struct Remover {
    list: &'static SubscriberList,
    victim: usize,
    kinds: u32,
}

fn remove_victim(_: &MemEvent, context: usize) {
    let r: &Remover = ctx(context);
    r.list
        .unsubscribe(r.kinds, Callback::Rust(record), r.victim)
        .unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri gives one fn several addresses; unsubscribe compares them"
)]
fn unsubscribe_takes_effect_within_the_dispatch_that_made_it() {
    for kinds in [mask::FREE.bits(), mask::ALL.bits()] {
        let list = leak(SubscriberList::new());
        let log = new_log();
        let victim = recorder(2, log);
        let remover = addr(leak(Remover {
            list,
            victim,
            kinds,
        }));
        list.subscribe(mask::FREE, 0, Callback::Rust(remove_victim), remover)
            .unwrap();
        list.subscribe(mask::ALL, 1, Callback::Rust(record), victim)
            .unwrap();
        // The dispatch iterates the snapshot it started with, which still lists the victim for
        // frees; the victim must be skipped all the same.
        list.dispatch(&free(1));
        assert_eq!(tags(log), [] as [u32; 0], "kinds {kinds}");
        list.dispatch(&alloc(2));
        let expect: &[u32] = if kinds == mask::ALL.bits() { &[] } else { &[2] };
        assert_eq!(tags(log), expect, "kinds {kinds}");
    }
}
