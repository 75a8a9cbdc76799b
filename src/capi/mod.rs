//! The C API (`include/cuhook.h`): thin `extern "C"` wrappers that validate arguments, map
//! errors to status codes and never let a panic unwind into C.

mod engine_api;
mod status;

pub use engine_api::{CHook, CSlotInfo, CUninstallReport};
pub use status::*;
