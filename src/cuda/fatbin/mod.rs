//! Reading the device code the driver loads, for the names of its `__managed__` variables.
//!
//! The CUDA runtime learns a managed variable's address at load time through an interface that
//! is not a public entry point, and `cudaGetSymbolAddress` answers from that without a driver
//! call (measured on the H200, `docs/gpu-results.md`). So when a library or module is loaded,
//! cuhook reads the image the driver took — a fatbin container (or nvcc's wrapper of one), a
//! cubin, or PTX text — for the variables marked managed, and asks the driver for each
//! (`loaded.rs`). A container holds the same variables in every cubin, so one cubin is read:
//! a stored one if there is one, else the compressed one that decodes to the fewest bytes;
//! PTX only when no cubin reads.
//!
//! Unlike the allocation hooks, this path allocates (the decoder's buffers): it runs once per
//! loaded image, inside a call that itself allocates heavily, and never while cuhook holds a lock.
//!
//! # Safety
//!
//! [`image_at`] makes slices of the image a successful load call took, as long as its own
//! headers say it is: a container's header gives its length, a cubin's ELF header its section
//! table and that its symbol and string tables, PTX ends at its NUL. The driver accepted the
//! image, so those headers are the toolchain's; reads are bounded (`MAX_IMAGE`) either way.
#![allow(unsafe_code)]

mod container;
mod cubin;
mod decode;
mod ptx;
#[cfg(test)]
mod tests;

use std::ffi::CStr;

use container::{Codec, Entry, Kind, FATBIN_MAGIC, HEADER, WRAPPER_MAGIC};

/// The longest image read.
const MAX_IMAGE: usize = 1 << 30;

/// Which loaded device code is read for managed variables (`CUHOOK_SCAN_MANAGED`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ManagedScan {
    /// Every image, compressed entries decoded (the default): every managed variable is
    /// registered at load. A zstd-compressed container costs about 1 ms to read on the H200
    /// (PyTorch's: docs/performance.md).
    #[default]
    All,
    /// Only entries stored uncompressed (nvcc 13 stores cubins by default; libraries built
    /// with `--compress-mode` compress them): no decoding at load. Managed variables of
    /// compressed code are then found only when queried by name, and `cuhook_classify` answers
    /// their addresses.
    Stored,
    /// Nothing is read at load.
    Off,
}

impl ManagedScan {
    /// The values `CUHOOK_SCAN_MANAGED` accepts.
    pub const NAMES: &'static str = "all|stored|off";

    /// Parses a `CUHOOK_SCAN_MANAGED` value.
    pub fn parse(v: &str) -> Option<Self> {
        match v.trim() {
            "all" => Some(ManagedScan::All),
            "stored" => Some(ManagedScan::Stored),
            "off" => Some(ManagedScan::Off),
            _ => None,
        }
    }
}

/// Device code as a load call takes it.
#[derive(Clone, Copy, Debug)]
pub enum Image<'a> {
    /// A fatbin container.
    Fatbin(&'a [u8]),
    /// A CUDA ELF object.
    Cubin(&'a [u8]),
    /// PTX text.
    Ptx(&'a [u8]),
}

/// Calls `found` with the name and size (0 when the image does not say) of each managed
/// variable `image` defines. Returns false when it held no device code cuhook could read (with
/// `scan`).
pub fn managed_variables(
    image: Image<'_>,
    scan: ManagedScan,
    found: &mut dyn FnMut(&CStr, usize),
) -> bool {
    match image {
        _ if scan == ManagedScan::Off => false,
        Image::Cubin(b) => cubin::managed(b, found),
        Image::Ptx(t) => {
            ptx::managed(t, found);
            true
        }
        Image::Fatbin(b) => fatbin_managed(b, scan, found),
    }
}

fn fatbin_managed(b: &[u8], scan: ManagedScan, found: &mut dyn FnMut(&CStr, usize)) -> bool {
    let mut scratch = Vec::new();
    let wanted = |e: &Entry<'_>| scan == ManagedScan::All || e.codec == Codec::Stored;
    let cubins = || container::entries(b).filter(|e| e.kind == Kind::Cubin && wanted(e));
    let stored = cubins().filter(|e| e.codec == Codec::Stored);
    let smallest = cubins()
        .filter(|e| e.codec != Codec::Stored)
        .min_by_key(|e| e.size);
    for e in stored.chain(smallest) {
        if let Some(code) = decode::decoded(&e, &mut scratch) {
            if cubin::managed(code, found) {
                return true;
            }
        }
    }
    let ptx = container::entries(b).find(|e| e.kind == Kind::Ptx && wanted(e));
    match ptx.and_then(|e| decode::decoded(&e, &mut scratch)) {
        Some(text) => {
            ptx::managed(text, found);
            true
        }
        None => false,
    }
}

/// The image a load call took at `p`, recognised by its first bytes; `None` for anything else
/// (or PTX too short to define a variable).
///
/// # Safety
///
/// `p` is the image argument of a successful `cuLibraryLoadData`, `cuModuleLoadData`,
/// `cuModuleLoadDataEx` or `cuModuleLoadFatBinary` call, still alive: a fatbin container or
/// nvcc's wrapper of one, a cubin, or NUL-terminated PTX.
pub unsafe fn image_at<'a>(p: *const u8) -> Option<Image<'a>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the image is at least a NUL-terminated string or a longer header (contract);
    // strnlen stops at its NUL.
    if unsafe { libc::strnlen(p.cast(), 4) } < 4 {
        return None;
    }
    // SAFETY: four readable bytes (just checked).
    let magic = u32::from_le_bytes(unsafe { p.cast::<[u8; 4]>().read_unaligned() });
    match magic {
        // SAFETY: a container the driver read whole (contract).
        FATBIN_MAGIC => unsafe { fatbin_at(p) }.map(Image::Fatbin),
        WRAPPER_MAGIC => {
            // SAFETY: nvcc's wrapper: magic, version, then the container's address at byte 8.
            let data = unsafe { p.add(8).cast::<*const u8>().read_unaligned() };
            if data.is_null() {
                return None;
            }
            // SAFETY: the container the wrapper names, which the driver read (contract).
            let head = unsafe { data.cast::<[u8; 4]>().read_unaligned() };
            if u32::from_le_bytes(head) != FATBIN_MAGIC {
                return None;
            }
            // SAFETY: as above.
            unsafe { fatbin_at(data) }.map(Image::Fatbin)
        }
        // SAFETY: an ELF object the driver read whole (contract).
        0x464c_457f => Some(Image::Cubin(unsafe { grown(p, &cubin::need) })),
        _ => {
            // SAFETY: NUL-terminated text (contract); strnlen stops at its NUL.
            let len = unsafe { libc::strnlen(p.cast(), MAX_IMAGE) };
            // SAFETY: `len` bytes before the NUL, all readable.
            Some(Image::Ptx(unsafe { std::slice::from_raw_parts(p, len) }))
        }
    }
}

/// The container at `p`, whole.
///
/// # Safety
///
/// `p` starts a fatbin container the driver read whole.
unsafe fn fatbin_at<'a>(p: *const u8) -> Option<&'a [u8]> {
    // SAFETY: a container starts with its 16-byte header (contract).
    let head = unsafe { std::slice::from_raw_parts(p, HEADER) };
    let len = container::container_len(head)?.min(MAX_IMAGE);
    // SAFETY: the header's length, all of which the driver read (contract).
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The bytes at `p` as far as `need` asks for, growing the view step by step.
///
/// # Safety
///
/// `p` starts an object at least as long as `need` says, given its leading bytes (an ELF object
/// the driver read whole: its header, section headers and tables).
unsafe fn grown<'a>(p: *const u8, need: &dyn Fn(&[u8]) -> usize) -> &'a [u8] {
    let mut len = 0;
    loop {
        // SAFETY: `len` bytes were asked for by `need` on the previous view (contract).
        let view = unsafe { std::slice::from_raw_parts(p, len) };
        let more = need(view).min(MAX_IMAGE);
        if more <= len {
            return view;
        }
        len = more;
    }
}
