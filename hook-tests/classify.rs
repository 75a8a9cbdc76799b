//! Pointer classification against the fake driver, in a separate process: memory of every kind
//! allocated before `cuhook_install()`, classified from a thread with no current context
//! (fixtures/classify/app_classify.c).

mod common;

use common::{run_fixture, Run};

/// The warning cuhook writes when devices differ in memory-pool support.
const MIXED_WARNING: &str = "cuhook: CUDA devices differ in memory-pool support";

fn warnings(run: &Run) -> usize {
    run.stderr.matches(MIXED_WARNING).count()
}

const EVERY_KIND: &[&str] = &[
    "setup",
    "install",
    "thread_has_no_context",
    "device",
    "device_context",
    "managed",
    "managed_context",
    "pool",
    "pool_handle",
    "vmm",
    "vmm_no_context",
    "pinned_host",
    "pageable_heap",
    "pageable_stack",
    "null",
    "primary_context_current",
    "primary_retained_once",
    "vmm_again",
    "pool_again",
    "no_second_retain",
    "vmm_probe_handles_released",
    "null_info",
    "registry",
    "freed",
];

#[test]
fn every_kind_of_memory_allocated_before_install() {
    let run = run_fixture("app_classify", &[], &[]);
    run.assert_passed(EVERY_KIND);
    assert_eq!(warnings(&run), 0, "{}", run.stderr);
}

#[test]
fn no_device_means_host_without_driver_queries() {
    let run = run_fixture("app_classify", &[], &[("FAKECUDA_DEVICES", "0")]);
    run.assert_passed(&[
        "setup",
        "install",
        "no_device_heap",
        "no_device_stack",
        "no_device_unmapped",
        "no_device_bails_out",
        "null_info",
    ]);
}

#[test]
fn mixed_pool_support_warns_once_and_still_finds_pools() {
    let run = run_fixture(
        "app_classify",
        &[],
        &[("FAKECUDA_DEVICES", "2"), ("FAKECUDA_POOLS", "1,0")],
    );
    let mut required = EVERY_KIND.to_vec();
    required.push("device1");
    run.assert_passed(&required);
    assert_eq!(warnings(&run), 1, "one warning line:\n{}", run.stderr);
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains(MIXED_WARNING))
        .unwrap();
    assert!(
        line.contains("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED"),
        "{line}"
    );
}

#[test]
fn homogeneous_devices_do_not_warn() {
    let run = run_fixture(
        "app_classify",
        &[],
        &[("FAKECUDA_DEVICES", "2"), ("FAKECUDA_POOLS", "1,1")],
    );
    run.assert_passed(&["pool", "device1", "primary_retained_once"]);
    assert_eq!(warnings(&run), 0, "{}", run.stderr);
}
