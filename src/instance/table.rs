//! The table one copy of cuhook offers the others (`Peer`), its entry points, and the ELF note
//! through which a copy is found even inside a program (whose symbols are not exported).
//!
//! Only plain C types cross between copies: the copies may be different builds, so nothing of
//! Rust's layout (enums, `&str`, trait objects) is shared, and the table starts with a magic,
//! an ABI number and its own size, which a copy checks before it uses any other field.
//!
//! # Safety
//! The entry points are `extern "C"` and catch every panic ([`guarded`]); pointers they
//! receive are checked for NULL and otherwise are what the table's caller promises (writable
//! out-parameters, a callback valid until its subscription is removed).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::events::{self, Callback, EventKind, MemEvent, MemType};
use crate::registry::{self, Allocation, RegistryStats};
use crate::sys::boundary::guarded;
use crate::Error;

/// What the note's descriptor points at starts with these bytes.
pub(crate) const MAGIC: [u8; 8] = *b"cuhook\0\x01";
/// Bumped on every change to [`Peer`], [`Record`] or [`RegistryStats`].
pub(crate) const ABI: u32 = 2;
/// The note's type (`n_type`) under the name `cuhook`.
pub(crate) const NOTE_TYPE: u32 = 0x4b48_4331;
/// Room for an error message one copy hands another.
pub(crate) const MESSAGE: usize = 256;

/// One allocation or event, as copies exchange it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    pub start: usize,
    pub size: usize,
    /// `MemType` as its C value.
    pub mem_type: c_int,
    pub device: c_int,
    pub flags: u32,
    /// `EventKind` as its C value (1 alloc, 2 free; 0 for a registry record).
    pub kind: c_int,
    pub pool: usize,
    pub stream: usize,
    pub context: usize,
    /// A NUL-terminated name in the sending copy's object (pinned by the receiver).
    pub api: *const c_char,
    pub seq: u64,
}

/// A subscriber across copies: `callback(record, context)`.
pub(crate) type PeerCallback = unsafe extern "C" fn(*const Record, *mut c_void);

/// The table (ABI [`ABI`]). Fallible entries return 0, or -1 with a message in `message`.
#[repr(C)]
pub(crate) struct Peer {
    pub magic: [u8; 8],
    pub abi: u32,
    pub size: u32,
    /// Whether this copy's CUDA hooks are installed: it owns the process.
    pub claimed: unsafe extern "C" fn() -> c_int,
    /// Install the CUDA hooks once more (counted); the installation's id in `*id`.
    pub install: unsafe extern "C" fn(id: *mut u64, message: *mut c_char) -> c_int,
    /// Undo one `install`; `*still` = 1 when other installations keep the hooks.
    pub uninstall: unsafe extern "C" fn(id: u64, still: *mut c_int, message: *mut c_char) -> c_int,
    /// The allocation holding `[address, address + length)` (length 0: one byte): 1 and
    /// `*out` filled, or 0.
    pub lookup: unsafe extern "C" fn(address: usize, length: usize, out: *mut Record) -> c_int,
    /// Subscribe `callback` to the events in `mask`; the subscription's id in `*id`.
    pub subscribe: unsafe extern "C" fn(
        mask: u32,
        priority: c_int,
        callback: PeerCallback,
        context: *mut c_void,
        id: *mut u64,
        message: *mut c_char,
    ) -> c_int,
    /// Remove a subscription; afterwards its callback runs on no thread.
    pub unsubscribe: unsafe extern "C" fn(id: u64, message: *mut c_char) -> c_int,
    /// The registry's counters.
    pub stats: unsafe extern "C" fn(out: *mut RegistryStats),
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Peer@{:p}", self)
    }
}

/// This copy's table.
pub(crate) static PEER: Peer = Peer {
    magic: MAGIC,
    abi: ABI,
    size: std::mem::size_of::<Peer>() as u32,
    claimed,
    install,
    uninstall,
    lookup,
    subscribe,
    unsubscribe,
    stats,
};

// The note: name "cuhook", type NOTE_TYPE, and as descriptor the distance from the descriptor
// to `PEER` (resolved by the static linker: no run-time relocation in a read-only note). Linkers
// keep allocated note sections under `--gc-sections`.
core::arch::global_asm!(
    ".pushsection .note.cuhook,\"a\",@note",
    ".balign 4",
    ".long 7",
    ".long 8",
    ".long {ty}",
    ".asciz \"cuhook\"",
    ".balign 4",
    ".quad {peer} - .",
    ".popsection",
    ty = const NOTE_TYPE,
    peer = sym PEER,
);

impl Record {
    pub(crate) fn of_allocation(a: &Allocation) -> Record {
        Record {
            start: a.start,
            size: a.size,
            mem_type: a.mem_type as c_int,
            device: a.device,
            flags: a.flags,
            kind: 0,
            pool: a.pool,
            stream: a.stream,
            context: a.context,
            api: a.api.as_ptr(),
            seq: a.seq,
        }
    }

    pub(crate) fn of_event(ev: &MemEvent) -> Record {
        Record {
            start: ev.range.start,
            size: ev.range.size,
            mem_type: ev.range.mem_type as c_int,
            device: ev.range.device,
            flags: ev.range.flags,
            kind: ev.kind as c_int,
            pool: ev.range.pool,
            stream: ev.range.stream,
            context: ev.range.context,
            api: ev.api.as_ptr(),
            seq: 0,
        }
    }

    fn mem_type(&self) -> MemType {
        match self.mem_type {
            0 => MemType::Host,
            1 => MemType::Cuda,
            2 => MemType::CudaManaged,
            _ => MemType::Unknown,
        }
    }

    /// The API name, borrowed from the sending copy's object.
    ///
    /// # Safety
    /// `api` is NULL or a NUL-terminated string that lives as long as the process (the sending
    /// copy's object is pinned).
    unsafe fn api(&self) -> &'static CStr {
        if self.api.is_null() {
            return c"";
        }
        // SAFETY: as the caller promises.
        unsafe { CStr::from_ptr(self.api) }
    }

    /// The allocation this record describes.
    ///
    /// # Safety
    /// As [`Record::api`].
    pub(crate) unsafe fn allocation(&self) -> Allocation {
        // SAFETY: forwarded.
        let mut a = Allocation::new(self.start, self.size, unsafe { self.api() });
        a.mem_type = self.mem_type();
        a.device = self.device;
        a.flags = self.flags;
        a.pool = self.pool;
        a.stream = self.stream;
        a.context = self.context;
        a.seq = self.seq;
        a
    }

    /// The event this record describes (`None` for a kind this copy does not know).
    ///
    /// # Safety
    /// As [`Record::api`].
    pub(crate) unsafe fn event(&self) -> Option<MemEvent> {
        let kind = match self.kind {
            1 => EventKind::Alloc,
            2 => EventKind::Free,
            _ => return None,
        };
        // SAFETY: forwarded.
        let api = unsafe { self.api() };
        let range = Allocation {
            mem_type: self.mem_type(),
            device: self.device,
            flags: self.flags,
            pool: self.pool,
            stream: self.stream,
            context: self.context,
            ..Allocation::new(self.start, self.size, api)
        };
        Some(MemEvent { kind, api, range })
    }
}

/// Write `e`'s message into the caller's buffer (NUL-terminated, cut to fit).
fn report(e: &Error, message: *mut c_char) -> c_int {
    if !message.is_null() {
        let text = e.to_string();
        let n = text.len().min(MESSAGE - 1);
        // SAFETY: the caller passes `MESSAGE` writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), message.cast::<u8>(), n);
            *message.add(n) = 0;
        }
    }
    -1
}

/// Run `f`, turning an error or a panic into -1 and a message.
fn entry(message: *mut c_char, f: impl FnOnce() -> crate::Result<()>) -> c_int {
    guarded(
        || match f() {
            Ok(()) => 0,
            Err(e) => report(&e, message),
        },
        || {
            report(
                &Error::InvalidArgument {
                    what: "a panic inside the cuhook engine (a bug: please report it)",
                },
                message,
            )
        },
    )
}

unsafe extern "C" fn claimed() -> c_int {
    c_int::from(super::own_claimed())
}

unsafe extern "C" fn install(id: *mut u64, message: *mut c_char) -> c_int {
    entry(message, || {
        let installed = crate::cuda::install()?.leak();
        if !id.is_null() {
            // SAFETY: a writable out-parameter (the table's contract).
            unsafe { id.write(installed) };
        }
        Ok(())
    })
}

unsafe extern "C" fn uninstall(id: u64, still: *mut c_int, message: *mut c_char) -> c_int {
    entry(message, || {
        let report = crate::cuda::uninstall_id(id)?;
        if !still.is_null() {
            // SAFETY: a writable out-parameter.
            unsafe { still.write(c_int::from(report.still_referenced)) };
        }
        Ok(())
    })
}

unsafe extern "C" fn lookup(address: usize, length: usize, out: *mut Record) -> c_int {
    guarded(
        || match registry::hot().lookup_span(address, length) {
            Some(a) if !out.is_null() => {
                // SAFETY: a writable out-parameter.
                unsafe { out.write(Record::of_allocation(&a)) };
                1
            }
            _ => 0,
        },
        || 0,
    )
}

/// Calls a subscriber of another copy with the record of `ev`.
fn call_peer(target: usize, ev: &MemEvent, context: usize) {
    let record = Record::of_event(ev);
    // SAFETY: `target` is the `PeerCallback` another copy subscribed, live until it
    // unsubscribes.
    unsafe { crate::sys::func::fn_at::<PeerCallback>(target)(&record, context as *mut c_void) };
}

unsafe extern "C" fn subscribe(
    mask: u32,
    priority: c_int,
    callback: PeerCallback,
    context: *mut c_void,
    id: *mut u64,
    message: *mut c_char,
) -> c_int {
    entry(message, || {
        let callback = Callback::Foreign {
            adapter: call_peer,
            target: callback as usize,
        };
        let sub = events::subscribe(mask, priority, callback, context as usize)?;
        if !id.is_null() {
            // SAFETY: a writable out-parameter.
            unsafe { id.write(sub.get()) };
        }
        Ok(())
    })
}

unsafe extern "C" fn unsubscribe(id: u64, message: *mut c_char) -> c_int {
    entry(message, || {
        let id = events::SubscriptionId::from_raw(id).ok_or(Error::NoSuchSubscriber)?;
        events::unsubscribe_id(id)
    })
}

unsafe extern "C" fn stats(out: *mut RegistryStats) {
    guarded(
        || {
            if !out.is_null() {
                // SAFETY: a writable out-parameter.
                unsafe { out.write(crate::cuda::stats()) };
            }
        },
        || (),
    )
}
