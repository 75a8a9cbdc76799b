//! One loaded ELF object as the loader lists it (load bias, name, the program headers the crate
//! reads), and how a name the loader spelled in bytes compares with the object's name as text.

use libc::{Elf64_Phdr, PT_DYNAMIC, PT_LOAD};

/// One loaded ELF object as the loader reported it.
#[derive(Debug, Clone)]
pub struct LoadedObject {
    /// Load bias (`l_addr`): what is added to the object's virtual addresses.
    pub base: usize,
    /// Path as the loader knows it; empty for the main program.
    pub name: String,
    /// Copy of the program headers, in their order: at least those the crate reads (`PT_LOAD`,
    /// `PT_DYNAMIC`; a snapshot keeps only these).
    pub phdrs: Vec<Elf64_Phdr>,
    /// Position in the loader's list (0 is the main program); [`Self::UNKNOWN_POSITION`]
    /// for an object described through its handle rather than found by a walk.
    pub position: usize,
}

impl LoadedObject {
    /// The position of an object that was not found by walking the list (never the main
    /// program).
    pub const UNKNOWN_POSITION: usize = usize::MAX;

    /// Whether this is the loader's entry with this load bias and name. The loader's list may
    /// hold two objects at one bias (a `dlmopen` namespace, a reused address), so identity is
    /// both; every "same object" test in the crate goes through here. `name` is the loader's
    /// bytes, which [`Self::name`] holds as text: a name that is not UTF-8 was converted
    /// lossily, and is compared the same way. Allocates nothing (it runs inside walks of the
    /// loader's list).
    pub fn is(&self, base: usize, name: &[u8]) -> bool {
        self.base == base && (self.name.as_bytes() == name || lossy_equal(&self.name, name))
    }

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
        self.segment_holds(addr, len, 0)
    }

    /// Whether `[addr, addr+len)` lies inside one loaded segment whose `p_flags` include all
    /// of `flags` (`PF_R`, `PF_W`, `PF_X`).
    pub fn segment_holds(&self, addr: usize, len: usize, flags: u32) -> bool {
        match addr.checked_add(len) {
            Some(end) => self
                .segments()
                .any(|(s, e, f)| f & flags == flags && addr >= s && end <= e),
            None => false,
        }
    }

    /// The program header of the given type, if any.
    pub fn phdr(&self, p_type: u32) -> Option<&Elf64_Phdr> {
        self.phdrs.iter().find(|p| p.p_type == p_type)
    }
}

impl LoadedObject {
    /// The program headers a [`LoadedObject`] keeps of `all` (what a snapshot keeps): every
    /// later look at its segments then passes over fewer.
    pub fn kept_program_headers(all: &[Elf64_Phdr]) -> Vec<Elf64_Phdr> {
        let mut kept_ones = Vec::with_capacity(all.iter().filter(|p| kept(p)).count());
        kept_ones.extend(all.iter().filter(|p| kept(p)).copied());
        kept_ones
    }
}

/// Whether a snapshot keeps this program header: the others (notes, stack, EH frame, …) are
/// never read, and a big process has thousands of them to copy.
pub(super) fn kept(p: &Elf64_Phdr) -> bool {
    p.p_type == PT_LOAD || p.p_type == PT_DYNAMIC
}

/// Whether `text` is what [`path_text`] makes of `bytes` that are not UTF-8 (each invalid
/// sequence one U+FFFD), compared piece by piece without building it.
fn lossy_equal(text: &str, bytes: &[u8]) -> bool {
    let mut rest = text.as_bytes();
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid().as_bytes();
        let Some(after) = rest.strip_prefix(valid) else {
            return false;
        };
        rest = after;
        if !chunk.invalid().is_empty() {
            let Some(after) = rest.strip_prefix("\u{FFFD}".as_bytes()) else {
                return false;
            };
            rest = after;
        }
    }
    rest.is_empty()
}

/// A path as text: paths are nearly always UTF-8, and validating is cheaper than the lossy
/// conversion's scan.
pub(super) fn path_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_names_that_are_not_utf8_compare_as_their_text() {
        let raw = b"/opt/lib\xffcuda\xc3.so";
        let obj = LoadedObject {
            base: 0x1000,
            name: path_text(raw),
            phdrs: Vec::new(),
            position: 3,
        };
        assert!(obj.is(0x1000, raw));
        assert!(!obj.is(0x2000, raw));
        assert!(!obj.is(0x1000, b"/opt/lib\xffcuda\xc3.so.1"));
        assert!(!obj.is(0x1000, b"/opt/lib\xfecudb\xc3.so"));
        assert!(lossy_equal("a\u{FFFD}b", b"a\xffb"));
        assert!(!lossy_equal("a\u{FFFD}", b"a\xffb"));
    }
}
