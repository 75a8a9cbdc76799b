//! A current context for threads that meet context-less memory (pool and VMM allocations belong
//! to no context) while none is current: the device's primary context is retained and made
//! current, as Open MPI does, so that the caller's next driver calls on that memory (copies,
//! IPC handles, probes on drivers that want a context) have one.
//!
//! # At most one reference per thread, released never
//!
//! A thread holds at most one reference that cuhook took, remembered in a const-initialised
//! thread-local without a destructor (it may be read from hooks and late in thread teardown).
//! The reference is never released: cuhook cannot know when the caller is done with the
//! context it found current (it may have created streams or opened IPC handles in it), and
//! releasing the last reference destroys the primary context with everything in it. The cost
//! is one primary-context reference per thread that ever needed one, left at thread exit: for
//! a device the application uses through the runtime (which holds its own reference) that is a
//! counter, not a context. A thread-exit destructor could release it, but would have to call
//! the driver during thread (or process) teardown, when the driver may already be gone.
//!
//! When the thread already holds its reference and finds no context current again (the
//! application cleared it), the held context is made current again; that is also the answer
//! for context-less memory of another device. Taking a second reference would break the bound,
//! and swapping (retain the new one, release the old) could destroy the old context under the
//! caller, as above. Driver queries on UVA pointers do not depend on which device's context is
//! current.

use std::cell::Cell;

use super::interface::{DriverApi, CUDA_SUCCESS};

/// The reference this thread holds: which classifier took it (so independent classifiers, as in
/// tests, never share one), for which device, and the context.
#[derive(Clone, Copy)]
struct Held {
    owner: usize,
    device: i32,
    ctx: usize,
}

const NOTHING: Held = Held {
    owner: 0,
    device: -1,
    ctx: 0,
};

thread_local! {
    static HELD: Cell<Held> = const { Cell::new(NOTHING) };
}

/// What [`ensure_current`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A context was already current (or the driver cannot tell): nothing changed.
    AlreadyCurrent,
    /// The context this thread already holds was made current again (no new reference).
    Reused { device: i32 },
    /// The device's primary context was retained (the thread's one reference) and made current.
    Retained { device: i32 },
    /// Nothing could be made current (no device ordinal, or the driver refused).
    Failed,
}

/// Make sure the calling thread has a current context, retaining `device`'s primary context
/// only if the thread holds no reference from `owner` yet.
pub fn ensure_current<D: DriverApi>(driver: &D, owner: usize, device: i32) -> Outcome {
    match driver.ctx_get_current() {
        Ok(0) => {}
        // A context is current, or the driver cannot say: never stack a reference blindly.
        Ok(_) | Err(_) => return Outcome::AlreadyCurrent,
    }
    let held = HELD.try_with(Cell::get).unwrap_or(NOTHING);
    if held.owner == owner && held.ctx != 0 {
        return if driver.ctx_set_current(held.ctx) == CUDA_SUCCESS {
            Outcome::Reused {
                device: held.device,
            }
        } else {
            Outcome::Failed
        };
    }
    if device < 0 {
        return Outcome::Failed;
    }
    let Ok(ctx) = driver.primary_ctx_retain(device) else {
        return Outcome::Failed;
    };
    if ctx == 0 {
        return Outcome::Failed;
    }
    // Remembered before making it current: the reference is held whatever happens next.
    let _ = HELD.try_with(|h| h.set(Held { owner, device, ctx }));
    if driver.ctx_set_current(ctx) == CUDA_SUCCESS {
        Outcome::Retained { device }
    } else {
        Outcome::Failed
    }
}
