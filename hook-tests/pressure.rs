//! A guest under pressure (issue 40): the host sandboxes itself with seccomp after start-up, or
//! runs with a tight descriptor limit. This program embeds cuhook; each test runs in a child
//! process of its own (a seccomp filter and a resource limit are process-wide and final), and
//! the host's own calls are compared with what they do without cuhook.

mod common;
mod support;

use std::sync::Arc;

use support::*;

/// A program that denies `ioctl` and `membarrier` to itself after cuhook installed and a
/// subscriber registered: a library it loads afterwards is still patched (the maps text stands
/// in for the refused `PROCMAP_QUERY`), its allocations are seen, and unsubscribing does not
/// abort the process. (Before: the runtime stayed unhooked, its tables "unreadable", and the
/// unsubscribe aborted with "membarrier failed after registration".)
#[test]
fn a_host_that_sandboxes_itself_after_start_up() {
    if cuhook_fixtures::skip_when_cross("qemu-user filters its own host system calls") {
        return;
    }
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "a_host_that_sandboxes_itself_after_start_up",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let hooks = cuhook::install().unwrap();
    let heard = Arc::new(Heard::default());
    let first = listen(&heard);
    assert!(cuhook_fixtures::deny_syscalls(
        &[libc::SYS_ioctl, libc::SYS_membarrier],
        libc::EPERM
    ));
    // Loaded now: the runtime, and the driver it loads itself.
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    runtime_round_trip(runtime, &heard, 1 << 20);
    drop(first); // a writer barrier: membarrier is denied now
    let again = listen(&heard);
    runtime_round_trip(runtime, &heard, 4096);
    drop(again);
    assert!(!cuhook::events::asymmetric_barriers());
    hooks.uninstall().unwrap();
}

/// Descriptors this process can still open (each opened, counted, closed).
fn free_descriptors() -> usize {
    let mut opened = Vec::new();
    loop {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            break;
        }
        opened.push(fd);
    }
    for &fd in &opened {
        // SAFETY: our own descriptors.
        unsafe { libc::close(fd) };
    }
    opened.len()
}

/// Set the soft descriptor limit so that exactly `free` more descriptors can be opened (new
/// descriptors take the lowest unused numbers below the limit).
fn leave_free(free: usize) {
    // SAFETY: F_GETFD only asks whether a descriptor number is open.
    let is_open = |fd: usize| unsafe { libc::fcntl(fd as i32, libc::F_GETFD) } >= 0;
    let (mut limit, mut unused) = (0usize, 0usize);
    while unused < free || is_open(limit) {
        if !is_open(limit) {
            unused += 1;
        }
        limit += 1;
    }
    let limit = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let limit = libc::rlimit {
            rlim_max: old.rlim_max,
            ..limit
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// Under limits that leave 1, 2, 5 and 61 descriptors (the limits 4, 5, 8 and 64 for a
/// program with three open), the host gets every one of them after cuhook installed and patched
/// a library it loaded: cuhook holds none between its operations. (Before, the kept
/// `/proc/self/maps` descriptor took one: EMFILE one open early.)
#[test]
fn a_tight_descriptor_limit_leaves_the_host_every_descriptor() {
    if cuhook_fixtures::skip_when_cross("qemu-user opens host files of its own under the limit") {
        return;
    }
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "a_tight_descriptor_limit_leaves_the_host_every_descriptor",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let heard = Arc::new(Heard::default());
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    for free in [61, 5, 2, 1] {
        leave_free(free);
        let plain = free_descriptors();
        assert_eq!(plain, free, "the limit as set");
        let hooks = cuhook::install().unwrap();
        let sub = listen(&heard);
        runtime_round_trip(runtime, &heard, 4096 * free);
        assert_eq!(
            free_descriptors(),
            plain,
            "cuhook kept a descriptor (limit leaving {free})"
        );
        drop(sub);
        hooks.uninstall().unwrap();
        assert_eq!(free_descriptors(), plain);
    }
}

/// No descriptor free at all (`RLIMIT_NOFILE` = the descriptors already open, 3 for most
/// programs): cuhook cannot read page protections, so it patches nothing new and says so; the
/// host runs as without it (its calls succeed, nothing crashes), and a lookup still answers.
#[test]
fn no_free_descriptor_degrades_to_patching_nothing() {
    if cuhook_fixtures::skip_when_cross("qemu-user opens host files of its own under the limit") {
        return;
    }
    let fixtures = common::fixtures_dir().to_str().unwrap().to_owned();
    if in_child(
        "no_free_descriptor_degrades_to_patching_nothing",
        &[("LD_LIBRARY_PATH", fixtures)],
    ) {
        return;
    }
    let runtime = open(&common::fixtures_dir().join("libcudart.so.13"));
    let malloc: CudaMalloc = as_fn(program_dlsym(runtime, "cudaMalloc"));
    let free: CudaFree = as_fn(program_dlsym(runtime, "cudaFree"));
    // The runtime loads the driver at its first call: before the limit, as the host would.
    let mut p = std::ptr::null_mut();
    // SAFETY: as below.
    unsafe {
        assert_eq!(malloc(&mut p, 64), 0);
        assert_eq!(free(p), 0);
    }
    leave_free(0);
    assert_eq!(free_descriptors(), 0);
    let hooks = cuhook::install();
    // Whatever install answered, the host's own calls behave as without cuhook.
    // SAFETY: the fake runtime's calls with a valid out-pointer, freeing our allocation.
    unsafe {
        assert_eq!(malloc(&mut p, 4096), 0);
        let _ = cuhook::lookup(p);
        assert_eq!(free(p), 0);
    }
    let diagnostics = cuhook::hooks::diagnostics().to_string();
    assert!(
        hooks.is_err()
            || diagnostics.contains("unreadable")
            || cuhook::hooks::patched_slots().is_empty(),
        "{diagnostics}"
    );
    drop(hooks);
    assert_eq!(free_descriptors(), 0);
}

/// The counts `libwrapper.so` printed at exit, and the exit report's rows for the driver's
/// allocation and free (`None` where absent).
struct Seen {
    wrapper: Option<String>,
    allocs: Option<String>,
    frees: Option<String>,
    unpatched: bool,
}

/// `app_plugin libcov_plugin.so` (a program that dlopens a plugin which allocates through its
/// own driver imports) with `preload`.
fn run_plugin_app(preload: &[std::path::PathBuf]) -> Seen {
    run_plugin_app_with(preload, &[], None)
}

/// [`run_plugin_app`] with `env` added, under `runner` (valgrind, say) when given.
fn run_plugin_app_with(
    preload: &[std::path::PathBuf],
    env: &[(&str, String)],
    runner: Option<&[&str]>,
) -> Seen {
    let dir = common::fixtures_dir();
    let preload: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
    let app = dir.join("app_plugin");
    let mut cmd = match runner {
        Some([program, args @ ..]) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(&app);
            c
        }
        _ => std::process::Command::new(&app),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .arg(dir.join("libcov_plugin.so"))
        .env("LD_LIBRARY_PATH", &dir)
        .env("LD_PRELOAD", preload.join(":"))
        .env("CUHOOK_REPORT", "stderr")
        .env_remove("CUHOOK_DISABLE")
        .env_remove("CUHOOK_TRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let row = |api: &str| {
        stderr
            .lines()
            .find(|l| l.split_whitespace().next() == Some(api))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
    };
    Seen {
        wrapper: stderr
            .lines()
            .find(|l| l.starts_with("wrapper: "))
            .map(str::to_owned),
        allocs: row("cuMemAlloc_v2"),
        frees: row("cuMemFree_v2"),
        unpatched: stderr.contains("left unpatched"),
    }
}

/// Another interposer preloaded beside libcuhook.so, before or after it (a `dlopen`/`dlclose`
/// wrapper as profilers and sandboxes have, wrapping `cuMemAlloc_v2`/`cuMemFree_v2` as quota shims
/// do): both see every call. The wrapper counts exactly what it counts without cuhook, and
/// cuhook's report counts exactly what it counts without the wrapper. (Before, the program's
/// `dlopen` slot, bound to the wrapper while cuhook's lookup found the C library's, was left
/// unpatched: the plugin was patched late and an allocation was missed.)
#[test]
fn another_interposer_in_either_preload_order() {
    let wrapper = common::fixtures_dir().join("libwrapper.so");
    let cuhook = common::libcuhook();
    let alone = run_plugin_app(std::slice::from_ref(&wrapper));
    let plain = run_plugin_app(std::slice::from_ref(&cuhook));
    assert!(
        alone.wrapper.is_some() && plain.allocs.is_some(),
        "no counts to compare"
    );
    for order in [[&wrapper, &cuhook], [&cuhook, &wrapper]] {
        let both = run_plugin_app(&[order[0].clone(), order[1].clone()]);
        let what = format!("LD_PRELOAD order {order:?}");
        assert_eq!(
            both.wrapper, alone.wrapper,
            "{what}: the wrapper's counts changed"
        );
        assert_eq!(both.allocs, plain.allocs, "{what}: cuhook's allocations");
        assert_eq!(both.frees, plain.frees, "{what}: cuhook's frees");
        assert!(!both.unpatched, "{what}: a slot was left unpatched");
    }
}

static CHAIN_ORIGINAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static CHAIN_STORES: [std::sync::atomic::AtomicUsize; 2] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; 2];
static CHAIN_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn call_original(store: &std::sync::atomic::AtomicUsize, x: i32) -> i32 {
    CHAIN_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let f = store.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the engine publishes only `chain_target`'s definitions (int(int)) here.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(f) };
    f(x)
}
extern "C" fn hooked(x: i32) -> i32 {
    call_original(&CHAIN_ORIGINAL, x)
}
extern "C" fn chain0(x: i32) -> i32 {
    call_original(&CHAIN_STORES[0], x)
}
extern "C" fn chain1(x: i32) -> i32 {
    call_original(&CHAIN_STORES[1], x)
}

/// One symbol bound to two definitions at once (two plugins loaded `RTLD_LOCAL`, each with its
/// own library defining `chain_target`): with chains, both slots are patched and each call
/// still reaches its own definition; the uninstall puts both back. Without chains, the second
/// slot is the conflict it always was (left unpatched and reported).
#[test]
fn one_symbol_with_two_definitions_is_chained() {
    if in_child("one_symbol_with_two_definitions_is_chained", &[]) {
        return;
    }
    use cuhook::hooks::{Hook, HookSet};
    type Call = extern "C" fn(i32) -> i32;
    let dir = common::fixtures_dir();
    let call = |lib: &str| -> Call {
        let path = std::ffi::CString::new(dir.join(lib).to_str().unwrap()).unwrap();
        // SAFETY: fixture plugins exporting `int chain_call(int)`.
        unsafe {
            let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!h.is_null(), "dlopen {lib}");
            as_fn(libc::dlsym(h, c"chain_call".as_ptr()))
        }
    };
    let (p1, p2) = (call("libchain_p1.so"), call("libchain_p2.so"));
    assert_eq!((p1(3), p2(3)), (31, 32));
    let hook = Hook::new(
        "chain_target",
        hooked as *const () as usize,
        &CHAIN_ORIGINAL,
    )
    .unwrap();

    // Without chains: one slot is patched, the other is a conflict.
    let set = HookSet::new("unchained", vec![hook.clone()]).unwrap();
    let installed = cuhook::hooks::install(&set).unwrap();
    assert_eq!((p1(3), p2(3)), (31, 32));
    assert_eq!(CHAIN_CALLS.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(cuhook::hooks::diagnostics().conflicts.len(), 1);
    installed.uninstall().unwrap();

    let chained = hook.with_chains(&[
        (chain0 as *const () as usize, &CHAIN_STORES[0]),
        (chain1 as *const () as usize, &CHAIN_STORES[1]),
    ]);
    let set = HookSet::new("chained", vec![chained]).unwrap();
    let installed = cuhook::hooks::install(&set).unwrap();
    let before = CHAIN_CALLS.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        (p1(3), p2(3)),
        (31, 32),
        "a call reached the other definition"
    );
    assert_eq!(
        CHAIN_CALLS.load(std::sync::atomic::Ordering::SeqCst) - before,
        2
    );
    assert!(cuhook::hooks::diagnostics().chained_slots >= 1);
    assert_eq!(
        cuhook::hooks::diagnostics().conflicts.len(),
        1,
        "no new conflict"
    );
    installed.uninstall().unwrap();
    let before = CHAIN_CALLS.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!((p1(3), p2(3)), (31, 32));
    assert_eq!(
        CHAIN_CALLS.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "a slot stayed patched"
    );
}

/// A CUDA function bound to two definitions at once: a plugin loaded `RTLD_DEEPBIND` binds
/// `cuMemAlloc_v2` to the quota shim it depends on, while the rest of the process binds the
/// driver's. The plugin's slot gets a chain of the CUDA hook that calls the shim, so its
/// allocation is seen and the shim still counts it; the other plugin's slot gets the hook
/// itself; uninstall puts the shim back. (Before: "bound to ADDR, not the hooked definition:
/// left unpatched", and the allocation unseen.)
#[test]
fn a_cuda_function_with_two_definitions_is_chained() {
    if in_child("a_cuda_function_with_two_definitions_is_chained", &[]) {
        return;
    }
    let dir = common::scratch("cuda-chain");
    let fixtures = cuhook_fixtures::dir();
    let build = |name: &str, code: &str, with: &[&std::path::Path]| {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, code).unwrap();
        let lib = dir.join(format!("lib{name}.so"));
        let mut cc = cuhook_fixtures::cc();
        cc.args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&src);
        for w in with {
            cc.arg(w);
        }
        assert!(cc.arg("-ldl").status().unwrap().success(), "build {name}");
        lib
    };
    let shim = build(
        "quotashim",
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n\
         typedef unsigned long long CUdeviceptr;\n\
         int shim_calls;\n\
         int cuMemAlloc_v2(CUdeviceptr *p, unsigned long n) {\n\
           shim_calls++;\n\
           void *driver = dlopen(\"libcuda.so.1\", RTLD_NOW | RTLD_NOLOAD);\n\
           int (*real)(CUdeviceptr *, unsigned long) = (int (*)(CUdeviceptr *, unsigned long))dlsym(driver, \"cuMemAlloc_v2\");\n\
           dlclose(driver);\n\
           return real(p, n);\n}\n",
        &[],
    );
    let plugin_code = "typedef unsigned long long CUdeviceptr;\n\
         int cuMemAlloc_v2(CUdeviceptr *, unsigned long);\n\
         int plugin_alloc(CUdeviceptr *p, unsigned long n) { return cuMemAlloc_v2(p, n); }\n";
    let shimmed = build(
        "shimmed",
        plugin_code,
        &[&shim, &fixtures.join("libcuda.so.1")],
    );
    let plain = build(
        "plainplugin",
        plugin_code,
        &[&fixtures.join("libcuda.so.1")],
    );

    let (driver, _runtime) = load_cuda();
    make_context_current(driver);
    type PluginAlloc = unsafe extern "C" fn(*mut u64, std::ffi::c_ulong) -> std::ffi::c_int;
    let open_with = |lib: &std::path::Path, mode: i32| {
        let c = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        let h = unsafe { libc::dlopen(c.as_ptr(), mode) };
        assert!(!h.is_null(), "dlopen {}", lib.display());
        h
    };
    let h_shimmed = open_with(
        &shimmed,
        libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
    );
    let h_plain = open_with(&plain, libc::RTLD_NOW | libc::RTLD_LOCAL);
    let via_shim: PluginAlloc = as_fn(defined(h_shimmed, "plugin_alloc"));
    let direct: PluginAlloc = as_fn(defined(h_plain, "plugin_alloc"));
    let h_shim = open_with(&shim, libc::RTLD_NOW | libc::RTLD_NOLOAD);
    let shim_calls = defined(h_shim, "shim_calls").cast::<std::ffi::c_int>();
    // SAFETY: the shim's counter, an int it exports.
    let calls = || unsafe { shim_calls.read_volatile() };
    let free: CuMemFree = as_fn(program_dlsym(driver, "cuMemFree_v2"));
    let mut before = 0u64;
    // SAFETY: as below, before cuhook is installed.
    unsafe { assert_eq!(via_shim(&mut before, 4096), 0) };
    assert_eq!(calls(), 1);
    // SAFETY: the fake driver's free of its own allocation.
    unsafe { assert_eq!(free(before), 0) };

    let hooks = cuhook::install().unwrap();
    let (mut p, mut q) = (0u64, 0u64);
    // SAFETY: the plugins' wrappers of the fake driver's cuMemAlloc_v2.
    unsafe {
        assert_eq!(via_shim(&mut p, 4096), 0);
        assert_eq!(direct(&mut q, 8192), 0);
    }
    assert_eq!(calls(), 2, "the shim lost its call");
    assert_eq!(
        cuhook::lookup(p).map(|a| a.size),
        Some(4096),
        "the shimmed plugin's allocation unseen"
    );
    assert_eq!(cuhook::lookup(q).map(|a| a.size), Some(8192));
    let diag = cuhook::hooks::diagnostics();
    assert!(diag.chained_slots >= 1, "{diag}");
    assert!(
        !diag.conflicts.iter().any(|c| c.symbol == "cuMemAlloc_v2"),
        "{diag}"
    );
    for x in [p, q] {
        // SAFETY: the fake driver's free of its own allocations.
        unsafe { assert_eq!(free(x), 0) };
    }
    drop(hooks);
    let mut r = 0u64;
    // SAFETY: as above, with every slot put back.
    unsafe { assert_eq!(via_shim(&mut r, 4096), 0) };
    assert_eq!(calls(), 3, "the shim's slot was not put back");
    // SAFETY: as above.
    unsafe { assert_eq!(free(r), 0) };
}

/// `VmSize` of this process, in bytes.
fn address_space() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

fn set_address_space_limit(bytes: libc::rlim_t) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: bytes.min(old.rlim_max),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &new), 0);
    }
}

/// Host memory exhausted (`RLIMIT_AS` just above what the process holds, as `ulimit -v` or a
/// cgroup leaves it): the registry cannot grow, and the allocations it cannot record go
/// untracked (counted; lookups find nothing) instead of the host being aborted ("memory
/// allocation of 524288 bytes failed", SIGABRT, from the `cuMemAlloc_v2` hook). Once memory
/// is back, new allocations are tracked again.
#[test]
fn exhausted_memory_leaves_ranges_untracked_instead_of_aborting() {
    if cuhook_fixtures::skip_when_cross("qemu-user's own mappings count against the limit") {
        return;
    }
    if in_child(
        "exhausted_memory_leaves_ranges_untracked_instead_of_aborting",
        &[],
    ) {
        return;
    }
    const N: usize = 40_000;
    let (driver, _runtime) = load_cuda();
    make_context_current(driver);
    let mut ptrs = vec![0u64; N];
    {
        // The driver's own bookkeeping grown to N ranges first, unhooked (it keeps its room).
        let alloc: CuMemAlloc = as_fn(program_dlsym(driver, "cuMemAlloc_v2"));
        let free: CuMemFree = as_fn(program_dlsym(driver, "cuMemFree_v2"));
        for p in ptrs.iter_mut() {
            // SAFETY: the fake driver's calls on our own allocations.
            unsafe { assert_eq!(alloc(p, 256), 0) };
        }
        for &p in &ptrs {
            // SAFETY: as above.
            unsafe { assert_eq!(free(p), 0) };
        }
    }
    let hooks = cuhook::install().unwrap();
    let alloc: CuMemAlloc = as_fn(program_dlsym(driver, "cuMemAlloc_v2"));
    let free: CuMemFree = as_fn(program_dlsym(driver, "cuMemFree_v2"));
    set_address_space_limit(address_space() + (256 << 10));
    // Whatever the allocator still holds free is taken too (the driver's warm-up left some).
    let mut eaten = Vec::with_capacity(1 << 20);
    for size in [1usize << 16, 1 << 12, 1 << 8] {
        loop {
            // SAFETY: plain malloc; every block is freed below.
            let p = unsafe { libc::malloc(size) };
            if p.is_null() || eaten.len() == eaten.capacity() {
                break;
            }
            eaten.push(p);
        }
    }
    let mut made = 0;
    for p in ptrs.iter_mut() {
        // SAFETY: as above (through the hook).
        if unsafe { alloc(p, 256) } != 0 {
            break; // the driver ran out too: as without cuhook
        }
        made += 1;
    }
    for p in eaten {
        // SAFETY: blocks from malloc above, freed once.
        unsafe { libc::free(p) };
    }
    set_address_space_limit(libc::RLIM_INFINITY);
    let stats = cuhook::stats();
    assert!(
        stats.untracked > 0,
        "{made} allocations, none left untracked: the limit never bit ({stats:?})"
    );
    assert_eq!(
        stats.live as u64 + stats.untracked,
        made as u64,
        "{stats:?}"
    );
    let report = cuhook::report::render();
    assert!(report.contains("Allocations not tracked"), "{report}");
    // Memory is back: tracked again.
    let mut p = 0u64;
    // SAFETY: as above.
    unsafe { assert_eq!(alloc(&mut p, 4096), 0) };
    assert_eq!(cuhook::lookup(p).map(|a| a.size), Some(4096));
    for &q in ptrs[..made].iter().chain([&p]) {
        // SAFETY: as above.
        unsafe { assert_eq!(free(q), 0) };
    }
    drop(hooks);
}

/// A library loaded while memory is short (`RLIMIT_AS` leaves the host room for the `dlopen`, less
/// than the engine's margin): the engine puts its patching off instead of indexing it with
/// allocations that could abort the host; the plugin works, its calls unseen meanwhile, and the
/// first scan once memory is back patches it. At exit with memory short, the report is one fixed
/// line and the host's exit status is its own.
#[test]
fn a_library_loaded_while_memory_is_short_is_patched_once_it_is_back() {
    if cuhook_fixtures::skip_when_cross("qemu-user's own mappings count against the limit") {
        return;
    }
    if in_child(
        "a_library_loaded_while_memory_is_short_is_patched_once_it_is_back",
        &[],
    ) {
        return;
    }
    let dir = common::scratch("short-memory");
    let src = dir.join("memplugin.c");
    std::fs::write(
        &src,
        "typedef unsigned long long CUdeviceptr;\n\
         int cuMemAlloc_v2(CUdeviceptr *, unsigned long);\n\
         int plugin_alloc(CUdeviceptr *p, unsigned long n) { return cuMemAlloc_v2(p, n); }\n",
    )
    .unwrap();
    let plugin = dir.join("libmemplugin.so");
    let fixtures = cuhook_fixtures::dir();
    assert!(cuhook_fixtures::cc()
        .args(["-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(&src)
        .arg(fixtures.join("libcuda.so.1"))
        .status()
        .unwrap()
        .success());
    let (driver, _runtime) = load_cuda();
    make_context_current(driver);
    let hooks = cuhook::install().unwrap();
    let free: CuMemFree = as_fn(program_dlsym(driver, "cuMemFree_v2"));
    type PluginAlloc = unsafe extern "C" fn(*mut u64, std::ffi::c_ulong) -> std::ffi::c_int;

    set_address_space_limit(address_space() + (6 << 20));
    let handle = open(&plugin); // through the program's patched dlopen
    let plugin_alloc: PluginAlloc = as_fn(defined(handle, "plugin_alloc"));
    let mut p = 0u64;
    // SAFETY: the plugin's wrapper of the fake driver's cuMemAlloc_v2.
    unsafe { assert_eq!(plugin_alloc(&mut p, 4096), 0) };
    set_address_space_limit(libc::RLIM_INFINITY);
    let diag = cuhook::hooks::diagnostics();
    assert!(diag.deferred_for_memory >= 1, "{diag}");
    assert_eq!(cuhook::lookup(p), None, "patched although memory was short");

    assert!(cuhook::hooks::rescan(None).unwrap() >= 1, "nothing patched");
    let mut q = 0u64;
    // SAFETY: as above.
    unsafe { assert_eq!(plugin_alloc(&mut q, 4096), 0) };
    assert_eq!(cuhook::lookup(q).map(|a| a.size), Some(4096));
    for x in [p, q] {
        // SAFETY: the fake driver's free of its own allocations.
        unsafe { assert_eq!(free(x), 0) };
    }
    drop(hooks);

    // The exit report of a preloaded host that exits with memory short.
    let src = dir.join("short_exit.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <string.h>\n#include <sys/resource.h>\n\
         int main(void) {\n\
           FILE *f = fopen(\"/proc/self/status\", \"r\"); char line[256]; long kib = 0;\n\
           while (fgets(line, sizeof line, f)) if (!strncmp(line, \"VmSize:\", 7)) kib = atol(line + 7);\n\
           fclose(f);\n\
           struct rlimit r = { (kib << 10) + (1 << 20), RLIM_INFINITY };\n\
           return setrlimit(RLIMIT_AS, &r) ? 2 : 7;\n}\n",
    )
    .unwrap();
    let exe = dir.join("short_exit");
    assert!(cuhook_fixtures::cc()
        .args(["-include", "stdlib.h", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let out = std::process::Command::new(&exe)
        .env("LD_PRELOAD", common::libcuhook())
        .env("CUHOOK_REPORT", "stderr")
        .env_remove(support::CHILD)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(
        err.contains("no exit report: memory is short at exit"),
        "{err}"
    );
}

/// Hosts that were already fine, kept so (issue 40): another allocator preloaded before or after
/// libcuhook.so (jemalloc, tcmalloc, where installed), eager and frozen binding (`LD_BIND_NOW`,
/// `LD_BIND_NOT`), an `LD_AUDIT` module, and valgrind's memcheck around the whole process: each
/// host runs, and cuhook counts exactly what it counts alone.
#[test]
fn hosts_that_were_fine_stay_fine() {
    if cuhook_fixtures::skip_when_cross("the host's allocators and valgrind are not aarch64") {
        return;
    }
    let cuhook = common::libcuhook();
    let plain = run_plugin_app(std::slice::from_ref(&cuhook));
    let same = |seen: Seen, what: &str| {
        assert_eq!(seen.allocs, plain.allocs, "{what}: allocations");
        assert_eq!(seen.frees, plain.frees, "{what}: frees");
        assert!(!seen.unpatched, "{what}: a slot was left unpatched");
    };
    for allocator in [
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    ] {
        let allocator = std::path::PathBuf::from(allocator);
        if !allocator.exists() {
            eprintln!("skipped: {} is not installed", allocator.display());
            continue;
        }
        for order in [[&allocator, &cuhook], [&cuhook, &allocator]] {
            let seen = run_plugin_app(&[order[0].clone(), order[1].clone()]);
            same(seen, &format!("LD_PRELOAD {order:?}"));
        }
    }
    for (k, v) in [("LD_BIND_NOW", "1"), ("LD_BIND_NOT", "1")] {
        let seen = run_plugin_app_with(std::slice::from_ref(&cuhook), &[(k, v.to_owned())], None);
        same(seen, k);
    }
    let audit = common::fixtures_dir().join("libaudit_count.so");
    let env = [("LD_AUDIT", audit.display().to_string())];
    same(
        run_plugin_app_with(std::slice::from_ref(&cuhook), &env, None),
        "LD_AUDIT",
    );
    if std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        // glibc's loader compares `$ORIGIN`-style tokens with a word-at-a-time `strncmp` that
        // reads the aligned word past a short string's end (harmless, never past its page);
        // memcheck flags it whenever `dlinfo(RTLD_DI_SERINFO)` expands a RUNPATH, which the
        // `dlopen` interposer asks for a bare name from a caller that has one.
        let supp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("glibc-ld.supp");
        std::fs::write(
            &supp,
            "{\n  glibc-ld-strncmp-word-read\n  Memcheck:Addr8\n  fun:strncmp\n  fun:is_dst\n}\n",
        )
        .unwrap();
        let supp = format!("--suppressions={}", supp.display());
        let memcheck: &[&str] = &["valgrind", "-q", "--error-exitcode=97", &supp];
        same(
            run_plugin_app_with(std::slice::from_ref(&cuhook), &[], Some(memcheck)),
            "valgrind memcheck",
        );
    } else {
        eprintln!("skipped: valgrind is not installed");
    }
}

/// Longer than any run of a fixture program here takes; reaching it means the host hung.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(60);

/// Run `cmd` (output piped) to its end, or kill it at the watchdog: `None` when it hung.
fn run_or_kill(cmd: &mut std::process::Command) -> Option<common::Run> {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Drained on threads of their own, so that a chatty host never blocks on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Some(status) => Some(common::Run {
            status,
            stdout,
            stderr,
        }),
        None => {
            eprintln!("hung; its output so far:\n{stdout}\n{stderr}");
            None
        }
    }
}

/// `host_cancel CASE`, first without cuhook (the host's own checks: each thread ends cancelled,
/// the rest of the process and a forked child go on), then with it (all of `required`), each
/// under the watchdog.
fn cancelled_inside(case: &str, required: &[&str]) {
    let host = common::fixtures_dir().join("host_cancel");
    // Callbacks exist only with cuhook: that case has no run without it.
    for plain in [case != "callback", false] {
        let mut cmd = std::process::Command::new(&host);
        cmd.arg(case)
            .args(plain.then_some("plain"))
            .env("CUHOOK_LIB", common::libcuhook())
            .env("CUHOOK_DISABLE", "1")
            .env_remove("LD_PRELOAD")
            .env_remove("CUHOOK_TRACE")
            .env_remove("CUHOOK_REPORT");
        let what = format!("{case}{}", if plain { " (without cuhook)" } else { "" });
        let run = run_or_kill(&mut cmd).unwrap_or_else(|| panic!("{what}: the host hung"));
        let required: Vec<&str> = required
            .iter()
            .copied()
            .filter(|c| !plain || c.ends_with("_cancelled") || *c == "child")
            .collect();
        run.assert_passed(&required);
    }
}

/// Threads cancelled (`pthread_cancel`) inside the real driver function a CUDA hook called
/// (`fixtures/host/host_cancel.c`: a `cuMemAlloc_v2` and a `cuMemFree_v2` waiting for the device
/// in `poll`, `fakecuda_stall_next`): each thread ends cancelled, and afterwards other threads
/// allocate and free with every event delivered and the registry right, the callbacks
/// unsubscribe, cuhook uninstalls and installs again, a library loaded later is patched, and a
/// forked child does all of it again. The free never reached the driver: the range is still
/// allocated there. (cuhook dropped it from the registry when it announced the free, before the
/// real call; the cancellation unwinds past the hook without putting it back: not checked.)
#[test]
fn threads_cancelled_inside_the_driver_leave_cuhook_working() {
    cancelled_inside(
        "driver",
        &[
            "driver_alloc_cancelled",
            "driver_free_cancelled",
            "stalled_free_still_allocated",
            "parent_events_0",
            "parent_registry_0",
            "parent_unsubscribe_blocker",
            "parent_unsubscribe",
            "parent_reinstall",
            "parent_plugin_seen",
            "child_reinstall",
            "child_plugin_seen",
            "child",
        ],
    );
}

/// Threads cancelled inside a subscriber's callback (a C callback blocked in `read`, another
/// looping on `pthread_testcancel`): the request waits (the thread still runs 200 ms later)
/// until the callback returns, and the thread is cancelled at its next cancellation point after
/// the hooked call; then the same as above. (Before: the host aborted at the first cancellation,
/// "FATAL: exception not rethrown": glibc cancels by a forced unwind, and the `catch_unwind`
/// that keeps a panicking callback from unwinding into C caught it.)
#[test]
fn threads_cancelled_inside_a_callback_leave_cuhook_working() {
    cancelled_inside(
        "callback",
        &[
            "callback_read_deferred",
            "callback_read_cancelled",
            "callback_testcancel_deferred",
            "callback_testcancel_cancelled",
            "parent_events_0",
            "parent_unsubscribe_blocker",
            "parent_unsubscribe",
            "parent_reinstall",
            "parent_plugin_seen",
            "child",
        ],
    );
}

/// A thread cancelled inside a hooked `dlopen`, in the constructor of the library it loads
/// (blocked in `read`). Without cuhook the cancellation acts in the constructor and glibc's
/// loader lock stays held by the dead thread (the host can load nothing more). With cuhook the
/// request waits until the `dlopen` has returned (the constructor released), the thread is
/// cancelled at its next cancellation point, and everything goes on, libraries loaded later
/// included. (Before: the host aborted, as in the callback case: the interposer's real `dlopen`
/// ran inside the unwind guard of its own work.)
#[test]
fn a_thread_cancelled_inside_a_hooked_dlopen_leaves_cuhook_working() {
    cancelled_inside(
        "dlopen",
        &[
            "constructor_deferred",
            "constructor_cancelled",
            "parent_events_0",
            "parent_unsubscribe_blocker",
            "parent_reinstall",
            "parent_plugin_seen",
            "child_reinstall",
            "child_plugin_seen",
            "child",
        ],
    );
}
