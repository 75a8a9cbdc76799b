//! The patcher on real pages of the system's size: 4 KiB natively, 64 KiB in CI's aarch64 run
//! (`QEMU_PAGESIZE=65536`). A read-only slot at either edge of a page is written, and its page
//! gets its protection back, its neighbours untouched. The page size is never a constant here:
//! it is the system's (`region` reads it with sysconf), as it is for the engine.
//!
//! Unsafe: the writes go through [`compare_and_write`], whose contract (an aligned, mapped slot;
//! one writer) these tests keep by owning the pages.
#![allow(unsafe_code)]

use region::Protection;

use super::slot::page_start;
use super::{compare_and_write, read_slot, ProtectionMap, SlotWrite};

/// Three pages of the system's size, each word holding its own offset; read-only.
struct Pages {
    memory: region::Allocation,
    page: usize,
}

impl Pages {
    fn new() -> Pages {
        let page = region::page::size();
        let mut memory = region::alloc(3 * page, Protection::READ_WRITE).expect("map 3 pages");
        // SAFETY: the allocation is 3 pages of readable, writable, page-aligned memory we own.
        let words =
            unsafe { std::slice::from_raw_parts_mut(memory.as_mut_ptr::<usize>(), 3 * page / 8) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = i * 8;
        }
        // SAFETY: our own mapping, made read-only as a RELRO GOT is.
        unsafe { region::protect(memory.as_ptr::<u8>(), 3 * page, Protection::READ) }
            .expect("make the pages read-only");
        Pages { memory, page }
    }

    fn base(&self) -> usize {
        self.memory.as_ptr::<u8>() as usize
    }

    fn protections(&self) -> Vec<Protection> {
        (0..3)
            .map(|i| {
                region::query((self.base() + i * self.page) as *const u8)
                    .expect("query a page")
                    .protection()
            })
            .collect()
    }

    /// The pages' protections, from the maps text: the kernel query's kept descriptor is
    /// shared with the protection tests, one of which closes it under the others.
    fn maps(&self) -> ProtectionMap {
        ProtectionMap::read_text(self.base(), self.base() + 3 * self.page).unwrap()
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
    let last_of_middle = 2 * p.page - 8;
    let first_of_last = 2 * p.page;
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
    for offset in (0..3 * p.page).step_by(8) {
        if offset != last_of_middle && offset != first_of_last {
            assert_eq!(p.read(offset), offset);
        }
    }
}

#[test]
fn a_mismatch_writes_nothing_and_leaves_the_page_read_only() {
    let p = Pages::new();
    let offset = p.page + 8;
    let maps = p.maps();
    // SAFETY: as in Pages::write, with an expected value the slot does not hold.
    let got = unsafe { compare_and_write(&maps, "test pages", p.base() + offset, 1, 2) }.unwrap();
    assert_eq!(got, SlotWrite::Mismatch { actual: offset });
    assert_eq!(p.read(offset), offset);
    assert_eq!(p.protections(), [Protection::READ; 3]);
}
