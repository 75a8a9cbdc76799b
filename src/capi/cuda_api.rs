//! C API of the CUDA side (`cuhook_install`, event handlers, registry lookups), ucm-style.
//!
//! # Safety
//! Pointers from C are checked for NULL; beyond that the caller promises what the header says
//! (`info` writable, callbacks valid until unset). Panics are caught by [`ffi_call`].
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use super::status::{ffi_call, CUHOOK_OK};
use crate::events::{self, Callback, MemEvent};
use crate::instance::{self, Route};
use crate::registry::Allocation;
use crate::{Error, Result};

/// `CUHOOK_EVENT_MEM_TYPE_ALLOC`.
pub const EVENT_ALLOC: c_int = 1;
/// `CUHOOK_EVENT_MEM_TYPE_FREE`.
pub const EVENT_FREE: c_int = 2;
/// `CUHOOK_EVENT_FLAG_NO_INSTALL`: subscribe without installing the hooks.
pub const FLAG_NO_INSTALL: c_int = 1 << 16;
/// `CUHOOK_EVENT_FLAG_EXISTING_ALLOC`: first replay every range the registry holds.
pub const FLAG_EXISTING_ALLOC: c_int = 1 << 17;

/// `cuhook_mem_event_t`.
#[repr(C)]
pub struct CMemEvent {
    pub address: *mut c_void,
    pub size: usize,
    pub mem_type: c_int,
    pub device: c_int,
    pub flags: c_uint,
    pub api: *const c_char,
    pub stream: *mut c_void,
    pub pool: *mut c_void,
    pub context: *mut c_void,
}

/// `cuhook_mem_info_t`: the event's fields followed by the registry's sequence number (the
/// same layout as the flat C struct: the event part is 64 bytes, 8-aligned).
#[repr(C)]
pub struct CMemInfo {
    pub event: CMemEvent,
    pub seq: u64,
}

/// `cuhook_event_callback_t`.
pub type CCallback = unsafe extern "C" fn(event: c_int, ev: *const CMemEvent, arg: *mut c_void);

/// The C API's installation made in another copy of cuhook that serves the process (0: none).
static FORWARDED: AtomicU64 = AtomicU64::new(0);

/// Install the CUDA hooks and the registry. Idempotent. When another copy of cuhook serves the
/// process, the installation is made there (once).
#[no_mangle]
pub extern "C" fn cuhook_install() -> c_int {
    ffi_call(|| match instance::route() {
        Route::Own => crate::cuda::install_global().map(|_| CUHOOK_OK),
        Route::Other(_) if FORWARDED.load(Ordering::Acquire) != 0 => Ok(CUHOOK_OK),
        route @ Route::Other(_) => {
            let id = crate::api::Installation::new(route)?.leak();
            if FORWARDED
                .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                crate::api::uninstall_forwarded(route, id)?;
            }
            Ok(CUHOOK_OK)
        }
    })
}

/// Restore every slot the CUDA hooks patched.
#[no_mangle]
pub extern "C" fn cuhook_uninstall() -> c_int {
    ffi_call(|| match instance::route() {
        Route::Own => crate::cuda::uninstall_global().map(|_| CUHOOK_OK),
        route @ Route::Other(_) => match FORWARDED.swap(0, Ordering::AcqRel) {
            0 => Err(Error::NotInstalled),
            id => crate::api::uninstall_forwarded(route, id).map(|_| CUHOOK_OK),
        },
    })
}

/// The C view of an event: its range's fields, with the event's own API.
pub(super) fn c_event(ev: &MemEvent) -> CMemEvent {
    c_range(&ev.range, ev.api)
}

/// The C view of a range (`cuhook_mem_event_t`, as lookups and `live` fill it), naming `api`.
pub(super) fn c_range(a: &Allocation, api: &'static CStr) -> CMemEvent {
    CMemEvent {
        address: a.start as *mut c_void,
        size: a.size,
        mem_type: a.mem_type as c_int,
        device: a.device,
        flags: a.flags,
        api: api.as_ptr(),
        stream: a.stream as *mut c_void,
        pool: a.pool as *mut c_void,
        context: a.context as *mut c_void,
    }
}

/// Calls a C callback (its address is `target`) with the C view of the event.
fn c_adapter(target: usize, ev: &MemEvent, arg: usize) {
    let c = c_event(ev);
    // SAFETY: `target` is the address of a `cuhook_event_callback_t` given to
    // cuhook_set_event_handler, valid until it is unset.
    unsafe {
        crate::sys::func::fn_at::<CCallback>(target)(ev.kind as c_int, &c, arg as *mut c_void)
    };
}

/// The subscriber form of a C callback (NULL is an invalid argument).
fn foreign(cb: Option<CCallback>) -> Result<Callback> {
    let cb = cb.ok_or(Error::InvalidArgument {
        what: "callback is NULL",
    })?;
    Ok(Callback::Foreign {
        adapter: c_adapter,
        target: cb as usize,
    })
}

fn mask_of(events: c_int) -> Result<u32> {
    let m = (events & (EVENT_ALLOC | EVENT_FREE)) as u32;
    if m == 0 || events & !(EVENT_ALLOC | EVENT_FREE | FLAG_NO_INSTALL | FLAG_EXISTING_ALLOC) != 0 {
        return Err(Error::InvalidArgument {
            what: "events must name ALLOC and/or FREE (plus known flags only)",
        });
    }
    Ok(m)
}

/// Subscribe `cb(event, ev, arg)` to the events in `events` (lower priority runs first).
/// Installs the hooks unless `CUHOOK_EVENT_FLAG_NO_INSTALL` is given.
///
/// # Safety
/// `cb` stays callable until unset.
#[no_mangle]
pub unsafe extern "C" fn cuhook_set_event_handler(
    events: c_int,
    priority: c_int,
    cb: Option<CCallback>,
    arg: *mut c_void,
) -> c_int {
    ffi_call(|| {
        let callback = foreign(cb)?;
        let mask = mask_of(events)?;
        if events & FLAG_NO_INSTALL == 0 {
            crate::cuda::install_global()?;
        }
        if events & FLAG_EXISTING_ALLOC != 0 {
            events::subscribe_with_replay(
                mask,
                priority,
                callback,
                arg as usize,
                crate::cuda::replay_existing,
            )?;
        } else {
            events::subscribe(mask, priority, callback, arg as usize)?;
        }
        Ok(CUHOOK_OK)
    })
}

/// Remove a handler; when this returns, `cb` runs on no thread and will not be called again.
///
/// # Safety
/// None beyond the header's contract.
#[no_mangle]
pub unsafe extern "C" fn cuhook_unset_event_handler(
    events: c_int,
    cb: Option<CCallback>,
    arg: *mut c_void,
) -> c_int {
    ffi_call(|| {
        let callback = foreign(cb)?;
        events::unsubscribe(mask_of(events)?, callback, arg as usize)?;
        Ok(CUHOOK_OK)
    })
}

fn fill_info(info: *mut CMemInfo, a: &Allocation) {
    // SAFETY: `info` is non-null and writable (checked by callers, promised by the header).
    unsafe {
        info.write(CMemInfo {
            event: c_range(a, a.api),
            seq: a.seq,
        })
    };
}

/// The call stack that allocated the range containing `address` (`CUHOOK_STACKS`): 0 and its id
/// in `*stack` (0: none recorded, 1: the stack table was full), or `CUHOOK_ERR_NOT_FOUND` when
/// no range contains it.
///
/// # Safety
/// `stack` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_stack_of(address: *const c_void, stack: *mut u32) -> c_int {
    ffi_call(|| {
        if stack.is_null() {
            return Err(Error::InvalidArgument {
                what: "stack is NULL",
            });
        }
        match crate::api::lookup_in(address as usize, 0) {
            Some(a) => {
                // SAFETY: non-null (checked) and writable (contract).
                unsafe { stack.write(a.stack.0) };
                Ok(CUHOOK_OK)
            }
            None => Ok(super::status::CUHOOK_ERR_NOT_FOUND),
        }
    })
}

/// The frames (return addresses, innermost first) of stack `id`: copies up to `capacity` of
/// them into `frames` and returns how many the stack has (0: no such stack).
///
/// # Safety
/// `frames` has room for `capacity` pointers (or `capacity` is 0).
#[no_mangle]
pub unsafe extern "C" fn cuhook_stack_frames(
    id: u32,
    frames: *mut *mut c_void,
    capacity: usize,
) -> usize {
    crate::sys::boundary::guarded(
        || {
            let Some(stack) = crate::stacks::frames(crate::stacks::StackId(id)) else {
                return 0;
            };
            if !frames.is_null() {
                for (i, &pc) in stack.iter().take(capacity).enumerate() {
                    // SAFETY: `i < capacity`, and `frames` has room for `capacity` (contract).
                    unsafe { frames.add(i).write(pc as *mut c_void) };
                }
            }
            stack.len()
        },
        || 0,
    )
}

/// Registry lookup: the allocation containing `[address, address+length)` (length 0: the one
/// byte at `address`). Returns 0 and fills `info`, or `CUHOOK_ERR_NOT_FOUND`.
///
/// # Safety
/// `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_lookup(
    address: *const c_void,
    length: usize,
    info: *mut CMemInfo,
) -> c_int {
    ffi_call(|| {
        if info.is_null() {
            return Err(Error::InvalidArgument {
                what: "info is NULL",
            });
        }
        match crate::api::lookup_in(address as usize, length) {
            Some(a) => {
                fill_info(info, &a);
                Ok(CUHOOK_OK)
            }
            None => Ok(super::status::CUHOOK_ERR_NOT_FOUND),
        }
    })
}
