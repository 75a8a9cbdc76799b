//! A copy of the loader's list of objects, taken with `dl_iterate_phdr`.
//!
//! # Safety
//! `dl_iterate_phdr` hands the callback raw pointers that are valid only during the call. The
//! callback copies them into storage reserved *before* the walk (so it never allocates while the
//! loader's lock is held: UCX #3517 deadlocked doing otherwise) and does no other work.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Arc;

use libc::{dl_phdr_info, Elf64_Phdr, PT_LOAD};

/// One loaded ELF object as the loader reported it.
#[derive(Debug, Clone)]
pub struct LoadedObject {
    /// Load bias (`l_addr`): what is added to the object's virtual addresses.
    pub base: usize,
    /// Path as the loader knows it; empty for the main program.
    pub name: String,
    /// Copy of the program headers.
    pub phdrs: Vec<Elf64_Phdr>,
    /// Position in the loader's list (0 is the main program); [`Self::UNKNOWN_POSITION`]
    /// for an object described through its handle rather than found by a walk.
    pub position: usize,
}

impl LoadedObject {
    /// The position of an object that was not found by walking the list (never the main
    /// program).
    pub const UNKNOWN_POSITION: usize = usize::MAX;

    /// A human-readable name: the path, or `<main program>`.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            "<main program>"
        } else {
            &self.name
        }
    }

    /// The `[start, end)` address ranges of the object's `PT_LOAD` segments (page-rounded).
    pub fn segments(&self) -> impl Iterator<Item = (usize, usize, u32)> + '_ {
        self.phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(move |p| {
                let start = self.base.wrapping_add(p.p_vaddr as usize);
                let end = start.wrapping_add(p.p_memsz as usize);
                (start, end, p.p_flags)
            })
    }

    /// Whether `addr` lies inside one of the object's loaded segments.
    pub fn contains(&self, addr: usize) -> bool {
        self.segments().any(|(s, e, _)| addr >= s && addr < e)
    }

    /// Whether `[addr, addr+len)` lies inside one loaded segment.
    pub fn contains_range(&self, addr: usize, len: usize) -> bool {
        match addr.checked_add(len) {
            Some(end) => self.segments().any(|(s, e, _)| addr >= s && end <= e),
            None => false,
        }
    }

    /// The program header of the given type, if any.
    pub fn phdr(&self, p_type: u32) -> Option<&Elf64_Phdr> {
        self.phdrs.iter().find(|p| p.p_type == p_type)
    }
}

/// The loaded objects at one moment, with the loader's add/remove counters of that moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub objects: Vec<Arc<LoadedObject>>,
    pub counters: Counters,
}

/// `dlpi_adds` / `dlpi_subs`: how many objects were ever added to / removed from the process.
/// Equal counters mean the list did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub adds: u64,
    pub subs: u64,
}

/// Raw facts copied out of the callback.
#[derive(Clone, Copy)]
struct RawEntry {
    base: usize,
    name_off: usize,
    name_len: usize,
    phdr_off: usize,
    phnum: usize,
}

/// Storage reserved before the walk; the callback only pushes within capacity.
struct Collector {
    entries: Vec<RawEntry>,
    names: Vec<u8>,
    phdrs: Vec<Elf64_Phdr>,
    counters: Counters,
    overflow: bool,
}

/// Sizes measured by a counting walk.
#[derive(Default)]
struct Sizes {
    objects: usize,
    name_bytes: usize,
    phdrs: usize,
}

/// Longest object name we copy; longer ones are truncated (PATH_MAX).
const MAX_NAME: usize = 4096;

pub(crate) fn has_counters(size: usize) -> bool {
    size >= std::mem::offset_of!(dl_phdr_info, dlpi_subs) + std::mem::size_of::<u64>()
}

/// # Safety
/// `info.dlpi_name` must be NULL or a NUL-terminated string (the loader guarantees it).
pub(crate) unsafe fn name_bytes(info: &dl_phdr_info) -> &[u8] {
    if info.dlpi_name.is_null() {
        return &[];
    }
    // The readable extent past the NUL is unknown, so scan byte by byte, at most MAX_NAME bytes.
    let mut len = 0usize;
    while len < MAX_NAME {
        // SAFETY: every byte before the terminating NUL and the NUL itself are readable.
        let b = unsafe { *info.dlpi_name.add(len).cast::<u8>() };
        if b == 0 {
            break;
        }
        len += 1;
    }
    // SAFETY: the first `len` bytes were just read one by one.
    unsafe { std::slice::from_raw_parts(info.dlpi_name.cast::<u8>(), len) }
}

unsafe extern "C" fn count_cb(
    info: *mut dl_phdr_info,
    _size: usize,
    data: *mut libc::c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut Sizes`.
    let (info, sizes) = unsafe { (&*info, &mut *data.cast::<Sizes>()) };
    sizes.objects += 1;
    // SAFETY: the name comes from the loader (see `name_bytes`).
    sizes.name_bytes += unsafe { name_bytes(info) }.len();
    sizes.phdrs += info.dlpi_phnum as usize;
    0
}

unsafe extern "C" fn collect_cb(
    info: *mut dl_phdr_info,
    size: usize,
    data: *mut libc::c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut Collector`.
    let (info, c) = unsafe { (&*info, &mut *data.cast::<Collector>()) };
    if c.entries.is_empty() && has_counters(size) {
        c.counters = Counters {
            adds: info.dlpi_adds,
            subs: info.dlpi_subs,
        };
    }
    // SAFETY: the name comes from the loader (see `name_bytes`).
    let name = unsafe { name_bytes(info) };
    let phnum = info.dlpi_phnum as usize;
    let fits = c.entries.len() < c.entries.capacity()
        && c.names.capacity() - c.names.len() >= name.len()
        && c.phdrs.capacity() - c.phdrs.len() >= phnum;
    if !fits {
        c.overflow = true;
        return 1;
    }
    let entry = RawEntry {
        base: info.dlpi_addr as usize,
        name_off: c.names.len(),
        name_len: name.len(),
        phdr_off: c.phdrs.len(),
        phnum,
    };
    c.names.extend_from_slice(name);
    if phnum > 0 && !info.dlpi_phdr.is_null() {
        // SAFETY: the loader's program headers array has `dlpi_phnum` entries.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, phnum) };
        c.phdrs.extend_from_slice(phdrs);
    } else {
        c.phdrs.resize(c.phdrs.len() + phnum, ZERO_PHDR);
    }
    c.entries.push(entry);
    0
}

const ZERO_PHDR: Elf64_Phdr = Elf64_Phdr {
    p_type: 0,
    p_flags: 0,
    p_offset: 0,
    p_vaddr: 0,
    p_paddr: 0,
    p_filesz: 0,
    p_memsz: 0,
    p_align: 0,
};

unsafe extern "C" fn counters_cb(
    info: *mut dl_phdr_info,
    size: usize,
    data: *mut libc::c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut Counters`.
    let (info, out) = unsafe { (&*info, &mut *data.cast::<Counters>()) };
    if has_counters(size) {
        *out = Counters {
            adds: info.dlpi_adds,
            subs: info.dlpi_subs,
        };
    }
    1
}

/// The loader's add/remove counters: a cheap "did anything change" test.
pub fn counters() -> Counters {
    let mut out = Counters::default();
    // SAFETY: the callback matches dl_iterate_phdr's contract and `out` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(counters_cb), (&mut out as *mut Counters).cast()) };
    out
}

/// Copy the loader's list of objects.
pub fn snapshot() -> Snapshot {
    loop {
        let mut sizes = Sizes::default();
        // SAFETY: the callback matches dl_iterate_phdr's contract and `sizes` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(count_cb), (&mut sizes as *mut Sizes).cast()) };
        // Slack absorbs objects loaded between the two walks; on overflow we simply retry.
        let mut c = Collector {
            entries: Vec::with_capacity(sizes.objects + 16),
            names: Vec::with_capacity(sizes.name_bytes + 16 * 256),
            phdrs: Vec::with_capacity(sizes.phdrs + 16 * 16),
            counters: Counters::default(),
            overflow: false,
        };
        // SAFETY: as above; `c` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(collect_cb), (&mut c as *mut Collector).cast()) };
        if c.overflow {
            continue;
        }
        let objects = c
            .entries
            .iter()
            .enumerate()
            .map(|(position, e)| {
                Arc::new(LoadedObject {
                    base: e.base,
                    name: String::from_utf8_lossy(&c.names[e.name_off..e.name_off + e.name_len])
                        .into_owned(),
                    phdrs: c.phdrs[e.phdr_off..e.phdr_off + e.phnum].to_vec(),
                    position,
                })
            })
            .collect();
        return Snapshot {
            objects,
            counters: c.counters,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_lists_main_program_and_libc() {
        let snap = snapshot();
        assert!(snap.objects.len() >= 3, "{:?}", snap.objects.len());
        assert_eq!(snap.objects[0].position, 0);
        let main_fn = snapshot as *const () as usize;
        assert!(
            snap.objects.iter().any(|o| o.contains(main_fn)),
            "no object contains our own code"
        );
        assert!(snap.objects.iter().any(|o| o.name.contains("libc.so")));
        assert!(snap.counters.adds >= snap.objects.len() as u64);
        assert_eq!(counters(), snap.counters);
    }
}
