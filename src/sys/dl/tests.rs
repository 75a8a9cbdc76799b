//! The loader calls against this test process: handles, link maps, the walk.

use super::*;
use std::ops::ControlFlow;

/// Every handle's link map is what the loader says it is, whether it was asked (the first
/// time) or the handle was taken as its own link map (afterwards, on glibc).
#[test]
fn a_handles_link_map_is_the_loaders_answer() {
    let handles: Vec<Handle> = [None, Some(c"libc.so.6"), Some(c"libm.so.6")]
        .into_iter()
        .filter_map(open_loaded)
        .collect();
    assert!(handles.len() >= 2, "the program and libc are loaded");
    for _ in 0..2 {
        for &h in &handles {
            // SAFETY: handles opened above, still open.
            let asked = unsafe { asked_link_map(h) };
            assert!(asked.is_some(), "dlinfo answers a live handle");
            // SAFETY: as above.
            assert_eq!(unsafe { link_map(h) }, asked);
        }
    }
    assert_ne!(HANDLE_IS_MAP.load(Ordering::Relaxed), UNSEEN);
    for h in handles {
        // SAFETY: our own references, given back once.
        unsafe { close(h) };
    }
}

#[test]
fn the_walk_lists_this_program_first_and_finds_it_by_address() {
    let mut names = Vec::new();
    iterate(&mut |o: &Listed<'_>| {
        names.push((o.name().to_vec(), o.info.dlpi_addr as usize, o.has_counters));
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(names.len() > 2, "{names:?}");
    assert!(
        names[0].0.is_empty(),
        "the main program is listed first, unnamed"
    );
    assert!(
        names.iter().all(|n| n.2),
        "glibc has had the counters since 2.4"
    );
    let own = link_map_containing(lookup_global as *const () as usize).unwrap();
    // SAFETY: our own object's link map is live for the whole test.
    let base = unsafe { (*own).l_addr };
    assert!(names.iter().any(|n| n.1 == base));
    assert!(matches!(
        object_at(lookup_global as *const () as usize),
        Some(Some(_)) | None
    ));
}

#[test]
fn a_panicking_visit_stops_the_walk_and_is_reported() {
    let mut seen = 0;
    let r = iterate(&mut |_: &Listed<'_>| -> ControlFlow<()> {
        seen += 1;
        panic!("inside the walk")
    });
    assert_eq!((r, seen), (Err(()), 1));
}
