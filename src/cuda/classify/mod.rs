//! Pointer classification: what kind of memory a pointer points to, for pointers the registry
//! has never seen (allocated before the hooks were installed, or through a path not hooked).
//!
//! [`classify`] looks in the registry first (nanoseconds) and otherwise asks the driver with
//! Open MPI's algorithm, improved (`classifier.rs`): one batched pointer-attribute query, the
//! VMM and memory-pool probes for memory that belongs to no context, the primary context made
//! current for threads that have none (`context.rs`), pool support read once per device, and
//! an immediate "host" with no driver call when there is no driver or no device.
//!
//! The driver sits behind the [`DriverApi`] trait: [`LibCuda`] calls the process's real (or fake)
//! libcuda through `dlsym`'d function pointers, never through cuhook's hooks; the unit tests
//! script it.
//!
//! # Driver answers are not cached in the registry
//!
//! A range the driver classified is not inserted into the registry, for three reasons:
//! - Only a hooked free removes a range. Without the hooks installed (classification works
//!   without them), or for a free on a path cuhook does not hook, a cached range outlives its
//!   memory, and the address, reused by a later allocation of another kind, is misclassified
//!   for good. A miss only costs one driver query.
//! - The driver's idea of a range (for VMM: the mapping, or the whole reservation) need not
//!   match the registry's; an insert overlapping a hooked record would evict it and count a
//!   missed free.
//! - The registry is the record of allocations the hooks *saw*: subscribers replay it
//!   (`CUHOOK_EVENT_FLAG_EXISTING_ALLOC`) and reports count it. Guesses would show up there as
//!   allocation events that never happened.
//!
//! Host answers are never cached by anyone: host memory can be unmapped and reused.
//! Callers that want a cache of their own can keep driver answers ([`Source::Driver`]).

mod classification;
mod classifier;
mod context;
mod interface;
mod libcuda;

#[cfg(test)]
mod mock;
#[cfg(test)]
mod tests;

pub use classification::{Classification, Source};
pub use classifier::{Classifier, PoolMode, MIXED_POOLS_WARNING};
pub use interface::{attr, DriverApi, DriverResult};
pub use libcuda::LibCuda;

/// The classifier over the process's libcuda.
static GLOBAL: Classifier<LibCuda> = Classifier::new(LibCuda::new(), warn);

/// The classifier's one-line warnings, on stderr as every diagnostic (`sys::write::stderr`:
/// usable from a library constructor or late in process exit, and never killed by `SIGPIPE`).
fn warn(line: &str) {
    crate::sys::write::stderr(line.as_bytes());
}

/// The process-wide classifier (driver answers only; [`classify`] asks the registry first).
pub fn classifier() -> &'static Classifier<LibCuda> {
    &GLOBAL
}

/// What kind of memory `ptr` points to: the registry's record if it has one, else the driver's
/// answer, else host.
pub fn classify(ptr: usize) -> Classification {
    match crate::registry::hot().lookup(ptr) {
        Some(a) => Classification::from_allocation(a),
        None => GLOBAL.classify(ptr),
    }
}
