//! The C API (`include/cuhook.h`): thin `extern "C"` wrappers that validate arguments, map
//! errors to status codes and never let a panic unwind into C.

mod binding_api;
mod classify_api;
mod cuda_api;
mod engine_api;
mod layout;
mod status;

pub use cuda_api::{CMemEvent, CMemInfo};
pub use engine_api::{CHook, CSlotInfo, CUninstallReport};
pub use status::*;
