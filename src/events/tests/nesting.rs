//! Callbacks that allocate (nested dispatch), the depth limit, and the hook guard.

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::AtomicU32;

use super::*;

struct Nester {
    list: &'static SubscriberList,
    calls: AtomicU32,
}

/// A callback that allocates on every event it sees, each allocation dispatching again.
fn allocate_again(ev: &MemEvent, context: usize) {
    let n: &Nester = ctx(context);
    n.calls.fetch_add(1, Ordering::Relaxed);
    n.list.dispatch(&alloc(ev.range.start + 1));
}

#[test]
fn nested_dispatch_from_callback_is_delivered_and_bounded() {
    let list = leak(SubscriberList::new());
    let n = leak(Nester {
        list,
        calls: AtomicU32::new(0),
    });
    list.subscribe(mask::ALLOC, 0, Callback::Rust(allocate_again), addr(n))
        .unwrap();
    list.dispatch(&alloc(0));
    assert_eq!(n.calls.load(Ordering::Relaxed) as usize, MAX_DEPTH);
    assert_eq!(list.stats().dropped_nested, 1);
    // The thread is back at depth 0: a new event gets the full depth again.
    list.dispatch(&alloc(100));
    assert_eq!(n.calls.load(Ordering::Relaxed) as usize, 2 * MAX_DEPTH);
    assert_eq!(list.stats().dropped_nested, 2);
}

thread_local! {
    static OUTER_SEEN_BY_DRIVER: Cell<Option<&'static CStr>> = const { Cell::new(None) };
}

/// Stand-in for the `cuMemAllocAsync` hook.
fn hooked_cu_mem_alloc_async(list: &SubscriberList, address: usize) {
    let Some(_guard) = HookGuard::enter(c"cuMemAllocAsync") else {
        // Nested in another hook: the real driver call only, no event.
        OUTER_SEEN_BY_DRIVER.set(HookGuard::outermost_api());
        return;
    };
    list.dispatch(&MemEvent::alloc(Allocation::new(
        address,
        1,
        c"cuMemAllocAsync",
    )));
}

/// Stand-in for the `cudaMallocAsync` hook, whose original reaches the driver through the
/// `cuMemAllocAsync` hook (as the real runtime does via cuGetProcAddress).
fn hooked_cuda_malloc_async(list: &SubscriberList, address: usize) {
    let Some(_guard) = HookGuard::enter(c"cudaMallocAsync") else {
        return hooked_cu_mem_alloc_async(list, address);
    };
    hooked_cu_mem_alloc_async(list, address); // the original runtime function
    list.dispatch(&MemEvent::alloc(Allocation::new(
        address,
        1,
        c"cudaMallocAsync",
    )));
}

struct Allocator {
    list: &'static SubscriberList,
    seen: Mutex<Vec<(&'static CStr, usize)>>,
}

/// Records each event; on the first one it allocates CUDA memory itself.
fn record_and_allocate_once(ev: &MemEvent, context: usize) {
    let a: &Allocator = ctx(context);
    let first = {
        let mut seen = a.seen.lock().unwrap();
        seen.push((ev.api, ev.range.start));
        seen.len() == 1
    };
    if first {
        hooked_cuda_malloc_async(a.list, 0x2000);
    }
}

#[test]
fn guard_silences_nested_hooks_but_not_callback_allocations() {
    let list = leak(SubscriberList::new());
    let a = leak(Allocator {
        list,
        seen: Mutex::new(Vec::new()),
    });
    list.subscribe(
        mask::ALL,
        0,
        Callback::Rust(record_and_allocate_once),
        addr(a),
    )
    .unwrap();

    hooked_cuda_malloc_async(list, 0x1000);

    // One event per application call (the nested driver hook stays silent), and the callback's
    // own allocation is dispatched as an outermost call of its own.
    assert_eq!(
        *a.seen.lock().unwrap(),
        [(c"cudaMallocAsync", 0x1000), (c"cudaMallocAsync", 0x2000)]
    );
    assert_eq!(OUTER_SEEN_BY_DRIVER.get(), Some(c"cudaMallocAsync"));
    assert_eq!(HookGuard::outermost_api(), None);
    assert_eq!(list.stats(), DispatchStats::default());
}
