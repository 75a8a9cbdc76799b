//! The one error type of cuhook.

use std::fmt;

/// Everything that can go wrong in cuhook, with enough context to act on.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A loaded object's dynamic section or tables could not be read.
    BadObject {
        /// Path of the object.
        object: String,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// Changing the protection of the page that holds a GOT slot failed.
    Protect {
        /// Path of the object holding the slot.
        object: String,
        /// Address of the slot.
        address: usize,
        /// `errno` of `mprotect`.
        errno: i32,
    },
    /// A slot sits on a page that is executable; making it writable would create a W+X mapping.
    ExecutableSlotPage {
        /// Path of the object holding the slot.
        object: String,
        /// Address of the slot.
        address: usize,
    },
    /// A slot lies on a page that is not readable now: the object made the page unreadable
    /// itself (before it was patched), or, for a slot to put back, was unmapped or replaced
    /// since. It is left alone.
    UnreadableSlot {
        /// Path of the object the slot was patched in.
        object: String,
        /// Address of the slot.
        address: usize,
    },
    /// The protection of a slot's page could not be read from the kernel's map of the process.
    QueryProtection {
        /// Address of the slot.
        address: usize,
        /// `errno` of reading `/proc/self/maps`.
        errno: i32,
    },
    /// A hook set names no symbols, a symbol twice, or a null replacement.
    InvalidHookSet {
        /// What is wrong with the set.
        reason: String,
    },
    /// A symbol name was not valid (empty, interior NUL, not UTF-8).
    InvalidSymbol {
        /// The name as given (lossily converted).
        symbol: String,
    },
    /// The hook set is not installed (uninstall of something never installed).
    NotInstalled,
    /// A C API argument was NULL or out of range.
    InvalidArgument {
        /// Which argument.
        what: &'static str,
    },
    /// Too many subscribers or hook sets at once.
    CapacityExceeded {
        /// What ran out (subscribers, hook sets, ...).
        what: &'static str,
        /// How many there may be at once.
        limit: usize,
    },
    /// No subscription matches the given (mask, callback, context).
    NoSuchSubscriber,
    /// Another copy of cuhook serves this process (`libcuhook.so` preloaded, or a library that
    /// embeds the crate installed first), and it refused the call that was forwarded to it.
    Forwarded {
        /// The object holding that copy.
        object: String,
        /// Its error message.
        message: String,
    },
    /// An engine operation was requested while this thread is already inside one (from a hook
    /// or a library constructor run by the engine's own loader calls), or the engine stayed busy.
    Busy,
    /// A file cuhook was asked to write (report, trace) could not be opened or written.
    Io {
        /// What was being done (`open the trace file`, ...).
        what: &'static str,
        /// `errno` of the failed call.
        errno: i32,
    },
}

/// `Result` with cuhook's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadObject { object, reason } => {
                write!(f, "cannot read the dynamic tables of `{object}`: {reason}")
            }
            Error::Protect { object, address, errno } => write!(
                f,
                "mprotect of the page holding GOT slot {address:#x} in `{object}` failed: {}",
                errno_text(*errno)
            ),
            Error::ExecutableSlotPage { object, address } => write!(
                f,
                "GOT slot {address:#x} in `{object}` lies on an executable page; cuhook never makes a page writable and executable"
            ),
            Error::UnreadableSlot { object, address } => write!(
                f,
                "GOT slot {address:#x} of `{object}` lies on a page that is not readable now (the object changed the page's protection, or was unmapped or replaced since it was patched); left alone"
            ),
            Error::QueryProtection { address, errno } => write!(
                f,
                "cannot read the protection of address {address:#x} from /proc/self/maps: {}",
                errno_text(*errno)
            ),
            Error::InvalidHookSet { reason } => write!(f, "invalid hook set: {reason}"),
            Error::InvalidSymbol { symbol } => write!(f, "invalid symbol name `{symbol}`"),
            Error::NotInstalled => write!(f, "the hook set is not installed"),
            Error::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            Error::CapacityExceeded { what, limit } => {
                write!(f, "too many {what} (the limit is {limit})")
            }
            Error::Busy => write!(
                f,
                "the patch engine is busy: another install/uninstall is running on this thread (called from a hook or constructor?)"
            ),
            Error::Io { what, errno } => write!(f, "cannot {what}: {}", errno_text(*errno)),
            Error::NoSuchSubscriber => {
                write!(f, "no subscriber is registered with that mask, callback and context")
            }
            Error::Forwarded { object, message } => write!(
                f,
                "the copy of cuhook in `{object}`, which serves this process, refused: {message}"
            ),
        }
    }
}

impl std::error::Error for Error {}

fn errno_text(errno: i32) -> String {
    // The errors cuhook's own output files meet by design (src/output.rs), explained.
    let hint = match errno {
        libc::ELOOP => {
            ": it is a symbolic link, which cuhook never writes through; name the file itself"
        }
        libc::ENXIO => ": it is a FIFO with no reader, and cuhook never waits for one",
        libc::EAGAIN => ": the reader of the pipe did not keep up, and cuhook never blocks on it",
        libc::EPIPE => ": the reader of the pipe has gone",
        _ => "",
    };
    format!(
        "{} (errno {errno}){hint}",
        std::io::Error::from_raw_os_error(errno)
    )
}
