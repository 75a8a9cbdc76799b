//! Whether a `dlopen` that adds several objects (a library with new dependencies) is handled
//! from the object it opened (`engine/opened.rs`, the group path) or by a whole sync.
//!
//! Off unless asked for (`CUHOOK_GROUP_DLOPEN=1`, or [`set_group_dlopen`]): on the H200 a
//! library with the group path on crashed PyTorch (a segmentation fault at its first CUDA
//! work; CuPy and JAX ran) in the eighteenth and nineteenth sessions, and the cause is not yet
//! found (docs/gpu-results.md). The whole sync is the path every real client has run with.

use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not decided yet (the environment is read on first use); 1: off; 2: on.
static GROUP_DLOPEN: AtomicU8 = AtomicU8::new(0);

/// Turns the group path on or off for this process (it overrides `CUHOOK_GROUP_DLOPEN`).
pub fn set_group_dlopen(on: bool) {
    GROUP_DLOPEN.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether the group path is on: as set, else as `CUHOOK_GROUP_DLOPEN` says (`1`, `true`,
/// `yes` or `on`), read once.
pub fn group_dlopen() -> bool {
    match GROUP_DLOPEN.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("CUHOOK_GROUP_DLOPEN").is_some_and(|v| {
                matches!(v.to_str().map(str::trim), Some("1" | "true" | "yes" | "on"))
            });
            // A concurrent `set_group_dlopen` wins over the environment.
            let _ = GROUP_DLOPEN.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            GROUP_DLOPEN.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}
