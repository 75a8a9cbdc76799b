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
//!
//! Rooms: `entry` (the naked entries), `open` (`dlopen`, `dlmopen`, `dlclose`), `lookup` (`dlsym`,
//! `dlvsym`), `caller` and `as_caller` (what the caller's object would see); here, the hook set,
//! the real functions and the chained entries.

mod as_caller;
mod caller;
mod entry;
mod lookup;
mod open;

use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::engine::DL_SET_NAME;
use crate::sys::real;
use lookup::lookup_as_caller;
use lookup::{dlsym_from, dlvsym_from};
use open::{dlclose_from, dlmopen_from, dlopen_from};
use open::{dlclose_via, dlmopen_via, dlopen_via};

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
