//! glibc's dynamic loader: handles, link maps, lookups, the list of loaded objects.
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

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::mem::{offset_of, size_of};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU8, Ordering};

use libc::{dl_phdr_info, Elf64_Phdr};

use super::func::TypedFn;

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
            Some(v) => super::real::dlvsym()(handle, symbol.as_ptr(), v.as_ptr()),
            None => super::real::dlsym()(handle, symbol.as_ptr()),
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
    /// The object's mapped range, `[map_start, map_end)`.
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

/// Longest object name read from a `dl_phdr_info`; longer ones are truncated (PATH_MAX).
const MAX_NAME: usize = 4096;

/// One object as [`iterate`] shows it.
pub(crate) struct Listed<'a> {
    pub info: &'a dl_phdr_info,
    /// The loader's add/remove counters are present (`dlpi_adds`/`dlpi_subs`).
    pub has_counters: bool,
}

impl Listed<'_> {
    /// The object's name as the loader recorded it ("" for the main program), bounded.
    pub(crate) fn name(&self) -> &[u8] {
        let name = self.info.dlpi_name;
        if name.is_null() {
            return &[];
        }
        // SAFETY: a NUL-terminated string of the loader's; `strnlen` stops at the NUL or after
        // MAX_NAME bytes (its wide reads never cross a page the string does not reach).
        let len = unsafe { libc::strnlen(name, MAX_NAME) };
        // SAFETY: the first `len` bytes precede the NUL (or the bound).
        unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len) }
    }

    /// Its program headers.
    pub(crate) fn program_headers(&self) -> &[Elf64_Phdr] {
        let n = self.info.dlpi_phnum as usize;
        if n == 0 || self.info.dlpi_phdr.is_null() {
            return &[];
        }
        // SAFETY: the loader's program headers array has `dlpi_phnum` entries.
        unsafe { std::slice::from_raw_parts(self.info.dlpi_phdr, n) }
    }
}

/// Walk the loader's list of objects (`dl_iterate_phdr`), in load order, under the loader's
/// list lock: `visit` must not allocate, lock or call the loader. It returns `Break` to stop.
/// A panic in `visit` stops the walk and is reported as `Err` (it never unwinds into glibc).
pub(crate) fn iterate<F>(visit: &mut F) -> Result<(), ()>
where
    F: FnMut(&Listed<'_>) -> ControlFlow<()>,
{
    struct State<'f, F> {
        visit: &'f mut F,
        panicked: bool,
    }
    unsafe extern "C" fn step<F>(info: *mut dl_phdr_info, size: usize, data: *mut c_void) -> c_int
    where
        F: FnMut(&Listed<'_>) -> ControlFlow<()>,
    {
        // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut State`.
        let (info, state) = unsafe { (&*info, &mut *data.cast::<State<F>>()) };
        let listed = Listed {
            info,
            has_counters: size >= offset_of!(dl_phdr_info, dlpi_subs) + size_of::<u64>(),
        };
        let visit = &mut *state.visit;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(&listed))) {
            Ok(ControlFlow::Continue(())) => 0,
            Ok(ControlFlow::Break(())) => 1,
            Err(_) => {
                state.panicked = true;
                1
            }
        }
    }
    let mut state = State {
        visit,
        panicked: false,
    };
    // SAFETY: the callback matches dl_iterate_phdr's contract and `state` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(step::<F>), (&mut state as *mut State<F>).cast()) };
    if state.panicked {
        Err(())
    } else {
        Ok(())
    }
}

/// `getauxval`, for locating the vDSO and the dynamic loader.
fn auxv(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}

/// The vDSO's and the program interpreter's load addresses (`AT_SYSINFO_EHDR`, `AT_BASE`; 0
/// when absent), read from the auxiliary vector once: they never change, and `getauxval` walks
/// the vector on every call (≈ 100 instructions, twice for each object admitted).
pub(crate) fn vdso_and_interpreter() -> (usize, usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const UNREAD: usize = usize::MAX;
    static VDSO: AtomicUsize = AtomicUsize::new(UNREAD);
    static INTERP: AtomicUsize = AtomicUsize::new(UNREAD);
    let (v, i) = (VDSO.load(Ordering::Relaxed), INTERP.load(Ordering::Relaxed));
    if v != UNREAD && i != UNREAD {
        return (v, i);
    }
    let (v, i) = (auxv(libc::AT_SYSINFO_EHDR), auxv(libc::AT_BASE));
    VDSO.store(v, Ordering::Relaxed);
    INTERP.store(i, Ordering::Relaxed);
    (v, i)
}

#[cfg(test)]
mod tests;
