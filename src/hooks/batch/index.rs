//! Indexing objects that have no reference of ours, from inside walks of the loader's list,
//! into storage reserved before the walk: many objects at a first install
//! ([`index_listed`]), or the new dependencies one `dlopen` brought ([`index_after`]).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::Arc;

use crate::elf::{IndexFailure, IndexRoom, Indexed, LoadedObject, ObjectIndex, WantedNames};
use crate::Result;

use super::visit;

/// Room reserved for the objects one walk indexes: enough for a big process in one walk (most
/// objects import no hooked function and take none of it). An object that finds the room full
/// waits for the next walk; one too big for an empty room is left to a pin by name.
const WALK_ENTRIES: usize = 16 * 1024;
const WALK_NAME_BYTES: usize = 1 << 20;

/// Index `objects` (from a snapshot whose loader removal counter was `subs`) without a
/// reference of our own, from inside walks of the loader's list, into storage reserved
/// beforehand. Per object: its index, the error that kept it from being read, or `None` when no
/// walk could vouch for it (removed meanwhile, not yet relocated, anything unloaded since the
/// snapshot, too big for the room): the caller pins it by name or leaves it alone.
pub(crate) fn index_listed(
    objects: &[Arc<LoadedObject>],
    wanted: &WantedNames,
    subs: u64,
) -> Vec<Option<Result<ObjectIndex>>> {
    let mut out: Vec<Option<Result<ObjectIndex>>> = objects.iter().map(|_| None).collect();
    let mut room = IndexRoom::fixed(WALK_ENTRIES, WALK_NAME_BYTES, wanted.len());
    let mut pending: Vec<usize> = (0..objects.len()).collect();
    while !pending.is_empty() {
        room.clear();
        let listed: Vec<&LoadedObject> = pending.iter().map(|&i| &*objects[i]).collect();
        let mut parts: Vec<Option<std::result::Result<Indexed, IndexFailure>>> =
            vec![None; listed.len()];
        let mut full = false;
        let reached = visit(&listed, subs, &mut |k| {
            if full {
                return;
            }
            let was_empty = room.is_empty();
            match ObjectIndex::index_into(listed[k], Some(wanted), &mut room) {
                // The rest waits for the next walk, with the room emptied.
                Err(IndexFailure::Full) if !was_empty => full = true,
                result => parts[k] = Some(result),
            }
        });
        let mut next = Vec::new();
        for (k, part) in parts.into_iter().enumerate() {
            let i = pending[k];
            match part {
                Some(Ok(part)) => {
                    out[i] = Some(Ok(ObjectIndex::from_room(objects[i].clone(), &room, &part)))
                }
                Some(Err(IndexFailure::Full)) => {}
                Some(Err(e)) => out[i] = Some(Err(e.into_error(&objects[i]))),
                None if reached[k] => next.push(i),
                None => {}
            }
        }
        pending = next;
    }
    out
}

/// Room per object for [`index_after`]: a new dependency that imports more (or has longer
/// names) is indexed again the way [`index_listed`] does it.
const AFTER_ENTRIES: usize = 128;
const AFTER_NAME_BYTES: usize = 4096;

/// Exported names [`index_after`] keeps per object, and the longest it keeps.
const AFTER_EXPORTS: usize = 4;
const AFTER_EXPORT_BYTES: usize = 256;

/// What [`index_after`] found.
pub(crate) struct IndexedAfter {
    /// The objects, with their link maps.
    pub objects: Vec<(Arc<LoadedObject>, usize)>,
    /// Each one's index as [`index_listed`] gives it.
    pub indexes: Vec<Option<Result<ObjectIndex>>>,
    /// A few names each exports (`IndexRoom::exported_names`): a `dlsym` of one through the opened
    /// object's handle that lands in the object proves the object is in that handle's scope.
    pub exported: Vec<Vec<CString>>,
}

/// The `count` objects the loader lists after the object whose link map is `link_map`
/// (`elf::listed_after`: the new dependencies a `dlopen` brought), each indexed inside the walk
/// that finds them, into storage reserved beforehand: one walk of the loader's list for all of
/// them, without a reference of our own; with `exports`, a few names each exports too. `None`
/// when they are not exactly those.
///
/// # Safety
/// As `elf::listed_after`: the object of `link_map` stays loaded while this runs.
pub(crate) unsafe fn index_after(
    link_map: usize,
    count: usize,
    wanted: &WantedNames,
    subs: u64,
    exports: bool,
) -> Option<IndexedAfter> {
    let mut room = IndexRoom::fixed(
        count * AFTER_ENTRIES,
        count * AFTER_NAME_BYTES,
        wanted.len(),
    );
    let mut parts: Vec<Option<std::result::Result<Indexed, IndexFailure>>> = vec![None; count];
    let mut names: Vec<u8> = Vec::with_capacity(count * AFTER_EXPORTS * AFTER_EXPORT_BYTES);
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(count * AFTER_EXPORTS);
    let mut owners: Vec<usize> = Vec::with_capacity(count * AFTER_EXPORTS);
    // SAFETY: the caller's promise, passed on.
    let listed = unsafe {
        crate::elf::listed_after(link_map, count, subs, &mut |i, obj| {
            parts[i] = Some(ObjectIndex::index_into(obj, Some(wanted), &mut room));
            let mut kept = 0;
            if !exports {
                return;
            }
            room.exported_names(obj, &mut |name| {
                // Within the capacities reserved above: nothing allocates.
                if name.len() <= AFTER_EXPORT_BYTES {
                    spans.push((names.len(), name.len()));
                    owners.push(i);
                    names.extend_from_slice(name);
                    kept += 1;
                }
                kept < AFTER_EXPORTS
            });
        })
    }?;
    let objects: Vec<(Arc<LoadedObject>, usize)> =
        listed.into_iter().map(|(o, m)| (Arc::new(o), m)).collect();
    let indexes = parts
        .into_iter()
        .zip(&objects)
        .map(|(part, (obj, _))| match part {
            Some(Ok(part)) => Some(Ok(ObjectIndex::from_room(obj.clone(), &room, &part))),
            Some(Err(IndexFailure::Full)) | None => None,
            Some(Err(e)) => Some(Err(e.into_error(obj))),
        })
        .collect();
    let mut exported: Vec<Vec<CString>> = (0..count).map(|_| Vec::new()).collect();
    for (&(at, len), &i) in spans.iter().zip(&owners) {
        exported[i].extend(CString::new(&names[at..at + len]).ok());
    }
    Some(IndexedAfter {
        objects,
        indexes,
        exported,
    })
}
