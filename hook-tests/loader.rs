//! The loader interposers (dlopen, dlmopen, dlclose, dlsym, dlvsym) on the fixture app
//! `app_dl`, one process per scenario.

#[macro_use]
mod common;

use common::run_fixture;

macro_rules! loader_tests {
    ($($test:ident: $scenario:literal $(, env $env:expr)? => [$($check:literal),*];)*) => {
        $(
            #[test]
            fn $test() {
                run_fixture("app_dl", &[$scenario], &[$($env)?]).assert_passed(&[$($check),*]);
            }
        )*
    };
}

loader_tests! {
    plugins_loaded_after_install_are_patched: "plugins" => ["plugin_opened", "plugin_hooked", "dependency_hooked",
        "through_dependency_hooked", "constructor_opened_second", "opened_by_constructor_hooked",
        "late_constructors_reported", "plugin_after_uninstall", "second_after_uninstall", "no_slots_after_uninstall"];
    bare_names_use_the_callers_runpath: "runpath" => ["plain_dlopen_uses_runpath", "dlerror_clear_after_success",
        "same_file_opened", "sub_library_works", "plain_origin_is_callers_dir", "origin_is_callers_dir",
        "missing_gives_null", "missing_same_dlerror", "dlerror_consumed", "dlopen_null_is_main", "loaded_soname_wins"];
    lookups_return_hooks_only_for_hooked_originals: "dlsym" => ["plain_rtld_next_is_y", "plain_next_foo", "plain_default_finds_local_dependency",
        "default_finds_local_dependency",
        "dlsym_handle_hooked", "dlsym_default_hooked", "dlsym_next_from_main_hooked", "dlvsym_hooked_version",
        "dlvsym_unhooked_version_plain", "dlsym_unhooked_plain", "rtld_next_from_x_is_y", "rtld_next_versioned",
        "rtld_next_missing_null", "rtld_next_missing_dlerror", "rtld_next_chain_no_cycle"];
    dlclose_forgets_and_reopen_patches_again: "reopen" => ["first_open_hooked", "plugin_has_slots", "dlclose_ok",
        "unloaded", "forgotten", "reopened_hooked", "reopened_slots_once", "still_held_hooked", "still_held_slots"];
    dlmopen_namespace_reported_not_patched: "dlmopen" => ["dlmopen_opened", "namespace_call_correct",
        "namespace_skip_reported", "main_namespace_still_hooked"];
    concurrent_dlopen_calls_and_installs: "stress" => ["stress_no_errors", "stress_results", "stress_rounds"];
    libraries_with_new_dependencies_opened_by_two_threads: "group_churn",
        env ("CUHOOK_GROUP_DLOPEN", "1") => ["group_churn_correct",
        "group_churn_hooked", "group_churn_from_opened_object", "group_churn_forgotten"];
    libraries_with_new_dependencies_opened_by_two_threads_default_path: "group_churn",
        env ("CUHOOK_GROUP_DLOPEN", "0") => ["group_churn_correct",
        "group_churn_hooked", "group_churn_from_opened_object", "group_churn_forgotten"];
}

/// Calls `f(a, b)` of a fixture library, asserts it returns `want`, and that it went through a
/// counting hook once (`calls` grew by one); `what` names the check.
///
/// # Safety
/// `f` is a live function of that signature.
unsafe fn assert_hooked_call(
    f: unsafe extern "C" fn(std::ffi::c_int, std::ffi::c_int) -> std::ffi::c_int,
    (a, b): (std::ffi::c_int, std::ffi::c_int),
    want: std::ffi::c_int,
    calls: &std::sync::atomic::AtomicUsize,
    what: &str,
) {
    let before = calls.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the caller's contract.
    assert_eq!(unsafe { f(a, b) }, want, "{what}: wrong result");
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::Relaxed),
        before + 1,
        "{what}"
    );
}

/// The exit report's warning about libraries whose constructors ran before they were hooked
/// names them (before: only how many). The `plugins` scenario opens libplugin_ctor.so after
/// install; here cuhook also starts as it would preloaded, so that it writes the report.
#[test]
fn exit_report_names_the_libraries_whose_constructors_ran_unhooked() {
    let run = run_fixture(
        "app_dl",
        &["plugins"],
        &[("CUHOOK_DISABLE", "0"), ("CUHOOK_REPORT", "stderr")],
    );
    assert!(
        run.checks()
            .iter()
            .any(|(name, ok, _)| name == "late_constructors_reported" && *ok),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    let warning = run
        .stderr
        .lines()
        .find(|l| l.contains("ran before they were hooked"))
        .unwrap_or_else(|| panic!("no warning about late constructors:\n{}", run.stderr));
    let (count, names) = warning
        .split_once("): ")
        .unwrap_or_else(|| panic!("the warning names no library: {warning}"));
    assert!(names.contains("/libplugin_ctor.so"), "{warning}");
    let n: usize = count
        .split_once("constructors of ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count: {warning}"));
    assert!((1..=8).contains(&n), "{warning}");
    assert_eq!(
        names.split(", ").count(),
        n,
        "each of the {n} libraries is named: {warning}"
    );
}

/// Issue 12 item 10: a `dlclose` nested in a library's destructor (the loader's lock held)
/// while another thread opens and closes a plugin to patch and a third toggles a hook set: no
/// call may wait out the interposers' patience (before the fix: stalls of 2 s in every run).
#[test]
fn a_destructors_dlclose_never_stalls_another_threads_dlopen() {
    run_fixture("app_dl", &["nested_close"], &[]).assert_passed(&[
        "nested_close_no_stall",
        "nested_close_all_ran",
        "nested_close_correct",
        "nested_close_still_hooked",
    ]);
}

/// Issue 12 item 1: a first install into more objects than are pinned before indexing, while
/// other threads close and reopen some of them: no child may crash reading an object being
/// unmapped, and the install still hooks the plugins. `FIXTURE_ROUNDS` sets the number of
/// child processes (200 by default: before the fix 1 in 60 crashed, so 200 miss it 4 % of the
/// time).
#[test]
fn a_first_install_into_many_objects_survives_concurrent_dlclose() {
    run_fixture("app_dl", &["first_install_churn"], &[])
        .assert_passed(&["first_install_churn_no_crash", "first_install_churn_hooked"]);
}

/// Nothing read inside a walk of the loader's list (a first install into more than 64 new
/// objects, a `dlopen` with new dependencies, its `dlclose`, the uninstall) makes a dynamic
/// thread-local access: one there deadlocks against a concurrent `dlclose` whenever a library
/// with thread-locals came or went meanwhile (`__tls_get_addr`'s slow path takes the loader's TLS
/// lock, which that `dlclose` holds while it waits for the walk's list lock). Seen before the fix
/// as a hang in 5 of 400 exit-report runs; the preloaded `libtls_watch.so` sees every such access
/// instead of the rare hang. x86_64 only: aarch64 reaches thread-locals through TLS descriptors,
/// which a preloaded library cannot watch.
#[cfg(target_arch = "x86_64")]
#[test]
fn nothing_inside_a_loader_walk_touches_dynamic_thread_locals() {
    let shim = common::fixtures_dir().join("libtls_watch.so");
    let shim = shim.to_str().unwrap();
    // The group path, and with it off the whole sync.
    for group in ["1", "0"] {
        run_fixture(
            "app_dl",
            &["walk_tls"],
            &[("LD_PRELOAD", shim), ("CUHOOK_GROUP_DLOPEN", group)],
        )
        .assert_passed(&[
            "walk_tls_watching",
            "walk_tls_many_hooked",
            "walk_tls_group_hooked",
            "walk_tls_group_path",
            "walk_tls_none",
        ]);
    }
}

/// Issue 12 items 7 and 8: `RTLD_NEXT` from libraries opened with `dlopen` gives glibc's own
/// answer and `dlerror` text. x86_64 only: elsewhere the lookup is emulated (a documented limit).
#[cfg(target_arch = "x86_64")]
#[test]
fn rtld_next_from_dlopened_libraries_is_glibcs() {
    run_fixture("app_dl", &["next_dlopened"], &[]).assert_passed(&[
        "local_opened",
        "local_plain_is_libc",
        "local_next_malloc",
        "local_next_malloc_versioned",
        "local_dlerror_names_caller",
        "global_opened",
        "global_plain_is_libc",
        "global_next_malloc",
        "global_next_malloc_versioned",
        "global_dlerror_names_caller",
    ]);
}

/// In this process (the other tests run fixture processes): a `dlopen` that adds exactly one
/// object is handled through the returned handle and its `dlclose` through `_dl_find_object`,
/// without walking the loader's list; one that adds two objects (a library and its new
/// dependency) through the handle and the objects listed after it, and the `dlclose` that
/// removes both through what arrived with it: no copy of the whole list. All patch and forget
/// exactly as a whole sync would. The one new object is written directly (no batch planner)
/// when its hooks are live and it was bound at load; opened `RTLD_LAZY` (its slot holds its own
/// PLT stub), it goes through the planner.
#[test]
fn one_new_object_is_handled_without_a_walk() {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::sync::atomic::AtomicUsize;

    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static REAL_MUL: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    counting_hook!(mul, REAL_MUL, CALLS);
    type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Call = unsafe extern "C" fn(c_int, c_int) -> c_int;

    let dir = common::fixtures_dir();
    let path = |name: &str| CString::new(dir.join(name).to_str().unwrap()).unwrap();
    // SAFETY: fixture libraries built by build.rs; symbols looked up with their C types.
    unsafe {
        // libsecond.so imports target_add: its slot, patched at install, makes the hook live.
        for lib in ["libtarget.so", "libdlcaller.so", "libsecond.so"] {
            let h = libc::dlopen(path(lib).as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            assert!(!h.is_null(), "{lib}");
        }
        let caller = libc::dlopen(path("libdlcaller.so").as_ptr(), libc::RTLD_NOW);
        let open: Open = std::mem::transmute(libc::dlsym(caller, c"dlcaller_open".as_ptr()));
        let close: Close = std::mem::transmute(libc::dlsym(caller, c"dlcaller_close".as_ptr()));

        let set = cuhook::hooks::HookSet::new(
            "quick",
            vec![
                cuhook::hooks::Hook::new("target_add", add as *const () as usize, &REAL_ADD)
                    .unwrap(),
                cuhook::hooks::Hook::new("target_mul", mul as *const () as usize, &REAL_MUL)
                    .unwrap(),
            ],
        )
        .unwrap();
        let installed = cuhook::hooks::install(&set).unwrap();
        let slots_in = |name: &str| {
            cuhook::hooks::patched_slots()
                .iter()
                .filter(|s| s.object.ends_with(name))
                .count()
        };
        let before = cuhook::hooks::diagnostics();

        // libplugin.so needs only libtarget.so, already loaded: one new object.
        for round in 0..3 {
            let h = open(path("libplugin.so").as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null());
            assert!(
                slots_in("libplugin.so") > 0,
                "round {round}: plugin not patched"
            );
            let call: Call = std::mem::transmute(libc::dlsym(h, c"plugin_call".as_ptr()));
            assert_hooked_call(call, (2, 3), 5, &CALLS, "hook not called");
            assert_eq!(close(h), 0);
            assert_eq!(
                slots_in("libplugin.so"),
                0,
                "round {round}: closed plugin not forgotten"
            );
        }
        let quick = cuhook::hooks::diagnostics();
        assert_eq!(quick.quick_scans, before.quick_scans + 6, "{quick}");
        assert_eq!(quick.rescans, before.rescans, "a walk was taken: {quick}");
        assert_eq!(quick.direct_patches, before.direct_patches + 3, "{quick}");

        // Lazily bound: the slot holds the plugin's own PLT stub, which only the planner
        // resolves; the plugin is patched all the same.
        let h = open(path("libplugin.so").as_ptr(), libc::RTLD_LAZY);
        assert!(!h.is_null());
        assert_eq!(slots_in("libplugin.so"), 1, "lazy plugin not patched");
        let call: Call = std::mem::transmute(libc::dlsym(h, c"plugin_call".as_ptr()));
        assert_hooked_call(call, (4, 5), 9, &CALLS, "lazy plugin: hook not called");
        assert_eq!(close(h), 0);
        let lazy = cuhook::hooks::diagnostics();
        assert_eq!(lazy.direct_patches, quick.direct_patches, "{lazy}");
        assert_eq!(lazy.quick_scans, quick.quick_scans + 2, "{lazy}");

        // libplugin_dep.so brings libdep.so: two new objects, found after the opened one in
        // the loader's list (no copy of the whole list), both patched, both forgotten at the
        // dlclose that unloads them together. First a slot of target_mul is patched (so its
        // hook is live: the direct write's condition), and the process made big enough that
        // proving a dependency is in the opened library's scope costs less than a walk (a few
        // dozen copies of libplugin.so, each a distinct object to the loader).
        // With the group path turned off, such a library takes a whole sync, and is patched
        // all the same; the sync remembers what arrived with it, so the dlclose that unloads
        // both forgets them without another.
        cuhook::hooks::set_group_dlopen(false);
        let leaf = open(path("libgroup_leaf.so").as_ptr(), libc::RTLD_NOW);
        assert!(!leaf.is_null());
        let off = cuhook::hooks::diagnostics();
        let h = open(path("libplugin_dep.so").as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        assert!(
            slots_in("libdep.so") > 0,
            "group path off: dependency not patched"
        );
        let synced = cuhook::hooks::diagnostics();
        assert_eq!(synced.group_scans, off.group_scans, "{synced}");
        assert!(synced.rescans > off.rescans, "no whole sync: {synced}");
        assert_eq!(close(h), 0);
        let closed = cuhook::hooks::diagnostics();
        assert_eq!(
            closed.rescans, synced.rescans,
            "dlclose took a sync: {closed}"
        );
        assert_eq!(closed.group_scans, synced.group_scans + 1, "{closed}");
        assert_eq!(slots_in("libdep.so"), 0, "dependency not forgotten");
        assert_eq!(slots_in("libplugin_dep.so"), 0, "library not forgotten");
        // The dependency held on its own: the library's dlclose unloads it alone (one object,
        // the quick path), and the dependency stays known and patched until its own dlclose.
        // Returns the dependency's handle.
        let held_dependency = |what: &str| {
            let h = open(path("libplugin_dep.so").as_ptr(), libc::RTLD_NOW);
            let dep = open(path("libdep.so").as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null() && !dep.is_null());
            assert_eq!(close(h), 0);
            assert!(
                slots_in("libdep.so") > 0,
                "{what}: the held dependency was forgotten"
            );
            dep
        };
        let dep = held_dependency("group path off");
        let dep_call: Call = std::mem::transmute(libc::dlsym(dep, c"dep_call".as_ptr()));
        assert_hooked_call(dep_call, (3, 4), 12, &CALLS, "held dependency");
        assert_eq!(close(dep), 0);
        assert_eq!(slots_in("libdep.so"), 0);
        let held = cuhook::hooks::diagnostics();
        assert_eq!(held.quick_scans, closed.quick_scans + 2, "{held}");
        assert_eq!(held.rescans, closed.rescans + 1, "{held}");

        cuhook::hooks::set_group_dlopen(true);
        let copies = common::LibraryCopies::new("libplugin.so", 40);
        for copy in &copies.paths {
            assert!(!open(copy.as_ptr(), libc::RTLD_NOW).is_null());
        }
        drop(copies);
        let lazy = cuhook::hooks::diagnostics();
        type Call2 = Call;
        for round in 0..3 {
            let h = open(path("libplugin_dep.so").as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null());
            assert!(
                slots_in("libdep.so") > 0,
                "round {round}: the new dependency is not patched"
            );
            let call: Call2 = std::mem::transmute(libc::dlsym(h, c"plugin_dep_call".as_ptr()));
            assert_hooked_call(
                call,
                (3, 4),
                12,
                &CALLS,
                &format!("round {round}: the dependency's call did not reach the hook"),
            );
            assert_eq!(close(h), 0);
            assert_eq!(slots_in("libdep.so"), 0, "round {round}: not forgotten");
        }
        let group = cuhook::hooks::diagnostics();
        assert_eq!(group.group_scans, lazy.group_scans + 6, "{group}");
        assert_eq!(
            group.rescans, lazy.rescans,
            "a whole sync was taken: {group}"
        );
        // The dependency (the library itself imports nothing hooked) is proven to be in the
        // library's scope (a `dlsym` of `dep_call` through its handle lands in it), so the
        // handle keeps it loaded, and it is written directly: no walk, no batch planner.
        assert_eq!(group.direct_patches, lazy.direct_patches + 3, "{group}");
        assert_eq!(
            group.dependencies_in_scope,
            lazy.dependencies_in_scope + 3,
            "{group}"
        );

        // Held on its own again, with the group path: the dependency's own dlclose then finds
        // it gone too.
        let dep = held_dependency("group path on");
        assert_eq!(close(dep), 0);
        assert_eq!(slots_in("libdep.so"), 0);
        let held = cuhook::hooks::diagnostics();
        assert_eq!(held.group_scans, group.group_scans + 1, "{held}");
        assert_eq!(held.quick_scans, group.quick_scans + 2, "{held}");
        assert_eq!(
            held.rescans, group.rescans,
            "a whole sync was taken: {held}"
        );

        installed.uninstall().unwrap();
    }
}

/// Issue 36: a `dlopen` that brings several new objects defining one hooked name (found in no
/// global scope: loaded `RTLD_LOCAL`) gives the hook the definition the loader would bind, the
/// first in load order: the opened library's own, not its dependency's. The group path once
/// took the dependency's here (it was proven in scope and given to the planner first; on the
/// H200 PyTorch's hooks then called another copy of the CUDA runtime and crashed): such a group
/// now takes a whole sync, which gives the planner load order. In a child process of its own,
/// made big enough that the group path would prove the dependency's scope.
#[test]
fn several_new_definers_give_the_first_loaded_definition() {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::sync::atomic::{AtomicUsize, Ordering};

    if common::ran_in_child(
        "several_new_definers_give_the_first_loaded_definition",
        "CUHOOK_TEST_DEFINER_ORDER",
    ) {
        return;
    }
    static REAL_ORDER: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn order_value() -> c_int {
        // SAFETY: the engine published the original before routing any call here.
        let real: extern "C" fn() -> c_int =
            unsafe { std::mem::transmute(REAL_ORDER.load(Ordering::Acquire)) };
        real() + 100
    }
    type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    let dir = common::fixtures_dir();
    let path = |name: &str| CString::new(dir.join(name).to_str().unwrap()).unwrap();
    // SAFETY: fixture libraries built by build.rs; symbols looked up with their C types.
    unsafe {
        // The copies below need libtarget.so, found loaded by its soname.
        let target = libc::dlopen(
            path("libtarget.so").as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        );
        assert!(!target.is_null());
        let caller = libc::dlopen(path("libdlcaller.so").as_ptr(), libc::RTLD_NOW);
        assert!(!caller.is_null());
        let open: Open = std::mem::transmute(libc::dlsym(caller, c"dlcaller_open".as_ptr()));
        let set = cuhook::hooks::HookSet::new(
            "definer order",
            vec![cuhook::hooks::Hook::new(
                "order_value",
                order_value as *const () as usize,
                &REAL_ORDER,
            )
            .unwrap()],
        )
        .unwrap();
        let installed = cuhook::hooks::install(&set).unwrap();
        // A few dozen other objects: proving a dependency's scope is then worth a `dlsym`.
        let copies = common::LibraryCopies::new("libplugin.so", 40);
        for copy in &copies.paths {
            assert!(!open(copy.as_ptr(), libc::RTLD_NOW).is_null());
        }
        drop(copies);
        let before = cuhook::hooks::diagnostics();
        let h = open(
            path("libord_top.so").as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        assert!(!h.is_null());
        let after = cuhook::hooks::diagnostics();
        assert_eq!(after.group_scans, before.group_scans, "{after}");
        assert_eq!(after.rescans, before.rescans + 1, "no whole sync: {after}");
        let original = REAL_ORDER.load(Ordering::Acquire);
        assert_ne!(original, 0, "no original published: {after}");
        let real: extern "C" fn() -> c_int = std::mem::transmute(original);
        assert_eq!(
            real(),
            1,
            "the hook's original is the dependency's definition, not the library's"
        );
        installed.uninstall().unwrap();
    }
}

/// A hooked function that nothing imports gets its original when a library defining it is
/// opened later, loaded `RTLD_LOCAL` (found in its own scope) or `RTLD_GLOBAL` (globally):
/// a new object's patch looks for the originals of the hooks whose names it may define (its
/// name filter), and must not miss one. Runs in a child process of its own (the other
/// in-process test counts this process's scans).
#[test]
fn a_later_library_defining_a_hooked_function_gives_its_original() {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::sync::atomic::{AtomicUsize, Ordering};

    if common::ran_in_child(
        "a_later_library_defining_a_hooked_function_gives_its_original",
        "CUHOOK_TEST_LATE_DEFINER",
    ) {
        return;
    }
    static REAL_ANSWER: AtomicUsize = AtomicUsize::new(0);
    static REAL_DEP: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(dep_call, REAL_DEP, CALLS);
    extern "C" fn answer() -> c_int {
        // SAFETY: never called (nothing imports subonly_answer); its type if it were.
        let real: extern "C" fn() -> c_int =
            unsafe { std::mem::transmute(REAL_ANSWER.load(Ordering::Acquire)) };
        real() + 1
    }
    type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Lookup = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

    let dir = common::fixtures_dir();
    let path = |name: &str| CString::new(dir.join(name).to_str().unwrap()).unwrap();
    let lib = path("sub/libsubonly.so");
    // SAFETY: fixture libraries built by build.rs; symbols looked up with their C types.
    unsafe {
        // This program contains cuhook and is patched like any other: once installed, its own
        // `dlsym` answers with hooks. The definitions are asked from the loader's own dlsym,
        // taken before the install.
        let raw: Lookup = std::mem::transmute(libc::dlsym(libc::RTLD_DEFAULT, c"dlsym".as_ptr()));
        let caller = libc::dlopen(path("libdlcaller.so").as_ptr(), libc::RTLD_NOW);
        assert!(!caller.is_null());
        let open: Open = std::mem::transmute(libc::dlsym(caller, c"dlcaller_open".as_ptr()));
        let close: Close = std::mem::transmute(libc::dlsym(caller, c"dlcaller_close".as_ptr()));
        assert!(libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD).is_null());

        let set = cuhook::hooks::HookSet::new(
            "late definer",
            vec![
                cuhook::hooks::Hook::new(
                    "subonly_answer",
                    answer as *const () as usize,
                    &REAL_ANSWER,
                )
                .unwrap(),
                cuhook::hooks::Hook::new("dep_call", dep_call as *const () as usize, &REAL_DEP)
                    .unwrap(),
            ],
        )
        .unwrap();
        let installed = cuhook::hooks::install(&set).unwrap();
        assert_eq!(
            REAL_ANSWER.load(Ordering::Acquire),
            0,
            "nothing defines it yet"
        );

        // One new object, local: found in its own scope.
        let before = cuhook::hooks::diagnostics();
        let h = open(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let defined = raw(h, c"subonly_answer".as_ptr()) as usize;
        assert_ne!(defined, 0);
        assert_eq!(REAL_ANSWER.load(Ordering::Acquire), defined, "RTLD_LOCAL");
        assert_eq!(
            libc::dlsym(h, c"subonly_answer".as_ptr()) as usize,
            answer as *const () as usize,
            "the program's own dlsym gives the hook"
        );
        let after = cuhook::hooks::diagnostics();
        assert!(after.quick_scans > before.quick_scans, "{after}");
        assert_eq!(close(h), 0);

        // Global this time, after a reinstall (the old original is stale: reset it).
        installed.uninstall().unwrap();
        REAL_ANSWER.store(0, Ordering::Release);
        let installed = cuhook::hooks::install(&set).unwrap();
        assert_eq!(REAL_ANSWER.load(Ordering::Acquire), 0, "unloaded again");
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!h.is_null());
        cuhook::hooks::rescan(Some(std::time::Duration::from_secs(10))).unwrap();
        let defined = raw(h, c"subonly_answer".as_ptr()) as usize;
        assert_eq!(REAL_ANSWER.load(Ordering::Acquire), defined, "RTLD_GLOBAL");
        installed.uninstall().unwrap();

        // Excluded: libdep.so defines dep_call (nothing loaded imports it). Nothing is looked
        // up when it comes (it is not patched), but while it is loaded the next new object's
        // patch looks for every missing original, and the global scope has it. (Another
        // library than libsubonly.so: a global lookup that found a definition keeps its library
        // loaded for good.)
        let dep = path("libdep.so");
        assert!(libc::dlopen(dep.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD).is_null());
        cuhook::hooks::set_exclude_list(["libdep.so"]);
        let installed = cuhook::hooks::install(&set).unwrap();
        assert_eq!(
            REAL_DEP.load(Ordering::Acquire),
            0,
            "nothing defines dep_call yet"
        );
        let h = open(dep.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!h.is_null());
        assert_eq!(
            REAL_DEP.load(Ordering::Acquire),
            0,
            "excluded: not looked at"
        );
        // libnextd.so imports dlsym (hooked by the loader set): a new object that matters.
        let other = open(
            path("libnextd.so").as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        );
        assert!(!other.is_null());
        let defined = raw(h, c"dep_call".as_ptr()) as usize;
        assert_ne!(defined, 0);
        assert_eq!(
            REAL_DEP.load(Ordering::Acquire),
            defined,
            "found while an excluded library is loaded"
        );
        assert_eq!(close(other), 0);
        assert_eq!(close(h), 0);
        installed.uninstall().unwrap();
        cuhook::hooks::set_exclude_list(Vec::<String>::new());
    }
}

/// Loads `libtarget.so` (global) and the 80 `libmany_NN.so` plugins (local, each importing
/// `target_add`): more new objects than a sync pins by name before it reads them inside walks.
/// Returns the plugins' handles (never closed).
///
/// # Safety
/// Runs the fixture libraries' constructors.
unsafe fn open_many_plugins() -> Vec<*mut std::ffi::c_void> {
    let target = common::fixture_path("libtarget.so");
    // SAFETY: fixture libraries built by build.rs (the caller's promise about constructors).
    unsafe {
        assert!(!libc::dlopen(target.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL).is_null());
        (0..80)
            .map(|k| {
                let p = common::fixture_path(&format!("libmany_{k:02}.so"));
                let h = libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                assert!(!h.is_null(), "libmany_{k:02}.so");
                h
            })
            .collect()
    }
}

/// An install into many objects and the uninstall that follows touch the objects from inside
/// walks of the loader's list, never by pinning each by name (a `dlopen` with `RTLD_NOLOAD`
/// per object, which makes glibc compare the name with every loaded object: O(N²) for N
/// objects; before the fix an uninstall from 1,000 objects spent 103 M instructions there,
/// 93 % of it). Every slot is still put back. Runs in a child process of its own (it counts
/// this process's pins).
#[test]
fn install_and_uninstall_never_pin_objects_by_name() {
    use std::ffi::c_int;
    use std::sync::atomic::{AtomicUsize, Ordering};

    if common::ran_in_child(
        "install_and_uninstall_never_pin_objects_by_name",
        "CUHOOK_TEST_NO_PIN_BY_NAME",
    ) {
        return;
    }
    // SAFETY: gnu_get_libc_version returns a static string.
    let glibc = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let minor: u32 = glibc.to_str().unwrap()["2.".len()..].parse().unwrap_or(0);
    if minor < 35 {
        // No `_dl_find_object`: a walk cannot tell a relocated object from one being loaded,
        // so every object is pinned by name (documented in hooks/loader.rs).
        eprintln!("glibc {glibc:?} has no _dl_find_object: nothing to check");
        return;
    }
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    type Call = unsafe extern "C" fn(c_int, c_int) -> c_int;

    let mut calls = Vec::new();
    // SAFETY: fixture libraries built by build.rs; symbols looked up with their C types.
    unsafe {
        for h in open_many_plugins() {
            let f = libc::dlsym(h, c"many_call".as_ptr());
            assert!(!f.is_null());
            calls.push(std::mem::transmute::<*mut libc::c_void, Call>(f));
        }
        let set = common::one_hook_set(
            "no pins by name",
            "target_add",
            add as *const () as usize,
            &REAL_ADD,
        );
        let before = cuhook::hooks::diagnostics();
        let installed = cuhook::hooks::install(&set).unwrap();
        let patched: std::collections::HashSet<String> = cuhook::hooks::patched_slots()
            .into_iter()
            .map(|s| s.object)
            .collect();
        assert!(patched.len() >= 80, "{} objects patched", patched.len());
        let n = CALLS.load(Ordering::Relaxed);
        for call in &calls {
            call(1, 2);
        }
        assert_eq!(
            CALLS.load(Ordering::Relaxed),
            n + 80,
            "every library hooked"
        );
        let installed_diag = cuhook::hooks::diagnostics();
        assert_eq!(
            installed_diag.pinned_by_name, before.pinned_by_name,
            "install: {installed_diag}"
        );

        let report = installed.uninstall().unwrap();
        assert!(report.restored >= 80, "{report:?}");
        assert_eq!((report.gone, report.failed), (0, 0), "{report:?}");
        assert!(report.foreign.is_empty(), "{report:?}");
        let after = cuhook::hooks::diagnostics();
        assert_eq!(
            after.pinned_by_name, before.pinned_by_name,
            "uninstall: {after}"
        );
        assert!(cuhook::hooks::patched_slots().is_empty());
        let n = CALLS.load(Ordering::Relaxed);
        for call in &calls {
            call(1, 2);
        }
        assert_eq!(CALLS.load(Ordering::Relaxed), n, "a slot still hooked");
    }
}

/// The word that tells a patch whether it must look at a `JUMP_SLOT` once more after writing
/// it (a thread inside the lazy-binding resolver could write the resolved function over the
/// hook): the third word of the PLT's GOT, where glibc puts its resolver only when it binds the
/// object lazily. A library linked `-z lazy` and opened `RTLD_LAZY` has it set, and its patched
/// `JUMP_SLOT`s are rechecked; one opened `RTLD_NOW`, or linked `-z now`, has it clear, and
/// nothing of it is rechecked. Runs in a child process of its own (the libraries must be loaded
/// here first, with these modes).
#[test]
fn the_lazy_resolver_word_tells_lazy_binding_apart() {
    use std::ffi::{c_char, c_int, c_void};
    use std::sync::atomic::AtomicUsize;

    if common::ran_in_child(
        "the_lazy_resolver_word_tells_lazy_binding_apart",
        "CUHOOK_TEST_RESOLVER_WORD",
    ) {
        return;
    }
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    let bind_now = std::env::var_os("LD_BIND_NOW").is_some_and(|v| !v.is_empty());
    let path = common::fixture_path;
    let slots_in = |lib: &str| {
        cuhook::hooks::patched_slots()
            .iter()
            .filter(|s| s.object.ends_with(lib))
            .count()
    };
    // (library, dlopen mode, bound lazily); the first two are opened through a hooked dlopen.
    let cases = [
        ("libcaller_lazy.so", libc::RTLD_LAZY, !bind_now),
        ("libmany_00.so", libc::RTLD_NOW, false),
        ("libcaller_now.so", libc::RTLD_LAZY, false),
    ];
    // SAFETY: fixture libraries built by build.rs, kept loaded; symbols looked up with their C
    // types.
    unsafe {
        let caller = libc::dlopen(path("libdlcaller.so").as_ptr(), libc::RTLD_NOW);
        assert!(!caller.is_null());
        let open: Open = std::mem::transmute(libc::dlsym(caller, c"dlcaller_open".as_ptr()));
        let set = common::one_hook_set(
            "resolver word",
            "target_add",
            add as *const () as usize,
            &REAL_ADD,
        );
        let installed = cuhook::hooks::install(&set).unwrap();
        for &(lib, mode, lazy) in &cases[..2] {
            let before = cuhook::hooks::diagnostics().rechecked_slots;
            assert!(!open(path(lib).as_ptr(), mode).is_null(), "{lib}");
            assert!(slots_in(lib) > 0, "{lib} not patched");
            let after = cuhook::hooks::diagnostics().rechecked_slots;
            assert_eq!(after > before, lazy, "{lib}: rechecked {before} -> {after}");
        }
        installed.uninstall().unwrap();
        let h = libc::dlopen(path(cases[2].0).as_ptr(), cases[2].1);
        assert!(!h.is_null(), "{}", cases[2].0);
    }
    for (lib, _, lazy) in cases {
        let object = cuhook::elf::snapshot()
            .objects
            .into_iter()
            .find(|o| o.name.ends_with(lib))
            .expect("listed");
        let index = cuhook::elf::ObjectIndex::build(object, None).unwrap();
        let word = index
            .lazy_resolver_word()
            .expect("a PLT GOT inside the object");
        // SAFETY: an aligned word inside the object's writable loaded segment (the index
        // checked it); the object stays loaded (its handle is never closed).
        let value = unsafe { std::ptr::read_volatile(word as *const usize) };
        assert_eq!(value != 0, lazy, "{lib}: resolver word {value:#x}");
    }
}

/// A journal entry can outlive what it describes: an object unmapped or replaced at the same
/// address and path without the engine seeing it. Uninstall then finds the slot's page not
/// readable, and must leave it alone and say so, not read it (before the fix it read every slot
/// before asking about its page: a SIGSEGV here). Simulated by taking all access away from a
/// patched library's GOT page. Runs in a child process of its own.
#[test]
fn uninstall_leaves_a_slot_on_an_unreadable_page_alone() {
    use std::sync::atomic::AtomicUsize;

    if common::ran_in_child(
        "uninstall_leaves_a_slot_on_an_unreadable_page_alone",
        "CUHOOK_TEST_STALE_SLOT",
    ) {
        return;
    }
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    let lib = "libmany_04.so";
    let path = common::fixture_path(lib);
    // SAFETY: a fixture library built by build.rs, kept loaded.
    assert!(!unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) }.is_null());
    let set = common::one_hook_set(
        "stale slot",
        "target_add",
        add as *const () as usize,
        &REAL_ADD,
    );
    let installed = cuhook::hooks::install(&set).unwrap();
    let slots: Vec<usize> = cuhook::hooks::patched_slots()
        .into_iter()
        .filter(|s| s.object.ends_with(lib))
        .map(|s| s.address)
        .collect();
    assert!(!slots.is_empty(), "{lib} not patched");
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let page = slots[0] & !(page_size - 1);
    let on_page = slots
        .iter()
        .filter(|&&a| a & !(page_size - 1) == page)
        .count();
    // SAFETY: the library's own GOT page; nothing runs the library's code until access is
    // given back below.
    assert_eq!(
        unsafe { libc::mprotect(page as *mut _, page_size, libc::PROT_NONE) },
        0
    );
    let report = installed.uninstall().unwrap();
    // SAFETY: as above; read and write is what a lazily bound GOT page has.
    assert_eq!(
        unsafe {
            libc::mprotect(
                page as *mut _,
                page_size,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        },
        0
    );
    assert_eq!(report.failed, on_page, "{report:?}");
    let diag = cuhook::hooks::diagnostics();
    assert!(
        diag.unreadable
            .iter()
            .any(|t| t.contains("not readable now")),
        "{diag}"
    );
}

/// A whole sync recognises the objects it knows inside its walk of the loader's list, by load
/// bias and the name's bytes (`elf::listing_unknown`), while a known object keeps its name as
/// text (a path that is not UTF-8 converted lossily). Such an object must still be recognised:
/// taken for a new one, it would be indexed again on every sync. Here a library whose directory
/// name is not UTF-8 stays known across whole syncs (each `dlopen` of a library with a new
/// dependency takes one, the group path being off): only the two new objects of each round are
/// indexed, and its slots are not duplicated. In a child process of its own, twice: with the
/// kernel's `PROCMAP_QUERY`, and reading `/proc/self/maps` as text as on kernels before 6.11
/// (and under qemu). That text holds the path's bytes, and taken for UTF-8 it failed every
/// protection query from then on: nothing loaded after such a library was patched (found by
/// this test under qemu).
#[test]
fn whole_syncs_recognise_a_library_whose_path_is_not_utf8() {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::AtomicUsize;

    const NAME: &str = "whole_syncs_recognise_a_library_whose_path_is_not_utf8";
    if std::env::var_os("CUHOOK_TEST_NON_UTF8_PATH").is_none() {
        common::rerun_in_child(NAME, "CUHOOK_TEST_NON_UTF8_PATH", "1");
        common::rerun_in_child_with(
            NAME,
            &[
                ("CUHOOK_TEST_NON_UTF8_PATH", "1"),
                ("CUHOOK_NO_PROCMAP_QUERY", "1"),
            ],
        );
        return;
    }
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    type Close = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Call = unsafe extern "C" fn(c_int, c_int) -> c_int;

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let mut name = format!("cuhook-test-{}-", std::process::id()).into_bytes();
    name.extend_from_slice(b"lib\xff\xfe");
    let dir = Dir(std::env::temp_dir().join(std::ffi::OsStr::from_bytes(&name)));
    std::fs::create_dir_all(&dir.0).unwrap();
    let odd = dir.0.join("libplugin.so");
    std::fs::copy(common::fixtures_dir().join("libplugin.so"), &odd).unwrap();
    assert!(odd.to_str().is_none(), "the path must not be UTF-8");
    let odd = CString::new(odd.as_os_str().as_bytes()).unwrap();

    // SAFETY: fixture libraries built by build.rs; symbols looked up with their C types.
    unsafe {
        let target = common::fixture_path("libtarget.so");
        assert!(!libc::dlopen(target.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL).is_null());
        let caller = common::fixture_path("libdlcaller.so");
        let caller = libc::dlopen(caller.as_ptr(), libc::RTLD_NOW);
        assert!(!caller.is_null());
        let open: Open = std::mem::transmute(libc::dlsym(caller, c"dlcaller_open".as_ptr()));
        let close: Close = std::mem::transmute(libc::dlsym(caller, c"dlcaller_close".as_ptr()));
        let set = common::one_hook_set("odd", "target_add", add as *const () as usize, &REAL_ADD);
        // The whole sync is what this test is about: the group path would handle the
        // dependency's `dlopen` without one.
        cuhook::hooks::set_group_dlopen(false);
        let installed = cuhook::hooks::install(&set).unwrap();
        let odd_slots = || {
            cuhook::hooks::patched_slots()
                .iter()
                .filter(|s| s.object.contains('\u{FFFD}'))
                .count()
        };

        let h = open(odd.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null());
        let call: Call = std::mem::transmute(libc::dlsym(h, c"plugin_call".as_ptr()));
        assert_hooked_call(call, (2, 3), 5, &CALLS, "odd library not hooked");
        let slots = odd_slots();
        assert!(slots > 0, "odd library not patched");

        let before = cuhook::hooks::diagnostics();
        let dep = common::fixture_path("libplugin_dep.so");
        for round in 0..3 {
            let g = open(dep.as_ptr(), libc::RTLD_NOW);
            assert!(!g.is_null(), "round {round}");
            assert_eq!(close(g), 0);
        }
        let after = cuhook::hooks::diagnostics();
        assert!(
            after.rescans >= before.rescans + 3,
            "no whole syncs: {after}"
        );
        assert_eq!(
            after.objects_indexed,
            before.objects_indexed + 3 * 2,
            "the odd library was taken for a new one: {after}"
        );
        assert_eq!(
            odd_slots(),
            slots,
            "the odd library's slots were duplicated"
        );
        assert_hooked_call(
            call,
            (1, 1),
            2,
            &CALLS,
            "odd library unhooked after the syncs",
        );
        assert_eq!(close(h), 0);
        installed.uninstall().unwrap();
    }
}

/// `dlsym(RTLD_DEFAULT)` from a dependency that nobody opened by name answers as the loader
/// does, with the interposers in place and the object never pinned by name (an install into
/// many objects reads them inside walks): a symbol that exists nowhere is not found, one of its
/// load group is. Before: a miss in the global scope was retried with the caller's bare link
/// map as the handle, which glibc gives no dependency list unless it was opened itself, and
/// `dlsym` on it faulted inside the loader (PyTorch's `torch.cuda.synchronize()` crashed so on
/// the H200 when new objects were read without pins). Runs in a child process of its own.
#[test]
fn rtld_default_from_a_dependency_answers_as_the_loader() {
    use std::ffi::{c_char, c_void, CString};
    use std::sync::atomic::AtomicUsize;

    if common::ran_in_child(
        "rtld_default_from_a_dependency_answers_as_the_loader",
        "CUHOOK_TEST_DEFAULT_SCOPE",
    ) {
        return;
    }
    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    type Lookup = unsafe extern "C" fn(*const c_char) -> *mut c_void;
    // The symbols asked for: nowhere, in the dependency's own dependency, in the library that
    // loaded it (in its group's scope, not in the dependency's own list), and a global one.
    let names = [
        "cuhook_test_defined_nowhere",
        "scope_leaf_fn",
        "scope_top_only",
        "target_add",
    ];
    let names: Vec<CString> = names.iter().map(|n| CString::new(*n).unwrap()).collect();
    // SAFETY: fixture libraries built by build.rs, kept loaded; symbols looked up with their C
    // types.
    unsafe {
        open_many_plugins();
        let top = common::fixture_path("libscope_top.so");
        let top = libc::dlopen(top.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!top.is_null());
        let lookup: Lookup = std::mem::transmute(libc::dlsym(top, c"scope_top_lookup".as_ptr()));
        let plain: Vec<usize> = names.iter().map(|n| lookup(n.as_ptr()) as usize).collect();
        assert_eq!(plain[0], 0);
        assert!(plain[1..].iter().all(|&a| a != 0), "{plain:x?}");

        let set = common::one_hook_set(
            "default scope",
            "target_add",
            add as *const () as usize,
            &REAL_ADD,
        );
        let before = cuhook::hooks::diagnostics();
        let installed = cuhook::hooks::install(&set).unwrap();
        assert_eq!(
            cuhook::hooks::diagnostics().pinned_by_name,
            before.pinned_by_name,
            "the dependency must not have been opened by name for this test"
        );
        let hooked: Vec<usize> = names
            .iter()
            .map(|n| {
                let found = lookup(n.as_ptr()) as usize;
                (found, libc::dlerror().is_null())
            })
            .map(|(found, no_error)| {
                assert_eq!(
                    found == 0,
                    !no_error,
                    "dlerror must tell a miss, and only a miss"
                );
                found
            })
            .collect();
        assert_eq!(hooked[0], 0, "found a symbol defined nowhere");
        assert_eq!(hooked[1], plain[1], "its own dependency's symbol");
        assert_eq!(
            hooked[3], add as *const () as usize,
            "a hooked original is its hook"
        );
        // Entered as the caller (x86_64, no shadow stack), the loader searches the caller's own
        // scope; elsewhere the dependency's own list stands in for it, which lacks the library
        // above it.
        if cfg!(target_arch = "x86_64") {
            assert_eq!(hooked[2], plain[2], "its load group's symbol");
        }
        installed.uninstall().unwrap();
    }
}
