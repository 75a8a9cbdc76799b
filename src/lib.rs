//! cuhook: intercept every CUDA allocation and free by GOT/PLT patching, dispatch each one as an
//! event, and keep an address-range registry that answers "is this pointer GPU memory, which
//! allocation?" in nanoseconds.
//!
//! Layers, each using only those below it: [`elf`] reads loaded objects, [`patch`] writes GOT
//! slots, [`hooks`] decides what to patch (and interposes the dynamic loader), [`events`]
//! dispatches, [`registry`] answers lookups, [`cuda`] holds the CUDA hook table and
//! classification, [`report`] and [`init`] are what users see, [`capi`] is the C surface.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod api;
pub mod capi;
pub mod cuda;
pub mod elf;
pub mod error;
pub mod events;
pub mod hooks;
pub mod init;
pub mod log;
pub mod output;
pub mod patch;
pub mod registry;
pub mod report;

pub use api::{
    hook_table, install, lookup, lookup_span, subscribe, subscribe_with_existing, Subscription,
};
pub use error::{Error, Result};
