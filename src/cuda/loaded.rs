//! Modules and libraries as they are loaded: the `__managed__` variables their device code
//! defines are registered at once (`fatbin` says why the load is the moment), each asked of the
//! driver by name and announced like a queried global (`emit::global`: registered once, flagged
//! GLOBAL, removed at unload).
//!
//! # Safety
//! Each driver function comes from the driver table (`driver.rs`), which keeps it with its C
//! signature.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use super::abi::CUDA_SUCCESS;
use super::driver::{self, DriverFn, GetGlobal};
use super::emit::{self, Announce, Global};
use super::fatbin::{self, ManagedScan};
use crate::events::HookGuard;
use crate::registry;

/// `ManagedScan` as its discriminant.
static SCAN: AtomicU8 = AtomicU8::new(ManagedScan::All as u8);

/// Which loaded device code is read for managed variables from now on.
pub fn set_managed_scan(scan: ManagedScan) {
    SCAN.store(scan as u8, Ordering::Relaxed);
}

fn managed_scan() -> ManagedScan {
    match SCAN.load(Ordering::Relaxed) {
        s if s == ManagedScan::Stored as u8 => ManagedScan::Stored,
        s if s == ManagedScan::Off as u8 => ManagedScan::Off,
        _ => ManagedScan::All,
    }
}

/// A library (`cuLibraryLoadData`) was loaded from `code` as `library`.
///
/// # Safety
/// `code` is the image argument of the successful call that returned `library`.
#[cold]
pub unsafe fn library_loaded(api: &'static CStr, library: usize, code: *const c_void) {
    // SAFETY: the caller's contract.
    unsafe {
        loaded(
            api,
            library,
            code,
            &driver::LIBRARY_GET_MANAGED,
            Global::LibraryManaged,
        )
    }
}

/// A module (`cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`) was loaded
/// from `image` as `module`. A module's managed variable is found with `cuModuleGetGlobal_v2`.
///
/// # Safety
/// `image` is the image argument of the successful call that returned `module`.
#[cold]
pub unsafe fn module_loaded(api: &'static CStr, module: usize, image: *const c_void) {
    // SAFETY: the caller's contract.
    unsafe {
        loaded(
            api,
            module,
            image,
            &driver::MODULE_GET_GLOBAL,
            Global::ModuleManaged,
        )
    }
}

/// # Safety
/// As [`library_loaded`].
unsafe fn loaded(
    api: &'static CStr,
    owner: usize,
    image: *const c_void,
    query: &DriverFn<GetGlobal>,
    kind: Global,
) {
    let scan = managed_scan();
    if owner == 0 || scan == ManagedScan::Off || !registry::attached_hot() {
        return;
    }
    // SAFETY: the image of a successful load (caller).
    let Some(image) = (unsafe { fatbin::image_at(image.cast()) }) else {
        return;
    };
    let Some(get) = query.get() else {
        return;
    };
    // Loads run at every depth; only the outermost hooked call of the thread dispatches.
    let guard = HookGuard::enter(api);
    let announce = if guard.is_some() {
        Announce::Dispatch
    } else {
        Announce::RegistryOnly
    };
    fatbin::managed_variables(image, scan, &mut |name, _| {
        let (mut address, mut size) = (0u64, 0usize);
        // SAFETY: two output slots of the right sizes, the handle the driver returned, a
        // NUL-terminated name.
        let rc = unsafe { get(&mut address, &mut size, owner as *mut c_void, name.as_ptr()) };
        if rc == CUDA_SUCCESS {
            emit::global(api, address as usize, size, owner, kind, announce);
        }
    });
}
