//! The system layer: every call into glibc's dynamic loader (`dl`), the one conversion of an
//! address into a callable function (`func`), the `extern "C"` boundary (`boundary`),
//! cancellation deferred while host code runs inside our frames (`cancel`), one-time
//! initialisation that survives `fork` (`once`), and whether memory can be had before work that
//! allocates as it goes (`memory`). Modules above call these typed wrappers and
//! never name `libc::dl*` themselves, so the loader's contracts (handles, `struct link_map`,
//! `dlerror`'s thread-local message, callbacks that must not unwind) are kept in one place.

pub(crate) mod boundary;
pub(crate) mod cancel;
pub(crate) mod dl;
pub(crate) mod func;
pub(crate) mod memory;
pub(crate) mod once;
pub(crate) mod real;
