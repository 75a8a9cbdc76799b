//! Definition lookups through the GNU and SysV hash tables of the libraries this test process
//! loaded.

use super::*;
use crate::elf::{snapshot, Snapshot};

/// This process's C library.
fn libc_in(snap: &Snapshot) -> &LoadedObject {
    snap.objects
        .iter()
        .find(|o| o.name.contains("libc.so"))
        .expect("libc loaded")
}

#[test]
fn libc_defines_getpid_and_not_a_made_up_name() {
    let snap = snapshot();
    let libc = libc_in(&snap);
    assert!(defines(libc, "getpid", None));
    // The oldest symbol version glibc has on each architecture.
    let base_version = if cfg!(target_arch = "aarch64") {
        "GLIBC_2.17"
    } else {
        "GLIBC_2.2.5"
    };
    assert!(defines(libc, "getpid", Some(base_version)));
    assert!(!defines(libc, "getpid", Some("NO_SUCH_VERSION")));
    assert!(!defines(libc, "cuhook_no_such_symbol", None));
    // The main program imports getpid-like symbols but defines none of libc's.
    assert!(!defines(&snap.objects[0], "getpid", None));
}

/// Visit every object of this process that has a usable GNU hash table.
fn each_gnu_table(mut visit: impl FnMut(&LoadedObject, &DynamicTables, &Image<'_>, &GnuTable<'_>)) {
    for obj in snapshot().objects {
        let Ok(Some(t)) = DynamicTables::read(&obj) else {
            continue;
        };
        let img = Image::new(&obj);
        if let Some(table) = t.gnu_hash.and_then(|at| GnuTable::read(&img, at)) {
            visit(&obj, &t, &img, &table);
        }
    }
}

/// Reading a small table symbol by symbol finds exactly what asking it name by name finds,
/// in every object of this process, for names each object defines and names none does.
#[test]
fn symbols_read_one_by_one_match_lookups_name_by_name() {
    let mut compared = 0;
    each_gnu_table(|obj, t, img, table| {
        let Some(hashed) = table.few_hashed(img, 1 << 16) else {
            return;
        };
        let name_at = |index: u32| {
            t.sym_addr(index as usize)
                .and_then(|a| img.read::<Sym>(a))
                .and_then(|s| t.string(img, s.st_name as usize))
        };
        // Every other symbol the object hashes (found bucket by bucket, chain by chain,
        // independently of `few_hashed`), and names nobody defines.
        let mut all = Vec::new();
        for b in 0..table.nbuckets as usize {
            let Some(mut i) = table.bucket(img, b).filter(|&i| i >= table.symoffset) else {
                continue;
            };
            while let Some(h) = table.chain(img, i) {
                all.extend(name_at(i).map(<[u8]>::to_vec));
                if h & 1 != 0 {
                    break;
                }
                i += 1;
            }
        }
        let mut names: Vec<Vec<u8>> = all.into_iter().step_by(2).collect();
        names.extend((0..20).map(|k| format!("cuhook_nobody_{k}").into_bytes()));
        let wanted = WantedNames::of(&names);
        let mut by_name = Vec::new();
        for (name, hash) in wanted.with_gnu_hashes() {
            table.walk(img, hash, |i| {
                if name_at(i as u32) == Some(name) {
                    by_name.push(i as u32);
                }
                false
            });
        }
        let one_by_one: Vec<u32> = hashed
            .filter(|&i| {
                table.chain(img, i).is_some_and(|h| wanted.may_have_hash(h))
                    && name_at(i).is_some_and(|n| wanted.contains(n))
            })
            .collect();
        by_name.sort_unstable();
        by_name.dedup();
        assert_eq!(one_by_one, by_name, "{}", obj.display_name());
        compared += by_name.len();
    });
    assert!(compared > 20, "only {compared} symbols compared");
}

/// The Bloom filter test is the loader's: every symbol a GNU hash table holds passes it (in
/// every object of this process), and it turns most made-up names away.
#[test]
fn bloom_filter_passes_every_hashed_symbol_and_turns_others_away() {
    let (mut passed, mut refused, mut tried) = (0, 0, 0);
    each_gnu_table(|obj, t, img, table| {
        // Every hashed symbol, chain by chain (up to 5,000 per object).
        let mut seen = 0;
        for b in 0..table.nbuckets as usize {
            let Some(mut index) = table.bucket(img, b) else {
                break;
            };
            while index >= table.symoffset && seen < 5000 {
                seen += 1;
                let at = table.chains + (index - table.symoffset) as usize * 4;
                let (Some(ch), Some(sym)) = (
                    img.read::<u32>(at),
                    t.sym_addr(index as usize).and_then(|a| img.read::<Sym>(a)),
                ) else {
                    break;
                };
                if let Some(name) = t.string(img, sym.st_name as usize) {
                    assert!(
                        table.may_hold(gnu_hash(name)),
                        "{}: {} refused",
                        obj.display_name(),
                        String::from_utf8_lossy(name)
                    );
                    passed += 1;
                }
                if ch & 1 != 0 {
                    break;
                }
                index += 1;
            }
        }
        for k in 0..100 {
            tried += 1;
            let made_up = format!("cuhook_no_such_symbol_{k}");
            refused += usize::from(!table.may_hold(gnu_hash(made_up.as_bytes())));
        }
    });
    assert!(passed > 100, "only {passed} symbols checked");
    assert!(
        refused * 2 > tried,
        "the filter refused {refused} of {tried}"
    );
}

/// The names offered to prove a dependency is in a handle's scope are each the object's own
/// default-version global definition, the loader agrees (`dlsym` in the object's scope lands
/// in it), and the list stops when the visitor says so.
#[test]
#[allow(unsafe_code)]
fn exported_names_are_the_objects_own_definitions() {
    let snap = snapshot();
    let libc = libc_in(&snap);
    let mut names = Vec::new();
    exported_names(&Image::new(libc), &mut |n| {
        names.push(String::from_utf8(n.to_vec()).unwrap());
        names.len() < 4
    });
    assert_eq!(names.len(), 4, "libc exports hundreds of names: {names:?}");
    for n in &names {
        assert!(defines(libc, n, None), "{n} is not libc's own definition");
        let c = std::ffi::CString::new(n.as_str()).unwrap();
        let handle =
            crate::sys::dl::open_loaded(Some(&std::ffi::CString::new(libc.name.as_str()).unwrap()))
                .expect("libc by name");
        // SAFETY: our own reference to libc, closed below; a NUL-terminated name.
        let at = unsafe { crate::sys::dl::lookup(handle, &c, None) };
        // SAFETY: the reference taken above, given back once.
        unsafe { crate::sys::dl::close(handle) };
        assert!(libc.contains(at), "dlsym({n}) = {at:#x} is not in libc");
    }
    // The main program imports from libc but exports nothing of this kind through a GNU hash
    // table, or only its own names.
    exported_names(&Image::new(&snap.objects[0]), &mut |n| {
        assert!(!names.iter().any(|x| x.as_bytes() == n), "{n:?} is libc's");
        true
    });
}
