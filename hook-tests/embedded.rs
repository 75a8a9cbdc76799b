//! cuhook embedded in a Rust program (this test program links the crate): the program's own
//! `dlopen`/`dlsym`/`cuGetProcAddress`/`cudaGetDriverEntryPoint` calls are hooked like any
//! library's, the install guard behaves under threads and from callbacks, and a process holds one
//! engine whichever copy of cuhook came first (`libcuhook.so` preloaded, or loaded after the
//! program installed its own). Each test runs in a process of its own: GOT state and the
//! choice of engine are process-wide.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuhook::events::{EventKind, EventMask, MemEvent};

type CudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type CudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;
type CudaEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> c_int;
type GetProc =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuPrimaryRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuMemFree = unsafe extern "C" fn(u64) -> c_int;
type Lookup = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Environment variable that marks the child run of a test.
const CHILD: &str = "CUHOOK_TEST_EMBEDDED_CHILD";

/// In the test process: run test `name` again in a child (with `env` added) and assert it
/// passed; returns true. In the child: returns false (run the test).
fn in_child(name: &str, env: &[(&str, String)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        raw_dlsym(); // before the test installs anything
        return false;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("CUHOOK_DISABLE")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the test executable again");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// The loader's own dlsym, taken before anything is installed in this process.
fn raw_dlsym() -> Lookup {
    static RAW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let p = *RAW.get_or_init(|| {
        // SAFETY: a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlsym".as_ptr()) as usize }
    });
    // SAFETY: the address of the loader's dlsym.
    unsafe { std::mem::transmute::<usize, Lookup>(p) }
}

fn open(path: &std::path::Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

/// `name` through this program's own `dlsym` (the one the program's GOT slot leads to).
fn program_dlsym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    assert!(!p.is_null(), "{name} not found");
    p
}

/// `name` as the library defines it.
fn defined(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    unsafe { raw_dlsym()(handle, c.as_ptr()) }
}

fn as_fn<T: Copy>(p: *mut c_void) -> T {
    assert!(!p.is_null());
    // SAFETY: callers name the C signature of the function at `p`.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The fake driver and runtime, loaded globally (the runtime's own `dlopen("libcuda.so.1")`
/// then finds the driver by its soname).
fn load_cuda() -> (*mut c_void, *mut c_void) {
    raw_dlsym();
    let dir = common::fixtures_dir();
    (
        open(&dir.join("libcuda.so.1")),
        open(&dir.join("libcudart.so.13")),
    )
}

/// Counts of alloc and free events a closure subscriber saw.
#[derive(Default)]
struct Heard {
    allocs: AtomicUsize,
    frees: AtomicUsize,
}

fn listen(heard: &Arc<Heard>) -> cuhook::Subscription {
    let h = heard.clone();
    cuhook::subscribe(EventMask::ALL, 0, move |ev: &MemEvent| {
        match ev.kind {
            EventKind::Alloc => h.allocs.fetch_add(1, Ordering::SeqCst),
            EventKind::Free => h.frees.fetch_add(1, Ordering::SeqCst),
        };
    })
    .unwrap()
}

/// Initialise the driver and make device 0's primary context current; returns it.
fn make_context_current(driver: *mut c_void) -> usize {
    let init: CuInit = as_fn(program_dlsym(driver, "cuInit"));
    let get: CuDeviceGet = as_fn(program_dlsym(driver, "cuDeviceGet"));
    let retain: CuPrimaryRetain = as_fn(program_dlsym(driver, "cuDevicePrimaryCtxRetain"));
    let set: CuCtxSetCurrent = as_fn(program_dlsym(driver, "cuCtxSetCurrent"));
    let (mut dev, mut ctx) = (0, std::ptr::null_mut());
    // SAFETY: the fake driver's entry points with valid out-pointers.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(get(&mut dev, 0), 0);
        assert_eq!(retain(&mut ctx, dev), 0);
        assert_eq!(set(ctx), 0);
    }
    ctx as usize
}

/// The runtime's `cudaMalloc`/`cudaFree` through the program's own `dlsym`: one event each,
/// and the registry holds the range in between.
fn runtime_round_trip(runtime: *mut c_void, heard: &Heard, size: usize) {
    let malloc: CudaMalloc = as_fn(program_dlsym(runtime, "cudaMalloc"));
    let free: CudaFree = as_fn(program_dlsym(runtime, "cudaFree"));
    let before = (
        heard.allocs.load(Ordering::SeqCst),
        heard.frees.load(Ordering::SeqCst),
    );
    let mut p = std::ptr::null_mut();
    // SAFETY: the fake runtime's calls with a valid out-pointer, freeing our own allocation.
    unsafe { assert_eq!(malloc(&mut p, size), 0) };
    let a = cuhook::lookup(p).expect("cudaMalloc through the program's dlsym was not seen");
    assert_eq!((a.start, a.size), (p as usize, size));
    assert_eq!(a.api.to_str().unwrap(), "cudaMalloc");
    // SAFETY: as above.
    unsafe { assert_eq!(free(p), 0) };
    assert!(
        cuhook::lookup(p).is_none(),
        "a freed range stayed registered"
    );
    assert_eq!(heard.allocs.load(Ordering::SeqCst), before.0 + 1);
    assert_eq!(heard.frees.load(Ordering::SeqCst), before.1 + 1);
}

/// A driver allocation and free through pointers a resolver handed out.
fn driver_round_trip(alloc: CuMemAlloc, free: CuMemFree, what: &str) {
    let mut p = 0u64;
    // SAFETY: the fake driver's calls with a valid out-pointer, freeing our own allocation.
    unsafe { assert_eq!(alloc(&mut p, 12345), 0) };
    let a = cuhook::lookup(p).unwrap_or_else(|| panic!("{what}: the allocation was not seen"));
    assert_eq!(
        (a.start, a.size, a.device),
        (p as usize, 12345, 0),
        "{what}"
    );
    // SAFETY: as above.
    unsafe { assert_eq!(free(p), 0) };
    assert!(cuhook::lookup(p).is_none(), "{what}: the free was not seen");
}

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
