//! The system layer, the only one that talks to the OS and the loader: every call into glibc's
//! dynamic loader (`dl`), the one conversion of an address into a callable function (`func`),
//! the `extern "C"` boundary (`boundary`), cancellation deferred while host code runs inside our
//! frames (`cancel`), one-time initialisation that survives `fork` (`once`), whether memory can
//! be had before work that allocates as it goes (`memory`), descriptors as owned values and the
//! one identity check (`fd`), raw writes and the one way to stderr (`write`), the kernel's view
//! of our mappings (`maps`: `PROCMAP_QUERY`; `maps_text`: `/proc/self/maps`), thread ids (`thread`),
//! process-wide barriers (`membarrier`), and the process's start, exit and clock (`process`).
//! Modules above call these typed wrappers and name `libc` only for types, constants and pure
//! computations, so the contracts (the loader's handles and `dlerror`, descriptors the host
//! may reuse, `SIGPIPE`) are kept in one place.

pub(crate) mod boundary;
pub(crate) mod cancel;
pub(crate) mod dl;
pub(crate) mod fd;
pub(crate) mod func;
pub(crate) mod maps;
pub(crate) mod maps_text;
pub(crate) mod membarrier;
pub(crate) mod memory;
pub(crate) mod once;
pub(crate) mod process;
pub(crate) mod real;
pub(crate) mod thread;
pub(crate) mod write;
