//! The lookup side of the loader interposers: `dlsym`/`dlvsym` answered as for the caller
//! (`RTLD_NEXT` relative to it, `RTLD_DEFAULT` in its scope), a found original replaced by its
//! hook.

use std::ffi::{c_char, c_void, CStr};

use super::{as_caller, caller, real_dlsym, real_dlvsym};
use crate::hooks::substitution::substitute;
use crate::sys::boundary::guarded;
use crate::sys::real;

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

/// `dlsym`/`dlvsym` (a null `version`: `dlsym`) as the caller would have looked up, through
/// the given real functions; a found original is handed out as its hook.
pub(super) fn lookup_as_caller(
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
            let real = if version.is_null() {
                real_dlsym as usize
            } else {
                real_dlvsym as usize
            };
            let mut found = if handle == libc::RTLD_NEXT && !symbol.is_null() {
                as_caller::lookup(real, handle, symbol, version, caller)
                    .unwrap_or_else(|| next_as_caller(symbol, version, caller, &plain))
            } else {
                plain(handle)
            };
            // RTLD_DEFAULT searches the caller's scope: the global scope (asked from our object
            // above), then, for a library opened RTLD_LOCAL, the group it was loaded with. Only
            // a miss pays for the second part: entered as the caller, the loader answers
            // exactly; where it cannot be (not x86_64, a shadow stack), the caller's own
            // dependency list stands in for its group.
            if found.is_null() && handle == libc::RTLD_DEFAULT && !symbol.is_null() {
                found = match as_caller::lookup(real, handle, symbol, version, caller) {
                    Some(exact) => exact,
                    None => match caller::pinned(caller).map(|own| plain(own.handle())) {
                        Some(in_own) if !in_own.is_null() => in_own,
                        // Closing the pin cleared the loader's message: fail once more, so
                        // that `dlerror` tells the caller why.
                        _ => plain(handle),
                    },
                };
                if !found.is_null() {
                    // Found after all: the global scope's miss leaves no message behind.
                    crate::sys::dl::clear_error();
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
