//! What the tests of a program that embeds cuhook share (`embedded.rs`, `pressure.rs`): a test
//! run again in a child process of its own, the fake CUDA runtime and driver reached through the
//! program's own `dlopen`/`dlsym`, and a closure subscriber that counts events.
#![allow(dead_code)] // each test file uses a part

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuhook::events::{EventKind, EventMask, MemEvent};

pub type CudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
pub type CudaFree = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type CudaEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> c_int;
pub type GetProc =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
pub type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
pub type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
pub type CuPrimaryRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
pub type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
pub type CuMemFree = unsafe extern "C" fn(u64) -> c_int;
pub type Lookup = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Environment variable that marks the child run of a test.
pub const CHILD: &str = "CUHOOK_TEST_EMBEDDED_CHILD";

/// In the test process: run test `name` again in a child (with `env` added) and assert it
/// passed; returns true. In the child: returns false (run the test).
pub fn in_child(name: &str, env: &[(&str, String)]) -> bool {
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
pub fn raw_dlsym() -> Lookup {
    static RAW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let p = *RAW.get_or_init(|| {
        // SAFETY: a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlsym".as_ptr()) as usize }
    });
    // SAFETY: the address of the loader's dlsym.
    unsafe { std::mem::transmute::<usize, Lookup>(p) }
}

pub fn open(path: &std::path::Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

/// `name` through this program's own `dlsym` (the one the program's GOT slot leads to).
pub fn program_dlsym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    assert!(!p.is_null(), "{name} not found");
    p
}

/// `name` as the library defines it.
pub fn defined(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    // SAFETY: a live handle and a NUL-terminated name.
    unsafe { raw_dlsym()(handle, c.as_ptr()) }
}

pub fn as_fn<T: Copy>(p: *mut c_void) -> T {
    assert!(!p.is_null());
    // SAFETY: callers name the C signature of the function at `p`.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The fake driver and runtime, loaded globally (the runtime's own `dlopen("libcuda.so.1")`
/// then finds the driver by its soname).
pub fn load_cuda() -> (*mut c_void, *mut c_void) {
    raw_dlsym();
    let dir = cuhook_fixtures::dir();
    (
        open(&dir.join("libcuda.so.1")),
        open(&dir.join("libcudart.so.13")),
    )
}

/// Counts of alloc and free events a closure subscriber saw.
#[derive(Default)]
pub struct Heard {
    pub allocs: AtomicUsize,
    pub frees: AtomicUsize,
}

pub fn listen(heard: &Arc<Heard>) -> cuhook::Subscription {
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
pub fn make_context_current(driver: *mut c_void) -> usize {
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
pub fn runtime_round_trip(runtime: *mut c_void, heard: &Heard, size: usize) {
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
pub fn driver_round_trip(alloc: CuMemAlloc, free: CuMemFree, what: &str) {
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
