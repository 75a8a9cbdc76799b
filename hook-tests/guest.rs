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
    let path = CString::new(common::fixtures_dir().join(name).to_str().unwrap()).unwrap();
    // SAFETY: a fixture library built by build.rs.
    let h = unsafe { libc::dlopen(path.as_ptr(), mode) };
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

/// Mappings of this process that are writable and executable at once.
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
    let set = cuhook::hooks::HookSet::new(
        "textrel",
        vec![cuhook::hooks::Hook::new("target_add", add as *const () as usize, &REAL_ADD).unwrap()],
    )
    .unwrap();
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
