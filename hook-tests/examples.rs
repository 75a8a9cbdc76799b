//! The examples of `examples/` run on the fake driver: the registration cache in C (built
//! against the installed C library with pkg-config) and in Rust (`cargo test` builds the
//! examples), cudarc's safe API with cuhook embedded, and the leak hunt on a Python program
//! under `cuhook run`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> common::Run {
    let out = cmd.output().expect("run the example");
    common::Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const CACHE_CHECKS: [&str; 7] = [
    "first_send_registers",
    "same_allocation_reuses_registration",
    "free_invalidates_before_release",
    "new_allocation_gets_new_registration",
    "host_memory_is_not_registered",
    "range_past_the_end_is_not_registered",
    "every_registration_dropped",
];

#[test]
fn c_registration_cache() {
    let fixtures = common::fixtures_dir();
    let lib = common::installed_c_prefix().join("lib");
    let dir = common::scratch("example-regcache-c");
    let exe = dir.join("regcache");
    let status = cuhook_fixtures::cc()
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("examples/regcache/regcache.c"))
        .args(common::pkg_config_cuhook())
        // <cuda.h> of the fake driver.
        .arg("-I")
        .arg(root().join("fixtures/examples"))
        .arg("-I")
        .arg(root().join("fixtures/cuda"))
        .arg(format!("-L{}", fixtures.display()))
        .args(["-l:libcuda.so.1", "-lpthread"])
        .arg(format!(
            "-Wl,-rpath,{}:{}",
            lib.display(),
            fixtures.display()
        ))
        .status()
        .expect("run the C compiler");
    assert!(
        status.success(),
        "compiling examples/regcache/regcache.c failed"
    );
    let r = run(Command::new(&exe).env_remove("CUHOOK_DISABLE"));
    r.assert_passed(&CACHE_CHECKS);
    assert!(
        r.stdout.contains("hits 1 misses 3 invalidations 3"),
        "{}",
        r.stdout
    );
}

/// `target/<profile>/examples/NAME`, which `cargo test` builds beside the test executables.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} missing: `cargo test --release` builds the examples (or `cargo build --release --examples`)",
        path.display()
    );
    path
}

#[test]
fn rust_registration_cache() {
    let r = run(Command::new(example("regcache"))
        .env("LD_LIBRARY_PATH", common::fixtures_dir())
        .env_remove("CUHOOK_DISABLE"));
    r.assert_passed(&CACHE_CHECKS);
    assert!(
        r.stdout.contains("hits 1 misses 3 invalidations 3"),
        "{}",
        r.stdout
    );
}

/// cudarc's safe API (context, stream, `alloc_zeros`, `clone_htod`, `clone_dtoh`, drops) on the
/// fake driver, with cuhook embedded in the same executable: cudarc dlopens `libcuda.so.1` and
/// dlsyms each entry point from this object, so the registry sees its buffers only when the
/// object that embeds cuhook is patched too.
#[test]
fn rust_cudarc_example() {
    let r = run(Command::new(example("cudarc"))
        .env("LD_LIBRARY_PATH", common::fixtures_dir())
        .env_remove("CUHOOK_DISABLE"));
    let mut required: Vec<String> = (0..8).map(|i| format!("buffer_{i}_registered")).collect();
    required.extend(
        [
            "htod_bytes_read_back",
            "zeroed_bytes_read_back",
            "every_buffer_left_the_registry",
            "eight_alloc_events",
            "eight_free_events",
        ]
        .map(String::from),
    );
    r.assert_passed(&required.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        r.stdout.contains("cudarc example: 13 passed, 0 failed"),
        "{}",
        r.stdout
    );
}

/// The same program under `cuhook run` (libcuhook.so preloaded): one engine. The program's
/// install, subscription and lookups go to the preloaded copy (before, its lookups asked its own
/// empty registry and found none of the 8 buffers), the report counts cudarc's calls, and it
/// raises no false alarm about a static CUDA runtime (cudarc names every driver function,
/// `cuGetProcAddress_v2` included, but links no runtime).
#[test]
fn rust_cudarc_example_under_cuhook_run() {
    let dir = common::scratch("example-cudarc-run");
    let r = run(common::cuhook_command()
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", common::fixtures_dir())
        .args(["run", "--report", "r.txt", "--"])
        .arg(example("cudarc")));
    assert!(
        r.status.success() && r.stdout.contains("cudarc example: 13 passed, 0 failed"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let report = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    let row = |api: &str| {
        report
            .lines()
            .find(|l| l.split_whitespace().next() == Some(api))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
    };
    assert_eq!(
        row("cuMemAllocAsync").as_deref(),
        Some("8 5517236 0 0"),
        "{report}"
    );
    assert_eq!(
        row("cuMemFreeAsync").as_deref(),
        Some("0 0 8 5517236"),
        "{report}"
    );
    assert!(!report.contains("static CUDA runtime"), "{report}");
}

/// `cuhook run --report --trace -- python3 leaky.py ARGS`: the report and the trace.
fn leak_hunt(dir: &Path, args: &[&str]) -> (String, String) {
    common::output_ok(
        common::cuhook_command()
            .current_dir(dir)
            .env("CUDART", common::fixtures_dir().join("libcudart.so.13"))
            .args([
                "run", "--report", "r.txt", "--trace", "t.jsonl", "--", "python3",
            ])
            .arg(root().join("examples/leak-hunt/leaky.py"))
            .args(args),
    );
    let report = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    let trace = std::fs::read_to_string(dir.join("t.jsonl")).unwrap();
    (report, trace)
}

#[test]
fn python_leak_hunt_finds_one_buffer_per_step() {
    if cuhook_fixtures::skip_when_cross(
        "the machine's python3 cannot load the cross-built fake libcudart.so.13 nor libcuhook.so",
    ) {
        return;
    }
    let dir = common::scratch("example-leak");
    let (report, trace) = leak_hunt(&dir, &["--steps", "20"]);
    assert!(
        report.contains("Live allocations at exit: 20 (5.0 MiB)"),
        "{report}"
    );
    let leaked: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("256.0 KiB cuda") && l.ends_with("cudaMalloc"))
        .collect();
    assert_eq!(leaked.len(), 20, "{report}");
    assert_eq!(
        trace.lines().count(),
        20 * 5,
        "3 allocations and 2 frees per step"
    );
    // The trace opens in the viewer.
    common::output_ok(common::cuhook_command().current_dir(&dir).args([
        "view",
        "-o",
        "leak.html",
        "t.jsonl",
    ]));
    let html = std::fs::read_to_string(dir.join("leak.html")).unwrap();
    assert!(html.contains("Live allocations at exit: 20 (5.0 MiB)"));

    let (fixed, _) = leak_hunt(&dir, &["--steps", "20", "--fixed"]);
    assert!(
        fixed.contains("Live allocations at exit: 0 (0 B)"),
        "{fixed}"
    );
}

/// `scripts/run-example.sh NAME ARGS`, the one command each example's documentation gives for
/// a machine without a GPU, on this build (`CUHOOK_PREBUILT`: no cargo inside the test), its
/// files in `out`.
fn run_example_script(name: &str, args: &[&str], out: &Path) -> common::Run {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    run(Command::new("sh")
        .arg(root().join("scripts/run-example.sh"))
        .arg(name)
        .args(args)
        .env("CUHOOK_PREBUILT", profile)
        .env("CUHOOK_EXAMPLE_OUT", out)
        .env("CC", cuhook_fixtures::CC)
        .env_remove("CUHOOK_DISABLE")
        .env_remove("CUHOOK_LIB")
        .env_remove("LD_PRELOAD"))
}

/// Each example runs with the one command its documentation gives (before: regcache.c failed
/// with "cuda.h: No such file", the Rust example with "cannot load libcudart.so.13", the leak
/// hunt needed `CUDART=`).
#[test]
fn every_example_runs_with_the_one_command_its_doc_gives() {
    if cuhook_fixtures::skip_when_cross(
        "the script builds the fake driver for this machine and runs python3",
    ) {
        return;
    }
    for file in [
        "examples/regcache/regcache.c",
        "examples/regcache.rs",
        "examples/cudarc.rs",
        "examples/leak-hunt/README.md",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        assert!(
            text.contains("scripts/run-example.sh "),
            "{file} does not give the command"
        );
    }
    let out = common::scratch("example-script");
    for (name, dir) in [("regcache-c", "c"), ("regcache", "rust")] {
        let r = run_example_script(name, &[], &out.join(dir));
        r.assert_passed(&CACHE_CHECKS);
        assert!(
            r.stdout.contains("hits 1 misses 3 invalidations 3"),
            "{name}: {}",
            r.stdout
        );
    }
    let r = run_example_script("cudarc", &[], &out.join("cudarc"));
    assert!(
        r.status.success() && r.stdout.contains("cudarc example: 13 passed, 0 failed"),
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let leak = out.join("leak");
    let r = run_example_script("leak-hunt", &["--steps", "4"], &leak);
    assert!(r.status.success(), "{}\n{}", r.stdout, r.stderr);
    let report = std::fs::read_to_string(leak.join("leak.txt")).unwrap();
    assert!(
        report.contains("Live allocations at exit: 4 (1.0 MiB)"),
        "{report}"
    );
    let page = std::fs::read_to_string(leak.join("leak.html")).unwrap();
    assert!(page.contains("Live allocations at exit: 4 (1.0 MiB)"));
}
