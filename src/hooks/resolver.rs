//! Which function a hooked symbol really resolves to (never a PLT stub or a non-PIE
//! executable's canonical entry), asked the way the loader would bind it.

use rustc_hash::FxHashMap as HashMap;
use std::ffi::CStr;
use std::sync::Arc;

use crate::elf::{ObjectIndex, Slot};

use super::batch::Batch;
use super::engine::KnownAt;
use super::loader::{lookup_global, Pin};
use super::set::Hook;

/// Whether a patch has anything to do with this object: slots to write, or definitions of
/// hooked functions to find.
pub(super) fn matters(idx: &ObjectIndex) -> bool {
    !idx.is_empty() || idx.defines_wanted()
}

/// The canonical PLT entries of `symbol` in `canonical` (the indexes of non-PIE executables
/// that take its address): addresses that look like the function but are not it.
pub(super) fn canonical_entries<'a>(
    canonical: &'a [Arc<ObjectIndex>],
    symbol: &'a str,
) -> impl Iterator<Item = usize> + 'a {
    canonical
        .iter()
        .flat_map(move |i| i.slots(symbol, None).filter_map(|s| s.canonical_plt))
}

/// Finds the function a symbol really resolves to, never a PLT stub.
pub(super) struct Resolver<'a> {
    symbol: &'a CStr,
    batch: &'a Batch,
    /// Canonical PLT entries (non-PIE executables) of this symbol: addresses that *look* like
    /// the function but jump through a GOT slot we may have patched.
    pub canonical: Vec<usize>,
    /// Every known object, for the rare search behind a canonical entry.
    known: Option<&'a HashMap<usize, KnownAt>>,
}

impl<'a> Resolver<'a> {
    pub fn new(
        hook: &'a Hook,
        batch: &'a Batch,
        canonical: &[Arc<ObjectIndex>],
        known: Option<&'a HashMap<usize, KnownAt>>,
    ) -> Self {
        let canonical = canonical_entries(canonical, hook.symbol()).collect();
        Resolver {
            symbol: &hook.symbol,
            batch,
            canonical,
            known,
        }
    }

    /// The first definition found in the scope of a batch object that may define the symbol
    /// (pinned on demand; usually one or two objects), skipping canonical PLT entries.
    pub fn in_definers(&self, version: Option<&CStr>) -> usize {
        self.batch
            .definers()
            .iter()
            .filter_map(|&i| self.batch.pin(i))
            .map(|p| p.lookup(self.symbol, version))
            .find(|&a| a != 0 && !self.canonical.contains(&a))
            .unwrap_or(0)
    }

    /// The definition the loader would bind: global scope first, then the scope of the
    /// importer (batch object `importer`; objects loaded `RTLD_LOCAL`), skipping canonical PLT
    /// entries.
    pub fn definition(&self, version: Option<&CStr>, importer: Option<usize>) -> usize {
        let mut found = lookup_global(self.symbol, version);
        if found == 0 {
            if let Some(pin) = importer.and_then(|i| self.batch.pin(i)) {
                found = pin.lookup(self.symbol, version);
            }
        }
        if found != 0 && self.canonical.contains(&found) {
            // Behind a non-PIE executable's canonical entry: the definition is in the scope of
            // some other object. Ask the batch's definers first, then pin known objects one by
            // one (only programs that take the address of a hooked function come here).
            let real = |a: usize| a != 0 && !self.canonical.contains(&a);
            found = Some(self.in_definers(version))
                .filter(|&a| real(a))
                .or_else(|| {
                    self.known?
                        .values()
                        .flatten()
                        .filter(|k| k.object.position != 0 && k.index.is_some())
                        .filter_map(|k| Pin::object(&k.object))
                        .map(|p| p.lookup(self.symbol, version))
                        .find(|&a| real(a))
                })
                .unwrap_or(0);
        }
        found
    }

    /// What a slot holding `value` is bound to. A value inside the importer itself is its
    /// lazy PLT stub (or its own canonical entry): resolve in the importer's scope instead.
    pub fn binding(&self, value: usize, slot: Slot, importer: &ObjectIndex, at: usize) -> usize {
        if importer.object.contains(value) || self.canonical.contains(&value) {
            let version = importer
                .version_of(slot.address)
                .and_then(|v| std::ffi::CString::new(v).ok());
            let exact = self.definition(version.as_deref(), Some(at));
            if version.is_some() {
                // The loader takes, for a versioned reference, the first definition of the exact
                // version *or without a version*; `dlvsym` only the former. An earlier definer
                // without a version (a preloaded wrapper) is what the slot will be bound to.
                let first = self.definition(None, Some(at));
                if first != 0 && first != exact && self.unversioned_at(first) {
                    return first;
                }
            }
            exact
        } else {
            value
        }
    }

    /// Whether the known object holding `address` defines this symbol without a version.
    fn unversioned_at(&self, address: usize) -> bool {
        let name = self.symbol.to_str().unwrap_or_default();
        self.known
            .into_iter()
            .flat_map(|k| k.values().flatten())
            .find(|k| k.object.contains(address))
            .and_then(|k| {
                crate::hooks::while_pinned(&k.object, || {
                    crate::elf::defines_unversioned(&k.object, name)
                })
            })
            .unwrap_or(false)
    }
}
