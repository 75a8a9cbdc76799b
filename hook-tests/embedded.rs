//! cuhook embedded in a Rust program (this test program links the crate): the program's own
//! `dlopen`/`dlsym`/`cuGetProcAddress`/`cudaGetDriverEntryPoint` calls are hooked like any
//! library's, the install guard behaves under threads and from callbacks, and a process holds one
//! engine whichever copy of cuhook came first (`libcuhook.so` preloaded, or loaded after the
//! program installed its own). Each test runs in a process of its own: GOT state and the
//! choice of engine are process-wide.

mod common;
mod support;

use support::*;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuhook::events::{EventMask, MemEvent};

/// Before, the engine skipped "cuhook's own object", which here is the program: its `dlsym`
/// handed out the real functions and none of these calls was seen.
#[test]
fn the_programs_own_loader_and_cuda_calls_are_hooked() {
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "the_programs_own_loader_and_cuda_calls_are_hooked",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let hooks = cuhook::install().unwrap();
    assert!(!hooks.is_forwarded());
    // The runtime, loaded after install by the program itself (patched by its dlopen
    // interposer); the runtime loads the driver itself on its first call (a library that a
    // library of the program loads).
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD loads nothing.
    let not_yet =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(
        not_yet.is_null(),
        "the driver was loaded before the runtime's first call"
    );
    let heard = Arc::new(Heard::default());
    let sub = listen(&heard);
    runtime_round_trip(runtime, &heard, 1 << 20);
    // SAFETY: as above.
    let driver =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!driver.is_null(), "the runtime did not load the driver");
    assert_ne!(
        program_dlsym(runtime, "cudaMalloc"),
        defined(runtime, "cudaMalloc"),
        "the program's dlsym gave the real cudaMalloc"
    );

    make_context_current(driver);
    // cuGetProcAddress, taken with the program's dlsym: our wrapper, which hands out hooks.
    let get_proc: GetProc = as_fn(program_dlsym(driver, "cuGetProcAddress_v2"));
    let proc = |name: &std::ffi::CStr| {
        let mut p = std::ptr::null_mut();
        // SAFETY: the driver's lookup with a valid out-pointer; NULL status is allowed.
        let rc = unsafe { get_proc(name.as_ptr(), &mut p, 12000, 0, std::ptr::null_mut()) };
        assert_eq!(rc, 0);
        p
    };
    driver_round_trip(
        as_fn(proc(c"cuMemAlloc")),
        as_fn(proc(c"cuMemFree")),
        "cuGetProcAddress",
    );
    // cudaGetDriverEntryPoint, from the runtime the program loaded.
    let entry: CudaEntryPoint = as_fn(program_dlsym(runtime, "cudaGetDriverEntryPoint"));
    let by_runtime = |name: &std::ffi::CStr| {
        let mut p = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { entry(name.as_ptr(), &mut p, 0, std::ptr::null_mut()) };
        assert_eq!(rc, 0);
        p
    };
    driver_round_trip(
        as_fn(by_runtime(c"cuMemAlloc")),
        as_fn(by_runtime(c"cuMemFree")),
        "cudaGetDriverEntryPoint",
    );
    // dlvsym, for a hooked function of the C library (the loader interposers' set).
    // SAFETY: NUL-terminated strings.
    let versioned = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"dlopen".as_ptr(),
            c"GLIBC_2.34".as_ptr(),
        )
    };
    assert!(!versioned.is_null());
    assert_ne!(
        versioned,
        defined(libc::RTLD_DEFAULT, "dlopen"),
        "the program's dlvsym gave the real dlopen"
    );
    // dlsym of the driver function itself.
    driver_round_trip(
        as_fn(program_dlsym(driver, "cuMemAlloc_v2")),
        as_fn(program_dlsym(driver, "cuMemFree_v2")),
        "dlsym",
    );
    drop(sub);

    // Dropped on another thread: every slot back, the program's dlsym answers as glibc's.
    std::thread::spawn(move || hooks.uninstall().unwrap())
        .join()
        .unwrap();
    assert_eq!(
        program_dlsym(runtime, "cudaMalloc"),
        defined(runtime, "cudaMalloc")
    );
    assert!(cuhook::hooks::patched_slots().is_empty());
}

/// `install` twice counts twice; one from inside a subscriber callback works too (the callback
/// runs inside the hooked CUDA call, not inside an engine operation); uninstalling other
/// installations while threads allocate loses no event.
#[test]
fn install_counts_and_no_event_is_lost_while_installed() {
    if in_child("install_counts_and_no_event_is_lost_while_installed", &[]) {
        return;
    }
    let first = cuhook::install().unwrap();
    let (driver, runtime) = load_cuda();
    let ctx = make_context_current(driver);
    let set_current: CuCtxSetCurrent = as_fn(program_dlsym(driver, "cuCtxSetCurrent"));
    let heard = Arc::new(Heard::default());

    // From a callback: installed once more, kept until the test drops it.
    static FROM_CALLBACK: Mutex<Option<cuhook::Result<cuhook::Installation>>> = Mutex::new(None);
    static ONCE: AtomicBool = AtomicBool::new(false);
    let inner = cuhook::subscribe(EventMask::ALLOC, 1, |_ev: &MemEvent| {
        if !ONCE.swap(true, Ordering::SeqCst) {
            *FROM_CALLBACK.lock().unwrap() = Some(cuhook::install());
        }
    })
    .unwrap();
    let sub = listen(&heard);
    runtime_round_trip(runtime, &heard, 4096);
    let from_callback = FROM_CALLBACK.lock().unwrap().take().expect("callback ran");
    let from_callback = from_callback.expect("install from inside a callback");
    drop(inner);

    // Threads allocate and free through hooked pointers while other installations come and
    // go: every call is an event (`first` holds the hooks throughout).
    let alloc: CuMemAlloc = as_fn(program_dlsym(driver, "cuMemAlloc_v2"));
    let free: CuMemFree = as_fn(program_dlsym(driver, "cuMemFree_v2"));
    let (allocs0, frees0) = (
        heard.allocs.load(Ordering::SeqCst),
        heard.frees.load(Ordering::SeqCst),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                // SAFETY: the primary context made current above.
                assert_eq!(unsafe { set_current(ctx as *mut c_void) }, 0);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n < 200 {
                    let mut p = 0u64;
                    // SAFETY: the fake driver's calls on our own allocation.
                    unsafe {
                        assert_eq!(alloc(&mut p, 256), 0);
                        assert!(cuhook::lookup(p).is_some(), "an allocation was not seen");
                        assert_eq!(free(p), 0);
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::SeqCst);
            })
        })
        .collect();
    for _ in 0..50 {
        let extra = cuhook::install().unwrap();
        let report = extra.uninstall().unwrap();
        assert!(report.still_referenced);
    }
    drop(from_callback);
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    let calls = done.load(Ordering::SeqCst);
    assert_eq!(heard.allocs.load(Ordering::SeqCst) - allocs0, calls);
    assert_eq!(heard.frees.load(Ordering::SeqCst) - frees0, calls);
    drop(sub);
    assert!(!first.uninstall().unwrap().still_referenced);
}

/// Under `LD_PRELOAD=libcuhook.so` (what `cuhook run` does), the program's copy of the crate
/// forwards to the preloaded engine: its install counts there, its subscriber hears the
/// preloaded hooks' events, its lookups and stats are the preloaded registry's. Before, the
/// program's lookups asked its own empty registry and found nothing.
#[test]
fn under_a_preloaded_libcuhook_the_crate_uses_that_engine() {
    let preload = common::libcuhook().to_str().unwrap().to_owned();
    if in_child(
        "under_a_preloaded_libcuhook_the_crate_uses_that_engine",
        &[("LD_PRELOAD", preload)],
    ) {
        return;
    }
    let hooks = cuhook::install().unwrap();
    assert!(hooks.is_forwarded(), "a second engine was installed");
    assert!(
        !cuhook::registry::attached(),
        "the program's own registry is in use"
    );
    let (_driver, runtime) = load_cuda();
    let heard = Arc::new(Heard::default());
    let sub = listen(&heard);
    runtime_round_trip(runtime, &heard, 3 << 20);
    assert!(
        cuhook::hooks::patched_slots().is_empty(),
        "this copy patched slots"
    );
    let malloc: CudaMalloc = as_fn(program_dlsym(runtime, "cudaMalloc"));
    let mut p = std::ptr::null_mut();
    // SAFETY: the fake runtime's allocation with a valid out-pointer (kept).
    unsafe { assert_eq!(malloc(&mut p, 777), 0) };
    assert_eq!(cuhook::lookup_span(p, 777).map(|a| a.size), Some(777));
    assert!(cuhook::stats().live >= 1);
    drop(sub);
    assert!(
        hooks.uninstall().unwrap().still_referenced,
        "the preloaded install went away"
    );
    assert!(cuhook::lookup(p).is_some(), "the preloaded engine stopped");
}

/// The reverse: the program installed its own engine, then `libcuhook.so` is loaded. Its
/// constructor must not install a second set of hooks, and its C API answers from the
/// program's engine.
#[test]
fn a_libcuhook_loaded_later_defers_to_the_programs_engine() {
    if in_child(
        "a_libcuhook_loaded_later_defers_to_the_programs_engine",
        &[],
    ) {
        return;
    }
    type Install = unsafe extern "C" fn() -> c_int;
    type Slots = unsafe extern "C" fn(*mut c_void, usize) -> isize;
    type CLookup = unsafe extern "C" fn(*const c_void, usize, *mut [u8; 80]) -> c_int;
    let hooks = cuhook::install().unwrap();
    let (_driver, runtime) = load_cuda();
    let lib = open(&common::libcuhook());
    let slots: Slots = as_fn(defined(lib, "cuhook_patched_slots"));
    // SAFETY: a count query (no buffer).
    assert_eq!(
        unsafe { slots(std::ptr::null_mut(), 0) },
        0,
        "libcuhook.so installed too"
    );
    let install: Install = as_fn(defined(lib, "cuhook_install"));
    // SAFETY: the C API.
    assert_eq!(unsafe { install() }, 0);
    // SAFETY: as above.
    assert_eq!(
        unsafe { slots(std::ptr::null_mut(), 0) },
        0,
        "its cuhook_install patched"
    );

    let heard = Arc::new(Heard::default());
    let sub = listen(&heard);
    runtime_round_trip(runtime, &heard, 1 << 16);
    let malloc: CudaMalloc = as_fn(program_dlsym(runtime, "cudaMalloc"));
    let mut p = std::ptr::null_mut();
    // SAFETY: as above (kept).
    unsafe { assert_eq!(malloc(&mut p, 4321), 0) };
    assert_eq!(heard.allocs.load(Ordering::SeqCst), 2, "one event per call");
    let lookup: CLookup = as_fn(defined(lib, "cuhook_lookup"));
    let mut info = [0u8; 80];
    // SAFETY: a writable cuhook_mem_info_t (72 bytes; 80 to spare).
    assert_eq!(
        unsafe { lookup(p, 0, &mut info) },
        0,
        "its cuhook_lookup missed"
    );
    let size = usize::from_ne_bytes(info[8..16].try_into().unwrap());
    assert_eq!(size, 4321);
    drop(sub);
    drop(hooks);
}
