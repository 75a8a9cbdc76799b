//! What a hooked `dlopen` of one new library allocates: only what the engine keeps (the
//! object's description and index, its cache entry, the journal entries of its slots), not a
//! heap list per step of the operation. Counted with a counting global allocator, so this
//! file holds this one test (other tests running beside it would allocate too).
//!
//! With one hooked slot in the library, a hooked `dlopen`+`dlclose` pair made 40 allocations
//! before the batch's lists became inline small vectors (this test, run on that code, fails),
//! and makes 7 now. The bound leaves room for the engine's kept state without letting
//! per-operation lists back in.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

extern "C" fn add_hook(a: c_int, b: c_int) -> c_int {
    // SAFETY: the engine published the real `target_add` before routing a call here.
    let real: extern "C" fn(c_int, c_int) -> c_int =
        unsafe { std::mem::transmute(ORIGINAL.load(Ordering::Acquire)) };
    real(a, b) + 1000
}

type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
type Call = unsafe extern "C" fn(c_int, c_int) -> c_int;

/// Open `libplugin.so` through `libdlcaller.so` (an object cuhook patches: this test's own
/// executable is never patched), check that its call reaches the hook, close it.
fn pair(open: Open, close: Close, plugin: &CString) {
    // SAFETY: the fixture's wrappers of dlopen/dlclose/dlsym with a valid path; the plugin's
    // `plugin_call` has this signature.
    unsafe {
        let h = open(plugin.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "libplugin.so did not open");
        let f = libc::dlsym(h, c"plugin_call".as_ptr());
        assert!(!f.is_null());
        let call: Call = std::mem::transmute(f);
        assert_eq!(call(1, 2), 1003, "the plugin's call did not reach the hook");
        assert_eq!(close(h), 0);
    }
}

#[test]
fn a_hooked_dlopen_of_one_library_allocates_only_what_the_engine_keeps() {
    let dir = common::fixtures_dir();
    let path = |name: &str| CString::new(dir.join(name).to_str().unwrap()).unwrap();
    // SAFETY: loading fixture libraries and looking up their functions by name.
    let (open, close) = unsafe {
        // The plugin's dependency stays loaded, so each open adds exactly one object (the
        // path a `dlopen` of one new library takes).
        let target = libc::dlopen(path("libtarget.so").as_ptr(), libc::RTLD_NOW);
        assert!(!target.is_null());
        let caller = libc::dlopen(path("libdlcaller.so").as_ptr(), libc::RTLD_NOW);
        assert!(!caller.is_null());
        let open = libc::dlsym(caller, c"dlcaller_open".as_ptr());
        let close = libc::dlsym(caller, c"dlcaller_close".as_ptr());
        assert!(!open.is_null() && !close.is_null());
        (
            std::mem::transmute::<*mut c_void, Open>(open),
            std::mem::transmute::<*mut c_void, Close>(close),
        )
    };
    let hook =
        cuhook::hooks::Hook::new("target_add", add_hook as *const () as usize, &ORIGINAL).unwrap();
    let set = cuhook::hooks::HookSet::new("allocations", vec![hook]).unwrap();
    let installed = cuhook::hooks::install(&set).unwrap();
    let plugin = path("libplugin.so");
    // Warm up: diagnostics lists and the engine's tables reach their steady size.
    for _ in 0..5 {
        pair(open, close, &plugin);
    }
    const PAIRS: usize = 40;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..PAIRS {
        pair(open, close, &plugin);
    }
    let per_pair = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / PAIRS as f64;
    installed.uninstall().unwrap();
    println!("allocations per hooked dlopen+dlclose pair: {per_pair:.1}");
    assert!(
        per_pair <= 20.0,
        "{per_pair:.1} allocations per hooked dlopen+dlclose pair (7 expected)"
    );
    assert!(per_pair >= 1.0, "nothing counted: is the counter wired?");
}
