//! Whether a `dlopen` that adds several objects (a library with new dependencies) is handled
//! from the object it opened (`engine/opened.rs`, the group path) or by a whole sync.
//!
//! On unless turned off (`CUHOOK_GROUP_DLOPEN=0`, or [`set_group_dlopen`]). It was off from the
//! nineteenth to the twenty-second session: with it, PyTorch crashed on the H200. The cause was
//! our `dlsym` interposer, not this path: a `RTLD_DEFAULT` miss retried on the caller's bare
//! link map, which has no dependency list of its own unless the object was opened by name, as
//! every object was when a whole sync pinned it (docs/gpu-results.md, twenty-second session).

use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not decided yet (the environment is read on first use); 1: off; 2: on.
static GROUP_DLOPEN: AtomicU8 = AtomicU8::new(0);

/// Turns the group path on or off for this process (it overrides `CUHOOK_GROUP_DLOPEN`).
pub fn set_group_dlopen(on: bool) {
    GROUP_DLOPEN.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether the group path is on: as set, else as `CUHOOK_GROUP_DLOPEN` says, read once (what
/// a library that installs through the API, with the constructor's configuration off, gets).
pub fn group_dlopen() -> bool {
    match GROUP_DLOPEN.load(Ordering::Relaxed) {
        0 => {
            let on = crate::sys::process::env_flag_or("CUHOOK_GROUP_DLOPEN", true);
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
