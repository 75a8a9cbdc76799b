//! What a subscriber is: a function to call and how it is identified for `unsubscribe`.

use std::num::NonZeroU64;

use super::types::MemEvent;

/// A subscriber's function.
///
/// Two forms, so that the C API can register a C function without boxing anything: the adapter
/// turns the [`MemEvent`] into the C struct and calls `target` (the C function's address) with the
/// C argument (`context`). Identity for `unsubscribe` is the function address(es) plus the
/// context, like ucm's `(callback, arg)`. Distinct functions with identical bodies may be merged
/// by the linker and then compare equal; register with distinct contexts if that matters.
#[derive(Clone, Copy, Debug)]
pub enum Callback {
    /// A Rust function: `f(event, context)`. Panics are caught and counted.
    Rust(fn(&MemEvent, usize)),
    /// A foreign function reached through an adapter: `adapter(target, event, context)`.
    Foreign {
        /// Converts the event and calls `target`; must not unwind into C (panics are caught here).
        adapter: fn(usize, &MemEvent, usize),
        /// The foreign function's address, passed through untouched.
        target: usize,
    },
}

impl Callback {
    #[inline(always)]
    pub(crate) fn call(&self, ev: &MemEvent, context: usize) {
        match *self {
            Callback::Rust(f) => f(ev, context),
            Callback::Foreign { adapter, target } => {
                // The host's code (a C callback) may reach a cancellation point: the request
                // waits until the hooked call has returned to the host (`crate::sys::cancel`).
                // Closures of the Rust API defer it in their trampoline (`closure.rs`);
                // cuhook's own subscribers (the report's counters, the trace, whose writes
                // defer it themselves) pay nothing for it.
                let _cancel = crate::sys::cancel::Deferred::begin();
                adapter(target, ev, context)
            }
        }
    }

    /// The addresses that identify this callback (compared as integers: comparing function
    /// pointers directly is deliberately linted against, and addresses are what ucm compares).
    fn key(&self) -> (usize, usize) {
        match *self {
            Callback::Rust(f) => (f as usize, 0),
            Callback::Foreign { adapter, target } => (adapter as usize, target),
        }
    }
}

impl PartialEq for Callback {
    fn eq(&self, other: &Callback) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Callback {}

/// Names one subscription for [`super::SubscriberList::unsubscribe_id`]. Never reused within a
/// process, so a stale id cannot remove someone else's subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubscriptionId(pub(crate) NonZeroU64);

impl SubscriptionId {
    /// The id as an integer (for C handles and logs).
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// The id an integer from [`SubscriptionId::get`] names (`None` for 0).
    pub fn from_raw(id: u64) -> Option<SubscriptionId> {
        NonZeroU64::new(id).map(SubscriptionId)
    }
}
