//! The C library as C consumers take it in: `scripts/install-c.sh` lays out the versioned shared
//! object, header and pkg-config file, and a program built with nothing but
//! `pkg-config --cflags --libs cuhook` runs against it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn readelf_dynamic(file: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .expect("run readelf");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Build fixtures/install/hello.c with the flags pkg-config gives, against `pc_dir`.
fn build_hello(pc_dir: &Path, sysroot: Option<&Path>, exe: &Path) -> Vec<String> {
    let flags = common::pkg_config_flags(pc_dir, sysroot);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/install/hello.c");
    let status = cuhook_fixtures::cc()
        .arg(&src)
        .args(&flags)
        .arg("-o")
        .arg(exe)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "cc hello.c {flags:?} failed");
    flags
}

fn run_hello(exe: &Path, lib_dir: &Path) {
    let out = Command::new(exe)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("CUHOOK_DISABLE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("install 0 "), "{stdout}");
    assert!(stdout.contains("lookup -9 "), "{stdout}");
}

#[test]
fn the_built_library_carries_the_versioned_soname() {
    let dynamic = readelf_dynamic(&common::libcuhook());
    assert!(
        dynamic.contains("Library soname: [libcuhook.so.0]"),
        "{dynamic}"
    );
}

#[test]
fn installed_tree_has_versioned_library_header_and_pkg_config() {
    let prefix = common::installed_c_prefix();
    let lib = prefix.join("lib");
    let version = env!("CARGO_PKG_VERSION");
    assert!(lib.join(format!("libcuhook.so.{version}")).is_file());
    assert_eq!(
        std::fs::read_link(lib.join("libcuhook.so.0")).unwrap(),
        PathBuf::from(format!("libcuhook.so.{version}"))
    );
    assert_eq!(
        std::fs::read_link(lib.join("libcuhook.so")).unwrap(),
        PathBuf::from("libcuhook.so.0")
    );
    assert_eq!(
        std::fs::read(prefix.join("include/cuhook.h")).unwrap(),
        std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/cuhook.h")).unwrap()
    );
    let pc = std::fs::read_to_string(lib.join("pkgconfig/cuhook.pc")).unwrap();
    assert!(pc.contains(&format!("Version: {version}")), "{pc}");
}

#[test]
fn program_built_with_only_pkg_config_flags_runs() {
    let prefix = common::installed_c_prefix();
    let exe = prefix.join("hello");
    let flags = build_hello(&prefix.join("lib/pkgconfig"), None, &exe);
    assert!(flags.contains(&"-lcuhook".to_owned()), "{flags:?}");
    // The program records the soname, not the unversioned development link.
    assert!(readelf_dynamic(&exe).contains("Shared library: [libcuhook.so.0]"));
    run_hello(&exe, &prefix.join("lib"));
}

#[test]
fn staged_install_names_the_final_prefix() {
    let stage = std::env::temp_dir().join(format!("cuhook-stage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    common::output_ok(
        Command::new("sh")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install-c.sh"))
            .args(["--prefix", "/opt/cuhook", "--destdir"])
            .arg(&stage)
            .arg("--lib")
            .arg(common::libcuhook()),
    );
    let root = stage.join("opt/cuhook");
    let pc = std::fs::read_to_string(root.join("lib/pkgconfig/cuhook.pc")).unwrap();
    assert!(pc.contains("prefix=/opt/cuhook\n"), "{pc}");
    // Built as a packager would, through the sysroot the staged tree stands for.
    let exe = stage.join("hello");
    let flags = build_hello(&root.join("lib/pkgconfig"), Some(&stage), &exe);
    assert!(
        flags
            .iter()
            .any(|f| f.starts_with("-I") && f.contains("cuhook-stage")),
        "{flags:?}"
    );
    run_hello(&exe, &root.join("lib"));
    let _ = std::fs::remove_dir_all(&stage);
}

/// What `cargo publish` would upload: the library, CLI, header and the demo's C sources, and
/// nothing of the tests (no fixture crate, no test or bench sources, no binaries).
#[test]
fn crate_package_ships_no_test_fixtures() {
    let out = Command::new(env!("CARGO"))
        .args(["package", "--list", "--allow-dirty", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo package --list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = String::from_utf8(out.stdout).unwrap();
    for needed in [
        "src/lib.rs",
        "build.rs",
        "include/cuhook.h",
        "scripts/install-c.sh",
        "fixtures/cuda/fake_libcuda.c",
        "fixtures/demo/demo.c",
    ] {
        assert!(
            files.lines().any(|l| l == needed),
            "{needed} missing:\n{files}"
        );
    }
    for line in files.lines() {
        assert!(
            !line.starts_with("hook-tests/")
                && !line.starts_with("fixtures/build/")
                && !line.starts_with("benches/")
                && !line.starts_with(".ci/")
                && ![".so", ".a", ".o"].iter().any(|ext| line.ends_with(ext))
                && !line.contains(".so."),
            "packaged a test-only file: {line}"
        );
    }
}
