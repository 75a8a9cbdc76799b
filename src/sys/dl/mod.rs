//! glibc's dynamic loader: handles, link maps, lookups, the list of loaded objects. Handles
//! and link maps are here; `find.rs`: which object holds an address, which address a name has;
//! `walk.rs`: the walk of the loader's list.
//!
//! # Safety
//! Handles come from `dlopen` (closed exactly once by their owner) or are `RTLD_DEFAULT`; a
//! glibc handle is its object's `struct link_map`, whose first five fields are public ABI
//! (`<link.h>`, checked below). Strings passed in are NUL-terminated and outlive each call.
//! Loader callbacks never unwind into glibc: a panic inside one is caught and ends the walk.
//! `dlopen`, `dlclose`, `dlsym` and `dlvsym` are called through the addresses `real` captured
//! before anything was patched, never through a slot of our own object (which is patched when
//! the crate is linked into its host), so they always reach the real loader.
#![allow(unsafe_code)]

mod find;
mod walk;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU8, Ordering};

use libc::Elf64_Phdr;

pub(crate) use find::{
    can_find_objects, clear_error, file_containing, found_object_if_resolved, in_main_program,
    link_map_containing, lookup, lookup_global, object_at, open_containing, FoundObject,
};
pub(crate) use walk::{iterate, vdso_and_interpreter, Listed};

/// The public head of glibc's `struct link_map`.
#[repr(C)]
pub(crate) struct LinkMap {
    /// Load bias.
    pub l_addr: usize,
    /// Path the loader recorded ("" for the main program).
    pub l_name: *const c_char,
    l_ld: *mut c_void,
    l_next: *mut LinkMap,
    l_prev: *mut LinkMap,
}

// `<link.h>` on LP64 (x86_64, aarch64): five pointer-sized fields, in this order.
const _: () = {
    assert!(offset_of!(LinkMap, l_addr) == 0);
    assert!(offset_of!(LinkMap, l_name) == 8);
    assert!(offset_of!(LinkMap, l_ld) == 16);
    assert!(offset_of!(LinkMap, l_next) == 24);
    assert!(offset_of!(LinkMap, l_prev) == 32);
};

/// An object the loader lists after another one (see [`listed_after`]).
#[derive(Clone, Copy)]
pub(crate) struct Next {
    /// Its `struct link_map`.
    pub map: usize,
    /// Load bias.
    pub base: usize,
    /// The name the loader recorded (`dlpi_name` of the walk is this very pointer).
    pub name: *const c_char,
}

/// Fill `out` with the objects listed after `map` in its namespace's list, in order, and say
/// whether exactly `count` follow it (then the list ends with them). Never grows `out` past
/// `count`, and allocates nothing when `out` has room for `count`.
///
/// # Safety
/// Called from inside an [`iterate`] walk (the loader holds its list lock, so no entry is
/// added or unlinked meanwhile), with `map` the link map of an object that stays loaded.
pub(crate) unsafe fn listed_after(map: *const LinkMap, count: usize, out: &mut Vec<Next>) -> bool {
    // SAFETY: a live link map (caller's contract); its public `l_next` field.
    let mut next = unsafe { (*map).l_next };
    while !next.is_null() {
        if out.len() == count {
            return false;
        }
        // SAFETY: an entry of the loader's list, which cannot change while the walk holds
        // its lock.
        let (base, name) = unsafe { ((*next).l_addr, (*next).l_name) };
        out.push(Next {
            map: next as usize,
            base,
            name,
        });
        // SAFETY: as above.
        next = unsafe { (*next).l_next };
    }
    out.len() == count
}

/// A loader handle: `RTLD_DEFAULT`, or one `dlopen` returned.
pub(crate) type Handle = *mut c_void;

/// Open an already-loaded object by name (`None`: the main program) without loading anything:
/// a new reference the caller must [`close`]. `None` when no loaded object has that name.
pub(crate) fn open_loaded(name: Option<&CStr>) -> Option<Handle> {
    let name = name.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: NULL or a NUL-terminated name; RTLD_NOLOAD never loads a new object.
    let handle = unsafe { super::real::dlopen()(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    (!handle.is_null()).then_some(handle)
}

/// Give back a reference from [`open_loaded`].
///
/// # Safety
/// `handle` is a reference the caller owns, given back once.
pub(crate) unsafe fn close(handle: Handle) {
    // SAFETY: as the caller promises.
    unsafe { super::real::dlclose()(handle) };
}

/// What `dlinfo(RTLD_DI_LINKMAP)` answers for a handle: not seen yet, the handle itself (glibc:
/// a handle is its object's link map), or something else (then it is always asked).
static HANDLE_IS_MAP: AtomicU8 = AtomicU8::new(UNSEEN);
const UNSEEN: u8 = 0;
const SAME: u8 = 1;
const OTHER: u8 = 2;

/// The link map of the object behind `handle`. Once the loader has answered one handle with
/// itself, later handles are their own link maps without asking (each `dlinfo` costs the
/// loader's error-catching set-up, ≈ 260 instructions, on every `dlopen` of a new library).
///
/// # Safety
/// `handle` is live (`RTLD_DEFAULT` is not a handle here).
pub(crate) unsafe fn link_map(handle: Handle) -> Option<*const LinkMap> {
    if handle.is_null() {
        return None;
    }
    if HANDLE_IS_MAP.load(Ordering::Relaxed) == SAME {
        return Some(handle as *const LinkMap);
    }
    // SAFETY: forwarded from the caller.
    let map = unsafe { asked_link_map(handle) }?;
    let seen = if map.cast::<c_void>() == handle.cast_const() {
        SAME
    } else {
        OTHER
    };
    // The first answer decides; a loader never mixes the two.
    let _ = HANDLE_IS_MAP.compare_exchange(UNSEEN, seen, Ordering::Relaxed, Ordering::Relaxed);
    Some(map)
}

/// The link map `dlinfo(RTLD_DI_LINKMAP)` gives for `handle`.
///
/// # Safety
/// `handle` is live.
unsafe fn asked_link_map(handle: Handle) -> Option<*const LinkMap> {
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: RTLD_DI_LINKMAP stores a `struct link_map *` into the pointed-to variable.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *const LinkMap).cast(),
        )
    };
    (rc == 0 && !map.is_null()).then_some(map)
}

/// Load bias and recorded path of the object behind `handle`.
///
/// # Safety
/// `handle` is live.
pub(crate) unsafe fn base_and_name(handle: Handle) -> Option<(usize, String)> {
    // SAFETY: the caller keeps the handle, hence the link map, live.
    let map = unsafe { link_map(handle) }?;
    // SAFETY: as above.
    Some(unsafe { map_base_and_name(map) })
}

/// Load bias and recorded path of the object a link map describes.
///
/// # Safety
/// `map` is a live link map (its object stays loaded while this runs).
pub(crate) unsafe fn map_base_and_name(map: *const LinkMap) -> (usize, String) {
    // SAFETY: a live link map (caller's contract).
    let (base, name) = unsafe { ((*map).l_addr, (*map).l_name) };
    if name.is_null() {
        return (base, String::new());
    }
    // SAFETY: a live link map's name is NUL-terminated and lives as long as the object.
    let name = unsafe { CStr::from_ptr(name) };
    // Paths are nearly always UTF-8: validating is cheaper than the lossy conversion's scan.
    let name = match name.to_str() {
        Ok(s) => s.to_owned(),
        Err(_) => name.to_string_lossy().into_owned(),
    };
    (base, name)
}

/// Whether the object behind `handle` lives in the base namespace (not a `dlmopen` one).
///
/// # Safety
/// `handle` is live.
pub(crate) unsafe fn in_base_namespace(handle: Handle) -> bool {
    let mut lmid: libc::Lmid_t = -1;
    // SAFETY: RTLD_DI_LMID stores the namespace id into the pointed-to `Lmid_t`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LMID,
            (&mut lmid as *mut libc::Lmid_t).cast(),
        )
    };
    rc == 0 && lmid == libc::LM_ID_BASE
}

/// `RTLD_DI_PHDR` of `<dlfcn.h>` (glibc 2.36).
const RTLD_DI_PHDR: c_int = 11;

/// The program headers of the object behind `handle` (`None` before glibc 2.36).
///
/// # Safety
/// `handle` is live, and stays so while the result is used.
pub(crate) unsafe fn program_headers<'h>(handle: Handle) -> Option<&'h [Elf64_Phdr]> {
    let mut phdr: *const Elf64_Phdr = std::ptr::null();
    // SAFETY: RTLD_DI_PHDR stores the address of the program headers and returns their
    // number (or -1: older glibc, or an error).
    let phnum = unsafe {
        libc::dlinfo(
            handle,
            RTLD_DI_PHDR,
            (&mut phdr as *mut *const Elf64_Phdr).cast(),
        )
    };
    if phnum <= 0 || phdr.is_null() {
        return None;
    }
    // SAFETY: the loader's program headers of a live object: `phnum` entries.
    Some(unsafe { std::slice::from_raw_parts(phdr, phnum as usize) })
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

const _: () = {
    assert!(size_of::<SerPath>() == 16 && offset_of!(SerPath, dls_flags) == 8);
    assert!(offset_of!(SerInfo, dls_cnt) == 8 && offset_of!(SerInfo, dls_serpath) == 16);
};

/// The directories glibc searches for a bare name opened by the object behind `handle`, in
/// order.
///
/// # Safety
/// `handle` is live.
pub(crate) unsafe fn search_path(handle: Handle) -> Vec<CString> {
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
        .div_ceil(size_of::<usize>())
        .max(size_of::<SerInfo>());
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

#[cfg(test)]
mod tests;
