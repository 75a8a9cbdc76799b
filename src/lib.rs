//! cuhook sees every CUDA memory allocation and free in a Linux process — synchronous,
//! stream-ordered, pool, VMM, managed and pinned host memory, through the driver or the runtime,
//! shared or statically linked — by patching the GOT/PLT slots of every loaded object (and of
//! every object loaded later). Each allocation and free becomes an event for lock-free
//! subscribers, and an address-range registry answers "is this pointer GPU memory, which
//! allocation?" in nanoseconds, from any thread.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use cuhook::events::{EventMask, MemEvent, MemType};
//!
//! static FREES: AtomicUsize = AtomicUsize::new(0);
//!
//! let hooks = cuhook::install()?; // patch every loaded object, start the registry
//! // Runs on the freeing thread before the memory goes: drop cached registrations here.
//! let subscription = cuhook::subscribe(EventMask::FREE, 0, |_ev: &MemEvent| {
//!     FREES.fetch_add(1, Ordering::Relaxed);
//! })?;
//!
//! // Host memory is in no CUDA allocation: the registry says so without asking the driver.
//! let buf = vec![0u8; 4096];
//! assert!(cuhook::lookup_span(buf.as_ptr(), buf.len()).is_none());
//! // With no CUDA driver loaded, classification falls back to host memory.
//! assert_eq!(cuhook::cuda::classify(buf.as_ptr() as usize).mem_type, MemType::Host);
//!
//! drop(subscription); // the closure runs on no thread after this
//! hooks.uninstall()?; // every patched slot back as it was
//! # Ok::<(), cuhook::Error>(())
//! ```
//!
//! Built as `libcuhook.so` it installs itself from a constructor (`LD_PRELOAD`, or linked into a
//! host library) and offers the same API to C (`include/cuhook.h`; `scripts/install-c.sh`
//! installs the versioned library, header and pkg-config file). The `cuhook` command runs a
//! program under the hooks (`cuhook run`), with an exit report and a trace that `cuhook view`
//! draws.
//!
//! Modules, each using only those below it: [`hooks`] decides what to patch (and interposes the
//! dynamic loader; its generic engine hooks any symbol), [`events`] dispatches, [`registry`]
//! answers lookups, [`cuda`] holds the CUDA hook table and classification, [`report`] is what
//! users see (exit report, trace, reading traces back). The ELF reader, the slot writer, the
//! logger and the C API's Rust side are internal.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub(crate) mod api;
mod atomics;
/// The C API (`include/cuhook.h`): exported `extern "C"` functions, not for Rust callers.
#[doc(hidden)]
pub mod capi;
pub mod cuda;
#[cfg(cuhook_diag = "timing")]
mod diag;
/// ELF readers, public only for the ELF fuzz harness and the engine tests: not part of the API.
#[doc(hidden)]
pub mod elf;
pub mod error;
pub mod events;
pub mod hooks;
pub mod init;
mod instance;
mod locks;
#[doc(hidden)]
pub mod log;
#[doc(hidden)]
pub mod output;
mod patch;
pub mod registry;
pub mod report;
pub mod stacks;
mod sys;

pub use api::{
    hook_table, install, lookup, lookup_span, record_stacks, stats, subscribe,
    subscribe_with_existing, Address, Installation, Subscription,
};
pub use error::{Error, Result};

/// The README's Rust snippets, compiled as doc-tests (its shell and C snippets are run and
/// compiled by hook-tests/install.rs).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
