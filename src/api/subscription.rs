//! Subscriptions of closures, served by this copy of cuhook or by the one that owns the
//! process (`crate::instance`).

use std::ffi::c_void;

use crate::events::closure::Boxed;
use crate::events::{self, EventMask, MemEvent, SubscriptionId};
use crate::instance::{Peer, Record, Route};
use crate::Result;

use super::installation::call;

/// A live subscription; dropping it unsubscribes, after which the callback runs on no thread
/// (and a closure is dropped).
#[must_use = "dropping the subscription unsubscribes"]
#[derive(Debug)]
pub struct Subscription {
    held: Option<Held>,
}

#[derive(Debug)]
enum Held {
    Own(SubscriptionId, Boxed),
    Other(&'static Peer, u64, Boxed),
}

impl Subscription {
    /// Subscribe `f` through `route`; `existing`: first replay the registry's ranges (this
    /// copy's registry only: another copy's is not replayed).
    pub(crate) fn new<F>(
        route: Route,
        mask: EventMask,
        priority: i32,
        f: F,
        existing: bool,
    ) -> Result<Subscription>
    where
        F: Fn(&MemEvent) + Send + Sync + 'static,
    {
        let boxed = Boxed::new(f);
        let (callback, context) = boxed.subscriber();
        let subscribed = match route {
            Route::Own if existing => events::subscribe_with_replay(
                mask,
                priority,
                callback,
                context,
                crate::cuda::replay_existing,
            )
            .map(|id| Held::Own(id, boxed)),
            Route::Own => {
                events::subscribe(mask, priority, callback, context).map(|id| Held::Own(id, boxed))
            }
            Route::Other(peer) => {
                let mut id = 0u64;
                call(peer, |m| {
                    // SAFETY: the table's contract: a callback that never unwinds, whose
                    // context (the boxed closure) lives until the unsubscribe returned, and
                    // writable out-parameters.
                    #[allow(unsafe_code)]
                    unsafe {
                        (peer.subscribe)(
                            mask.bits(),
                            priority,
                            from_other_copy,
                            context as *mut c_void,
                            &mut id,
                            m,
                        )
                    }
                })
                .map(|()| Held::Other(peer, id, boxed))
            }
        };
        match subscribed {
            Ok(held) => Ok(Subscription { held: Some(held) }),
            Err(e) => Err(e),
        }
    }

    /// Unsubscribe now, reporting errors.
    pub fn unsubscribe(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        let (result, boxed) = match self.held.take() {
            None => return Ok(()),
            Some(Held::Own(id, boxed)) => (events::unsubscribe_id(id), boxed),
            Some(Held::Other(peer, id, boxed)) => (
                call(peer, |m| {
                    // SAFETY: the table's contract: a writable message buffer.
                    #[allow(unsafe_code)]
                    unsafe {
                        (peer.unsubscribe)(id, m)
                    }
                }),
                boxed,
            ),
        };
        if result.is_ok() {
            // SAFETY: the subscription is gone and its callback runs on no thread.
            #[allow(unsafe_code)]
            unsafe {
                boxed.free()
            };
        }
        // Otherwise it is still subscribed somewhere: the closure stays allocated for good.
        result
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Another copy's dispatch calls this with the record of an event; `context` is the boxed
/// closure. Never unwinds (a panic in the closure is caught here and the event dropped).
#[allow(unsafe_code)]
unsafe extern "C" fn from_other_copy(record: *const Record, context: *mut c_void) {
    crate::sys::boundary::guarded(
        || {
            // SAFETY: the other copy passes a valid record whose API name lives in its pinned
            // object.
            let Some(ev) = (unsafe { record.as_ref().and_then(|r| r.event()) }) else {
                return;
            };
            // SAFETY: `context` is the boxed closure of a live subscription (the other copy
            // calls no callback after the unsubscribe returned, and only then is it freed).
            unsafe { crate::events::closure::call_boxed(&ev, context as usize) };
        },
        || (),
    )
}
