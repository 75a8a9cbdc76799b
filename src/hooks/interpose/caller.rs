//! What glibc would have done for the *caller*: its library search path for bare `dlopen`
//! names (RPATH/RUNPATH with `$ORIGIN`), and the objects after it for `RTLD_NEXT`.
//!
//! The loader calls live in `crate::sys::dl`; a link map found for an address is its object's
//! handle (glibc's handles are link maps).
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};

use super::super::loader::Pin;
use crate::elf;
use crate::sys::dl;

/// The object (its link map, as a number) whose loaded segments contain `address`, as glibc
/// attributes addresses to objects. (Only the x86_64 entry "as the caller" needs it.)
#[cfg(target_arch = "x86_64")]
pub fn object_of(address: usize) -> Option<usize> {
    dl::link_map_containing(address).map(|m| m as usize)
}

/// Directories to try, in order, before handing a bare name to the real `dlopen` from our own
/// object: the caller's list up to its last directory that our own list lacks (the caller's
/// RPATH/RUNPATH entries, and whatever precedes them, such as LD_LIBRARY_PATH). Empty when the
/// caller searches exactly like us.
pub fn caller_only_dirs(caller: usize) -> Vec<CString> {
    let Some(caller_map) = dl::link_map_containing(caller) else {
        return Vec::new();
    };
    let Some(own_map) = dl::link_map_containing(caller_only_dirs as *const () as usize) else {
        return Vec::new();
    };
    if caller_map == own_map {
        return Vec::new();
    }
    // SAFETY: link maps of loaded objects (the caller's and ours) are their live handles.
    let (theirs, ours) = unsafe {
        (
            dl::search_path(caller_map.cast()),
            dl::search_path(own_map.cast()),
        )
    };
    match theirs.iter().rposition(|d| !ours.contains(d)) {
        Some(last) => theirs[..=last].to_vec(),
        None => Vec::new(),
    }
}

/// The path the loader recorded for the object behind a `dlopen`/`dlmopen` handle.
///
/// # Safety
/// `handle` is live (the caller holds it open).
pub unsafe fn object_path(handle: *mut c_void) -> Option<String> {
    // SAFETY: as the caller promises.
    unsafe { dl::base_and_name(handle) }.map(|(_, name)| name)
}

/// `$ORIGIN` of the caller: the directory of the object containing `caller`.
pub fn origin_of(caller: usize) -> Option<String> {
    let snap = elf::snapshot();
    let obj = snap.objects.iter().find(|o| o.contains(caller))?;
    let path = if obj.name.is_empty() {
        std::fs::read_link("/proc/self/exe")
            .ok()?
            .display()
            .to_string()
    } else {
        obj.name.clone()
    };
    Some(
        path.rsplit_once('/')
            .map(|(d, _)| d.to_owned())
            .unwrap_or_else(|| ".".to_owned()),
    )
}

/// What `RTLD_NEXT` finds for the caller: the definition in the first object after it, in
/// load order, that defines `symbol` (with `version`). Each candidate is pinned while it is
/// read, so a concurrent `dlclose` cannot unmap it under us.
pub fn next_definition(caller: usize, symbol: &CStr, version: Option<&CStr>) -> Option<usize> {
    let name = symbol.to_str().ok()?;
    let ver = match version {
        Some(v) => Some(v.to_str().ok()?),
        None => None,
    };
    let snap = elf::snapshot();
    let at = snap.objects.iter().position(|o| o.contains(caller))?;
    for obj in &snap.objects[at + 1..] {
        let Some(pin) = Pin::object(obj) else {
            continue;
        };
        if elf::defines(obj, name, ver) {
            let found = pin.lookup(symbol, version);
            if found != 0 {
                return Some(found);
            }
        }
    }
    None
}

/// The caller's object pinned by name, for lookups in its own dependency list; `None` for our
/// own object, and for one its name does not find (another `dlmopen` namespace). Never its bare
/// link map: glibc builds an object's own dependency list only when the object itself is
/// opened, so a dependency nobody opened by name has none, and `dlsym` on its link map faults
/// inside the loader (PyTorch's `libc10.so` did, under the twenty-first session's loader change).
pub fn pinned(caller: usize) -> Option<Pin> {
    let map = dl::link_map_containing(caller)?;
    let own = dl::link_map_containing(pinned as *const () as usize)?;
    if map == own {
        return None;
    }
    // SAFETY: the caller is running code of this object, so it stays loaded while it is read.
    let (base, name) = unsafe { dl::map_base_and_name(map) };
    Pin::named(base, &name)
}
