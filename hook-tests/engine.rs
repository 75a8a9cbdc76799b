//! The GOT patch engine on the fixture matrix: every link mode × every scenario, each in its
//! own process (GOT state is process-wide).

mod common;

use common::run_fixture;

/// The link modes of the fixture apps.
const MODES: [&str; 4] = ["app_lazy", "app_now", "app_noplt", "app_nopie"];

/// The call paths every `paths` run checks in each phase.
const PATHS: [&str; 11] = [
    "direct_add",
    "direct_mul",
    "app_taken",
    "app_table",
    "caller_add",
    "caller_mul",
    "caller_taken",
    "caller_table",
    "versioned_default",
    "versioned_old",
    "libc_getpid",
];

fn required(phases: &[&str]) -> Vec<String> {
    phases
        .iter()
        .flat_map(|p| PATHS.iter().map(move |c| format!("{p}.{c}")))
        .collect()
}

/// (kind, symbol, object) of every slot the app printed.
fn slots(run: &common::Run) -> Vec<(String, String, String)> {
    run.lines_with("slot")
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].to_owned(),
                f[1].to_owned(),
                f[2..f.len() - 1].join(" "),
            )
        })
        .collect()
}

fn has_slot(s: &[(String, String, String)], kind: &str, symbol: &str, object: &str) -> bool {
    s.iter()
        .any(|(k, sym, o)| k == kind && sym == symbol && o.contains(object))
}

fn check_paths(app: &str) -> Vec<(String, String, String)> {
    let run = run_fixture(app, &["paths"], &[]);
    let req = required(&["before", "installed", "after"]);
    let mut names: Vec<&str> = req.iter().map(String::as_str).collect();
    names.extend([
        "orig_add_in_target",
        "orig_mul_in_target",
        "orig_ver_is_v2",
        "orig_pid_in_libc",
    ]);
    run.assert_passed(&names);
    slots(&run)
}

#[test]
fn paths_lazy_binding() {
    let s = check_paths("app_lazy");
    assert!(
        has_slot(&s, "JUMP_SLOT", "target_add", "<main program>"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "JUMP_SLOT", "target_mul", "libcaller_lazy"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "GLOB_DAT", "target_mul", "libcaller_lazy"),
        "address taken: JUMP_SLOT + GLOB_DAT: {s:?}"
    );
    assert!(
        has_slot(&s, "ABS64", "target_add", "libcaller_lazy"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "ABS64", "target_add", "<main program>"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "JUMP_SLOT", "target_mul", "<main program>"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "GLOB_DAT", "target_mul", "<main program>"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "JUMP_SLOT", "getpid", "<main program>"),
        "{s:?}"
    );
}

#[test]
fn paths_full_relro() {
    let s = check_paths("app_now");
    assert!(
        has_slot(&s, "JUMP_SLOT", "target_add", "libcaller_now"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "GLOB_DAT", "target_mul", "<main program>"),
        "{s:?}"
    );
    let run = run_fixture("app_now", &["paths"], &[]);
    let prot: Vec<String> = run
        .lines_with("slot")
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
        .collect();
    assert!(
        !prot.is_empty() && prot.iter().all(|p| p == "r--"),
        "full RELRO pages must be read-only: {prot:?}"
    );
}

#[test]
fn paths_no_plt() {
    let s = check_paths("app_noplt");
    assert!(
        s.iter().all(|(k, _, _)| k != "JUMP_SLOT"),
        "-fno-plt objects have no JUMP_SLOT: {s:?}"
    );
    assert!(
        has_slot(&s, "GLOB_DAT", "target_add", "<main program>"),
        "{s:?}"
    );
    assert!(
        has_slot(&s, "GLOB_DAT", "target_add", "libcaller_noplt"),
        "{s:?}"
    );
}

#[test]
fn paths_non_pie() {
    let s = check_paths("app_nopie");
    // A non-PIE executable takes addresses through canonical PLT entries: no GLOB_DAT, and the
    // originals must still be the definitions in libtarget (checked by orig_*_in_target).
    assert!(
        has_slot(&s, "JUMP_SLOT", "target_mul", "<main program>"),
        "{s:?}"
    );
    assert!(
        !s.iter()
            .any(|(k, _, o)| k == "GLOB_DAT" && o == "<main program>"),
        "{s:?}"
    );
}

macro_rules! scenario_tests {
    ($($test:ident: $scenario:literal => [$($check:literal),*];)*) => {
        $(
            #[test]
            fn $test() {
                for app in MODES {
                    let run = run_fixture(app, &[$scenario], &[]);
                    run.assert_passed(&[$($check),*]);
                }
            }
        )*
    };
}

scenario_tests! {
    lazy_binding_keeps_hook: "lazy" => ["lazy_results", "lazy_all_hooked", "lazy_orig_is_definition", "lazy_slots_still_hooked", "lazy_after"];
    uninstall_restores_bits_and_protection: "restore" => ["no_wx_before", "slot_holds_hook", "prot_same_during", "no_wx_during",
        "restored_count", "slot_restored_bit_for_bit", "prot_same_after", "no_wx_after", "no_slots_left", "after.direct_add"];
    threads_call_while_installing: "threads" => ["threads_api_errors", "threads_results", "threads_hook_seen", "after.caller_add"];
    exclude_list_holds: "exclude" => ["set_exclude", "excluded_not_patched", "excluded.caller_add", "excluded.direct_add"];
    own_object_never_patched: "selfskip" => ["self_not_patched", "app_patched", "self.app_getauxval"];
    unimported_symbol_installs_with_zero_slots: "unknown" => ["unknown_installs", "unknown_zero_slots", "unknown_nothing_restored"];
    install_twice_and_reinstall: "twice" => ["twice_same_id", "twice_no_new_slots", "one_ref_left.direct_add",
        "all_refs_dropped.direct_add", "third_uninstall_refused", "reinstalled.caller_table", "final.caller_table"];
    foreign_repatch_left_alone: "foreign" => ["foreign_victim_found", "foreign_reported", "foreign_left_alone"];
    versioned_import_hooked_by_version: "versions" => ["v1.old_hooked", "v1.default_untouched", "orig_is_v1", "v1_after.old"];
}
