//! ELF record layouts read from loaded objects, and the marker that makes such reads sound.
//!
//! Holds the only `unsafe impl`s of [`Plain`]: each states that a type is plain data.
#![allow(unsafe_code)]

/// Types for which every bit pattern is a valid value (ELF records and integers), so that
/// [`super::image::Image::read`] may copy one out of an object's memory.
///
/// # Safety
/// Implement only for `Copy` types with no padding-sensitive invariants, no references and no
/// niches (integers and `#[repr(C)]` structs of integers).
pub(crate) unsafe trait Plain {}

/// Marks integer types and `#[repr(C)]` records made only of integers as [`Plain`].
macro_rules! plain {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: an integer, or a `#[repr(C)]` struct made only of integers: every bit
            // pattern is a valid value.
            unsafe impl Plain for $t {}
        )*
    };
}

plain!(
    u8,
    u16,
    u32,
    u64,
    usize,
    goblin::elf64::dynamic::Dyn,
    goblin::elf64::reloc::Rela,
    goblin::elf64::sym::Sym,
    Rel,
    Verneed,
    Vernaux,
    Verdef,
    Verdaux,
);

/// `Elf64_Rel` (goblin's is not `Copy`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Rel {
    pub r_offset: u64,
    pub r_info: u64,
}

/// `Elf64_Verneed`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Verneed {
    pub vn_version: u16,
    pub vn_cnt: u16,
    pub vn_file: u32,
    pub vn_aux: u32,
    pub vn_next: u32,
}

/// `Elf64_Vernaux`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Vernaux {
    pub vna_hash: u32,
    pub vna_flags: u16,
    pub vna_other: u16,
    pub vna_name: u32,
    pub vna_next: u32,
}

/// `Elf64_Verdef`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Verdef {
    pub vd_version: u16,
    pub vd_flags: u16,
    pub vd_ndx: u16,
    pub vd_cnt: u16,
    pub vd_hash: u32,
    pub vd_aux: u32,
    pub vd_next: u32,
}

/// `Elf64_Verdaux`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Verdaux {
    pub vda_name: u32,
    pub vda_next: u32,
}

// The layouts of glibc's `<elf.h>` for these records.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Rel>() == 16 && offset_of!(Rel, r_info) == 8);
    assert!(size_of::<Verneed>() == 16);
    assert!(offset_of!(Verneed, vn_cnt) == 2 && offset_of!(Verneed, vn_file) == 4);
    assert!(offset_of!(Verneed, vn_aux) == 8 && offset_of!(Verneed, vn_next) == 12);
    assert!(size_of::<Vernaux>() == 16);
    assert!(offset_of!(Vernaux, vna_other) == 6 && offset_of!(Vernaux, vna_name) == 8);
    assert!(offset_of!(Vernaux, vna_next) == 12);
    assert!(size_of::<Verdef>() == 20);
    assert!(offset_of!(Verdef, vd_ndx) == 4 && offset_of!(Verdef, vd_hash) == 8);
    assert!(offset_of!(Verdef, vd_aux) == 12 && offset_of!(Verdef, vd_next) == 16);
    assert!(size_of::<Verdaux>() == 8 && offset_of!(Verdaux, vda_next) == 4);
};
