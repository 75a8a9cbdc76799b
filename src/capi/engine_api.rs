//! C API of the generic patch engine: hook any symbol from C, list what is patched.
//!
//! # Safety
//! Every function validates its pointers for NULL; beyond that, the C caller promises what the
//! header documents (strings NUL-terminated, arrays as long as the count says, `original`
//! variables valid while installed). Panics are caught by [`ffi_call`].
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};

use super::status::{ffi_call, message_of, CUHOOK_OK};
use crate::hooks::{self, Hook, HookSet};
use crate::{Error, Result};

/// `cuhook_hook_t`.
#[repr(C)]
pub struct CHook {
    pub symbol: *const c_char,
    pub version: *const c_char,
    pub replacement: *const c_void,
    pub original: *mut *const c_void,
}

/// `cuhook_uninstall_report_t`.
#[repr(C)]
pub struct CUninstallReport {
    pub restored: usize,
    pub foreign: usize,
    pub gone: usize,
}

/// `cuhook_slot_info_t`.
#[repr(C)]
pub struct CSlotInfo {
    pub set: [c_char; 64],
    pub object: [c_char; 256],
    pub symbol: [c_char; 128],
    pub address: usize,
    pub kind: c_int,
    pub old_value: usize,
    pub new_value: usize,
    pub protection: [c_char; 4],
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char, what: &'static str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::InvalidArgument { what });
    }
    // SAFETY: non-null, NUL-terminated (caller).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::InvalidArgument { what })
}

fn copy_str(dst: &mut [c_char], src: &str) {
    let n = src.len().min(dst.len() - 1);
    for (d, s) in dst.iter_mut().zip(src.as_bytes()[..n].iter()) {
        *d = *s as c_char;
    }
    dst[n] = 0;
}

/// `CUHOOK_MAX_HOOKS`: the most hooks one set may hold. A larger `count` is a caller's mistake
/// (a negative length cast to `size_t`, an uninitialised variable) and is refused before the array
/// is read or anything is allocated for it.
pub const MAX_HOOKS: usize = 65536;

/// Install hooks given as a C array. Returns 0 and stores the installation id.
///
/// # Safety
/// `hooks` points to `count` valid entries; strings are NUL-terminated; each `original` stays
/// valid while installed; `id_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_hooks_install(
    name: *const c_char,
    hooks: *const CHook,
    count: usize,
    id_out: *mut u64,
) -> c_int {
    ffi_call(|| {
        // SAFETY: see the function's contract.
        let name = unsafe { c_str(name, "set name is NULL or not UTF-8") }?;
        if hooks.is_null() && count > 0 {
            return Err(Error::InvalidArgument {
                what: "hooks is NULL",
            });
        }
        if count > MAX_HOOKS {
            return Err(Error::InvalidArgument {
                what: "count is larger than CUHOOK_MAX_HOOKS (65536)",
            });
        }
        let mut list = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `hooks` has `count` entries.
            let h = unsafe { &*hooks.add(i) };
            // SAFETY: NUL-terminated strings (contract).
            let symbol = unsafe { c_str(h.symbol, "hook symbol is NULL or not UTF-8") }?;
            // SAFETY: `original` is valid while installed (contract); checked for NULL inside.
            let mut hook = unsafe { Hook::from_raw(symbol, h.replacement as usize, h.original) }?;
            if !h.version.is_null() {
                // SAFETY: NUL-terminated (contract).
                hook =
                    hook.with_version(unsafe { c_str(h.version, "hook version is not UTF-8") }?)?;
            }
            list.push(hook);
        }
        let set = HookSet::new(name, list)?;
        let id = hooks::install(&set)?.leak();
        if !id_out.is_null() {
            // SAFETY: non-null and writable (contract).
            unsafe { *id_out = id };
        }
        Ok(CUHOOK_OK)
    })
}

/// Uninstall an installation by id; `report` (may be NULL) receives the counts.
///
/// # Safety
/// `report` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_hooks_uninstall(id: u64, report: *mut CUninstallReport) -> c_int {
    ffi_call(|| {
        let r = hooks::uninstall_id(id)?;
        if !report.is_null() {
            // SAFETY: non-null and writable (contract).
            unsafe {
                *report = CUninstallReport {
                    restored: r.restored,
                    foreign: r.foreign.len(),
                    gone: r.gone,
                }
            };
        }
        Ok(CUHOOK_OK)
    })
}

/// Patch objects loaded since the last scan; returns the number of slots patched. Waits at
/// most [`hooks::API_PATIENCE`] for another thread's operation (`CUHOOK_ERR_BUSY` after): a
/// library constructor calling this holds the loader's lock, which that operation may wait for.
#[no_mangle]
pub extern "C" fn cuhook_hooks_rescan() -> c_int {
    ffi_call(|| {
        hooks::rescan(Some(hooks::API_PATIENCE)).map(|n| n.min(c_int::MAX as usize) as c_int)
    })
}

/// Set the exclude list (comma-separated object-name substrings; NULL or "" clears it).
///
/// # Safety
/// `list` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuhook_set_exclude(list: *const c_char) -> c_int {
    ffi_call(|| {
        let text = if list.is_null() {
            ""
        } else {
            // SAFETY: non-null and NUL-terminated (contract).
            unsafe { c_str(list, "exclude list is not UTF-8") }?
        };
        hooks::set_exclude_list(text.split(',').map(str::trim));
        Ok(CUHOOK_OK)
    })
}

/// Copy up to `capacity` patched slots into `out`; returns how many exist in total.
///
/// # Safety
/// `out` is NULL (when `capacity` is 0) or points to `capacity` writable entries.
#[no_mangle]
pub unsafe extern "C" fn cuhook_patched_slots(out: *mut CSlotInfo, capacity: usize) -> isize {
    let r = ffi_call(|| {
        let slots = hooks::patched_slots();
        if !out.is_null() {
            for (i, s) in slots.iter().take(capacity).enumerate() {
                // SAFETY: `out` has `capacity` entries (contract).
                let dst = unsafe { &mut *out.add(i) };
                copy_str(&mut dst.set, &s.set);
                copy_str(&mut dst.object, &s.object);
                copy_str(&mut dst.symbol, &s.symbol);
                copy_str(&mut dst.protection, &s.protection);
                dst.address = s.address;
                dst.kind = s.kind as c_int;
                dst.old_value = s.old;
                dst.new_value = s.new;
            }
        }
        Ok(slots.len().min(c_int::MAX as usize) as i32)
    });
    r as isize
}

/// Write the engine's diagnostics as text (one finding per line) into `buf` (NUL-terminated,
/// truncated to `len`); returns the full length without the NUL.
///
/// # Safety
/// `buf` is NULL (when `len` is 0) or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cuhook_diagnostics(buf: *mut c_char, len: usize) -> isize {
    ffi_call(|| {
        let text = hooks::diagnostics().to_string();
        if !buf.is_null() && len > 0 {
            // SAFETY: `buf` has `len` writable bytes (contract).
            let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
            copy_str(dst, &text);
        }
        Ok(text.len().min(c_int::MAX as usize) as i32)
    }) as isize
}

/// A static message for a status code.
#[no_mangle]
pub extern "C" fn cuhook_strerror(status: c_int) -> *const c_char {
    message_of(status).as_ptr()
}
