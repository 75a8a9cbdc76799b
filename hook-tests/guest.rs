//! Issue 12 in this process: a library with text relocations, and hook sets stacked on one
//! symbol. The tests share the engine, so they run one at a time.

#[macro_use]
mod common;

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

type Call = unsafe extern "C" fn(c_int, c_int) -> c_int;

fn open(name: &str, mode: c_int) -> *mut c_void {
    open_with(libc::dlopen, name, mode)
}

/// Open a fixture library with `opener` (`dlopen`, or a patched library's call of it).
fn open_with(opener: OpenFn, name: &str, mode: c_int) -> *mut c_void {
    let path = CString::new(common::fixtures_dir().join(name).to_str().unwrap()).unwrap();
    // SAFETY: a fixture library built by build.rs, opened with dlopen's own contract.
    let h = unsafe { opener(path.as_ptr(), mode) };
    assert!(!h.is_null(), "dlopen {name}");
    h
}

fn function(handle: *mut c_void, name: &str) -> Call {
    let name = CString::new(name).unwrap();
    // SAFETY: fixture functions of type int(int, int).
    unsafe {
        let f = libc::dlsym(handle, name.as_ptr() as *const c_char);
        assert!(!f.is_null());
        std::mem::transmute::<*mut c_void, Call>(f)
    }
}

/// `dlopen`, `dlclose` and `dlsym` called from a patched object (libdlcaller.so): the test
/// program holds cuhook and is never patched, so its own loader calls are not interposed.
struct FromLibrary {
    open: OpenFn,
    close: CloseFn,
    sym: SymFn,
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type CloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type SymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

fn from_library() -> FromLibrary {
    let caller = open("libdlcaller.so", libc::RTLD_NOW);
    let find = |name: &std::ffi::CStr| {
        // SAFETY: a lookup in a fixture library we hold open.
        let f = unsafe { libc::dlsym(caller, name.as_ptr()) };
        assert!(!f.is_null());
        f
    };
    // SAFETY: the dlcaller_* functions have the types of dlopen, dlclose and dlsym.
    unsafe {
        FromLibrary {
            open: std::mem::transmute::<*mut c_void, OpenFn>(find(c"dlcaller_open")),
            close: std::mem::transmute::<*mut c_void, CloseFn>(find(c"dlcaller_close")),
            sym: std::mem::transmute::<*mut c_void, SymFn>(find(c"dlcaller_sym")),
        }
    }
}

/// A hook set of one hook on the fixtures' `target_add`.
fn target_add_set(
    name: &str,
    hook: extern "C" fn(c_int, c_int) -> c_int,
    real: &'static AtomicUsize,
) -> cuhook::hooks::HookSet {
    cuhook::hooks::HookSet::new(
        name,
        vec![cuhook::hooks::Hook::new("target_add", hook as *const () as usize, real).unwrap()],
    )
    .unwrap()
}

/// Mappings of this process that are writable and executable at once.
#[cfg(target_arch = "x86_64")] // for the text-relocation test only
fn writable_and_executable() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let perms = l.split_whitespace().nth(1).unwrap_or("");
            perms.contains('w') && perms.contains('x')
        })
        .map(str::to_owned)
        .collect()
}

/// Issue 12 item 13: a library whose code holds a relocated address of a hooked function
/// (`DT_TEXTREL`) is patched where it can be (its GOT), its code is never made writable, and
/// the calls its code makes directly are reported as not covered — in the diagnostics, the exit
/// report's coverage warnings and the log — rather than silently missed.
#[cfg(target_arch = "x86_64")] // the fixture's text relocation is written in x86_64 assembly
#[test]
fn text_relocations_are_never_patched_and_are_reported() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);

    open("libtarget.so", libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let lib = open("libtextrel.so", libc::RTLD_NOW);
    let (plt, text) = (
        function(lib, "textrel_through_plt"),
        function(lib, "textrel_through_text"),
    );
    let set = target_add_set("textrel", add, &REAL_ADD);
    let installed = cuhook::hooks::install(&set).unwrap();
    let wx = writable_and_executable();
    let before = CALLS.load(Ordering::Relaxed);
    // SAFETY: fixture functions of type int(int, int).
    let (a, b) = unsafe { (plt(2, 3), text(4, 5)) };
    let seen = CALLS.load(Ordering::Relaxed) - before;
    let diag = cuhook::hooks::diagnostics().to_string();
    let report = cuhook::report::render();
    installed.uninstall().unwrap();

    assert_eq!((a, b), (5, 9), "results changed");
    assert!(wx.is_empty(), "pages made writable and executable: {wx:?}");
    assert!(seen >= 1, "the PLT call was not hooked");
    let line = diag
        .lines()
        .find(|l| l.starts_with("text_relocations ") && l.contains("libtextrel.so"));
    assert!(line.is_some(), "no text_relocations finding:\n{diag}");
    assert!(
        report.lines().any(|l| l.trim_start().starts_with("- ")
            && l.contains("libtextrel.so")
            && l.contains("text relocation")),
        "no coverage warning in the report:\n{report}"
    );
}

/// Issue 12 item 9: two hook sets on one symbol. Each order of installing and uninstalling
/// must leave a chain that runs every installed hook once (the later set first), and, when
/// both are gone, the original alone — from a caller whose slot is patched and through dlsym.
#[test]
fn stacked_hook_sets_unstack_in_any_order() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static REAL_A: AtomicUsize = AtomicUsize::new(0);
    static REAL_B: AtomicUsize = AtomicUsize::new(0);
    static CALLS_A: AtomicUsize = AtomicUsize::new(0);
    static CALLS_B: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(hook_a, REAL_A, CALLS_A);
    counting_hook!(hook_b, REAL_B, CALLS_B);

    open("libtarget.so", libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let plugin = open("libplugin.so", libc::RTLD_NOW);
    let through_slot = function(plugin, "plugin_call");
    // dlsym called from a patched object (the test program holds cuhook and is never patched).
    let FromLibrary {
        open: dlopen_from_library,
        close: dlclose_from_library,
        sym: dlsym_from_library,
    } = from_library();
    let lookup = |name: &std::ffi::CStr| {
        // SAFETY: a lookup in the global scope; target_add has type int(int, int).
        let f = unsafe { dlsym_from_library(libc::RTLD_DEFAULT, name.as_ptr()) };
        assert!(!f.is_null());
        // SAFETY: as above.
        unsafe { std::mem::transmute::<*mut c_void, Call>(f) }
    };
    let a = target_add_set("stack-a", hook_a, &REAL_A);
    let b = target_add_set("stack-b", hook_b, &REAL_B);
    // (calls of A, calls of B) for one call through the plugin's slot and one through dlsym.
    let calls = || {
        let (a0, b0) = (
            CALLS_A.load(Ordering::Relaxed),
            CALLS_B.load(Ordering::Relaxed),
        );
        // SAFETY: fixture function of type int(int, int).
        assert_eq!(unsafe { through_slot(20, 22) }, 42, "result changed");
        let slot = (
            CALLS_A.load(Ordering::Relaxed) - a0,
            CALLS_B.load(Ordering::Relaxed) - b0,
        );
        let (a0, b0) = (
            CALLS_A.load(Ordering::Relaxed),
            CALLS_B.load(Ordering::Relaxed),
        );
        let looked_up = lookup(c"target_add");
        // SAFETY: as above.
        assert_eq!(unsafe { looked_up(1, 2) }, 3, "result changed");
        let lookup = (
            CALLS_A.load(Ordering::Relaxed) - a0,
            CALLS_B.load(Ordering::Relaxed) - b0,
        );
        (slot, lookup)
    };
    for (round, a_first_out) in [true, false, true, false].into_iter().enumerate() {
        let ia = cuhook::hooks::install(&a).unwrap();
        assert_eq!(calls(), ((1, 0), (1, 0)), "round {round}: A alone");
        let ib = cuhook::hooks::install(&b).unwrap();
        assert_eq!(calls(), ((1, 1), (1, 1)), "round {round}: A and B stacked");
        // A library loaded while both are installed gets the same chain.
        let second = CString::new(
            common::fixtures_dir()
                .join("libsecond.so")
                .to_str()
                .unwrap(),
        );
        // SAFETY: dlopen from a patched object, so the loader interposer sees it.
        let late = unsafe { dlopen_from_library(second.unwrap().as_ptr(), libc::RTLD_NOW) };
        assert!(!late.is_null());
        let (a0, b0) = (
            CALLS_A.load(Ordering::Relaxed),
            CALLS_B.load(Ordering::Relaxed),
        );
        // SAFETY: fixture function of type int(int, int).
        assert_eq!(unsafe { function(late, "second_call")(2, 2) }, 4);
        let seen = (
            CALLS_A.load(Ordering::Relaxed) - a0,
            CALLS_B.load(Ordering::Relaxed) - b0,
        );
        assert_eq!(seen, (1, 1), "round {round}: library loaded while stacked");
        // SAFETY: our own handle, closed from a patched object.
        assert_eq!(unsafe { dlclose_from_library(late) }, 0);
        if a_first_out {
            ia.uninstall().unwrap();
            assert_eq!(calls(), ((0, 1), (0, 1)), "round {round}: B after A left");
            ib.uninstall().unwrap();
        } else {
            ib.uninstall().unwrap();
            assert_eq!(calls(), ((1, 0), (1, 0)), "round {round}: A after B left");
            ia.uninstall().unwrap();
        }
        assert_eq!(
            calls(),
            ((0, 0), (0, 0)),
            "round {round}: the original alone"
        );
    }
}

/// Issue 12 item 6: a fork while another thread is inside an engine operation. The child must
/// be able to run engine operations (a rescan, a dlopen that patches) at once: before, it
/// inherited the patch lock held by a thread that does not exist there, so a rescan spun forever
/// and a dlopen waited out its patience.
#[test]
fn a_child_forked_during_an_engine_operation_can_use_the_engine() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    open("libtarget.so", libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let dlopen_from_library = from_library().open;
    let plugin = CString::new(
        common::fixtures_dir()
            .join("libplugin.so")
            .to_str()
            .unwrap(),
    )
    .unwrap();
    STOP.store(false, Ordering::Relaxed);
    let toggler = std::thread::spawn(|| {
        let set = target_add_set("fork-toggle", add, &REAL_ADD);
        let mut rounds = 0u64;
        while !STOP.load(Ordering::Relaxed) {
            if let Ok(i) = cuhook::hooks::install(&set) {
                let _ = i.uninstall();
            }
            rounds += 1;
        }
        rounds
    });
    let forks = std::env::var("CUHOOK_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (mut hung, mut failed) = (0, 0);
    for _ in 0..forks {
        // SAFETY: the child only calls into cuhook and the loader, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let start = std::time::Instant::now();
            let scanned = cuhook::hooks::rescan(None).is_ok();
            // SAFETY: a fixture library, opened from a patched object.
            let h = unsafe { dlopen_from_library(plugin.as_ptr(), libc::RTLD_NOW) };
            let quick = start.elapsed() < std::time::Duration::from_millis(1500);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe {
                libc::_exit(if scanned && !h.is_null() && quick {
                    0
                } else {
                    1
                })
            };
        }
        assert!(pid > 0, "fork failed");
        match cuhook_fixtures::wait_for(pid, Some(std::time::Duration::from_secs(10))) {
            Some(status) => {
                failed += !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) as u32
            }
            None => hung += 1,
        }
    }
    STOP.store(true, Ordering::Relaxed);
    let rounds = toggler.join().unwrap();
    assert!(rounds > 0);
    assert_eq!(
        (hung, failed),
        (0, 0),
        "of {forks} children: hung, slow or failed"
    );
}

/// Whether this kernel answers `PROCMAP_QUERY` (Linux >= 6.11); says why the calling test is
/// skipped when it does not (the readers then trust the segment flags, a documented limit).
fn kernel_query_or_skip() -> bool {
    let ok = cuhook::elf::ProtectionMap::for_addresses(std::iter::empty())
        .is_ok_and(|m| m.uses_kernel_query());
    if !ok {
        eprintln!("skipped: this kernel has no PROCMAP_QUERY (Linux >= 6.11)");
    }
    ok
}

/// Run `work` in a forked child, so that a crash is a failed check, not a dead test binary:
/// `Ok(exit code)`, or `Err(signal)` when it was killed.
fn in_child(work: impl FnOnce() -> c_int) -> Result<c_int, c_int> {
    // SAFETY: the child runs `work` and _exits without the parent's exit handlers.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = work();
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork");
    let status = cuhook_fixtures::wait_for(pid, Some(std::time::Duration::from_secs(120)))
        .expect("the child hung (killed)");
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

/// Issue 12 item 3: a library that made its own symbol-table page unreadable. Installing (in a
/// child process, so that a crash is a failed check) must not fault: the readers trust the
/// page's real protection, not the segment's flags, and leave that library unread.
#[test]
fn a_library_with_an_unreadable_symbol_table_is_left_unread() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    if !kernel_query_or_skip() {
        return;
    }
    open("libtarget.so", libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let outcome = in_child(|| {
        // Not looked up with dlsym: glibc's own lookup would fault on the hidden table.
        open("libhide_symbols.so", libc::RTLD_NOW | libc::RTLD_LOCAL);
        let plugin = function(
            open("libplugin.so", libc::RTLD_NOW | libc::RTLD_LOCAL),
            "plugin_call",
        );
        let set = target_add_set("hidden", add, &REAL_ADD);
        let ok = match cuhook::hooks::install(&set) {
            Ok(i) => {
                let before = CALLS.load(Ordering::Relaxed);
                // SAFETY: fixture function of type int(int, int).
                let result = unsafe { plugin(3, 4) };
                let hooked = CALLS.load(Ordering::Relaxed) == before + 1;
                result == 7 && hooked && i.uninstall().is_ok()
            }
            Err(_) => false,
        };
        c_int::from(!ok)
    });
    assert_eq!(
        outcome,
        Ok(0),
        "install with an unreadable symbol table: Ok(exit) or Err(signal)"
    );
}

/// A library whose constructor made the page holding its own PLT slots unreadable (PROT_NONE)
/// after the loader bound them. Whether it is opened after install (bound at load: the direct
/// path; lazily: the planner) or was there before install, the engine must not fault reading
/// those slots: it confirms each slot page readable (the same kernel answer the write needs)
/// before reading it, leaves that library unpatched, says so in the diagnostics, and goes on
/// patching the next library. Each case runs in a child, so that a crash is a failed check.
#[test]
fn a_library_that_hid_its_own_plt_slots_is_left_unpatched() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    if !kernel_query_or_skip() {
        return;
    }
    open("libtarget.so", libc::RTLD_NOW | libc::RTLD_GLOBAL);
    // Opens after install go through libdlcaller.so (see `FromLibrary`).
    let hooked_open = from_library().open;
    // (when it is opened, its mode): after install bound at load, after install lazily bound,
    // before install.
    let cases = [
        (true, libc::RTLD_NOW),
        (true, libc::RTLD_LAZY),
        (false, libc::RTLD_NOW),
    ];
    for (after_install, mode) in cases {
        let outcome = in_child(|| {
            // Its slot of target_add, patched at install, makes the hook live: a library
            // opened later bound to that original is the direct path's case.
            let second = function(
                open("libsecond.so", libc::RTLD_NOW | libc::RTLD_LOCAL),
                "second_call",
            );
            if !after_install {
                open("libhide_got.so", mode | libc::RTLD_LOCAL);
            }
            let set = target_add_set("hidden-got", add, &REAL_ADD);
            let code = match cuhook::hooks::install(&set) {
                Ok(i) => {
                    if after_install {
                        open_with(hooked_open, "libhide_got.so", mode | libc::RTLD_LOCAL);
                    }
                    let hidden = std::env::var("CUHOOK_TEST_GOT_HIDDEN").is_ok_and(|v| v == "1");
                    let plugin = function(
                        open_with(
                            hooked_open,
                            "libplugin.so",
                            libc::RTLD_NOW | libc::RTLD_LOCAL,
                        ),
                        "plugin_call",
                    );
                    let before = CALLS.load(Ordering::Relaxed);
                    // SAFETY: fixture functions of type int(int, int).
                    let sums = unsafe { (plugin(3, 4), second(1, 2)) };
                    let hooked = CALLS.load(Ordering::Relaxed) == before + 2;
                    let d = cuhook::hooks::diagnostics();
                    let reported = d.unreadable.iter().any(|r| r.contains("libhide_got.so"));
                    let untouched = cuhook::hooks::patched_slots()
                        .iter()
                        .all(|s| !s.object.ends_with("libhide_got.so"));
                    match (hidden, sums == (7, 3) && hooked, reported, untouched) {
                        (false, ..) => 3,
                        (true, false, ..) => 4,
                        (true, true, false, _) => 5,
                        (true, true, true, false) => 6,
                        (true, true, true, true) if i.uninstall().is_ok() => 0,
                        _ => 7,
                    }
                }
                Err(_) => 2,
            };
            code
        });
        let what = match outcome {
            Ok(0) => continue,
            Ok(2) => "install failed".to_owned(),
            Ok(3) => "the fixture did not hide its slot page (layout)".to_owned(),
            Ok(4) => "libplugin.so or libsecond.so not hooked afterwards".to_owned(),
            Ok(5) => "the unreadable slot page is not in the diagnostics".to_owned(),
            Ok(6) => "a slot of libhide_got.so is in the journal".to_owned(),
            Ok(c) => format!("exit {c}"),
            Err(signal) => format!("killed by signal {signal}"),
        };
        panic!("opened after install: {after_install}, mode {mode:#x}: {what}");
    }
}

/// A child forked while another thread subscribes and unsubscribes on the process-wide list can
/// subscribe at once: before, the list's writer lock had no fork handler, and a child that
/// inherited it held by the other thread waited for ever (killed by its alarm).
#[test]
fn a_child_forked_while_another_thread_subscribes_can_subscribe() {
    use cuhook::events::{self, mask, Callback, MemEvent};
    use std::sync::atomic::AtomicBool;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    fn quiet(_: &MemEvent, _: usize) {}
    static STOP: AtomicBool = AtomicBool::new(false);
    STOP.store(false, Ordering::Relaxed);
    let churn = std::thread::spawn(|| {
        while !STOP.load(Ordering::Relaxed) {
            let id = events::subscribe(mask::ALL, 0, Callback::Rust(quiet), 1).unwrap();
            events::unsubscribe_id(id).unwrap();
        }
    });
    let failed = (0..100)
        .filter(|_| {
            !cuhook_fixtures::forked(5, || {
                events::subscribe(mask::ALL, 0, Callback::Rust(quiet), 2)
                    .and_then(events::unsubscribe_id)
                    .is_ok()
            })
        })
        .count();
    STOP.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert_eq!(failed, 0, "children that could not subscribe");
}

/// libcuhook.so imports nothing of the C code linked into it: libzstd's weak tracing hooks
/// (`ZSTD_trace_*`, compiled out by `.cargo/config.toml`) would otherwise be undefined dynamic
/// symbols, and a host process defining them would receive our decoder's calls.
#[test]
fn the_decoders_import_nothing_from_the_host() {
    let lib = common::libcuhook();
    let out = std::process::Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    assert!(out.status.success(), "nm {}: {out:?}", lib.display());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("dlsym"),
        "nm listed no imports at all:\n{text}"
    );
    let leaked: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ZSTD") || l.contains("LZ4"))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
}

/// The statics an allocation hook reads (the registry, its attached flag and counters, the free
/// counters, whether stacks are recorded, the subscriber list and, when it dispatches, the grace period's state, the hook's original) are
/// addressed directly, not through the GOT. rustc gives a static a GOT entry when another crate
/// could reach it (an inlinable public function touching it, a public table pointing at it),
/// and the hook then loads its address from there first: one more instruction and one more
/// cache line per call (`benches/footprint.sh`).
#[test]
fn the_hooks_reach_their_statics_without_the_got() {
    let lib = common::libcuhook();
    let readelf = |args: &[&str]| {
        let out = std::process::Command::new("readelf")
            .args(args)
            .arg(&lib)
            .output()
            .expect("readelf (binutils) runs");
        assert!(out.status.success(), "readelf {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    // Legacy-mangled paths: `cuhook::registry::global::GLOBAL` is `..8registry6global6GLOBAL17h..`.
    let wanted = [
        "8registry6global6GLOBAL17h",
        "8registry6global8ATTACHED17h",
        "4cuda4emit13UNKNOWN_FREES17h",
        "4cuda4emit12FAILED_FREES17h",
        "6stacks6global5DEPTH17h",
        "6events11SUBSCRIBERS17h",
        "6events5grace5EPOCH17h",
        "6events5grace10ASYMMETRIC17h",
        "15cuMemAllocAsync8ORIGINAL17h",
        "14cuMemFreeAsync8ORIGINAL17h",
    ];
    // Symbol table lines: `Num: Value Size Type Bind Vis Ndx Name`.
    let symbols = readelf(&["-sW"]);
    let found: Vec<(&str, u64)> = symbols
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let w = wanted
                .iter()
                .find(|w| f.get(7).is_some_and(|n| n.contains(*w)))?;
            Some((*w, hex(f[1])?))
        })
        .collect();
    for w in wanted {
        assert!(
            found.iter().any(|(f, _)| *f == w),
            "no symbol matching {w} in {} (stripped?)",
            lib.display()
        );
    }
    // Section lines: `[Nr] Name Type Address Off Size ...`.
    let sections = readelf(&["-SW"]);
    let got: Vec<(u64, u64)> = sections
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(']').nth(1)?.split_whitespace().collect();
            (f.first() == Some(&".got")).then(|| {
                let at = hex(f[2]).unwrap();
                (at, at + hex(f[4]).unwrap())
            })
        })
        .collect();
    assert!(!got.is_empty(), "no .got section:\n{sections}");
    // Packed relative relocations would hide the GOT entries' targets from the scan below.
    assert!(
        !sections.contains(".relr.dyn"),
        "RELR relocations: this test cannot read the GOT's targets"
    );
    // Relocation lines: `Offset Info Type Symbol-value [Name + Addend]`. A GOT entry holding a
    // static's address is a RELATIVE relocation whose addend is that address, or (a static
    // that is exported) a relocation naming it.
    let relocations = readelf(&["-rW"]);
    let mut relative_in_got = 0;
    let mut through_got = Vec::new();
    for l in relocations.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(at) = f.first().and_then(|o| hex(o)) else {
            continue;
        };
        if f.len() < 4 || !got.iter().any(|&(lo, hi)| (lo..hi).contains(&at)) {
            continue;
        }
        if f.len() == 4 && f[2].ends_with("_RELATIVE") {
            relative_in_got += 1;
            if let Some(target) = hex(f[3]) {
                through_got.extend(found.iter().filter(|(_, a)| *a == target).map(|(w, _)| *w));
            }
        } else {
            through_got.extend(wanted.iter().filter(|w| l.contains(*w)));
        }
    }
    assert!(
        relative_in_got > 0,
        "no RELATIVE relocation into .got parsed:\n{relocations:.2000}"
    );
    assert!(through_got.is_empty(), "GOT entries for {through_got:?}");
}
