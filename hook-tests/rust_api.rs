//! The Rust API's install guard in a process of its own, with the fake driver: the registry
//! follows the CUDA hooks' lifetime. `cuhook::install` attaches it; when the last installation
//! of the CUDA set is uninstalled it is detached and emptied, since no hook sees frees any more
//! and anything kept could later be reported live after it was freed. (Before, only the C API's
//! `cuhook_uninstall` did this: a Rust guard's uninstall left every range registered.)

mod common;
mod support;

use support::*;

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The tests install and detach process-wide state: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `name` from the fake driver, looked up after install with this program's own `dlsym`: the
/// program contains cuhook and is patched like any other object, so a hooked name's answer is
/// the hook.
fn sym<T: Copy>(driver: *mut c_void, name: &str) -> T {
    let p = program_dlsym(driver, name);
    if cuhook::hook_table().iter().any(|h| h.symbol == name) {
        assert_ne!(
            p,
            real(driver, name),
            "{name}: this program's dlsym gave no hook"
        );
    }
    as_fn(p)
}

/// `name` as the driver defines it (no hook).
fn real(driver: *mut c_void, name: &str) -> *mut c_void {
    let p = defined(driver, name);
    assert!(!p.is_null(), "{name} missing from the fake driver");
    p
}

/// The fake driver, loaded globally (once per process; later calls return the same handle).
fn load_driver() -> *mut c_void {
    raw_dlsym(); // before any test installs
    open(&common::fixtures_dir().join("libcuda.so.1"))
}

#[test]
fn the_last_uninstall_detaches_and_empties_the_registry() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let driver = load_driver();
    let first = cuhook::install().unwrap();
    let second = cuhook::install().unwrap();
    make_context_current(driver);
    let alloc: CuMemAlloc = sym(driver, "cuMemAlloc_v2");
    // SAFETY: the driver's own cuMemFree_v2, as a program whose slot was restored calls it.
    let free =
        unsafe { std::mem::transmute::<*mut c_void, CuMemFree>(real(driver, "cuMemFree_v2")) };
    let (mut kept, mut freed) = (0u64, 0u64);
    // SAFETY: the fake driver's allocation (through the hook) with valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut kept, 1 << 16), 0);
        assert_eq!(alloc(&mut freed, 1 << 16), 0);
    }
    assert!(
        cuhook::lookup(kept as usize).is_some(),
        "the hooks fill the registry"
    );

    // Still held by `second`: the hooks stay, and so does the registry.
    let report = first.uninstall().unwrap();
    assert!(report.still_referenced);
    assert!(
        cuhook::lookup(kept as usize).is_some(),
        "emptied while still installed"
    );

    let report = second.uninstall().unwrap();
    assert!(!report.still_referenced);
    // The free is no longer seen (the slots are restored: the driver's own function is called);
    // nothing may claim either range is live.
    // SAFETY: the fake driver's free, of our own allocation.
    unsafe { assert_eq!(free(freed), 0) };
    assert!(
        cuhook::lookup(freed as usize).is_none(),
        "a range freed after the uninstall is still reported live"
    );
    assert!(
        cuhook::lookup(kept as usize).is_none(),
        "the registry kept ranges"
    );
    assert_eq!(cuhook::cuda::stats().live, 0);
}

/// Bytes of the last free event a subscriber of the test below saw.
static FREED_BYTES: AtomicUsize = AtomicUsize::new(0);

fn on_free(ev: &cuhook::events::MemEvent) {
    if ev.kind == cuhook::events::EventKind::Free {
        FREED_BYTES.store(ev.range.size, Ordering::SeqCst);
    }
}

/// A free the registry cannot answer for (here: it was detached) is described by the driver
/// (two calls) so that subscribers learn its size: only when someone listens. With nobody,
/// the hook must not ask the driver anything.
#[test]
fn an_unknown_free_asks_the_driver_only_for_a_subscriber() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let driver = load_driver();
    type CallCount = unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_ulong;
    // SAFETY: the fixture's counter of calls by API name.
    let count: CallCount = unsafe { std::mem::transmute(real(driver, "fakecuda_call_count")) };
    let asked = || {
        // SAFETY: NUL-terminated API names.
        unsafe {
            count(c"cuPointerGetAttributes".as_ptr()) + count(c"cuMemGetAddressRange_v2".as_ptr())
        }
    };

    let hooks = cuhook::install().unwrap();
    make_context_current(driver);
    let (alloc, free): (CuMemAlloc, CuMemFree) =
        (sym(driver, "cuMemAlloc_v2"), sym(driver, "cuMemFree_v2"));
    let (mut quiet, mut heard) = (0u64, 0u64);
    // SAFETY: the fake driver's allocation (through the hook) with valid out-pointers.
    unsafe {
        assert_eq!(alloc(&mut quiet, 1 << 16), 0);
        assert_eq!(alloc(&mut heard, 3 << 16), 0);
    }
    cuhook::registry::detach();

    let before = asked();
    // SAFETY: the hooked free of our own allocation.
    unsafe { assert_eq!(free(quiet), 0) };
    assert_eq!(
        asked(),
        before,
        "the driver was asked about a free nobody listens to"
    );

    let sub = cuhook::subscribe(cuhook::events::mask::ALL, 0, on_free).unwrap();
    // SAFETY: as above.
    unsafe { assert_eq!(free(heard), 0) };
    assert!(
        asked() > before,
        "a subscriber's free event was not described by the driver"
    );
    assert_eq!(FREED_BYTES.load(Ordering::SeqCst), 3 << 16);
    drop(sub);
    drop(hooks);
}
