//! What to hook: symbol → replacement, and where the replacement finds the original.
//!
//! # Safety
//! A hook's original is published through an `AtomicUsize` that the replacement function reads
//! on every call. For hooks written in C the store is a `void *` variable given by address;
//! [`Hook::from_raw`] requires it to stay valid and aligned for as long as the hook is installed.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{Error, Result};

/// Where the engine stores the original function for a replacement to call.
#[derive(Debug, Clone, Copy)]
pub struct OriginalStore(&'static AtomicUsize);

impl OriginalStore {
    /// The original function's address (0 until installed).
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, value: usize) {
        self.0.store(value, Ordering::Release);
    }

    fn addr(&self) -> usize {
        self.0 as *const AtomicUsize as usize
    }
}

/// Another way into a hook: a replacement of the same behaviour that calls an original of its
/// own. Where an importer's slot is bound to a definition other than the hook's original (another
/// interposer's wrapper, or the symbol version its import names while the global lookup gave
/// another), the slot is patched with a chain set to what it held: both interposers see each
/// call, and the uninstall puts the other's pointer back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chain {
    pub(crate) replacement: usize,
    pub(crate) original: OriginalStore,
}

/// One symbol to hook.
#[derive(Debug, Clone)]
pub struct Hook {
    /// For the loader (`dlsym`/`dlvsym`).
    pub(crate) symbol: CString,
    pub(crate) version: Option<CString>,
    /// The symbol as text, made once: the engine asks for it for every slot it plans and every
    /// journal entry it writes (shared, so an entry costs no allocation).
    name: Arc<str>,
    pub(crate) replacement: usize,
    pub(crate) original: OriginalStore,
    /// Chains for slots bound elsewhere (none for most hooks).
    pub(crate) chains: Arc<[Chain]>,
}

impl Hook {
    /// Hook every import of `symbol` (any version) with `replacement`; the original definition
    /// is published in `original` before any slot points at `replacement`.
    pub fn new(symbol: &str, replacement: usize, original: &'static AtomicUsize) -> Result<Hook> {
        let name = symbol;
        let symbol = CString::new(symbol)
            .ok()
            .filter(|s| !s.as_bytes().is_empty())
            .ok_or_else(|| Error::InvalidSymbol {
                symbol: symbol.to_owned(),
            })?;
        if replacement == 0 {
            return Err(Error::InvalidHookSet {
                reason: format!("`{name}` has a null replacement"),
            });
        }
        Ok(Hook {
            symbol,
            version: None,
            name: Arc::from(name),
            replacement,
            original: OriginalStore(original),
            chains: Arc::from([]),
        })
    }

    /// Give the hook chains: (replacement, where that replacement finds its original) pairs,
    /// each replacement behaving as the hook's own but calling the original published in its
    /// store. A slot bound to another definition than the hook's original (another interposer's
    /// wrapper; a library loaded `RTLD_LOCAL` with its own copy of the function) is then patched
    /// with a free chain set to what it held, instead of being left alone as a conflict. As
    /// many different definitions as chains can be followed at once.
    pub fn with_chains(mut self, chains: &[(usize, &'static AtomicUsize)]) -> Hook {
        self.chains = chains
            .iter()
            .map(|&(replacement, original)| Chain {
                replacement,
                original: OriginalStore(original),
            })
            .collect();
        self
    }

    /// Whether a slot holding `value` already leads into this hook (its replacement or a chain).
    pub(crate) fn leads_here(&self, value: usize) -> bool {
        value == self.replacement || self.chains.iter().any(|c| c.replacement == value)
    }

    /// The replacement of the chain that calls `bound`: the one already set to it, else a free
    /// one, set to it now (before any slot leads there). `None` when every chain calls another
    /// definition. Called under the patch lock only.
    pub(crate) fn chain_for(&self, bound: usize) -> Option<usize> {
        if let Some(c) = self.chains.iter().find(|c| c.original.get() == bound) {
            return Some(c.replacement);
        }
        let free = self.chains.iter().find(|c| c.original.get() == 0)?;
        free.original.set(bound);
        Some(free.replacement)
    }

    /// Like [`Hook::new`], with the original stored in a C `void *` variable.
    ///
    /// # Safety
    /// `original` must be non-null, aligned, and valid for reads and writes for as long as any
    /// installation of this hook exists (normally a static variable); it must be accessed only
    /// through plain pointer-sized loads by the replacement.
    pub unsafe fn from_raw(
        symbol: &str,
        replacement: usize,
        original: *mut *const std::ffi::c_void,
    ) -> Result<Hook> {
        if original.is_null()
            || !(original as usize).is_multiple_of(std::mem::align_of::<AtomicUsize>())
        {
            return Err(Error::InvalidArgument {
                what: "hook original pointer is null or misaligned",
            });
        }
        // SAFETY: non-null and aligned (checked); valid for the installation's life (caller).
        let store: &'static AtomicUsize = unsafe { AtomicUsize::from_ptr(original.cast()) };
        Hook::new(symbol, replacement, store)
    }

    /// Hook only imports of `symbol@version`; the original is looked up with `dlvsym`.
    pub fn with_version(mut self, version: &str) -> Result<Hook> {
        let v = CString::new(version)
            .ok()
            .filter(|s| !s.as_bytes().is_empty())
            .ok_or_else(|| Error::InvalidSymbol {
                symbol: format!("{}@{version}", self.name),
            })?;
        self.version = Some(v);
        Ok(self)
    }

    /// The symbol this hook replaces.
    pub fn symbol(&self) -> &str {
        &self.name
    }

    /// The symbol's name, shared (journal entries keep it without copying).
    pub(crate) fn shared_symbol(&self) -> &Arc<str> {
        &self.name
    }

    /// The symbol version it is limited to, if any.
    pub fn version(&self) -> Option<&str> {
        self.version.as_ref().and_then(|v| v.to_str().ok())
    }

    /// Address of the replacement function.
    pub fn replacement(&self) -> usize {
        self.replacement
    }

    /// The original currently published for this hook (0 before the first install).
    pub fn original(&self) -> usize {
        self.original.get()
    }

    fn key(&self) -> (&[u8], Option<&[u8]>, usize, usize) {
        (
            self.symbol.as_bytes(),
            self.version.as_ref().map(|v| v.as_bytes()),
            self.replacement,
            self.original.addr(),
        )
    }
}

/// The hooks among `hooks` (with their `by_hash` index) that an import of `name` (GNU hash
/// `hash`, import version `version`) is for, with their positions: a binary search by hash, then
/// the name, and the version for a versioned hook.
pub(crate) fn hooks_for_import<'h, 'n>(
    hooks: &'h [Hook],
    by_hash: &'h [(u32, u32)],
    (hash, name, version): (u32, &'n [u8], Option<&'n [u8]>),
) -> impl Iterator<Item = (usize, &'h Hook)> + use<'h, 'n> {
    let from = by_hash.partition_point(|e| e.0 < hash);
    by_hash[from..]
        .iter()
        .take_while(move |e| e.0 == hash)
        .map(|&(_, j)| (j as usize, &hooks[j as usize]))
        .filter(move |(_, hook)| {
            hook.symbol.as_bytes() == name
                && hook
                    .version
                    .as_ref()
                    .is_none_or(|v| Some(v.as_bytes()) == version)
        })
}

/// A named group of hooks installed and uninstalled together.
#[derive(Debug, Clone)]
pub struct HookSet {
    pub(crate) name: String,
    /// Shared: the engine takes the list for every batch it patches.
    pub(crate) hooks: std::sync::Arc<[Hook]>,
    /// Each hook's symbol hash, in hook order: whether a new library may define a hook's
    /// function is asked by hash.
    pub(crate) hashes: std::sync::Arc<[u32]>,
    /// (hash, hook position), sorted: the hooks an imported name may belong to, found by a
    /// binary search from the name's hash.
    pub(crate) by_hash: std::sync::Arc<[(u32, u32)]>,
}

impl HookSet {
    /// A set must name each (symbol, version) once.
    pub fn new(name: &str, hooks: Vec<Hook>) -> Result<HookSet> {
        for (i, h) in hooks.iter().enumerate() {
            if hooks[..i]
                .iter()
                .any(|o| o.symbol == h.symbol && o.version == h.version)
            {
                return Err(Error::InvalidHookSet {
                    reason: format!("`{}` appears twice in set `{name}`", h.symbol()),
                });
            }
        }
        let hashes: std::sync::Arc<[u32]> = hooks
            .iter()
            .map(|h| crate::elf::gnu_hash(h.symbol().as_bytes()))
            .collect();
        let mut by_hash: Vec<(u32, u32)> = hashes
            .iter()
            .enumerate()
            .map(|(j, &h)| (h, j as u32))
            .collect();
        by_hash.sort_unstable();
        Ok(HookSet {
            name: name.to_owned(),
            hashes,
            by_hash: by_hash.into(),
            hooks: hooks.into(),
        })
    }

    /// The set's name (shown in diagnostics).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hooks of the set.
    pub fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// Two sets are the same installation when they hook the same symbols with the same
    /// replacements and original stores.
    pub(crate) fn same_as(&self, other: &HookSet) -> bool {
        self.name == other.name
            && self.hooks.len() == other.hooks.len()
            && self
                .hooks
                .iter()
                .zip(other.hooks.iter())
                .all(|(a, b)| a.key() == b.key())
    }
}
