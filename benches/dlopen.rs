//! Hooked vs plain `dlopen`+`dlclose`, of a library that is not loaded yet (the hooked path
//! indexes and patches it, then forgets it) and of one that is already loaded (the hooked path
//! only checks the loader's counters).
//!
//! Run: `cargo bench --bench dlopen`. The calls come from the fixture `libdlcaller.so`, because
//! cuhook never patches the object it is linked into (this benchmark).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::AtomicUsize;
use std::time::Instant;

type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type Close = unsafe extern "C" fn(*mut c_void) -> c_int;

struct Caller {
    open: Open,
    close: Close,
}

fn caller() -> Caller {
    let dir = cuhook_fixtures::DIR;
    let path = CString::new(format!("{dir}/libdlcaller.so")).unwrap();
    // SAFETY: loading a fixture library (built by cuhook-fixtures) and looking up its two
    // functions.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(
            !h.is_null(),
            "libdlcaller.so missing: build the fixtures first"
        );
        let open = libc::dlsym(h, c"dlcaller_open".as_ptr());
        let close = libc::dlsym(h, c"dlcaller_close".as_ptr());
        Caller {
            open: std::mem::transmute::<*mut c_void, Open>(open),
            close: std::mem::transmute::<*mut c_void, Close>(close),
        }
    }
}

/// Nanoseconds per open+close pair over `iters` pairs.
fn round(c: &Caller, lib: &CString, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: the fixture's dlopen/dlclose wrappers with a valid path.
        unsafe {
            let h = (c.open)(lib.as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null());
            (c.close)(h);
        }
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// Plain and hooked rounds alternate, so machine noise hits both alike; the fastest round of
/// each is reported (the least disturbed one).
fn compare(
    c: &Caller,
    set: &cuhook::hooks::HookSet,
    lib: &CString,
    iters: usize,
    rounds: usize,
) -> (f64, f64) {
    let (mut plain, mut hooked) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        plain = plain.min(round(c, lib, iters));
        let installed = cuhook::hooks::install(set).unwrap();
        hooked = hooked.min(round(c, lib, iters));
        installed.uninstall().unwrap();
    }
    (plain, hooked)
}

static REAL_GETPID: AtomicUsize = AtomicUsize::new(0);
extern "C" fn counting_getpid() -> libc::pid_t {
    // SAFETY: the engine published libc's getpid before routing any call here.
    let real: extern "C" fn() -> libc::pid_t =
        unsafe { std::mem::transmute(REAL_GETPID.load(std::sync::atomic::Ordering::Acquire)) };
    real()
}

fn main() {
    let c = caller();
    let dir = cuhook_fixtures::DIR;
    let fresh = CString::new(format!("{dir}/libplugin_dep.so")).unwrap();
    let resident = CString::new(format!("{dir}/libplugin.so")).unwrap();
    // Keep `resident` loaded for the whole run.
    // SAFETY: plain dlopen of a fixture.
    let keep = unsafe { libc::dlopen(resident.as_ptr(), libc::RTLD_NOW) };
    assert!(!keep.is_null());

    let hook = cuhook::hooks::Hook::new(
        "getpid",
        counting_getpid as *const () as usize,
        &REAL_GETPID,
    )
    .unwrap();
    let set = cuhook::hooks::HookSet::new("bench", vec![hook]).unwrap();
    let (plain_new, hooked_new) = compare(&c, &set, &fresh, 100, 21);
    let (plain_loaded, hooked_loaded) = compare(&c, &set, &resident, 10_000, 21);
    println!("dlopen+dlclose of a new library:      plain {plain_new:>9.0} ns   hooked {hooked_new:>9.0} ns   ratio {:.3}", hooked_new / plain_new);
    println!("dlopen+dlclose of a loaded library:   plain {plain_loaded:>9.0} ns   hooked {hooked_loaded:>9.0} ns   ratio {:.3}", hooked_loaded / plain_loaded);
}
