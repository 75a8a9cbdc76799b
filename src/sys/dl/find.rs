//! Which loaded object holds an address (`dladdr1`, `_dl_find_object`), and which address a
//! name has (`dlsym`/`dlvsym`), with the one owner of `dlerror`.
//!
//! # Safety
//! As for the loader module (`sys/dl/mod.rs`): handles are live or `RTLD_DEFAULT`, strings
//! NUL-terminated, and the loader's answers read only as its ABI defines them.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::mem::offset_of;

use super::{open_loaded, Handle, LinkMap};
use crate::sys::func::TypedFn;

const RTLD_DL_LINKMAP: c_int = 2;

/// The link map of the object whose loaded segments contain `address`, as glibc attributes
/// addresses to objects (`dladdr1`).
pub(crate) fn link_map_containing(address: usize) -> Option<*mut LinkMap> {
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

/// Whether `address` lies in the main program (which is never unloaded, and which `dlopen`
/// cannot open by its path).
pub(crate) fn in_main_program(address: usize) -> bool {
    link_map_containing(address).is_some_and(|map| {
        // SAFETY: the loader's live link map; `l_name` is NULL or a NUL-terminated string.
        let name = unsafe { (*map).l_name };
        // SAFETY: as above.
        name.is_null() || unsafe { *name } == 0
    })
}

/// A new reference to the loaded object containing `address` (`dladdr`, then `dlopen` of its
/// path with `RTLD_NOLOAD`): the caller owns it (see [`close`]). Allocates nothing.
pub(crate) fn open_containing(address: usize) -> Option<Handle> {
    // SAFETY: Dl_info is plain data (pointers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for any address.
    if unsafe { libc::dladdr(address as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    open_loaded(Some(unsafe { CStr::from_ptr(info.dli_fname) }))
}

/// The path of the object containing `address` (`dladdr`'s `dli_fname`), as bytes.
pub(crate) fn file_containing(address: usize) -> Option<Vec<u8>> {
    // SAFETY: Dl_info is plain data (pointers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for any address.
    let ok = unsafe { libc::dladdr(address as *const c_void, &mut info) } != 0;
    if !ok || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_bytes()
            .to_vec(),
    )
}

/// `dlsym`/`dlvsym` in `handle`'s scope (`RTLD_DEFAULT`: the global scope); 0 when not found.
/// Leaves a failure's message pending in `dlerror` (see [`clear_error`]).
///
/// # Safety
/// `handle` is `RTLD_DEFAULT` or live.
pub(crate) unsafe fn lookup(handle: Handle, symbol: &CStr, version: Option<&CStr>) -> usize {
    // SAFETY: a valid handle (the caller's promise) and NUL-terminated strings.
    let p = unsafe {
        match version {
            Some(v) => crate::sys::real::dlvsym()(handle, symbol.as_ptr(), v.as_ptr()),
            None => crate::sys::real::dlsym()(handle, symbol.as_ptr()),
        }
    };
    p as usize
}

/// `dlsym(RTLD_DEFAULT, …)` / `dlvsym(RTLD_DEFAULT, …)`: the global scope's definition.
pub(crate) fn lookup_global(symbol: &CStr, version: Option<&CStr>) -> usize {
    // SAFETY: RTLD_DEFAULT is always valid.
    unsafe { lookup(libc::RTLD_DEFAULT, symbol, version) }
}

/// Discard the thread's pending `dlerror()` message. The one owner of that protocol: lookups
/// cuhook makes for itself must never show up in the application's next `dlerror()` call.
pub(crate) fn clear_error() {
    // SAFETY: dlerror only reads and resets thread-local loader state.
    unsafe { libc::dlerror() };
}

/// `struct dl_find_object` (glibc 2.35), with room to spare for fields other ports add.
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 16],
}

// `<dlfcn.h>` (glibc 2.35): the fields read come first, in this order.
const _: () = {
    assert!(offset_of!(DlFindObject, map_start) == 8 && offset_of!(DlFindObject, map_end) == 16);
    assert!(offset_of!(DlFindObject, link_map) == 24 && offset_of!(DlFindObject, eh_frame) == 32);
};

type FindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

/// glibc's `_dl_find_object` (2.35), looked up once by name; absent: `ABSENT`.
static FIND_OBJECT: TypedFn<FindObject> = TypedFn::unknown();
const ABSENT: usize = 1;

fn find_object() -> Option<FindObject> {
    if FIND_OBJECT.address() == 0 {
        let p = lookup_global(c"_dl_find_object", None);
        // SAFETY: glibc's `_dl_find_object`, looked up by its name, has this signature; or the
        // marker for "absent", which `get` is never asked to call (checked below).
        unsafe { FIND_OBJECT.set(if p == 0 { ABSENT } else { p }) };
    }
    (FIND_OBJECT.address() != ABSENT)
        .then(|| FIND_OBJECT.get())
        .flatten()
}

/// Which loaded, relocated object covers `address`, answered by glibc without a lock or a walk
/// (async-signal safe): `Some(Some(link_map))`, `Some(None)` when none does, `None` when this
/// glibc cannot say (before 2.35). glibc registers an object here only once it is relocated.
pub(crate) fn object_at(address: usize) -> Option<Option<usize>> {
    let find = find_object()?;
    // SAFETY: all-zero is a valid `DlFindObject` (integers and null pointers).
    let mut out: DlFindObject = unsafe { std::mem::zeroed() };
    // SAFETY: `out` is large enough for the result; any address may be asked about.
    let rc = unsafe { find(address as *mut c_void, &mut out) };
    Some((rc == 0).then_some(out.link_map as usize))
}

/// Whether this glibc can answer [`object_at`].
pub(crate) fn can_find_objects() -> bool {
    find_object().is_some()
}

/// What `_dl_find_object` says about the object covering an address, for an unwinder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FoundObject {
    /// The mapping holding the address, `[map_start, map_end)`: the whole object, or only one
    /// of its segments where glibc found gaps between them (then its `PT_GNU_EH_FRAME` may lie
    /// in another).
    pub map_start: usize,
    pub map_end: usize,
    /// Its `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`), relocated; 0 when it has none.
    pub eh_frame_hdr: usize,
}

/// [`object_at`] for callers inside hooks and signal handlers: never looks `_dl_find_object`
/// up (that `dlsym` takes the loader's lock), so it answers `None` until [`can_find_objects`]
/// has been called once outside the hook path, and on glibc before 2.35. glibc answers without
/// a lock, an allocation or a walk.
pub(crate) fn found_object_if_resolved(address: usize) -> Option<FoundObject> {
    let resolved = FIND_OBJECT.address();
    if resolved == 0 || resolved == ABSENT {
        return None;
    }
    let find = FIND_OBJECT.get()?;
    // SAFETY: all-zero is a valid `DlFindObject` (integers and null pointers).
    let mut out: DlFindObject = unsafe { std::mem::zeroed() };
    // SAFETY: `out` is large enough for the result; any address may be asked about.
    let rc = unsafe { find(address as *mut c_void, &mut out) };
    (rc == 0).then_some(FoundObject {
        map_start: out.map_start as usize,
        map_end: out.map_end as usize,
        eh_frame_hdr: out.eh_frame as usize,
    })
}
