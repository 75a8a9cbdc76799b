//! Interposers for the dynamic loader: `dlopen`, `dlmopen`, `dlclose`, `dlsym`, `dlvsym`.
//!
//! Installed with the first hook set and removed with the last. After a successful `dlopen`
//! every new object (the opened one and its new dependencies) is patched with every installed
//! set before `dlopen` returns; after `dlclose` unloaded objects are forgotten; lookups that
//! find the original of a hooked function return the hook.
//!
//! Caller semantics are kept: the naked entries (`entry.rs`) capture the caller's return
//! address, bare library names are searched in the caller's RPATH/RUNPATH first (`caller.rs`),
//! `$ORIGIN` in a path is the caller's directory, and `RTLD_NEXT` searches the objects after the
//! caller. Known limit: a library's constructors run inside the real `dlopen`, before its slots
//! are patched (see `Diagnostics::constructors_before_patch`).

mod as_caller;
mod caller;
mod entry;

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::engine::DL_SET_NAME;
use super::substitution::substitute;
use crate::sys::boundary::guarded;
use crate::sys::real;

use super::set::{Hook, HookSet};

/// How long a loader call waits for a busy engine before leaving its new objects to the
/// running operation's catch-up scan.
const PATIENCE: Duration = Duration::from_secs(2);

static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLMOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

/// Chains per loader function (see `Chain`): slots bound to another definition than the one
/// the global lookup gives (a `dlopen` wrapper preloaded by a profiler or sandbox; the symbol
/// version a program imports) are patched with one, which calls what the slot held.
const CHAINS: usize = 2;
static CHAIN_DLOPEN: [AtomicUsize; CHAINS] = [const { AtomicUsize::new(0) }; CHAINS];
static CHAIN_DLMOPEN: [AtomicUsize; CHAINS] = [const { AtomicUsize::new(0) }; CHAINS];
static CHAIN_DLCLOSE: [AtomicUsize; CHAINS] = [const { AtomicUsize::new(0) }; CHAINS];
static CHAIN_DLSYM: [AtomicUsize; CHAINS] = [const { AtomicUsize::new(0) }; CHAINS];
static CHAIN_DLVSYM: [AtomicUsize; CHAINS] = [const { AtomicUsize::new(0) }; CHAINS];

thread_local! {
    /// Depth of interposed `dlopen`/`dlmopen`/`dlclose` calls on this thread. A nested call
    /// comes from a constructor or destructor, which the loader runs holding its lock: waiting
    /// there for the engine could wait out the patience while the running operation waits for
    /// that very lock (issue 12 item 10). So only the outermost call scans, after the real call
    /// has returned and released the lock, and its scan covers what the nested ones did.
    static LOADER_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The loader hook set.
pub(crate) fn dl_hook_set() -> HookSet {
    macro_rules! hook {
        ($symbol:literal, $entry:ident, $real:ident, [$($chain:ident),*], $chains:ident) => {
            Hook::new($symbol, entry::$entry as *const () as usize, &$real)
                .ok()
                .map(|h| {
                    let mut k = 0;
                    h.with_chains(&[$({
                        k += 1;
                        (entry::$chain as *const () as usize, &$chains[k - 1])
                    }),*])
                })
        };
    }
    let hooks = [
        hook!(
            "dlopen",
            dlopen_entry,
            REAL_DLOPEN,
            [dlopen_entry_c0, dlopen_entry_c1],
            CHAIN_DLOPEN
        ),
        hook!(
            "dlmopen",
            dlmopen_entry,
            REAL_DLMOPEN,
            [dlmopen_entry_c0, dlmopen_entry_c1],
            CHAIN_DLMOPEN
        ),
        hook!(
            "dlclose",
            dlclose_entry,
            REAL_DLCLOSE,
            [dlclose_entry_c0, dlclose_entry_c1],
            CHAIN_DLCLOSE
        ),
        hook!(
            "dlsym",
            dlsym_entry,
            REAL_DLSYM,
            [dlsym_entry_c0, dlsym_entry_c1],
            CHAIN_DLSYM
        ),
        hook!(
            "dlvsym",
            dlvsym_entry,
            REAL_DLVSYM,
            [dlvsym_entry_c0, dlvsym_entry_c1],
            CHAIN_DLVSYM
        ),
    ];
    HookSet::new(DL_SET_NAME, hooks.into_iter().flatten().collect())
        .expect("the loader hook set names each symbol once")
}

/// The real function: the published original (the definition the importers' slots were bound
/// to), else the one captured before anything was patched (`sys::real`): never the linked
/// name, whose slot in our own object may lead back here when the crate is part of its host.
macro_rules! real {
    ($store:ident, $captured:path, $f:ty) => {{
        let p = $store.load(std::sync::atomic::Ordering::Acquire);
        if p == 0 {
            $captured()
        } else {
            // SAFETY: the engine stores only the address of the real function of this name and
            // signature (resolved with dlsym), never anything else.
            #[allow(unsafe_code)]
            unsafe {
                crate::sys::func::fn_at::<$f>(p)
            }
        }
    }};
}

fn real_dlopen() -> real::DlopenFn {
    real!(REAL_DLOPEN, real::dlopen, real::DlopenFn)
}
fn real_dlmopen() -> real::DlmopenFn {
    real!(REAL_DLMOPEN, real::dlmopen, real::DlmopenFn)
}
fn real_dlclose() -> real::DlcloseFn {
    real!(REAL_DLCLOSE, real::dlclose, real::DlcloseFn)
}
fn real_dlsym() -> real::DlsymFn {
    real!(REAL_DLSYM, real::dlsym, real::DlsymFn)
}
fn real_dlvsym() -> real::DlvsymFn {
    real!(REAL_DLVSYM, real::dlvsym, real::DlvsymFn)
}

/// A chain's original (what its slots held), else the hook's.
fn chained<F: Copy>(store: &AtomicUsize, hook_original: F) -> F {
    let p = store.load(std::sync::atomic::Ordering::Acquire);
    if p == 0 {
        hook_original
    } else {
        // SAFETY: the engine stores in a chain only the address a slot of this very loader
        // function was bound to (the C signature of that function).
        #[allow(unsafe_code)]
        unsafe {
            crate::sys::func::fn_at::<F>(p)
        }
    }
}

/// Open `file` as the object containing `caller` would have (in `namespace`).
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
            if let Some(dir) = caller::origin_of(caller) {
                let text = String::from_utf8_lossy(name)
                    .replace("${ORIGIN}", &dir)
                    .replace("$ORIGIN", &dir);
                if let Ok(path) = CString::new(text) {
                    return open(path.as_ptr());
                }
            }
            return open(file);
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
    // A library already loaded under this name (its soname) is what glibc returns first, before
    // any directory search.
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
    if !loaded.is_null() {
        let handle = open(file);
        // SAFETY: drops the extra reference the probe took, with the function that took it.
        #[allow(unsafe_code)]
        unsafe {
            if namespace == libc::LM_ID_BASE {
                real::dlclose()(loaded)
            } else {
                real_dlclose()(loaded)
            }
        };
        return handle;
    }
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
                return handle;
            }
        }
    }
    // Not in the caller's own directories: the rest of the search (cache, system directories)
    // is the same from any caller, and a failure leaves the loader's own message in dlerror.
    open(file)
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
        if let Some(now) = super::engine::loader_changed() {
            // SAFETY: `handle` was just returned by the real loader and is not yet the
            // caller's, so it stays open for this call.
            #[allow(unsafe_code)]
            let _ = unsafe { super::engine::rescan_opened(handle, now, Some(PATIENCE)) };
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
                    super::engine::note_other_namespace(path, Some(PATIENCE));
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

fn dlopen_via(
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

fn dlmopen_via(
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

fn dlclose_via(real: real::DlcloseFn, handle: *mut c_void) -> c_int {
    // Destructors, and our own rescan: as for `open_and_patch`.
    let _cancel = crate::sys::cancel::Deferred::begin();
    let depth = DepthGuard::enter();
    // SAFETY: the real dlclose with the caller's own handle.
    #[allow(unsafe_code)]
    let rc = unsafe { real(handle) };
    if rc == 0 && depth.0 == 1 {
        // Reading the counters cannot unwind (the walk's callback catches its own panics).
        if let Some(now) = super::engine::loader_changed() {
            // Unwind rules cached for code that may be gone: an address reused by a library
            // loaded later must not be unwound with them.
            if crate::stacks::depth() > 0 {
                crate::stacks::forget_unwind_rules();
            }
            let _ = guarded(
                || super::engine::rescan_closed(handle, now, Some(PATIENCE)),
                || Ok(0),
            );
        }
    }
    rc
}

/// `dlsym` with the caller's return address.
pub(super) extern "C" fn dlsym_from(
    handle: *mut c_void,
    symbol: *const c_char,
    caller: usize,
) -> *mut c_void {
    let reals = (real_dlsym(), real_dlvsym());
    lookup_as_caller(handle, symbol, std::ptr::null(), caller, reals)
}

/// `dlvsym` with the caller's return address.
pub(super) extern "C" fn dlvsym_from(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
    caller: usize,
) -> *mut c_void {
    let reals = (real_dlsym(), real_dlvsym());
    lookup_as_caller(handle, symbol, version, caller, reals)
}

/// The chained entries: the same interposers, each forwarding to what its slots held.
macro_rules! chain_entries {
    ($($k:literal: $open:ident, $mopen:ident, $close:ident, $sym:ident, $vsym:ident;)*) => {$(
        pub(super) extern "C" fn $open(file: *const c_char, mode: c_int, caller: usize) -> *mut c_void {
            dlopen_via(chained(&CHAIN_DLOPEN[$k], real_dlopen()), file, mode, caller)
        }
        pub(super) extern "C" fn $mopen(
            lmid: c_long,
            file: *const c_char,
            mode: c_int,
            caller: usize,
        ) -> *mut c_void {
            dlmopen_via(chained(&CHAIN_DLMOPEN[$k], real_dlmopen()), lmid, file, mode, caller)
        }
        pub(super) extern "C" fn $close(handle: *mut c_void, _caller: usize) -> c_int {
            dlclose_via(chained(&CHAIN_DLCLOSE[$k], real_dlclose()), handle)
        }
        pub(super) extern "C" fn $sym(
            handle: *mut c_void,
            symbol: *const c_char,
            caller: usize,
        ) -> *mut c_void {
            let reals = (chained(&CHAIN_DLSYM[$k], real_dlsym()), real_dlvsym());
            lookup_as_caller(handle, symbol, std::ptr::null(), caller, reals)
        }
        pub(super) extern "C" fn $vsym(
            handle: *mut c_void,
            symbol: *const c_char,
            version: *const c_char,
            caller: usize,
        ) -> *mut c_void {
            let reals = (real_dlsym(), chained(&CHAIN_DLVSYM[$k], real_dlvsym()));
            lookup_as_caller(handle, symbol, version, caller, reals)
        }
    )*};
}

chain_entries! {
    0: dlopen_from_c0, dlmopen_from_c0, dlclose_from_c0, dlsym_from_c0, dlvsym_from_c0;
    1: dlopen_from_c1, dlmopen_from_c1, dlclose_from_c1, dlsym_from_c1, dlvsym_from_c1;
}

fn lookup_as_caller(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
    caller: usize,
    (real_dlsym, real_dlvsym): (real::DlsymFn, real::DlvsymFn),
) -> *mut c_void {
    // SAFETY: the real lookup functions with the caller's own arguments.
    #[allow(unsafe_code)]
    let plain = |h: *mut c_void| unsafe {
        if version.is_null() {
            real_dlsym(h, symbol)
        } else {
            real_dlvsym(h, symbol, version)
        }
    };
    guarded(
        || {
            let mut found = if handle == libc::RTLD_NEXT && !symbol.is_null() {
                let real = if version.is_null() {
                    real_dlsym as usize
                } else {
                    real_dlvsym as usize
                };
                as_caller::lookup(real, handle, symbol, version, caller)
                    .unwrap_or_else(|| next_as_caller(symbol, version, caller, &plain))
            } else {
                plain(handle)
            };
            // RTLD_DEFAULT searches the caller's scope: the global scope, then the caller's own
            // dependencies (a library loaded RTLD_LOCAL finds its own dependencies' symbols).
            if found.is_null() && handle == libc::RTLD_DEFAULT {
                if let Some(own) = caller::handle_of(caller) {
                    found = plain(own);
                }
            }
            substitute(found as usize) as *mut c_void
        },
        || plain(handle),
    )
}

/// `RTLD_NEXT` relative to the caller, where the real lookup cannot be entered as the caller
/// (`as_caller`): the first object after it in load order that defines the symbol. Exact for the
/// main program, preloaded libraries and their dependencies; a library opened with `dlopen`
/// (whose scope is its own dependency list) may get a different answer or none.
fn next_as_caller(
    symbol: *const c_char,
    version: *const c_char,
    caller: usize,
    plain: &dyn Fn(*mut c_void) -> *mut c_void,
) -> *mut c_void {
    // SAFETY: NUL-terminated strings (dlsym's contract).
    #[allow(unsafe_code)]
    let (name, ver) = unsafe {
        (
            Some(CStr::from_ptr(symbol)),
            (!version.is_null()).then(|| CStr::from_ptr(version)),
        )
    };
    if let Some(name) = name {
        if let Some(found) = caller::next_definition(caller, name, ver) {
            return found as *mut c_void;
        }
    }
    // Nothing after the caller defines it: let the loader fail the same lookup relative to us,
    // which leaves its "undefined symbol" message in dlerror. If something after *us* defines
    // it, that is not what the caller asked for: fail with a lookup that cannot succeed.
    let found = plain(libc::RTLD_NEXT);
    if found.is_null() {
        return found;
    }
    // SAFETY: a version string that no object defines makes the real dlvsym fail cleanly.
    #[allow(unsafe_code)]
    unsafe {
        real_dlvsym()(
            libc::RTLD_DEFAULT,
            symbol,
            c"CUHOOK_RTLD_NEXT_NOT_FOUND".as_ptr(),
        )
    }
}
