//! The Rust API's install guard in a process of its own, with the fake driver: the registry
//! follows the CUDA hooks' lifetime. `cuhook::install` attaches it; when the last installation
//! of the CUDA set is uninstalled it is detached and emptied, since no hook sees frees any more
//! and anything kept could later be reported live after it was freed. (Before, only the C API's
//! `cuhook_uninstall` did this: a Rust guard's uninstall left every range registered.)

mod common;

use std::ffi::{c_void, CString};

type CuInit = unsafe extern "C" fn(u32) -> i32;
type CuDeviceGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
type CuPrimaryRetain = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> i32;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> i32;
type CuMemFree = unsafe extern "C" fn(u64) -> i32;

/// `name` from the fake driver, looked up after install, as the `dlsym` interposer answers a
/// program that resolves the driver at run time: the hook. (This test program contains cuhook,
/// and cuhook never patches its own object, so it asks for the substitution itself.)
fn sym<T: Copy>(driver: *mut c_void, name: &str) -> T {
    let p = cuhook::hooks::substitute(real(driver, name) as usize) as *mut c_void;
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `T` is the function-pointer type of `name`'s C signature.
    unsafe { std::mem::transmute_copy(&p) }
}

/// `name` as the driver defines it (no hook).
fn real(driver: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(driver, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing from the fake driver");
    p
}

#[test]
fn the_last_uninstall_detaches_and_empties_the_registry() {
    let path = common::fixtures_dir().join("libcuda.so.1");
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: loading the fake driver fixture.
    let driver = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!driver.is_null(), "the fake driver did not load");

    let first = cuhook::install().unwrap();
    let second = cuhook::install().unwrap();
    let (init, device_get, retain, set_current, alloc, free): (
        CuInit,
        CuDeviceGet,
        CuPrimaryRetain,
        CuCtxSetCurrent,
        CuMemAlloc,
        CuMemFree,
    ) = (
        sym(driver, "cuInit"),
        sym(driver, "cuDeviceGet"),
        sym(driver, "cuDevicePrimaryCtxRetain"),
        sym(driver, "cuCtxSetCurrent"),
        sym(driver, "cuMemAlloc_v2"),
        // SAFETY: the driver's own cuMemFree_v2, as a program whose slot was restored calls it.
        unsafe { std::mem::transmute::<*mut c_void, CuMemFree>(real(driver, "cuMemFree_v2")) },
    );
    let (mut dev, mut ctx, mut kept, mut freed) = (0, std::ptr::null_mut(), 0u64, 0u64);
    // SAFETY: the fake driver's entry points (through cuhook's hooks) with valid out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(device_get(&mut dev, 0), 0);
        assert_eq!(retain(&mut ctx, dev), 0);
        assert_eq!(set_current(ctx), 0);
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
    assert_eq!(cuhook::registry::stats().live, 0);
}
