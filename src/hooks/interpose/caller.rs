//! What glibc would have done for the *caller*: its library search path for bare `dlopen`
//! names (RPATH/RUNPATH with `$ORIGIN`), and the objects after it for `RTLD_NEXT`.
//!
//! # Safety
//! `dladdr1`/`dlinfo` are called with addresses and handles that glibc gave us; a `link_map`
//! pointer is what glibc's handles are, and the first five fields of `struct link_map` are
//! public ABI (`<link.h>`). The `Dl_serinfo` buffer is sized by `RTLD_DI_SERINFOSIZE` first.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_uint, c_void, CStr, CString};

use super::super::loader::Pin;
use crate::elf;

/// `struct link_map`'s public head.
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *mut c_void,
    l_next: *mut LinkMap,
    l_prev: *mut LinkMap,
}

/// `Dl_serpath`.
#[repr(C)]
struct SerPath {
    dls_name: *const c_char,
    dls_flags: c_uint,
}

/// `Dl_serinfo` header (followed by `dls_cnt` `SerPath`s).
#[repr(C)]
struct SerInfo {
    dls_size: usize,
    dls_cnt: c_uint,
    dls_serpath: [SerPath; 1],
}

const RTLD_DL_LINKMAP: libc::c_int = 2;

/// The link map of the object containing `address`.
fn link_map_of(address: usize) -> Option<*mut LinkMap> {
    // SAFETY: Dl_info is plain data (pointers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: dladdr1 writes a Dl_info and, with RTLD_DL_LINKMAP, a `struct link_map *`.
    let ok = unsafe {
        libc::dladdr1(
            address as *const c_void,
            &mut info,
            (&mut map as *mut *mut LinkMap).cast(),
            RTLD_DL_LINKMAP,
        )
    };
    (ok != 0 && !map.is_null()).then_some(map)
}

/// The object (its link map, as a number) whose loaded segments contain `address`, as glibc
/// attributes addresses to objects.
pub fn object_of(address: usize) -> Option<usize> {
    link_map_of(address).map(|m| m as usize)
}

/// The directories glibc searches for a bare name opened by the object at `handle`, in order.
fn search_list(handle: *mut c_void) -> Vec<CString> {
    let mut probe = SerInfo {
        dls_size: 0,
        dls_cnt: 0,
        dls_serpath: [SerPath {
            dls_name: std::ptr::null(),
            dls_flags: 0,
        }],
    };
    // SAFETY: RTLD_DI_SERINFOSIZE fills dls_size and dls_cnt of the header.
    if unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_SERINFOSIZE,
            (&mut probe as *mut SerInfo).cast(),
        )
    } != 0
    {
        return Vec::new();
    }
    let words = probe
        .dls_size
        .div_ceil(std::mem::size_of::<usize>())
        .max(std::mem::size_of::<SerInfo>());
    let mut buf = vec![0usize; words];
    let info = buf.as_mut_ptr().cast::<SerInfo>();
    // SAFETY: the buffer is at least dls_size bytes and aligned for SerInfo; glibc requires the
    // header to be initialised from the SIZE call before the SERINFO call.
    unsafe {
        (*info).dls_size = probe.dls_size;
        (*info).dls_cnt = probe.dls_cnt;
        if libc::dlinfo(handle, libc::RTLD_DI_SERINFO, info.cast()) != 0 {
            return Vec::new();
        }
        let paths = std::ptr::addr_of!((*info).dls_serpath).cast::<SerPath>();
        (0..(*info).dls_cnt as usize)
            .filter_map(|i| {
                let p = &*paths.add(i);
                (!p.dls_name.is_null()).then(|| CStr::from_ptr(p.dls_name).to_owned())
            })
            .collect()
    }
}

/// Directories to try, in order, before handing a bare name to the real `dlopen` from our own
/// object: the caller's list up to its last directory that our own list lacks (the caller's
/// RPATH/RUNPATH entries, and whatever precedes them, such as LD_LIBRARY_PATH). Empty when the
/// caller searches exactly like us.
pub fn caller_only_dirs(caller: usize) -> Vec<CString> {
    let Some(caller_map) = link_map_of(caller) else {
        return Vec::new();
    };
    let Some(own_map) = link_map_of(caller_only_dirs as *const () as usize) else {
        return Vec::new();
    };
    if caller_map == own_map {
        return Vec::new();
    }
    let theirs = search_list(caller_map.cast());
    let ours = search_list(own_map.cast());
    match theirs.iter().rposition(|d| !ours.contains(d)) {
        Some(last) => theirs[..=last].to_vec(),
        None => Vec::new(),
    }
}

/// The path the loader recorded for the object behind a `dlopen`/`dlmopen` handle.
pub fn object_path(handle: *mut c_void) -> Option<String> {
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: RTLD_DI_LINKMAP stores the handle's `struct link_map *`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *const LinkMap).cast(),
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: the link map is live while the handle is open; l_name is NUL-terminated.
    let name = unsafe { (*map).l_name };
    (!name.is_null()).then(|| {
        // SAFETY: a non-null l_name of a live link map is a NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    })
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

/// The caller's own handle (its link map), for lookups in the caller's scope; `None` for our own
/// object.
pub fn handle_of(caller: usize) -> Option<*mut c_void> {
    let map = link_map_of(caller)?;
    let own = link_map_of(handle_of as *const () as usize)?;
    (map != own).then_some(map.cast())
}
