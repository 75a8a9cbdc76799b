//! The patcher on real pages of the system's size: 4 KiB natively, 64 KiB in CI's aarch64 run
//! (`QEMU_PAGESIZE=65536`). A read-only slot at either edge of a page is written, and its page
//! gets its protection back, its neighbours untouched. The page size is never a constant here:
//! it is the system's (`region` reads it with sysconf), as it is for the engine.
//!
//! Unsafe: the writes go through [`compare_and_write`], whose contract (an aligned, mapped slot;
//! one writer) these tests keep by owning the pages.
#![allow(unsafe_code)]

use region::Protection;

use super::slot::{page_start, read_slot};
use super::{compare_and_write, compare_and_write_page, ProtectionMap, SlotWrite, WriteFailure};

/// Three pages of the system's size, each word holding its own offset; read-only. Fenced, so
/// that qemu-user's maps text cannot leave them out (see `FencedPages`).
struct Pages {
    memory: cuhook_fixtures::FencedPages,
}

impl Pages {
    fn new() -> Pages {
        let memory = cuhook_fixtures::FencedPages::new(3);
        let page = memory.page();
        assert_eq!(
            page,
            region::page::size(),
            "the engine's page size is the system's"
        );
        // SAFETY: the 3 pages between the fences are readable, writable, page-aligned and ours.
        let words =
            unsafe { std::slice::from_raw_parts_mut(memory.start() as *mut usize, 3 * page / 8) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = i * 8;
        }
        // Read-only, as a RELRO GOT is.
        memory.protect(0, 3, libc::PROT_READ);
        Pages { memory }
    }

    fn base(&self) -> usize {
        self.memory.start()
    }

    fn page(&self) -> usize {
        self.memory.page()
    }

    fn protections(&self) -> Vec<Protection> {
        (0..3)
            .map(|i| {
                region::query((self.base() + i * self.page()) as *const u8)
                    .expect("query a page")
                    .protection()
            })
            .collect()
    }

    /// The pages' protections, from the maps text: the kernel query's kept descriptor is
    /// shared with the protection tests, one of which closes it under the others.
    fn maps(&self) -> ProtectionMap {
        ProtectionMap::read_text(self.base(), self.base() + 3 * self.page()).unwrap()
    }

    /// compare_and_write at byte `offset`, expecting the value the word was filled with.
    fn write(&self, offset: usize, new: usize) -> SlotWrite {
        let address = self.base() + offset;
        let maps = self.maps();
        // SAFETY: an aligned word of our own mapping; this test is its only writer.
        unsafe { compare_and_write(&maps, "test pages", address, offset, new) }.unwrap()
    }

    fn read(&self, offset: usize) -> usize {
        // SAFETY: an aligned, readable word of our own mapping.
        unsafe { read_slot(self.base() + offset) }
    }
}

/// The rounding, for the page sizes aarch64 kernels use, whatever this machine's is.
#[test]
fn page_start_rounds_down_to_the_page_size_given() {
    let a = 0x55_0001_fff8;
    assert_eq!(page_start(a, 4 << 10), 0x55_0001_f000);
    assert_eq!(page_start(a, 16 << 10), 0x55_0001_c000);
    assert_eq!(page_start(a, 64 << 10), 0x55_0001_0000);
    // A slot in the first word of a 64 KiB page is not taken for one of the page before.
    assert_eq!(page_start(0x55_0002_0000, 64 << 10), 0x55_0002_0000);
    assert_eq!(page_start(0x55_0002_0000 - 8, 64 << 10), 0x55_0001_0000);
}

#[test]
fn the_page_size_is_the_systems() {
    // SAFETY: sysconf has no preconditions.
    let system = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    assert_eq!(region::page::size(), system);
    assert!(system.is_power_of_two() && system >= 4096, "{system}");
}

#[test]
fn read_only_slots_at_both_edges_of_a_page_are_written_and_the_page_restored() {
    let p = Pages::new();
    let last_of_middle = 2 * p.page() - 8;
    let first_of_last = 2 * p.page();
    for offset in [last_of_middle, first_of_last] {
        assert_eq!(
            p.write(offset, 0xabcd),
            SlotWrite::Written {
                protection: Protection::READ
            }
        );
        assert_eq!(p.read(offset), 0xabcd);
        assert_eq!(p.protections(), [Protection::READ; 3], "offset {offset:#x}");
    }
    // Nothing else changed: every other word still holds its offset.
    for offset in (0..3 * p.page()).step_by(8) {
        if offset != last_of_middle && offset != first_of_last {
            assert_eq!(p.read(offset), offset);
        }
    }
}

#[test]
fn a_mismatch_writes_nothing_and_leaves_the_page_read_only() {
    let p = Pages::new();
    let offset = p.page() + 8;
    let maps = p.maps();
    // SAFETY: as in Pages::write, with an expected value the slot does not hold.
    let got = unsafe { compare_and_write(&maps, "test pages", p.base() + offset, 1, 2) }.unwrap();
    assert_eq!(got, SlotWrite::Mismatch { actual: offset });
    assert_eq!(p.read(offset), offset);
    assert_eq!(p.protections(), [Protection::READ; 3]);
}

/// Slots of one page are written under one protection change: inside the work the page is
/// writable (once, for all of them), afterwards read-only again; the pages around are untouched.
#[test]
fn slots_sharing_a_page_are_written_under_one_protection_change() {
    let p = Pages::new();
    let offsets = [p.page(), p.page() + 8, 2 * p.page() - 8];
    let maps = p.maps();
    let mut found = Vec::new();
    let slot = |i: usize| (p.base() + offsets[i], offsets[i], 0x5000 + i);
    // SAFETY: aligned words of one page of our own mapping; this test is its only writer.
    let restored = unsafe {
        compare_and_write_page(&maps, offsets.len(), false, slot, |i, w| {
            if i == 0 {
                // Writable while the page's slots are written, and only this page.
                assert_eq!(
                    p.protections(),
                    [Protection::READ, Protection::READ_WRITE, Protection::READ]
                );
            }
            found.push((i, w));
        })
    };
    assert_eq!(restored, Ok(Ok(())));
    let written = SlotWrite::Written {
        protection: Protection::READ,
    };
    assert_eq!(found, [(0, written), (1, written), (2, written)]);
    for (i, &offset) in offsets.iter().enumerate() {
        assert_eq!(p.read(offset), 0x5000 + i);
    }
    assert_eq!(p.protections(), [Protection::READ; 3]);
    assert_eq!(p.read(p.page() - 8), p.page() - 8);
    assert_eq!(p.read(2 * p.page()), 2 * p.page());
}

/// A read-only page that cannot be made writable (a shared mapping of a file opened read-only):
/// slots that hold their expected value fail to be written; slots that hold something else are
/// reported as mismatches without the page's protection ever being asked to change.
#[test]
fn a_page_with_nothing_to_write_keeps_its_protection_untouched() {
    let path = std::env::temp_dir().join(format!("cuhook-ro-page-{}", std::process::id()));
    let page = region::page::size();
    let words: Vec<u8> = (0..page / 8).flat_map(|i| (i * 8).to_ne_bytes()).collect();
    std::fs::write(&path, words).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    // SAFETY: a fresh shared read-only mapping of our own file; unmapped below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    } as usize;
    assert_ne!(base, libc::MAP_FAILED as usize);
    let maps = ProtectionMap::read_text(base, base + page).unwrap();
    let slots = [(base + 8, 999, 1), (base + 16, 999, 2)];
    let mut found = Vec::new();
    // SAFETY: aligned, readable words of our own mapping.
    let nothing =
        unsafe { compare_and_write_page(&maps, 2, false, |i| slots[i], |i, w| found.push((i, w))) };
    assert_eq!(
        nothing,
        Ok(Ok(())),
        "no write was needed: no mprotect tried"
    );
    assert_eq!(
        found,
        [
            (0, SlotWrite::Mismatch { actual: 8 }),
            (1, SlotWrite::Mismatch { actual: 16 })
        ]
    );
    // The same page with a slot to write: the protection change is tried, and refused.
    let slots = [(base + 8, 999, 1), (base + 16, 16, 2)];
    // SAFETY: as above.
    let refused = unsafe { compare_and_write_page(&maps, 2, false, |i| slots[i], |_, _| ()) };
    assert_eq!(refused, Err(WriteFailure::Protect(libc::EACCES)));
    // SAFETY: as above.
    assert_eq!(unsafe { read_slot(base + 16) }, 16);
    // SAFETY: our own mapping, no longer used.
    unsafe { libc::munmap(base as *mut libc::c_void, page) };
}
