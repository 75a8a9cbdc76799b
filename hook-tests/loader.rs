//! The loader interposers (dlopen, dlmopen, dlclose, dlsym, dlvsym) on the fixture app
//! `app_dl`, one process per scenario.

mod common;

use common::run_fixture;

macro_rules! loader_tests {
    ($($test:ident: $scenario:literal => [$($check:literal),*];)*) => {
        $(
            #[test]
            fn $test() {
                run_fixture("app_dl", &[$scenario], &[]).assert_passed(&[$($check),*]);
            }
        )*
    };
}

loader_tests! {
    plugins_loaded_after_install_are_patched: "plugins" => ["plugin_opened", "plugin_hooked", "dependency_hooked",
        "through_dependency_hooked", "constructor_opened_second", "opened_by_constructor_hooked",
        "late_constructors_reported", "plugin_after_uninstall", "second_after_uninstall", "no_slots_after_uninstall"];
    bare_names_use_the_callers_runpath: "runpath" => ["plain_dlopen_uses_runpath", "dlerror_clear_after_success",
        "same_file_opened", "sub_library_works", "missing_gives_null", "missing_same_dlerror", "dlerror_consumed",
        "dlopen_null_is_main", "loaded_soname_wins"];
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
}
