//! The GOT patch engine on the fixture matrix: every link mode × every scenario, each in its
//! own process (GOT state is process-wide).

#[macro_use]
mod common;

use common::run_fixture;

/// The link modes of the fixture apps.
const MODES: [&str; 4] = ["app_lazy", "app_now", "app_noplt", "app_nopie"];

/// [`MODES`], and on aarch64 the app and libraries built with BTI + PAC (BTI-marked: guarded
/// pages, hook-tests/bti.rs proves it), so every scenario also runs under branch protection.
fn modes() -> Vec<&'static str> {
    let mut m = MODES.to_vec();
    if cfg!(target_arch = "aarch64") {
        m.push("bti/app_bti");
    }
    m
}

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
    // On aarch64 both GNU linkers give an imported function that a data table points at
    // (R_AARCH64_ABS64) a PLT entry and JUMP_SLOT that no code calls; x86-64 linkers do not.
    if cfg!(target_arch = "x86_64") {
        assert!(
            s.iter().all(|(k, _, _)| k != "JUMP_SLOT"),
            "-fno-plt objects have no JUMP_SLOT: {s:?}"
        );
    }
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

/// The page size the engine's protection changes round with (`region`'s) is the system's. CI's
/// 64 KiB run says which it must be (`CUHOOK_EXPECT_PAGE_SIZE`), so the engine tests of that run
/// cannot pass on 4 KiB pages unnoticed.
#[test]
fn page_size_is_the_systems() {
    // SAFETY: sysconf has no preconditions.
    let system = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    assert_eq!(region::page::size(), system);
    if let Ok(want) = std::env::var("CUHOOK_EXPECT_PAGE_SIZE") {
        assert_eq!(
            system.to_string(),
            want,
            "not the page size this run is for"
        );
    }
}

/// Branch protection (aarch64): the lazy-binding matrix's slots, in BTI-guarded code.
#[cfg(target_arch = "aarch64")]
#[test]
fn paths_branch_protected() {
    let s = check_paths("bti/app_bti");
    for (kind, symbol, object) in [
        ("JUMP_SLOT", "target_add", "<main program>"),
        ("JUMP_SLOT", "target_add", "libcaller_bti"),
        ("GLOB_DAT", "target_mul", "libcaller_bti"),
        ("ABS64", "target_add", "libcaller_bti"),
        ("JUMP_SLOT", "getpid", "<main program>"),
    ] {
        assert!(
            has_slot(&s, kind, symbol, object),
            "{kind} {symbol} {object}: {s:?}"
        );
    }
}

macro_rules! scenario_tests {
    ($($test:ident: $scenario:literal => [$($check:literal),*];)*) => {
        $(
            #[test]
            fn $test() {
                for app in modes() {
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

/// The protection a program gave a GOT page itself is what the engine sees and restores: here
/// the program made the (normally writable) lazy-binding GOT page of a library read-only
/// before install. Rules derived from the object's program headers would call that page
/// writable and fault on the write. Runs in this process; the `_text` twin re-runs it with
/// the `/proc/self/maps` text fallback.
#[test]
fn page_protected_by_the_program_is_seen_and_kept() {
    use std::ffi::{c_int, CString};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static REAL_ADD: AtomicUsize = AtomicUsize::new(0);
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    counting_hook!(add, REAL_ADD, CALLS);
    /// `rwx` letters of the mapping holding `addr`, from the kernel's text.
    fn maps_protection(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let range = f.next().unwrap();
            let perms = f.next().unwrap();
            let (lo, hi) = range.split_once('-').unwrap();
            let lo = usize::from_str_radix(lo, 16).unwrap();
            let hi = usize::from_str_radix(hi, 16).unwrap();
            if addr >= lo && addr < hi {
                return perms[..3].to_owned();
            }
        }
        panic!("{addr:#x} not mapped");
    }

    let lib = common::fixtures_dir().join("libcaller_lazy.so");
    let lib = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a fixture library; its GOT page is made read-only and back with mprotect, and the
    // slot found by the engine's own index is read with an atomic load.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        assert!(!h.is_null());
        let obj = cuhook::elf::snapshot()
            .objects
            .into_iter()
            .find(|o| o.name.ends_with("libcaller_lazy.so"))
            .unwrap();
        let index = cuhook::elf::ObjectIndex::build(obj, None).unwrap();
        let slot = index
            .slots("target_add", None)
            .find(|s| s.kind == cuhook::elf::RelocKind::JumpSlot)
            .expect("a JUMP_SLOT for target_add");
        let page_size = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let page = slot.address & !(page_size - 1);
        assert_eq!(
            maps_protection(slot.address),
            "rw-",
            "lazy GOT starts writable"
        );
        assert_eq!(
            libc::mprotect(page as *mut _, page_size, libc::PROT_READ),
            0
        );
        let read = |a: usize| {
            std::sync::atomic::AtomicUsize::from_ptr(a as *mut usize).load(Ordering::Acquire)
        };
        let before = read(slot.address);

        let set = common::one_hook_set(
            "protection",
            "target_add",
            add as *const () as usize,
            &REAL_ADD,
        );
        let installed = cuhook::hooks::install(&set).unwrap();
        assert_eq!(
            read(slot.address),
            add as *const () as usize,
            "slot patched"
        );
        let patched = cuhook::hooks::patched_slots();
        let entry = patched.iter().find(|p| p.address == slot.address).unwrap();
        assert_eq!(entry.protection, "r--", "journaled protection");
        assert_eq!(
            maps_protection(slot.address),
            "r--",
            "protection kept while installed"
        );
        let call: extern "C" fn(c_int, c_int) -> c_int =
            std::mem::transmute(libc::dlsym(h, c"caller_add".as_ptr()));
        assert_eq!(call(2, 3), 5);
        assert!(CALLS.load(Ordering::Relaxed) >= 1, "hook reached");

        let report = installed.uninstall().unwrap();
        assert!(report.restored >= 1 && report.failed == 0, "{report:?}");
        assert_eq!(read(slot.address), before, "slot restored bit for bit");
        assert_eq!(
            maps_protection(slot.address),
            "r--",
            "protection restored exactly"
        );
        assert_eq!(
            libc::mprotect(
                page as *mut _,
                page_size,
                libc::PROT_READ | libc::PROT_WRITE
            ),
            0
        );
    }
}

/// The same, with `PROCMAP_QUERY` turned off (older kernels): protections come from the
/// `/proc/self/maps` text.
#[test]
fn page_protected_by_the_program_is_seen_and_kept_text() {
    if std::env::var_os("CUHOOK_NO_PROCMAP_QUERY").is_some() {
        return; // this is the re-run itself
    }
    common::rerun_in_child(
        "page_protected_by_the_program_is_seen_and_kept",
        "CUHOOK_NO_PROCMAP_QUERY",
        "1",
    );
}
