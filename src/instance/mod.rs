//! One engine per process, however many copies of cuhook it holds.
//!
//! `libcuhook.so` (preloaded, or a library's dependency), a program that embeds the crate, and
//! a library of the user's that does are each a copy with its own hooks and registry. Two of
//! them installed at once would patch each other's slots, and each registry would hear only the
//! calls its own hooks caught: a program's `lookup` would ask an empty registry while the
//! preloaded one sees everything. So each copy publishes a table of entry points
//! ([`table::Peer`]) in a `cuhook` ELF note of its object, found by walking the program headers
//! of the loaded objects (a program's symbols are not exported, its notes are always mapped),
//! and the public API, Rust and C, first asks which copy serves the process:
//!
//! - the copy that claimed it first: the one whose registry is attached (its CUDA hooks are
//!   installed). Once another copy is chosen, this copy forwards to it for good (its object
//!   is pinned, so the table never dangles);
//! - otherwise this copy, which claims the process when it installs.
//!
//! A copy whose table has another ABI (another cuhook release) is never used: both then keep
//! their own engine, and the first one to see the other says so once. Generic hook sets
//! (`crate::hooks`) always belong to the copy they are installed with.

mod discover;
mod table;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub(crate) use table::{Peer, Record, MESSAGE};

use crate::log::Level;

/// Which copy the API talks to.
#[derive(Clone, Copy)]
pub(crate) enum Route {
    /// This copy.
    Own,
    /// Another copy, which owns the process.
    Other(&'static Peer),
}

/// The other copy chosen for good (its table's address; 0: none yet).
static OTHER: AtomicUsize = AtomicUsize::new(0);
/// The loader's add counter when the candidates were last looked for (`u64::MAX`: never).
static SEARCHED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
/// Other copies seen in the last walk, not yet claiming the process.
static CANDIDATES: [AtomicUsize; discover::MOST] = [const { AtomicUsize::new(0) }; discover::MOST];
static WARNED_INCOMPATIBLE: AtomicBool = AtomicBool::new(false);

/// Whether this copy serves the process: its registry is attached (its CUDA hooks are
/// installed and keep it current).
#[inline(always)]
pub(crate) fn own_claimed() -> bool {
    crate::registry::attached()
}

/// This copy's table.
fn own_table() -> usize {
    &table::PEER as *const Peer as usize
}

/// Which copy to use now, for calls that may ask the loader (install, subscribe, statistics):
/// settled in a load or two; otherwise the loader's list is walked again when it changed, and
/// the copies found are asked whether one claimed the process.
#[inline]
pub(crate) fn route() -> Route {
    match settled() {
        Some(route) => route,
        None => {
            refresh();
            claimed_candidate().unwrap_or(Route::Own)
        }
    }
}

/// [`route`] for lookups, which must never call the loader (a lookup may run in a child forked
/// while another thread held the loader's locks): only the copies found by earlier walks (the
/// constructor's, an install's or a subscription's) are asked.
#[inline]
pub(crate) fn route_quick() -> Route {
    settled().or_else(claimed_candidate).unwrap_or(Route::Own)
}

/// The copy already chosen, or this one while it serves the process.
#[inline(always)]
fn settled() -> Option<Route> {
    let other = OTHER.load(Ordering::Acquire);
    if other != 0 {
        // SAFETY: only `claimed_candidate` stores here: a checked table in a pinned object.
        #[allow(unsafe_code)]
        return Some(Route::Other(unsafe { &*(other as *const Peer) }));
    }
    own_claimed().then_some(Route::Own)
}

/// Look for other copies (once at start, and again when the loader's list changed), pinning
/// each one found.
#[cold]
fn refresh() {
    let adds = crate::elf::counters().adds;
    if SEARCHED_AT.swap(adds, Ordering::AcqRel) == adds {
        return;
    }
    let found = discover::others(own_table());
    crate::log!(
        Level::Debug,
        "other copies of cuhook: {} usable, {} of another release",
        found.count,
        found.incompatible
    );
    let mut kept = 0;
    for &table in &found.tables[..found.count] {
        // Pinned for good (the main program needs no pin): a lookup may then use the copy
        // without asking the loader anything.
        let pinned = crate::sys::dl::in_main_program(table)
            || CANDIDATES
                .iter()
                .any(|c| c.load(Ordering::Acquire) == table)
            || crate::sys::dl::open_containing(table).is_some();
        if pinned {
            CANDIDATES[kept].store(table, Ordering::Release);
            kept += 1;
        }
    }
    for slot in &CANDIDATES[kept..] {
        slot.store(0, Ordering::Release);
    }
    if found.incompatible > 0 && !WARNED_INCOMPATIBLE.swap(true, Ordering::Relaxed) {
        crate::log!(
            Level::Warn,
            "another cuhook release is loaded in this process ({} copies with another interface): each keeps its own hooks and registry",
            found.incompatible
        );
    }
}

/// The first known copy that claims the process, chosen for good.
#[cold]
fn claimed_candidate() -> Option<Route> {
    for slot in &CANDIDATES {
        let table = slot.load(Ordering::Acquire);
        if table == 0 {
            break;
        }
        // SAFETY: a table `discover` checked, in an object pinned by `refresh`.
        #[allow(unsafe_code)]
        let claimed = unsafe { ((*(table as *const Peer)).claimed)() } != 0;
        if !claimed {
            continue;
        }
        let chosen = match OTHER.compare_exchange(0, table, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => table,
            Err(earlier) => earlier,
        };
        // SAFETY: as above.
        #[allow(unsafe_code)]
        return Some(Route::Other(unsafe { &*(chosen as *const Peer) }));
    }
    None
}

/// At start-up (every copy's constructor): find the other copies already loaded, so that a
/// program's lookups use a preloaded engine from its first call.
pub(crate) fn discover_at_start() {
    refresh();
    if let Some(Route::Other(peer)) = claimed_candidate() {
        crate::log!(
            Level::Info,
            "the copy of cuhook in {} serves this process: this one forwards to it",
            object_of(peer)
        );
    }
}

/// The object holding another copy's table, for messages.
pub(crate) fn object_of(peer: &Peer) -> String {
    let name = crate::sys::dl::file_containing(peer as *const Peer as usize).unwrap_or_default();
    if name.is_empty() {
        "<main program>".to_owned()
    } else {
        String::from_utf8_lossy(&name).into_owned()
    }
}
