//! The opening side of the loader interposers: `dlopen`/`dlmopen` as the caller would have
//! opened (`$ORIGIN`, the caller's own directories), then patching what they loaded; `dlclose`,
//! then forgetting what it unloaded. Only the outermost call of a thread patches or forgets.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};

use super::{caller, real_dlclose, real_dlmopen, real_dlopen, PATIENCE};
use crate::sys::boundary::guarded;
use crate::sys::real;

thread_local! {
    /// Depth of interposed `dlopen`/`dlmopen`/`dlclose` calls on this thread. A nested call
    /// comes from a constructor or destructor, which the loader runs holding its lock: waiting
    /// there for the engine could wait out the patience while the running operation waits for
    /// that very lock (issue 12 item 10). So only the outermost call syncs, after the real call
    /// has returned and released the lock, and its sync covers what the nested ones did.
    static LOADER_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Open `file` as the object containing `caller` would have (in `namespace`): `$ORIGIN`
/// expanded, then a bare name looked for as already loaded, then in the caller's own
/// directories, then handed to the loader as it is.
fn open_as_caller(
    caller: usize,
    file: *const c_char,
    namespace: c_long,
    open_with: &dyn Fn(*const c_char, c_int) -> *mut c_void,
) -> *mut c_void {
    let open = |f: *const c_char| open_with(f, 0);
    if file.is_null() {
        return open(file);
    }
    // `strchr` scans of the C string decide the common cases (a path without '$' is opened as it
    // is) without measuring it first: on the `dlopen` of a library already loaded, `strlen` and
    // two `memchr` calls were a fifth of all our work. The name is measured only on the rarer
    // paths below.
    // SAFETY: dlopen's contract: a non-NULL file is a NUL-terminated string (so its first byte
    // can be read), alive for the call.
    #[allow(unsafe_code)]
    let (dollar, slash, name) = unsafe {
        (
            !libc::strchr(file, c_int::from(b'$')).is_null(),
            *file == b'/' as c_char || !libc::strchr(file, c_int::from(b'/')).is_null(),
            || CStr::from_ptr(file).to_bytes(),
        )
    };
    // `$ORIGIN` in a path means the caller's directory.
    if dollar {
        let name = name();
        if memchr::memmem::find(name, b"$ORIGIN").is_some()
            || memchr::memmem::find(name, b"${ORIGIN}").is_some()
        {
            return open_from_origin(caller, file, name, &open);
        }
    }
    if slash {
        return open(file);
    }
    let name = name();
    let dirs = caller::caller_only_dirs(caller);
    if dirs.is_empty() {
        return open(file);
    }
    if let Some(handle) = open_if_loaded(file, namespace, open_with) {
        return handle;
    }
    if let Some(handle) = open_in(dirs, name, &open) {
        return handle;
    }
    // Not in the caller's own directories: the rest of the search (cache, system directories)
    // is the same from any caller, and a failure leaves the loader's own message in dlerror.
    open(file)
}

/// Open `file` (`name`: its bytes, holding `$ORIGIN`) with the caller's directory in place of
/// `$ORIGIN`; as it is when that directory is unknown.
fn open_from_origin(
    caller: usize,
    file: *const c_char,
    name: &[u8],
    open: &dyn Fn(*const c_char) -> *mut c_void,
) -> *mut c_void {
    if let Some(dir) = caller::origin_of(caller) {
        let text = String::from_utf8_lossy(name)
            .replace("${ORIGIN}", &dir)
            .replace("$ORIGIN", &dir);
        if let Ok(path) = CString::new(text) {
            return open(path.as_ptr());
        }
    }
    open(file)
}

/// A library already loaded under this name (its soname) is what glibc returns first, before
/// any directory search: opened when the probe finds it.
fn open_if_loaded(
    file: *const c_char,
    namespace: c_long,
    open_with: &dyn Fn(*const c_char, c_int) -> *mut c_void,
) -> Option<*mut c_void> {
    // The probe is our own question: in the base namespace it goes to the C library directly,
    // never through another interposer that would count it.
    let loaded = if namespace == libc::LM_ID_BASE {
        // SAFETY: a NUL-terminated name (dlopen's contract); RTLD_NOLOAD loads nothing.
        #[allow(unsafe_code)]
        unsafe {
            real::dlopen()(file, libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        }
    } else {
        open_with(file, libc::RTLD_NOLOAD)
    };
    if loaded.is_null() {
        return None;
    }
    let handle = open_with(file, 0);
    // SAFETY: drops the extra reference the probe took, with the function that took it.
    #[allow(unsafe_code)]
    unsafe {
        if namespace == libc::LM_ID_BASE {
            real::dlclose()(loaded)
        } else {
            real_dlclose()(loaded)
        }
    };
    Some(handle)
}

/// The first of the caller's own directories `dirs` where `name` exists and opens.
fn open_in(
    dirs: Vec<CString>,
    name: &[u8],
    open: &dyn Fn(*const c_char) -> *mut c_void,
) -> Option<*mut c_void> {
    for dir in dirs {
        let mut path = dir.into_bytes();
        path.push(b'/');
        path.extend_from_slice(name);
        let Ok(path) = CString::new(path) else {
            continue;
        };
        if crate::sys::fd::exists(&path) {
            let handle = open(path.as_ptr());
            if !handle.is_null() {
                return Some(handle);
            }
        }
    }
    None
}

struct DepthGuard(u32);

impl DepthGuard {
    fn enter() -> DepthGuard {
        DepthGuard(LOADER_DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get()
        }))
    }
}

impl Drop for DepthGuard {
    fn drop(&mut self) {
        LOADER_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// After a successful open: patch what it loaded (outermost open only).
fn after_open(handle: *mut c_void, depth: &DepthGuard) {
    if !handle.is_null() && depth.0 == 1 {
        if let Some(now) = crate::hooks::engine::loader_changed() {
            // SAFETY: `handle` was just returned by the real loader and is not yet the
            // caller's, so it stays open for this call.
            #[allow(unsafe_code)]
            let _ = unsafe { crate::hooks::engine::sync_opened(handle, now, Some(PATIENCE)) };
        }
    }
}

/// Open as the caller would have, then patch what was loaded; a panic in our part falls back to
/// the plain call (or, after the open, to its result). `namespace` is the `dlmopen` namespace
/// (`LM_ID_BASE` for `dlopen`).
fn open_and_patch(
    caller: usize,
    file: *const c_char,
    namespace: c_long,
    open: &dyn Fn(*const c_char, c_int) -> *mut c_void,
) -> *mut c_void {
    // Kept outside the guard: after a panic in our part, a library already opened is handed
    // out as it is, never opened a second time (that leaked a reference for good).
    let opened = std::cell::Cell::new(None);
    // Constructors the open runs, and our own reading of what it loaded, may reach cancellation
    // points: a request waits until the open has returned to its caller (`crate::sys::cancel`).
    let _cancel = crate::sys::cancel::Deferred::begin();
    guarded(
        || {
            let depth = DepthGuard::enter();
            let handle = open_as_caller(caller, file, namespace, open);
            opened.set(Some(handle));
            after_open(handle, &depth);
            if !handle.is_null() && namespace != libc::LM_ID_BASE {
                // SAFETY: the handle the real dlmopen just returned, not yet handed out.
                #[allow(unsafe_code)]
                let path = unsafe { caller::object_path(handle) };
                if let Some(path) = path {
                    crate::hooks::engine::note_other_namespace(path, Some(PATIENCE));
                }
            }
            handle
        },
        || opened.get().unwrap_or_else(|| open(file, 0)),
    )
}

/// `dlopen` with the caller's return address (from `entry::dlopen_entry`).
pub(super) extern "C" fn dlopen_from(
    file: *const c_char,
    mode: c_int,
    caller: usize,
) -> *mut c_void {
    dlopen_via(real_dlopen(), file, mode, caller)
}

pub(super) fn dlopen_via(
    real: real::DlopenFn,
    file: *const c_char,
    mode: c_int,
    caller: usize,
) -> *mut c_void {
    // SAFETY: the real dlopen with the caller's own arguments.
    #[allow(unsafe_code)]
    let open = |f: *const c_char, extra: c_int| unsafe { real(f, mode | extra) };
    open_and_patch(caller, file, libc::LM_ID_BASE, &open)
}

/// `dlmopen` with the caller's return address.
pub(super) extern "C" fn dlmopen_from(
    lmid: c_long,
    file: *const c_char,
    mode: c_int,
    caller: usize,
) -> *mut c_void {
    dlmopen_via(real_dlmopen(), lmid, file, mode, caller)
}

pub(super) fn dlmopen_via(
    real: real::DlmopenFn,
    lmid: c_long,
    file: *const c_char,
    mode: c_int,
    caller: usize,
) -> *mut c_void {
    // SAFETY: the real dlmopen with the caller's own arguments.
    #[allow(unsafe_code)]
    let open = |f: *const c_char, extra: c_int| unsafe { real(lmid, f, mode | extra) };
    open_and_patch(caller, file, lmid, &open)
}

/// `dlclose`: close, then forget objects that are really gone (outermost call only).
pub(super) extern "C" fn dlclose_from(handle: *mut c_void, _caller: usize) -> c_int {
    dlclose_via(real_dlclose(), handle)
}

pub(super) fn dlclose_via(real: real::DlcloseFn, handle: *mut c_void) -> c_int {
    // Destructors, and our own sync: as for `open_and_patch`.
    let _cancel = crate::sys::cancel::Deferred::begin();
    let depth = DepthGuard::enter();
    // SAFETY: the real dlclose with the caller's own handle.
    #[allow(unsafe_code)]
    let rc = unsafe { real(handle) };
    if rc == 0 && depth.0 == 1 {
        // Reading the counters cannot unwind (the walk's callback catches its own panics).
        if let Some(now) = crate::hooks::engine::loader_changed() {
            // Unwind rules cached for code that may be gone: an address reused by a library
            // loaded later must not be unwound with them.
            if crate::stacks::depth() > 0 {
                crate::stacks::forget_unwind_rules();
            }
            let _ = guarded(
                || crate::hooks::engine::sync_closed(handle, now, Some(PATIENCE)),
                || Ok(0),
            );
        }
    }
    rc
}
