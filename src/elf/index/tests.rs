//! The index against this test program's own relocations and the libraries it loaded: fixed
//! and growable rooms, name filters, array and entry-by-entry reads, hash-table lookups.

use super::tables::{each_relocation, entry};
use super::*;
use crate::elf::dynamic::DynamicTables;
use crate::elf::image::Image;
use crate::elf::snapshot;
use crate::elf::wanted::gnu_hash;

#[test]
fn indexes_only_wanted_symbols_of_the_test_program() {
    let snap = snapshot();
    let exe = snap.objects[0].clone();
    let all = ObjectIndex::build(exe.clone(), None).unwrap();
    let some = ObjectIndex::build(exe, Some(&[b"malloc".to_vec()])).unwrap();
    assert!(
        all.slots("malloc", None).next().is_some(),
        "the test program imports malloc"
    );
    assert!(
        all.slots("free", None).next().is_some(),
        "the test program imports free"
    );
    assert_eq!(
        some.slots("malloc", None).count(),
        all.slots("malloc", None).count()
    );
    assert_eq!(some.slots("free", None).count(), 0);
    assert!(some.len() < all.len());
    for (_, _, slot) in all.iter() {
        assert!(slot.address % 8 == 0 && all.object.contains(slot.address));
    }
}

fn listing(idx: &ObjectIndex) -> Vec<(String, Option<String>, Slot)> {
    idx.iter()
        .map(|(n, v, s)| (n.to_owned(), v.map(str::to_owned), s))
        .collect()
}

/// Objects indexed one after another into one fixed room (as inside a walk of the loader's
/// list) give the same indexes as built alone; a room too small says `Full` and keeps
/// nothing of that object.
#[test]
fn a_shared_fixed_room_gives_the_same_indexes_and_refuses_what_does_not_fit() {
    let names: Vec<Vec<u8>> = ["free", "malloc", "memcpy", "pthread_create", "strlen"]
        .iter()
        .map(|n| n.as_bytes().to_vec())
        .collect();
    let objects = snapshot().objects;
    let wanted = WantedNames::of(&names);
    let mut room = IndexRoom::fixed(4096, 1 << 16, names.len());
    let (entries, arena) = (room.entries.capacity(), room.arena.capacity());
    let mut parts = Vec::new();
    for obj in &objects {
        parts.push(ObjectIndex::index_into(obj, Some(&wanted), &mut room));
    }
    assert_eq!(
        (room.entries.capacity(), room.arena.capacity()),
        (entries, arena)
    );
    let mut compared = 0;
    for (obj, part) in objects.iter().zip(&parts) {
        let alone = ObjectIndex::build(obj.clone(), Some(&names));
        match (part, alone) {
            (Ok(part), Ok(alone)) => {
                let shared = ObjectIndex::from_room(obj.clone(), &room, part);
                assert_eq!(listing(&shared), listing(&alone), "{}", obj.display_name());
                compared += alone.len();
            }
            (Err(IndexFailure::Bad(_)), Err(_)) => {}
            (part, alone) => panic!("{}: {part:?} vs {alone:?}", obj.display_name()),
        }
    }
    assert!(compared > 0, "no object imports any of the names");

    // The test program imports malloc and free: one entry of room is not enough.
    let exe = &objects[0];
    let mut tiny = IndexRoom::fixed(1, 1 << 16, names.len());
    assert_eq!(
        ObjectIndex::index_into(exe, Some(&wanted), &mut tiny).unwrap_err(),
        IndexFailure::Full
    );
    assert!(tiny.is_empty(), "a refused object leaves nothing behind");
}

/// Names the test objects import or define (some in every process: libc's).
const TEST_NAMES: [&str; 13] = [
    "malloc",
    "free",
    "getpid",
    "dlopen",
    "dlsym",
    "pthread_create",
    "__cxa_finalize",
    "strlen",
    "memcpy",
    "_Unwind_Resume",
    "__libc_start_main",
    "abort",
    "write",
];

/// Each slot carries its name's true hash (a patch finds hooks from it), and the defines
/// filter never turns away a name the object defines (in every object of this process).
#[test]
fn slot_hashes_and_name_filters_hold_every_imported_and_defined_name() {
    let names = TEST_NAMES;
    let wanted = WantedNames::of(names);
    let (mut imported, mut defined) = (0, 0);
    for obj in snapshot().objects {
        let Ok(idx) = ObjectIndex::build(obj.clone(), Some(wanted.names())) else {
            continue;
        };
        for (hash, name, _, _) in idx.named_slots() {
            assert_eq!(hash, gnu_hash(name), "{}", String::from_utf8_lossy(name));
            imported += 1;
        }
        assert_eq!(idx.named_slots().count(), idx.iter().count());
        for name in names {
            if crate::elf::defines(&obj, name, None) {
                assert!(
                    idx.defines().may_hold(gnu_hash(name.as_bytes())),
                    "{} defines {name}",
                    obj.display_name()
                );
                defined += 1;
            }
        }
    }
    assert!(
        imported > 0 && defined > 0,
        "{imported} imported, {defined} defined"
    );
    let one = NameFilter::of(gnu_hash(b"malloc"));
    assert!(one.may_hold(gnu_hash(b"malloc")) && !one.is_empty());
    assert!(!NameFilter::EMPTY.may_hold(gnu_hash(b"malloc")));
    assert!(NameFilter::ALL.may_hold(gnu_hash(b"anything")));
}

/// Relocation tables walked as arrays give exactly the entries read one by one, in every
/// object of this process.
#[test]
fn relocation_tables_read_as_arrays_match_entry_by_entry_reads() {
    let mut compared = 0;
    for obj in snapshot().objects {
        let Ok(Some(t)) = DynamicTables::read(&obj) else {
            continue;
        };
        let img = Image::new(&obj);
        for table in t.relocs.iter() {
            let mut walked = Vec::new();
            each_relocation(&img, table, &|_| true, |o, i, a| {
                walked.push((o, i, a));
                Ok::<(), ()>(())
            })
            .unwrap();
            let n = table.size / table.entsize;
            let one_by_one: Vec<_> = (table.relative.min(n)..n)
                .map_while(|i| entry(&img, table, i))
                .collect();
            assert_eq!(walked, one_by_one, "{}", obj.display_name());
            compared += walked.len();
        }
    }
    assert!(compared > 100, "only {compared} relocations compared");
}

/// The hash-table shortcut finds exactly the slots a name-by-name scan finds, in every
/// object of this process (executable, libc, libgcc, the loader, the vDSO).
#[test]
fn hash_lookup_finds_the_same_slots_as_reading_every_name() {
    let mut names: Vec<Vec<u8>> = TEST_NAMES.iter().map(|n| n.as_bytes().to_vec()).collect();
    names.sort();
    let mut compared = 0;
    for obj in snapshot().objects {
        let Ok(all) = ObjectIndex::build(obj.clone(), None) else {
            continue;
        };
        let fast = ObjectIndex::build(obj.clone(), Some(&names)).unwrap();
        let slow: Vec<_> = all
            .iter()
            .filter(|(n, _, _)| names.iter().any(|w| w == n.as_bytes()))
            .map(|(n, v, s)| (n.to_owned(), v.map(str::to_owned), s))
            .collect();
        let got: Vec<_> = fast
            .iter()
            .map(|(n, v, s)| (n.to_owned(), v.map(str::to_owned), s))
            .collect();
        assert_eq!(got, slow, "{}", obj.display_name());
        compared += slow.len();
    }
    assert!(compared > 0, "no object imports any of the names");
}
