//! The few dynamic-loader calls the engine makes: pinning objects and looking symbols up.
//!
//! # Safety
//! These wrap `dlopen`/`dlsym`/`dlvsym`/`dlinfo`/`dlclose` from glibc. Handles come only from
//! `dlopen` and are closed exactly once (by [`Pin`]'s `Drop`). Strings passed in are
//! NUL-terminated `CString`s that outlive each call. The engine calls these functions through
//! its own object, whose GOT it never patches, so they always reach the real loader.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};

use crate::elf::LoadedObject;

/// The first fields of glibc's `struct link_map` (public ABI, `<link.h>`).
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const libc::c_char,
}

/// A reference that keeps an object loaded while the engine reads or writes it: our own
/// (`dlopen(RTLD_NOLOAD)`, closed on drop) or borrowed from a caller that holds one.
#[derive(Debug)]
pub struct Pin {
    handle: *mut c_void,
    owned: bool,
}

// SAFETY: a dlopen handle may be used and closed from any thread.
unsafe impl Send for Pin {}
// SAFETY: `Pin` offers only `&self` lookups, which glibc serialises internally.
unsafe impl Sync for Pin {}

impl Pin {
    /// Pin an already-loaded object without loading anything. `None` when the object cannot be
    /// found in this namespace under its name (another `dlmopen` namespace, a name that no
    /// longer resolves), or when the name finds an object at another base address.
    pub fn object(obj: &LoadedObject) -> Option<Pin> {
        let handle = if obj.position == 0 && obj.name.is_empty() {
            // SAFETY: dlopen(NULL) returns the main program's handle.
            unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
        } else {
            let name = CString::new(obj.name.as_bytes()).ok()?;
            // SAFETY: `name` is NUL-terminated; RTLD_NOLOAD never loads a new object.
            unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
        };
        if handle.is_null() {
            return None;
        }
        let pin = Pin {
            handle,
            owned: true,
        };
        (pin.base() == Some(obj.base)).then_some(pin)
    }

    /// Use a handle the caller holds open (the one `dlopen` just returned to our interposer)
    /// as the pin, without taking another reference.
    ///
    /// # Safety
    /// `handle` must be a live `dlopen` handle that nobody closes while the `Pin` exists.
    pub unsafe fn borrowed(handle: *mut c_void) -> Pin {
        Pin {
            handle,
            owned: false,
        }
    }

    /// The pinned object's `struct link_map` (in glibc, also its handle's identity).
    pub fn link_map(&self) -> Option<usize> {
        let mut map: *const LinkMapHead = std::ptr::null();
        // SAFETY: RTLD_DI_LINKMAP stores a `struct link_map *` into the pointed-to variable.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LINKMAP,
                (&mut map as *mut *const LinkMapHead).cast(),
            )
        };
        (rc == 0 && !map.is_null()).then_some(map as usize)
    }

    /// The load bias of the pinned object.
    fn base(&self) -> Option<usize> {
        let map = self.link_map()? as *const LinkMapHead;
        // SAFETY: the link map of a pinned object stays valid while the pin is held.
        Some(unsafe { (*map).l_addr })
    }

    /// The pinned object as the loader describes it, asked through the handle (no walk of
    /// the object list), with its link map; `None` when it lives in another namespace or the
    /// loader cannot say (`RTLD_DI_PHDR` needs glibc 2.36).
    pub fn describe(&self) -> Option<(LoadedObject, usize)> {
        let mut lmid: libc::Lmid_t = -1;
        // SAFETY: RTLD_DI_LMID stores the namespace id into the pointed-to `Lmid_t`.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LMID,
                (&mut lmid as *mut libc::Lmid_t).cast(),
            )
        };
        if rc != 0 || lmid != libc::LM_ID_BASE {
            return None;
        }
        let map = self.link_map()?;
        let mut phdr: *const libc::Elf64_Phdr = std::ptr::null();
        // SAFETY: RTLD_DI_PHDR stores the address of the program headers and returns their
        // number (or -1: older glibc, or an error).
        let phnum = unsafe {
            libc::dlinfo(
                self.handle,
                RTLD_DI_PHDR,
                (&mut phdr as *mut *const libc::Elf64_Phdr).cast(),
            )
        };
        if phnum <= 0 || phdr.is_null() {
            return None;
        }
        // SAFETY: the loader's program headers of a pinned object: `phnum` entries, valid while
        // it stays loaded.
        let phdrs = unsafe { std::slice::from_raw_parts(phdr, phnum as usize) }.to_vec();
        let head = map as *const LinkMapHead;
        // SAFETY: the pinned object's link map and its name, a NUL-terminated string the
        // loader keeps for the object's lifetime.
        let (base, name) = unsafe {
            let name = (*head).l_name;
            let name = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            ((*head).l_addr, name)
        };
        let obj = LoadedObject {
            base,
            name,
            phdrs,
            position: LoadedObject::UNKNOWN_POSITION,
        };
        Some((obj, map))
    }

    /// `dlsym`/`dlvsym` in this object's local scope (the object and its dependencies).
    pub fn lookup(&self, symbol: &CStr, version: Option<&CStr>) -> usize {
        lookup_in(self.handle, symbol, version)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: our own handle from dlopen, closed once.
            unsafe { libc::dlclose(self.handle) };
        }
    }
}

/// `RTLD_DI_PHDR` of `<dlfcn.h>` (glibc 2.36).
const RTLD_DI_PHDR: libc::c_int = 11;

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

type FindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> libc::c_int;

/// `_dl_find_object`, looked up once: 0 not yet, 1 absent, else the function.
static FIND_OBJECT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Which loaded object covers `addr`, answered by glibc without a lock or a walk:
/// `Some(Some(link_map))`, `Some(None)` when no object does, `None` when this glibc cannot say
/// (before 2.35).
pub fn object_at(addr: usize) -> Option<Option<usize>> {
    use std::sync::atomic::Ordering;
    let mut f = FIND_OBJECT.load(Ordering::Acquire);
    if f == 0 {
        let p = lookup_global(c"_dl_find_object", None);
        f = if p == 0 { 1 } else { p };
        FIND_OBJECT.store(f, Ordering::Release);
    }
    if f == 1 {
        return None;
    }
    // SAFETY: `f` is glibc's `_dl_find_object` (looked up by its name), whose signature this is.
    let find = unsafe { std::mem::transmute::<usize, FindObject>(f) };
    // SAFETY: all-zero is a valid `DlFindObject` (integers and null pointers).
    let mut out: DlFindObject = unsafe { std::mem::zeroed() };
    // SAFETY: `out` is large enough for the result; any address may be asked about.
    let rc = unsafe { find(addr as *mut c_void, &mut out) };
    Some((rc == 0).then_some(out.link_map as usize))
}

/// `dlsym(RTLD_DEFAULT, …)` / `dlvsym(RTLD_DEFAULT, …)`: the global scope's definition.
pub fn lookup_global(symbol: &CStr, version: Option<&CStr>) -> usize {
    lookup_in(libc::RTLD_DEFAULT, symbol, version)
}

fn lookup_in(handle: *mut c_void, symbol: &CStr, version: Option<&CStr>) -> usize {
    // SAFETY: valid handle (RTLD_DEFAULT or from dlopen) and NUL-terminated strings.
    let p = unsafe {
        match version {
            Some(v) => libc::dlvsym(handle, symbol.as_ptr(), v.as_ptr()),
            None => libc::dlsym(handle, symbol.as_ptr()),
        }
    };
    p as usize
}

/// Discard the thread's pending `dlerror()` message, so lookups that failed inside the engine
/// never show up in the application's next `dlerror()` call.
pub fn clear_dlerror() {
    // SAFETY: dlerror only reads and resets thread-local loader state.
    unsafe { libc::dlerror() };
}

/// `getauxval`, for locating the vDSO and the dynamic loader.
pub fn auxv(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}
