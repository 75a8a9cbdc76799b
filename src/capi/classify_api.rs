//! C API of pointer classification (`cuhook_classify`): the registry's record, else the
//! driver's answer, else host.
//!
//! # Safety
//! `info` is checked for NULL; beyond that the caller promises it is writable. `address` is
//! only compared and passed to the driver as a number, never dereferenced. Panics are caught by
//! [`ffi_call`].
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use super::cuda_api::{c_range, CMemInfo};
use super::status::{ffi_call, CUHOOK_OK};
use crate::cuda::classify::{classify, Classification, Source};
use crate::events::Allocation;
use crate::Error;

/// The C view of a classification. A registry record gives the allocation (start, size, api,
/// stream, seq >= 1); a driver answer gives the address asked about, size 0, api "" and seq 0.
fn c_info(address: usize, c: &Classification) -> CMemInfo {
    let (start, size, api, stream, seq) = match c.source {
        Source::Registry(a) => (a.start, a.size, a.api, a.stream, a.seq),
        Source::Driver | Source::Fallback => (address, 0, c"", 0, 0),
    };
    let range = Allocation {
        mem_type: c.mem_type,
        device: c.device,
        flags: c.flags,
        stream,
        pool: c.pool,
        context: c.context,
        seq,
        ..Allocation::new(start, size, api)
    };
    CMemInfo {
        event: c_range(&range, api),
        seq,
    }
}

/// What kind of memory `address` points to. Fills `info` and returns 0; memory nobody knows is
/// `CUHOOK_MEM_TYPE_HOST`.
///
/// # Safety
/// `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuhook_classify(address: *const c_void, info: *mut CMemInfo) -> c_int {
    ffi_call(|| {
        if info.is_null() {
            return Err(Error::InvalidArgument {
                what: "info is NULL",
            });
        }
        let c = classify(address as usize);
        // SAFETY: `info` is non-null and writable (header contract).
        unsafe { info.write(c_info(address as usize, &c)) };
        Ok(CUHOOK_OK)
    })
}
