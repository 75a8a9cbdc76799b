//! The classification algorithm against the scripted driver: every kind of memory, contexts,
//! driver set-up outcomes, and pool-support modes.

use std::cell::Cell;

use super::interface::{
    attr, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED,
    DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
};
use super::mock::{primary, Alloc, Call, Kind, Mock};
use super::*;
use crate::events::{flags, MemType};
use crate::registry::Allocation;

const DEV: Alloc = Alloc {
    start: 0x7f10_0000_0000,
    size: 0x10000,
    kind: Kind::Device,
    device: 0,
    ctx: 0xAA00,
    pool: 0,
};
const MANAGED: Alloc = Alloc {
    start: 0x7f20_0000_0000,
    size: 0x4000,
    kind: Kind::Managed,
    device: 0,
    ctx: 0xAA00,
    pool: 0,
};
const POOL: Alloc = Alloc {
    start: 0x7f30_0000_0000,
    size: 0x2000,
    kind: Kind::Pool,
    device: 1,
    ctx: 0xAA01,
    pool: 0x9001,
};
const VMM: Alloc = Alloc {
    start: 0x7f40_0000_0000,
    size: 0x20_0000,
    kind: Kind::Vmm,
    device: 0,
    ctx: 0,
    pool: 0,
};
const PINNED: Alloc = Alloc {
    start: 0x7f50_0000_0000,
    size: 0x1000,
    kind: Kind::PinnedHost,
    device: 0,
    ctx: 0xAA00,
    pool: 0,
};
const CUDA_ERROR_NO_DEVICE: u32 = cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE as u32;
/// Memory the driver does not know: pageable host memory.
const PAGEABLE: usize = 0x5600_0000_1000;
/// A context the application made current.
const APP_CTX: usize = 0x5555;

thread_local! {
    static WARNINGS: Cell<usize> = const { Cell::new(0) };
}

fn count_warning(line: &str) {
    assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    WARNINGS.with(|w| w.set(w.get() + 1));
}

fn warnings() -> usize {
    WARNINGS.with(Cell::get)
}

/// Two devices with the given pool support, every kind of allocation, and a current context.
fn every_kind(pools: &[bool]) -> Classifier<Mock> {
    let m = Mock::new(pools)
        .with(DEV)
        .with(MANAGED)
        .with(POOL)
        .with(VMM)
        .with(PINNED);
    m.set_current(APP_CTX);
    Classifier::new(m, count_warning)
}

fn count(c: &Classifier<Mock>, pred: impl Fn(&Call) -> bool) -> usize {
    c.driver().calls().iter().filter(|x| pred(x)).count()
}

fn batches(c: &Classifier<Mock>) -> Vec<Vec<u32>> {
    c.driver()
        .calls()
        .into_iter()
        .filter_map(|x| match x {
            Call::PointerAttributes(_, a) => Some(a),
            _ => None,
        })
        .collect()
}

/// The classification the scripted driver should produce.
fn driver_answer(
    mem_type: MemType,
    device: i32,
    flags: u32,
    context: usize,
    pool: usize,
) -> Classification {
    Classification {
        mem_type,
        device,
        flags,
        context,
        pool,
        source: Source::Driver,
    }
}

#[test]
fn device_memory_with_a_context() {
    let c = every_kind(&[true, true]);
    assert_eq!(
        c.classify(DEV.start + 100),
        driver_answer(MemType::Cuda, 0, 0, DEV.ctx, 0)
    );
    assert_eq!(
        c.driver().calls(),
        vec![
            Call::Resolve,
            Call::DeviceCount,
            Call::DeviceAttribute(DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
            Call::DeviceAttribute(DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
            Call::PointerAttributes(
                DEV.start + 100,
                vec![
                    attr::MEMORY_TYPE,
                    attr::IS_MANAGED,
                    attr::DEVICE_ORDINAL,
                    attr::CONTEXT,
                    attr::MEMPOOL_HANDLE
                ]
            ),
        ],
        "set-up once, then one batched query and nothing else"
    );
    c.driver().clear_calls();
    c.classify(DEV.start);
    assert_eq!(c.driver().calls().len(), 1, "set-up is not repeated");
}

#[test]
fn managed_memory() {
    let c = every_kind(&[true, true]);
    assert_eq!(
        c.classify(MANAGED.start),
        driver_answer(MemType::CudaManaged, 0, 0, MANAGED.ctx, 0)
    );
    assert!(c.classify(MANAGED.start).is_cuda());
}

#[test]
fn pool_memory_without_a_context() {
    let c = every_kind(&[true, true]);
    let r = c.classify(POOL.start + 8);
    assert_eq!(
        r,
        driver_answer(
            MemType::Cuda,
            1,
            flags::POOL | flags::STREAM_ORDERED,
            0,
            POOL.pool
        )
    );
    assert!(r.is_pool() && !r.is_vmm());
    // The pool handle came with the batch: no VMM probe, no separate pool query.
    assert_eq!(
        count(&c, |x| matches!(x, Call::RetainAllocationHandle(_))),
        0
    );
    assert_eq!(batches(&c).len(), 1);
}

#[test]
fn vmm_memory_without_a_context() {
    let c = every_kind(&[true, true]);
    let r = c.classify(VMM.start + 0x1000);
    assert_eq!(r, driver_answer(MemType::Cuda, 0, flags::VMM, 0, 0));
    assert!(r.is_vmm());
    assert_eq!(
        count(&c, |x| *x
            == Call::RetainAllocationHandle(VMM.start + 0x1000)),
        1
    );
    assert_eq!(count(&c, |x| matches!(x, Call::Release(_))), 1);
    assert_eq!(
        c.driver().open_handles(),
        0,
        "the probe's handle is released"
    );
    // A context was current: it is left alone.
    assert_eq!(count(&c, |x| matches!(x, Call::PrimaryCtxRetain(_))), 0);
    assert_eq!(c.driver().current(), APP_CTX);
}

#[test]
fn host_memory() {
    let c = every_kind(&[true, true]);
    assert_eq!(c.classify(PAGEABLE), Classification::host(Source::Driver));
    assert_eq!(
        c.classify(PINNED.start),
        driver_answer(MemType::Host, 0, flags::PINNED_HOST, PINNED.ctx, 0)
    );
    assert_eq!(
        count(&c, |x| matches!(x, Call::RetainAllocationHandle(_))),
        0
    );
}

#[test]
fn failed_query_means_host() {
    let mut m = Mock::new(&[true]).with(DEV);
    m.query_error = Some(CUDA_ERROR_INVALID_VALUE);
    let c = Classifier::new(m, count_warning);
    assert_eq!(
        c.classify(DEV.start),
        Classification::host(Source::Fallback)
    );
}

#[test]
fn thread_without_context_retains_the_primary_context_once() {
    // A fresh thread: the thread-local reference record starts empty.
    std::thread::spawn(|| {
        let c = every_kind(&[true, true]);
        c.driver().set_current(0);
        let retains = |c: &Classifier<Mock>| count(c, |x| matches!(x, Call::PrimaryCtxRetain(_)));

        c.classify(POOL.start);
        assert_eq!(retains(&c), 1);
        assert!(c
            .driver()
            .calls()
            .contains(&Call::PrimaryCtxRetain(POOL.device)));
        assert_eq!(c.driver().current(), primary(POOL.device));

        // Now current: nothing more to do.
        c.classify(POOL.start);
        assert_eq!(retains(&c), 1);

        // The application clears the current context: the held one is made current again,
        // without a second reference.
        c.driver().set_current(0);
        c.driver().clear_calls();
        c.classify(POOL.start);
        assert_eq!(retains(&c), 0);
        assert!(c
            .driver()
            .calls()
            .contains(&Call::CtxSetCurrent(primary(POOL.device))));
        assert_eq!(c.driver().current(), primary(POOL.device));

        // Context-less memory of another device: still the one reference.
        c.driver().set_current(0);
        assert_eq!(c.classify(VMM.start).flags, flags::VMM);
        assert_eq!(retains(&c), 0);
        assert_eq!(c.driver().current(), primary(POOL.device));

        // Memory with a context never touches the current context.
        c.driver().set_current(0);
        c.driver().clear_calls();
        c.classify(DEV.start);
        assert_eq!(count(&c, |x| matches!(x, Call::CtxGetCurrent)), 0);
        assert_eq!(c.driver().current(), 0);
    })
    .join()
    .unwrap();
}

#[test]
fn zero_devices_bail_out_for_good() {
    for answer in [Ok(0), Err(CUDA_ERROR_NO_DEVICE)] {
        let mut m = Mock::new(&[]).with(DEV);
        m.device_count = answer;
        let c = Classifier::new(m, count_warning);
        for _ in 0..3 {
            assert_eq!(
                c.classify(DEV.start),
                Classification::host(Source::Fallback)
            );
        }
        assert_eq!(c.driver().calls(), vec![Call::Resolve, Call::DeviceCount]);
        assert_eq!(c.pool_mode(), None);
        assert_eq!(c.driver().calls().len(), 2);
    }
}

#[test]
fn missing_driver_is_not_asked_again_until_objects_are_loaded() {
    let mut m = Mock::new(&[true]).with(DEV);
    m.present = false;
    let c = Classifier::new(m, count_warning);
    for _ in 0..3 {
        assert_eq!(
            c.classify(DEV.start),
            Classification::host(Source::Fallback)
        );
    }
    assert_eq!(c.driver().calls(), vec![Call::Resolve]);
    c.driver().bump_generation();
    c.classify(DEV.start);
    c.classify(DEV.start);
    assert_eq!(c.driver().calls(), vec![Call::Resolve, Call::Resolve]);
}

#[test]
fn uninitialised_driver_is_asked_again() {
    let mut m = Mock::new(&[true]).with(DEV);
    m.device_count = Err(CUDA_ERROR_NOT_INITIALIZED);
    let c = Classifier::new(m, count_warning);
    assert_eq!(
        c.classify(DEV.start),
        Classification::host(Source::Fallback)
    );
    assert_eq!(
        c.classify(DEV.start),
        Classification::host(Source::Fallback)
    );
    assert_eq!(
        c.driver().calls(),
        vec![
            Call::Resolve,
            Call::DeviceCount,
            Call::Resolve,
            Call::DeviceCount
        ]
    );
}

#[test]
fn mixed_pool_support_warns_once_and_uses_the_generic_checks() {
    std::thread::spawn(|| {
        let c = every_kind(&[true, false]);
        for _ in 0..3 {
            assert_eq!(c.classify(DEV.start).mem_type, MemType::Cuda);
            assert_eq!(c.classify(VMM.start).flags, flags::VMM);
            let pool = c.classify(POOL.start);
            assert_eq!(pool.flags, flags::POOL | flags::STREAM_ORDERED);
            assert_eq!(pool.pool, POOL.pool);
        }
        assert_eq!(warnings(), 1);
        assert_eq!(c.pool_mode(), Some(PoolMode::Mixed));
        // The batch never carries the pool attribute; it is asked for on its own, only for
        // context-less memory that the VMM probe rejected, after that probe.
        for b in batches(&c).iter().filter(|b| b.len() > 1) {
            assert!(!b.contains(&attr::MEMPOOL_HANDLE), "{b:?}");
        }
        let calls = c.driver().calls();
        let alone = |p: usize| Call::PointerAttributes(p, vec![attr::MEMPOOL_HANDLE]);
        assert_eq!(calls.iter().filter(|x| **x == alone(POOL.start)).count(), 3);
        assert!(!calls.contains(&alone(VMM.start)));
        assert!(!calls.contains(&alone(DEV.start)));
        let probe = calls
            .iter()
            .position(|x| *x == Call::RetainAllocationHandle(POOL.start))
            .unwrap();
        let query = calls.iter().position(|x| *x == alone(POOL.start)).unwrap();
        assert!(probe < query, "VMM probe first, then the pool probe");
    })
    .join()
    .unwrap();
}

#[test]
fn no_pool_support_never_asks_for_the_pool_attribute() {
    std::thread::spawn(|| {
        let c = every_kind(&[false, false]);
        for p in [
            DEV.start,
            MANAGED.start,
            POOL.start,
            VMM.start,
            PINNED.start,
            PAGEABLE,
        ] {
            c.classify(p);
        }
        assert_eq!(c.pool_mode(), Some(PoolMode::None));
        assert_eq!(warnings(), 0);
        assert_eq!(batches(&c).len(), 6);
        for b in batches(&c) {
            assert!(!b.contains(&attr::MEMPOOL_HANDLE), "{b:?}");
        }
        assert_eq!(c.classify(VMM.start).flags, flags::VMM);
    })
    .join()
    .unwrap();
}

#[test]
fn homogeneous_pool_support_does_not_warn() {
    std::thread::spawn(|| {
        let c = every_kind(&[true, true, true]);
        c.classify(POOL.start);
        assert_eq!(c.pool_mode(), Some(PoolMode::All));
        assert_eq!(warnings(), 0);
    })
    .join()
    .unwrap();
}

#[test]
fn registry_answers_first() {
    let start = 0x7ffe_dead_0000usize;
    let mut a = Allocation::new(start, 4096, c"test_registry_first");
    a.mem_type = MemType::Cuda;
    a.device = 3;
    a.flags = flags::STREAM_ORDERED;
    crate::registry::hot().insert(a);
    let r = classify(start + 100);
    crate::registry::hot().remove(start, 4096);
    let Source::Registry(rec) = r.source else {
        panic!("not from the registry: {r:?}")
    };
    assert_eq!(rec.start, start);
    assert_eq!(rec.api, c"test_registry_first");
    assert_eq!(
        (r.mem_type, r.device, r.flags),
        (MemType::Cuda, 3, flags::STREAM_ORDERED)
    );
}

#[test]
fn without_a_driver_everything_is_host() {
    // The unit-test process has no libcuda loaded: the process-wide classifier says host.
    let x = 5u64;
    let r = classify(&x as *const u64 as usize);
    assert_eq!(r.mem_type, MemType::Host);
    assert!(!r.is_cuda());
}
