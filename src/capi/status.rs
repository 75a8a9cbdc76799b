//! Status codes of the C API and the guard that keeps panics from crossing `extern "C"`.

use crate::Error;

/// Success.
pub const CUHOOK_OK: i32 = 0;
/// A NULL pointer or out-of-range argument.
pub const CUHOOK_ERR_INVALID_ARGUMENT: i32 = -1;
/// The object tables of a loaded object could not be read.
pub const CUHOOK_ERR_BAD_OBJECT: i32 = -2;
/// A page protection could not be changed or read.
pub const CUHOOK_ERR_PROTECTION: i32 = -3;
/// Nothing installed under that id.
pub const CUHOOK_ERR_NOT_INSTALLED: i32 = -4;
/// A fixed capacity (subscribers, hook sets) is exhausted.
pub const CUHOOK_ERR_CAPACITY: i32 = -5;
/// No such subscriber.
pub const CUHOOK_ERR_NO_SUCH_SUBSCRIBER: i32 = -6;
/// The engine is busy (re-entrant call from a hook or a constructor).
pub const CUHOOK_ERR_BUSY: i32 = -7;
/// A Rust panic was caught at the C boundary (a bug: please report it).
pub const CUHOOK_ERR_INTERNAL: i32 = -8;
/// The registry holds no allocation at that address.
pub const CUHOOK_ERR_NOT_FOUND: i32 = -9;
/// A file (report, trace) could not be opened or written.
pub const CUHOOK_ERR_IO: i32 = -10;

/// The C status of an error.
pub fn status_of(e: &Error) -> i32 {
    match e {
        Error::BadObject { .. } => CUHOOK_ERR_BAD_OBJECT,
        Error::Protect { .. }
        | Error::ExecutableSlotPage { .. }
        | Error::UnreadableSlot { .. }
        | Error::QueryProtection { .. } => CUHOOK_ERR_PROTECTION,
        Error::InvalidHookSet { .. }
        | Error::InvalidSymbol { .. }
        | Error::InvalidArgument { .. } => CUHOOK_ERR_INVALID_ARGUMENT,
        Error::NotInstalled => CUHOOK_ERR_NOT_INSTALLED,
        Error::CapacityExceeded { .. } => CUHOOK_ERR_CAPACITY,
        Error::NoSuchSubscriber => CUHOOK_ERR_NO_SUCH_SUBSCRIBER,
        Error::Busy => CUHOOK_ERR_BUSY,
        Error::Io { .. } => CUHOOK_ERR_IO,
        Error::Forwarded { .. } => CUHOOK_ERR_INTERNAL,
    }
}

/// A fixed message for a status (static, NUL-terminated, for `cuhook_strerror`).
pub fn message_of(status: i32) -> &'static std::ffi::CStr {
    match status {
        CUHOOK_OK => c"success",
        CUHOOK_ERR_INVALID_ARGUMENT => {
            c"invalid argument (NULL pointer, bad symbol name or out-of-range value)"
        }
        CUHOOK_ERR_BAD_OBJECT => c"a loaded object's dynamic tables could not be read",
        CUHOOK_ERR_PROTECTION => c"the protection of a GOT page could not be read or changed",
        CUHOOK_ERR_NOT_INSTALLED => c"nothing is installed under that id",
        CUHOOK_ERR_CAPACITY => c"capacity exceeded (too many subscribers or hook sets)",
        CUHOOK_ERR_NO_SUCH_SUBSCRIBER => {
            c"no subscriber matches that event mask, callback and argument"
        }
        CUHOOK_ERR_BUSY => c"cuhook is busy (called re-entrantly from a hook or constructor)",
        CUHOOK_ERR_INTERNAL => c"internal error in cuhook (a bug; please report it)",
        CUHOOK_ERR_NOT_FOUND => c"no known allocation contains that address range",
        CUHOOK_ERR_IO => c"a report or trace file could not be opened or written",
        _ => c"unknown cuhook status",
    }
}

/// Run `f` at an `extern "C"` boundary: errors become statuses, panics become
/// `CUHOOK_ERR_INTERNAL` instead of aborting the host process.
pub fn ffi_call(f: impl FnOnce() -> crate::Result<i32>) -> i32 {
    crate::sys::boundary::guarded(
        || match f() {
            Ok(v) => v,
            Err(e) => status_of(&e),
        },
        || CUHOOK_ERR_INTERNAL,
    )
}
