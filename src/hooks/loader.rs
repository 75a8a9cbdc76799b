//! Keeping objects mapped while the engine reads or writes them: pins (a loader reference of
//! our own, or one the caller holds), and walks of the loader's list that vouch for objects
//! without a reference. The loader calls themselves live in `crate::sys::dl`.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::ops::ControlFlow;

use crate::elf::LoadedObject;
use crate::sys::dl::{self, Handle, Listed};

pub(crate) use crate::sys::dl::{lookup_global, vdso_and_interpreter};

/// What glibc's `_dl_find_object` says of an address inside `obj` (its first segment's start,
/// else its load bias): `Some(Some(link map))` of the relocated object there, `Some(None)` when
/// none is, `None` when this glibc cannot say (before 2.35). Lock-free: usable inside walks.
pub(crate) fn registered_at(obj: &LoadedObject) -> Option<Option<usize>> {
    dl::object_at(obj.segments().next().map_or(obj.base, |s| s.0))
}

/// Objects pinned by name so far in this process (see [`pinned_by_name`]).
static PINNED_BY_NAME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times an object was pinned by name (`dlopen` with `RTLD_NOLOAD`, which makes glibc
/// compare the name with every loaded object), for the diagnostics.
pub(crate) fn pinned_by_name() -> u64 {
    PINNED_BY_NAME.load(std::sync::atomic::Ordering::Relaxed)
}

/// A reference that keeps an object loaded while the engine reads or writes it: our own
/// (`dlopen(RTLD_NOLOAD)`, closed on drop) or borrowed from a caller that holds one.
#[derive(Debug)]
pub struct Pin {
    handle: Handle,
    owned: bool,
}

// SAFETY: a dlopen handle may be used and closed from any thread.
unsafe impl Send for Pin {}
// SAFETY: `Pin` offers only `&self` lookups, which glibc serialises internally.
unsafe impl Sync for Pin {}

impl Pin {
    /// Pin an already-loaded object without loading anything. `None` when the object cannot be
    /// found in this namespace under its name (another `dlmopen` namespace, a name that no
    /// longer resolves), or when the name finds an object at another base address.
    pub fn object(obj: &LoadedObject) -> Option<Pin> {
        Pin::named(obj.base, &obj.name)
    }

    /// [`Pin::object`] for the object at load bias `base` with the recorded path `name` (empty
    /// for the main program, which is opened as `dlopen(NULL)`; the base check tells any other
    /// object apart).
    pub fn named(base: usize, name: &str) -> Option<Pin> {
        PINNED_BY_NAME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = if name.is_empty() {
            dl::open_loaded(None)?
        } else {
            dl::open_loaded(Some(&CString::new(name.as_bytes()).ok()?))?
        };
        let pin = Pin {
            handle,
            owned: true,
        };
        (pin.base() == Some(base)).then_some(pin)
    }

    /// The loader's handle, for a lookup the pin's holder makes itself; live while the pin is.
    pub fn handle(&self) -> *mut c_void {
        self.handle
    }

    /// Use a handle the caller holds open (the one `dlopen` just returned to our interposer)
    /// as the pin, without taking another reference.
    ///
    /// # Safety
    /// `handle` must be a live `dlopen` handle that nobody closes while the `Pin` exists.
    pub unsafe fn borrowed(handle: *mut c_void) -> Pin {
        Pin {
            handle,
            owned: false,
        }
    }

    /// The load bias of the pinned object.
    fn base(&self) -> Option<usize> {
        // SAFETY: the pin keeps the handle, hence its link map, live.
        unsafe { dl::link_map(self.handle).map(|m| (*m).l_addr) }
    }

    /// The pinned object as the loader describes it, asked through the handle (no walk of
    /// the object list), with its link map; `None` when it lives in another namespace or the
    /// loader cannot say (`RTLD_DI_PHDR` needs glibc 2.36).
    pub fn describe(&self) -> Option<(LoadedObject, usize)> {
        // SAFETY: the pin keeps the handle live.
        if !unsafe { dl::in_base_namespace(self.handle) } {
            return None;
        }
        // SAFETY: the pin keeps the handle live.
        let map = unsafe { dl::link_map(self.handle) }?;
        // SAFETY: the pin keeps the handle live while the program headers are copied (those a
        // snapshot keeps: every look at the segments afterwards passes over half as many).
        let phdrs =
            LoadedObject::kept_program_headers(unsafe { dl::program_headers(self.handle) }?);
        // SAFETY: the pin keeps the object, hence its link map, live.
        let (base, name) = unsafe { dl::map_base_and_name(map) };
        let obj = LoadedObject {
            base,
            name,
            phdrs,
            position: LoadedObject::UNKNOWN_POSITION,
        };
        Some((obj, map as usize))
    }

    /// `dlsym`/`dlvsym` in this object's local scope (the object and its dependencies).
    pub fn lookup(&self, symbol: &CStr, version: Option<&CStr>) -> usize {
        // SAFETY: the pin keeps the handle live.
        unsafe { dl::lookup(self.handle, symbol, version) }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: our own handle from `open_loaded`, given back once.
            unsafe { dl::close(self.handle) };
        }
    }
}

/// Run `work(i)` for each object `objects[i]` without a reference to it: from inside one
/// `dl_iterate_phdr` walk, when the walk finds the object in the loader's list (same load
/// bias, same name) and no object was removed since the snapshot the objects come from
/// (`subs`). glibc unmaps objects while holding the lock that the walk holds, so each object
/// stays mapped while `work` runs; with `subs` unchanged it is the object the snapshot saw
/// (pinning N objects by name instead costs O(N²) name comparisons in glibc). Returns which
/// objects were reached; the caller pins the others by name.
///
/// `work` runs inside the loader's list lock: it must not allocate, take a lock or call the
/// dynamic loader (UCX #3517 deadlocked allocating there).
pub fn visit(objects: &[&LoadedObject], subs: u64, work: &mut dyn FnMut(usize)) -> Vec<bool> {
    if !dl::can_find_objects() {
        // glibc before 2.35: no way to tell a relocated object from one being loaded.
        return vec![false; objects.len()];
    }
    // (load bias, position in `objects`), sorted.
    let mut keys: Vec<(usize, usize)> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| (o.base, i))
        .collect();
    keys.sort_unstable();
    let mut reached = vec![false; objects.len()];
    let walked = dl::iterate(&mut |listed: &Listed<'_>| {
        if !listed.has_counters || listed.info.dlpi_subs != subs {
            // Something was unloaded since the snapshot (or this glibc cannot tell): touch
            // nothing.
            return ControlFlow::Break(());
        }
        let base = listed.info.dlpi_addr as usize;
        let from = keys.partition_point(|k| k.0 < base);
        if keys.get(from).is_none_or(|k| k.0 != base) {
            return ControlFlow::Continue(());
        }
        let name = listed.name();
        for &(b, i) in &keys[from..] {
            if b != base {
                break;
            }
            if reached[i] || !objects[i].is(base, name) {
                continue;
            }
            // Listed is not enough: an object another thread is loading is listed before it is
            // relocated. glibc registers an object for `_dl_find_object` only once it is
            // relocated, so an unregistered one is left to a pin by name, which waits for that
            // load to finish.
            if !matches!(registered_at(objects[i]), Some(Some(_))) {
                continue;
            }
            work(i);
            reached[i] = true;
        }
        ControlFlow::Continue(())
    });
    if walked.is_err() {
        crate::log!(
            crate::log::Level::Error,
            "a batch write panicked inside the loader walk; stopped"
        );
    }
    reached
}
