//! The C structs of `include/cuhook.h`, checked field by field at compile time.
//!
//! The same numbers are asserted on the C side by `fixtures/capi/layout.c` (compiled against
//! the installed header by the C API tests), so a change to either side that the other does not
//! follow fails a build. LP64 (x86_64 and aarch64, the only targets): pointers, `size_t` and
//! `uintptr_t` are 8 bytes, `int` 4.

use std::mem::{align_of, offset_of, size_of};

use super::cuda_api::{CMemEvent, CMemInfo};
use super::engine_api::{CHook, CSlotInfo, CUninstallReport};

/// `c_layout!(Type, size, field @ offset, ...)`: compile-time checks of one struct.
macro_rules! c_layout {
    ($t:ty, $size:expr, $($field:ident @ $offset:expr),* $(,)?) => {
        const _: () = {
            assert!(size_of::<$t>() == $size);
            assert!(align_of::<$t>() == 8);
            $(assert!(offset_of!($t, $field) == $offset);)*
        };
    };
}

c_layout!(CMemEvent, 64,
    address @ 0, size @ 8, mem_type @ 16, device @ 20, flags @ 24,
    api @ 32, stream @ 40, pool @ 48, context @ 56);
c_layout!(CMemInfo, 72, event @ 0, seq @ 64);
c_layout!(CHook, 32, symbol @ 0, version @ 8, replacement @ 16, original @ 24);
c_layout!(CSlotInfo, 488,
    set @ 0, object @ 64, symbol @ 320, address @ 448, kind @ 456,
    old_value @ 464, new_value @ 472, protection @ 480);
c_layout!(CUninstallReport, 24, restored @ 0, foreign @ 8, gone @ 16);
