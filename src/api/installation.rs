//! The guard of an installation of the CUDA hooks, served by this copy of cuhook or by the one
//! that owns the process (`crate::instance`).

use std::ffi::c_char;

use crate::hooks::{self, UninstallReport};
use crate::instance::{self, Peer, Route};
use crate::{Error, Result};

/// A live installation of the CUDA hooks and the registry. Dropping it uninstalls (errors are
/// then ignored: call [`Installation::uninstall`] to see them). The hooks stay as long as any
/// installation holds them (each [`crate::install`] counts once).
///
/// It may be dropped or uninstalled on any thread. When another copy of cuhook owns the process
/// (`libcuhook.so` preloaded, say), the installation is that copy's, counted there the same way.
#[must_use = "dropping the installation uninstalls the hooks"]
#[derive(Debug)]
pub struct Installation(Held);

#[derive(Debug)]
enum Held {
    Own(hooks::Installation),
    Other { peer: &'static Peer, id: u64 },
    Gone,
}

impl Installation {
    /// Install through `route`.
    pub(crate) fn new(route: Route) -> Result<Installation> {
        match route {
            Route::Own => Ok(Installation(Held::Own(crate::cuda::install()?))),
            Route::Other(peer) => {
                let mut id = 0u64;
                call(peer, |m| {
                    // SAFETY: the table's contract: a writable id and message buffer.
                    #[allow(unsafe_code)]
                    unsafe {
                        (peer.install)(&mut id, m)
                    }
                })?;
                Ok(Installation(Held::Other { peer, id }))
            }
        }
    }

    /// The installation's id (in the copy that serves it).
    pub fn id(&self) -> u64 {
        match &self.0 {
            Held::Own(i) => i.id(),
            Held::Other { id, .. } => *id,
            Held::Gone => 0,
        }
    }

    /// Whether another copy of cuhook in the process serves this installation.
    pub fn is_forwarded(&self) -> bool {
        matches!(self.0, Held::Other { .. })
    }

    /// Undo this installation: when it was the last, every slot the CUDA hooks patched is put
    /// back (compare-and-swap: slots re-patched by someone else are left alone and reported)
    /// and the registry is emptied. For an installation another copy serves, only
    /// `still_referenced` is filled in.
    pub fn uninstall(mut self) -> Result<UninstallReport> {
        self.finish()
    }

    /// Keep the hooks installed for the rest of the process; returns the id.
    pub fn leak(mut self) -> u64 {
        let id = self.id();
        match std::mem::replace(&mut self.0, Held::Gone) {
            Held::Own(i) => {
                i.leak();
            }
            Held::Other { .. } | Held::Gone => {}
        }
        id
    }

    fn finish(&mut self) -> Result<UninstallReport> {
        match std::mem::replace(&mut self.0, Held::Gone) {
            Held::Own(i) => i.uninstall(),
            Held::Other { peer, id } => {
                let mut still = 0;
                call(peer, |m| {
                    // SAFETY: the table's contract: writable out-parameters.
                    #[allow(unsafe_code)]
                    unsafe {
                        (peer.uninstall)(id, &mut still, m)
                    }
                })?;
                Ok(UninstallReport {
                    still_referenced: still != 0,
                    ..UninstallReport::default()
                })
            }
            Held::Gone => Err(Error::NotInstalled),
        }
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        if !matches!(self.0, Held::Gone) {
            let _ = self.finish();
        }
    }
}

/// Undo the installation `id` that `route`'s copy made for this one (the C API keeps ids, not
/// guards).
pub(crate) fn uninstall_forwarded(route: Route, id: u64) -> Result<UninstallReport> {
    match route {
        Route::Own => crate::cuda::uninstall_id(id),
        Route::Other(peer) => Installation(Held::Other { peer, id }).uninstall(),
    }
}

/// Call a fallible entry of another copy's table; its message becomes [`Error::Forwarded`].
pub(crate) fn call(peer: &Peer, f: impl FnOnce(*mut c_char) -> i32) -> Result<()> {
    let mut message = [0u8; instance::MESSAGE];
    if f(message.as_mut_ptr().cast()) == 0 {
        return Ok(());
    }
    let end = message
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(message.len());
    Err(Error::Forwarded {
        object: instance::object_of(peer),
        message: String::from_utf8_lossy(&message[..end]).into_owned(),
    })
}
