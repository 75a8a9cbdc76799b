//! cuhook: intercept every CUDA allocation and free by GOT/PLT patching.
#![deny(unsafe_code)]

pub mod error;
pub mod events;
pub mod registry;

pub use error::{Error, Result};
pub mod capi;
pub mod cuda;
pub mod elf;
pub mod hooks;
pub mod patch;
