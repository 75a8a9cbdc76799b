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

/// A reference that keeps an object loaded while the engine reads or writes it.
#[derive(Debug)]
pub struct Pin {
    handle: *mut c_void,
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
        let pin = Pin { handle };
        (pin.base() == Some(obj.base)).then_some(pin)
    }

    /// The load bias of the pinned object.
    fn base(&self) -> Option<usize> {
        let mut map: *const LinkMapHead = std::ptr::null();
        // SAFETY: RTLD_DI_LINKMAP stores a `struct link_map *` into the pointed-to variable.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LINKMAP,
                (&mut map as *mut *const LinkMapHead).cast(),
            )
        };
        if rc != 0 || map.is_null() {
            return None;
        }
        // SAFETY: the link map of a pinned object stays valid while the pin is held.
        Some(unsafe { (*map).l_addr })
    }

    /// `dlsym`/`dlvsym` in this object's local scope (the object and its dependencies).
    pub fn lookup(&self, symbol: &CStr, version: Option<&CStr>) -> usize {
        lookup_in(self.handle, symbol, version)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once.
        unsafe { libc::dlclose(self.handle) };
    }
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
