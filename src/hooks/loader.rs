//! The few dynamic-loader calls the engine makes: pinning objects and looking symbols up.
//!
//! # Safety
//! These wrap `dlopen`/`dlsym`/`dlvsym`/`dlinfo`/`dlclose` from glibc. Handles come only from
//! `dlopen` and are closed exactly once (by [`Pin`]'s `Drop`). Strings passed in are
//! NUL-terminated `CString`s that outlive each call. The engine calls these functions through
//! its own object, whose GOT it never patches, so they always reach the real loader.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};

use crate::elf::LoadedObject;

/// The first fields of glibc's `struct link_map` (public ABI, `<link.h>`).
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const libc::c_char,
}

/// A reference that keeps an object loaded while the engine reads or writes it: our own
/// (`dlopen(RTLD_NOLOAD)`, closed on drop) or borrowed from a caller that holds one.
#[derive(Debug)]
pub struct Pin {
    handle: *mut c_void,
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
        let handle = if obj.position == 0 && obj.name.is_empty() {
            // SAFETY: dlopen(NULL) returns the main program's handle.
            unsafe { libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
        } else {
            let name = CString::new(obj.name.as_bytes()).ok()?;
            // SAFETY: `name` is NUL-terminated; RTLD_NOLOAD never loads a new object.
            unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
        };
        if handle.is_null() {
            return None;
        }
        let pin = Pin {
            handle,
            owned: true,
        };
        (pin.base() == Some(obj.base)).then_some(pin)
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

    /// The pinned object's `struct link_map` (in glibc, also its handle's identity).
    pub fn link_map(&self) -> Option<usize> {
        let mut map: *const LinkMapHead = std::ptr::null();
        // SAFETY: RTLD_DI_LINKMAP stores a `struct link_map *` into the pointed-to variable.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LINKMAP,
                (&mut map as *mut *const LinkMapHead).cast(),
            )
        };
        (rc == 0 && !map.is_null()).then_some(map as usize)
    }

    /// The load bias of the pinned object.
    fn base(&self) -> Option<usize> {
        let map = self.link_map()? as *const LinkMapHead;
        // SAFETY: the link map of a pinned object stays valid while the pin is held.
        Some(unsafe { (*map).l_addr })
    }

    /// The pinned object as the loader describes it, asked through the handle (no walk of
    /// the object list), with its link map; `None` when it lives in another namespace or the
    /// loader cannot say (`RTLD_DI_PHDR` needs glibc 2.36).
    pub fn describe(&self) -> Option<(LoadedObject, usize)> {
        let mut lmid: libc::Lmid_t = -1;
        // SAFETY: RTLD_DI_LMID stores the namespace id into the pointed-to `Lmid_t`.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LMID,
                (&mut lmid as *mut libc::Lmid_t).cast(),
            )
        };
        if rc != 0 || lmid != libc::LM_ID_BASE {
            return None;
        }
        let map = self.link_map()?;
        let mut phdr: *const libc::Elf64_Phdr = std::ptr::null();
        // SAFETY: RTLD_DI_PHDR stores the address of the program headers and returns their
        // number (or -1: older glibc, or an error).
        let phnum = unsafe {
            libc::dlinfo(
                self.handle,
                RTLD_DI_PHDR,
                (&mut phdr as *mut *const libc::Elf64_Phdr).cast(),
            )
        };
        if phnum <= 0 || phdr.is_null() {
            return None;
        }
        // SAFETY: the loader's program headers of a pinned object: `phnum` entries, valid while
        // it stays loaded.
        let phdrs = unsafe { std::slice::from_raw_parts(phdr, phnum as usize) }.to_vec();
        let head = map as *const LinkMapHead;
        // SAFETY: the pinned object's link map and its name, a NUL-terminated string the
        // loader keeps for the object's lifetime.
        let (base, name) = unsafe {
            let name = (*head).l_name;
            let name = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            ((*head).l_addr, name)
        };
        let obj = LoadedObject {
            base,
            name,
            phdrs,
            position: LoadedObject::UNKNOWN_POSITION,
        };
        Some((obj, map))
    }

    /// `dlsym`/`dlvsym` in this object's local scope (the object and its dependencies).
    pub fn lookup(&self, symbol: &CStr, version: Option<&CStr>) -> usize {
        lookup_in(self.handle, symbol, version)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: our own handle from dlopen, closed once.
            unsafe { libc::dlclose(self.handle) };
        }
    }
}

/// State of one [`visit`] walk, shared with its callback.
struct Walk<'a> {
    /// (load bias, position in `objects`), sorted.
    keys: Vec<(usize, usize)>,
    /// An address inside each object (its first segment), to ask `_dl_find_object` about.
    probes: Vec<usize>,
    find: FindObject,
    objects: &'a [&'a LoadedObject],
    subs: u64,
    reached: Vec<bool>,
    work: &'a mut dyn FnMut(usize),
    failed: bool,
}

unsafe extern "C" fn walk_cb(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our `data`, a `&mut Walk`.
    let (info, w) = unsafe { (&*info, &mut *data.cast::<Walk>()) };
    if !crate::elf::has_counters(size) || info.dlpi_subs != w.subs {
        // Something was unloaded since the snapshot (or this glibc cannot tell): touch nothing.
        return 1;
    }
    let base = info.dlpi_addr as usize;
    // SAFETY: the name comes from the loader.
    let name = unsafe { crate::elf::name_bytes(info) };
    let from = w.keys.partition_point(|k| k.0 < base);
    for k in from..w.keys.len() {
        let (b, i) = w.keys[k];
        if b != base {
            break;
        }
        if w.reached[i] || w.objects[i].name.as_bytes() != name {
            continue;
        }
        // Listed is not enough: an object another thread is loading is listed before it is
        // relocated. glibc registers an object for `_dl_find_object` (lock-free, async-signal
        // safe) only once it is relocated, so an unregistered one is left to a pin by name,
        // which waits for that load to finish.
        // SAFETY: all-zero is a valid `DlFindObject`; any address may be asked about.
        let registered = unsafe {
            let mut out: DlFindObject = std::mem::zeroed();
            (w.find)(w.probes[i] as *mut c_void, &mut out) == 0
        };
        if !registered {
            continue;
        }
        let work = &mut *w.work;
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(i))).is_err() {
            w.failed = true;
            return 1;
        }
        w.reached[i] = true;
    }
    0
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
    let Some(find) = find_object() else {
        // glibc before 2.35: no way to tell a relocated object from one being loaded.
        return vec![false; objects.len()];
    };
    let probes = objects
        .iter()
        .map(|o| o.segments().next().map_or(o.base, |s| s.0))
        .collect();
    let mut keys: Vec<(usize, usize)> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| (o.base, i))
        .collect();
    keys.sort_unstable();
    let mut walk = Walk {
        keys,
        probes,
        find,
        objects,
        subs,
        reached: vec![false; objects.len()],
        work,
        failed: false,
    };
    // SAFETY: the callback matches dl_iterate_phdr's contract and `walk` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(walk_cb), (&mut walk as *mut Walk).cast()) };
    if walk.failed {
        crate::log!(
            crate::log::Level::Error,
            "a batch write panicked inside the loader walk; stopped"
        );
    }
    walk.reached
}

/// `RTLD_DI_PHDR` of `<dlfcn.h>` (glibc 2.36).
const RTLD_DI_PHDR: libc::c_int = 11;

/// `struct dl_find_object` (glibc 2.35), with room to spare for fields other ports add.
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 16],
}

type FindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> libc::c_int;

/// glibc's `_dl_find_object` (2.35), looked up once by name.
fn find_object() -> Option<FindObject> {
    use std::sync::atomic::Ordering;
    let mut f = FIND_OBJECT.load(Ordering::Acquire);
    if f == 0 {
        let p = lookup_global(c"_dl_find_object", None);
        f = if p == 0 { 1 } else { p };
        FIND_OBJECT.store(f, Ordering::Release);
    }
    // SAFETY: `f` is glibc's `_dl_find_object` (looked up by its name), whose signature this is.
    (f != 1).then(|| unsafe { std::mem::transmute::<usize, FindObject>(f) })
}

/// `_dl_find_object`, looked up once: 0 not yet, 1 absent, else the function.
static FIND_OBJECT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Which loaded object covers `addr`, answered by glibc without a lock or a walk:
/// `Some(Some(link_map))`, `Some(None)` when no object does, `None` when this glibc cannot say
/// (before 2.35).
pub fn object_at(addr: usize) -> Option<Option<usize>> {
    let find = find_object()?;
    // SAFETY: all-zero is a valid `DlFindObject` (integers and null pointers).
    let mut out: DlFindObject = unsafe { std::mem::zeroed() };
    // SAFETY: `out` is large enough for the result; any address may be asked about.
    let rc = unsafe { find(addr as *mut c_void, &mut out) };
    Some((rc == 0).then_some(out.link_map as usize))
}

/// `dlsym(RTLD_DEFAULT, …)` / `dlvsym(RTLD_DEFAULT, …)`: the global scope's definition.
pub fn lookup_global(symbol: &CStr, version: Option<&CStr>) -> usize {
    lookup_in(libc::RTLD_DEFAULT, symbol, version)
}

fn lookup_in(handle: *mut c_void, symbol: &CStr, version: Option<&CStr>) -> usize {
    // SAFETY: valid handle (RTLD_DEFAULT or from dlopen) and NUL-terminated strings.
    let p = unsafe {
        match version {
            Some(v) => libc::dlvsym(handle, symbol.as_ptr(), v.as_ptr()),
            None => libc::dlsym(handle, symbol.as_ptr()),
        }
    };
    p as usize
}

/// Discard the thread's pending `dlerror()` message, so lookups that failed inside the engine
/// never show up in the application's next `dlerror()` call.
pub fn clear_dlerror() {
    // SAFETY: dlerror only reads and resets thread-local loader state.
    unsafe { libc::dlerror() };
}

/// `getauxval`, for locating the vDSO and the dynamic loader.
pub fn auxv(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}
