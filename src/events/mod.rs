//! Events: what one allocation or free looks like, and (later) the subscriber list that dispatches it.

mod types;

pub use types::{flags, mask, EventKind, MemEvent, MemType};
