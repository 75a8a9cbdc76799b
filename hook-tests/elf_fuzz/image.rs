//! The ELF readers of `cuhook::elf` over arbitrary bytes, loaded the way the dynamic loader
//! would map them, with nothing readable around them. Shared by the property test
//! (hook-tests/elf_fuzz.rs) and the `cargo fuzz` target (fuzz/fuzz_targets/elf_readers.rs).
//!
//! The input is taken as an ELF file: its program headers (read by hand, tolerantly) say where
//! each `PT_LOAD` segment's bytes go. The whole span is reserved `PROT_NONE` with a guard page on
//! each side, each segment's pages are filled from the input and made readable only when the
//! segment says `PF_R`. A reader that steps outside what the object declares readable therefore
//! faults (to page granularity: bytes past a segment's end inside its last page stay readable),
//! and a panic is a panic: the harness lets both through to the test or the fuzzer.

#![allow(dead_code)]

use std::sync::Arc;

use cuhook::elf::{self, DynamicTables, LoadedObject, ObjectIndex};

const PAGE: usize = 4096;
/// Largest span of segments mapped (larger inputs are skipped: the readers do not care about
/// size, the fuzzer's speed does).
const MAX_SPAN: usize = 16 << 20;
const MAX_PHDRS: usize = 64;
/// Symbol names looked up with `defines`, beyond those the index found.
const NAMES_CHECKED: usize = 32;

fn bytes_at<const N: usize>(b: &[u8], at: usize, off: usize) -> Option<[u8; N]> {
    let start = at.checked_add(off)?;
    b.get(start..start.checked_add(N)?)?.try_into().ok()
}
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    bytes_at(b, at, 0).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], at: usize, off: usize) -> Option<u32> {
    bytes_at(b, at, off).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], at: usize, off: usize) -> Option<u64> {
    bytes_at(b, at, off).map(u64::from_le_bytes)
}

/// The program headers of `data`, read like the loader does (no validation beyond bounds).
pub fn program_headers(data: &[u8]) -> Vec<libc::Elf64_Phdr> {
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (u64_at(data, 32, 0), u16_at(data, 54), u16_at(data, 56))
    else {
        return Vec::new();
    };
    let (phoff, phentsize) = (phoff as usize, (phentsize as usize).max(56));
    (0..(phnum as usize).min(MAX_PHDRS))
        .map_while(|i| {
            let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
            Some(libc::Elf64_Phdr {
                p_type: u32_at(data, at, 0)?,
                p_flags: u32_at(data, at, 4)?,
                p_offset: u64_at(data, at, 8)?,
                p_vaddr: u64_at(data, at, 16)?,
                p_paddr: u64_at(data, at, 24)?,
                p_filesz: u64_at(data, at, 32)?,
                p_memsz: u64_at(data, at, 40)?,
                p_align: u64_at(data, at, 48)?,
            })
        })
        .collect()
}

/// `data` mapped as a loaded object; unmapped when dropped.
pub struct Mapped {
    region: usize,
    len: usize,
    pub object: Arc<LoadedObject>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the region this value mapped, unmapped once.
        unsafe { libc::munmap(self.region as *mut libc::c_void, self.len) };
    }
}

fn page_down(v: usize) -> usize {
    v & !(PAGE - 1)
}

/// Map `data`'s `PT_LOAD` segments; `None` when there is none or their span is too large.
pub fn map(data: &[u8]) -> Option<Mapped> {
    let phdrs = program_headers(data);
    let loads: Vec<&libc::Elf64_Phdr> = phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD && p.p_memsz > 0)
        .collect();
    let lo = page_down(loads.iter().map(|p| p.p_vaddr as usize).min()?);
    let hi = loads
        .iter()
        .map(|p| (p.p_vaddr as usize).checked_add(p.p_memsz as usize))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()?;
    let span = hi.checked_sub(lo)?.checked_add(PAGE - 1)? & !(PAGE - 1);
    if span > MAX_SPAN {
        return None;
    }
    let len = span + 2 * PAGE;
    // SAFETY: a fresh anonymous mapping, inaccessible until a segment makes pages of it readable.
    let region = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if region == libc::MAP_FAILED {
        return None;
    }
    let region = region as usize;
    let first = region + PAGE;
    let base = first.wrapping_sub(lo);
    let mapped = Mapped {
        region,
        len,
        object: Arc::new(LoadedObject {
            base,
            name: "fuzz-input.so".into(),
            phdrs: phdrs.clone(),
            position: 1,
        }),
    };
    // Fill every segment, then protect: unreadable segments first, so that a page a readable
    // segment shares stays readable (as the reader is entitled to assume).
    for p in &loads {
        let start = base.wrapping_add(p.p_vaddr as usize);
        let pages = page_down(start);
        let end = (start + p.p_memsz as usize + PAGE - 1) & !(PAGE - 1);
        // SAFETY: [pages, end) lies inside the region (span covers every segment).
        unsafe {
            libc::mprotect(
                pages as *mut libc::c_void,
                end - pages,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        let from = (p.p_offset as usize).min(data.len());
        let n = (p.p_filesz.min(p.p_memsz) as usize).min(data.len() - from);
        // SAFETY: `n` bytes from the input into the segment's writable pages.
        unsafe { std::ptr::copy_nonoverlapping(data[from..].as_ptr(), start as *mut u8, n) };
    }
    let mut order = loads.clone();
    order.sort_by_key(|p| p.p_flags & libc::PF_R != 0);
    for p in order {
        let start = base.wrapping_add(p.p_vaddr as usize);
        let pages = page_down(start);
        let end = (start + p.p_memsz as usize + PAGE - 1) & !(PAGE - 1);
        let prot = if p.p_flags & libc::PF_R != 0 {
            libc::PROT_READ
        } else {
            libc::PROT_NONE
        };
        // SAFETY: as above.
        unsafe { libc::mprotect(pages as *mut libc::c_void, end - pages, prot) };
    }
    Some(mapped)
}

/// What one run saw (for the test's own sanity checks: the generator must reach the tables).
#[derive(Debug, Default, Clone, Copy)]
pub struct Reached {
    pub dynamic: bool,
    pub symtab: bool,
    pub slots: usize,
    pub versioned: usize,
    pub defined: usize,
}

/// Run every reader over `data`. Panics and faults are the findings; the result only says how
/// deep the input got.
pub fn check(data: &[u8]) -> Reached {
    let mut r = Reached::default();
    let Some(m) = map(data) else { return r };
    let obj = &m.object;
    r.dynamic = matches!(DynamicTables::read(obj), Ok(Some(_)));
    if let Ok(Some(t)) = DynamicTables::read(obj) {
        r.symtab = t.symtab != 0;
    }
    let _ = elf::segments_contain(obj, b"cuGetProcAddress_v2\0");
    // The hash-table path (a few wanted names, sorted) reads the hash tables of corrupt input;
    // the full scan (`None`) reads every relocation's symbol name.
    let wanted: Vec<Vec<u8>> = [&b"cuMemAlloc_v2"[..], b"getpid", b"malloc", b"target_add"]
        .iter()
        .map(|n| n.to_vec())
        .collect();
    let _ = ObjectIndex::build(obj.clone(), Some(&wanted));
    let Ok(index) = ObjectIndex::build(obj.clone(), None) else {
        return r;
    };
    let mut names: Vec<(String, Option<String>)> = Vec::new();
    for (name, version, slot) in index.iter() {
        r.slots += 1;
        assert!(
            obj.contains_range(slot.address, 8),
            "a slot outside the object"
        );
        if version.is_some() {
            r.versioned += 1;
            // Corrupt tables may relocate one slot under two names: then this answers for
            // either, which is all it promises.
            let _ = index.version_of(slot.address);
        }
        if names.len() < NAMES_CHECKED {
            names.push((name.to_owned(), version.map(str::to_owned)));
        }
    }
    names.push(("malloc".into(), Some("GLIBC_2.2.5".into())));
    names.extend(candidate_names(data).into_iter().map(|n| (n, None)));
    for (name, version) in &names {
        assert!(index.slots(name, version.as_deref()).count() <= index.len());
        for v in [None, version.as_deref()] {
            if elf::defines(obj, name, v) {
                r.defined += 1;
            }
        }
    }
    r
}

/// Identifier-like NUL-terminated strings of the input (string-table entries, mostly), at most
/// [`NAMES_CHECKED`] of them spread over the whole input: names an object may define.
fn candidate_names(data: &[u8]) -> Vec<String> {
    let all: Vec<&[u8]> = data
        .split(|&b| b == 0)
        .filter(|s| {
            (3..64).contains(&s.len())
                && s.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_')
                && !s[0].is_ascii_digit()
        })
        .collect();
    let step = all.len().div_ceil(NAMES_CHECKED).max(1);
    all.iter()
        .step_by(step)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}
