//! Closures as subscribers: a boxed `Fn(&MemEvent)` behind the list's `(function, context)`
//! pair, so the list itself stays free of allocation and dynamic dispatch for the common case.
//!
//! The box's address is the subscription's context; one adapter function calls through it.
//! The box is freed only after the unsubscribe that removed it has returned, which guarantees
//! that the callback runs on no thread any more (the list's grace period).
//!
//! # Safety
//! A context made by [`Boxed::new`] is dereferenced by [`call`] only while its subscription is
//! live, and freed once by [`Boxed::free`] after the subscription is gone.
#![allow(unsafe_code)]

use super::callback::Callback;
use super::types::MemEvent;

/// What a closure subscriber is stored as.
type Closure = Box<dyn Fn(&MemEvent) + Send + Sync + 'static>;

/// A closure moved to the heap, to be handed to the list as `(Callback, context)`.
#[derive(Debug)]
pub(crate) struct Boxed(usize);

impl Boxed {
    /// Box `f`.
    pub(crate) fn new<F>(f: F) -> Boxed
    where
        F: Fn(&MemEvent) + Send + Sync + 'static,
    {
        let closure: Closure = Box::new(f);
        Boxed(Box::into_raw(Box::new(closure)) as usize)
    }

    /// The subscriber that calls the closure, and its context.
    pub(crate) fn subscriber(&self) -> (Callback, usize) {
        (Callback::Rust(call), self.0)
    }

    /// Free the closure.
    ///
    /// # Safety
    /// No subscription with this context is live, and no thread runs the closure any more
    /// (the unsubscribe that removed it has returned).
    pub(crate) unsafe fn free(self) {
        // SAFETY: made by `Box::into_raw` in `new`, freed once (self is consumed), unused now.
        drop(unsafe { Box::from_raw(self.0 as *mut Closure) });
    }
}

/// The adapter: `context` is the address of a live closure (see the module doc).
fn call(ev: &MemEvent, context: usize) {
    // The user's code: cancellation deferred as for a foreign callback (`Callback::call`).
    let _cancel = crate::sys::cancel::Deferred::begin();
    // SAFETY: the list calls this only with the context of a live subscription, whose closure
    // is freed after the subscription is gone.
    unsafe { call_boxed(ev, context) }
}

/// Call the closure whose context is `context` (for a subscription another copy of cuhook
/// dispatches).
///
/// # Safety
/// `context` comes from [`Boxed::subscriber`] of a closure not yet freed.
pub(crate) unsafe fn call_boxed(ev: &MemEvent, context: usize) {
    // SAFETY: as the caller promises.
    let f = unsafe { &*(context as *const Closure) };
    f(ev)
}
