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
    let stage = common::scratch("stage");
    common::output_ok(
        Command::new("sh")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/install-c.sh"))
            .args(["--prefix", "/opt/cuhook", "--destdir"])
            .arg(&*stage)
            .arg("--lib")
            .arg(common::libcuhook())
            .arg("--bin")
            .arg(env!("CARGO_BIN_EXE_cuhook")),
    );
    let root = stage.join("opt/cuhook");
    assert!(root.join("bin/cuhook").is_file());
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
}

/// Section headers of an ELF file (`readelf -S`, which reads any machine's ELF).
fn sections(file: &Path) -> String {
    let out = common::output_ok(Command::new("readelf").arg("-SW").arg(file));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The installed library and command are stripped (before: the 19 MB build, debug info and
/// all), and still work: the library keeps its dynamic symbols and its cuhook note.
#[test]
fn installed_library_and_command_are_stripped() {
    let prefix = common::installed_c_prefix();
    let lib = prefix.join(format!("lib/libcuhook.so.{}", env!("CARGO_PKG_VERSION")));
    for file in [&lib, &prefix.join("bin/cuhook")] {
        let s = sections(file);
        assert!(
            !s.contains(".debug_info") && !s.contains(" .symtab"),
            "{}:\n{s}",
            file.display()
        );
        let size = std::fs::metadata(file).unwrap().len();
        assert!(size < 8 << 20, "{}: {size} bytes", file.display());
    }
    let built = std::fs::metadata(common::libcuhook()).unwrap().len();
    let installed = std::fs::metadata(&lib).unwrap().len();
    assert!(
        installed * 4 < built,
        "{installed} bytes installed of {built} built"
    );
    assert!(sections(&lib).contains(".dynsym"));
    // program_built_with_only_pkg_config_flags_runs and the C examples link and run it.
}

/// `--debug-info` keeps the debug information beside the stripped files, linked by
/// `.gnu_debuglink` where gdb looks for it.
#[test]
fn debug_info_is_installed_separately_when_asked() {
    let prefix = common::scratch("prefix-debug");
    common::output_ok(common::install_command(&prefix).arg("--debug-info"));
    let name = format!("libcuhook.so.{}", env!("CARGO_PKG_VERSION"));
    for (file, debug) in [
        (
            prefix.join("lib").join(&name),
            prefix.join("lib/.debug").join(format!("{name}.debug")),
        ),
        (
            prefix.join("bin/cuhook"),
            prefix.join("bin/.debug/cuhook.debug"),
        ),
    ] {
        let s = sections(&file);
        assert!(
            !s.contains(".debug_info") && s.contains(".gnu_debuglink"),
            "{s}"
        );
        assert!(
            sections(&debug).contains(".debug_info"),
            "{}",
            debug.display()
        );
        let link = common::output_ok(
            Command::new("readelf")
                .arg("--string-dump=.gnu_debuglink")
                .arg(&file),
        );
        let file_name = debug.file_name().unwrap().to_str().unwrap();
        assert!(String::from_utf8_lossy(&link.stdout).contains(file_name));
    }
}

/// The installed `cuhook` runs a program with no setting at all (before: no `cuhook` was
/// installed, and a lone binary could not find its library): it finds
/// PREFIX/lib/libcuhook.so.0. The installer said what the loader needs.
#[test]
fn the_installed_command_runs_a_program_with_no_setting() {
    let prefix = common::scratch("prefix-run");
    let out = common::output_ok(&mut common::install_command(&prefix));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("is not in the loader's search path"),
        "{said}"
    );
    assert!(
        said.contains(&format!("-Wl,-rpath,{}", prefix.join("lib").display())),
        "{said}"
    );
    assert!(
        said.contains("run finds") && said.contains("by itself"),
        "{said}"
    );
    let work = common::scratch("prefix-run-work");
    let out = Command::new(prefix.join("bin/cuhook"))
        .current_dir(&*work)
        .env_remove("CUHOOK_LIB")
        .env_remove("LD_PRELOAD")
        .env_remove("CUHOOK_DISABLE")
        .env("PATH", "/usr/bin:/bin")
        .args(["run", "--report", "r.txt", "--"])
        .arg(common::fixtures_dir().join("demo_rt_static"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(work.join("r.txt")).unwrap();
    assert!(
        report.contains("Live allocations at exit: 1 (2.0 MiB)"),
        "{report}"
    );
    let out = Command::new(prefix.join("bin/cuhook"))
        .env_remove("CUHOOK_LIB")
        .env_remove("LD_PRELOAD")
        .args(["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\""])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        prefix.join("lib/libcuhook.so.0").display().to_string()
    );
}

/// The argument parser and the JSON reader are the binary's: the library that programs preload
/// links neither (the binary does, which shows the check can see them).
#[test]
fn the_preloaded_library_links_no_command_line_crate() {
    let symbols = |file: &Path| {
        let out = common::output_ok(Command::new("readelf").arg("-sW").arg(file));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let lib = symbols(&common::libcuhook());
    let bin = symbols(Path::new(env!("CARGO_BIN_EXE_cuhook")));
    for krate in ["lexopt", "serde_json"] {
        assert!(
            bin.contains(krate),
            "{krate} not seen in the binary's symbols"
        );
        assert!(!lib.contains(krate), "libcuhook.so links {krate}");
    }
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

/// The first ```LANG block of README.md after the line `heading`.
fn readme_block(heading: &str, lang: &str) -> String {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let after = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} not in README.md"))..];
    let fence = format!("```{lang}\n");
    let start = after
        .find(&fence)
        .unwrap_or_else(|| panic!("no {lang} block after {heading}"))
        + fence.len();
    after[start..start + after[start..].find("```").unwrap()].to_owned()
}

/// The README's quick start, run as written (in a fresh HOME, `./my_cuda_app` a fake-driver
/// program, `CUHOOK_PREBUILT` so that the install takes this build instead of running cargo),
/// then its `cuhook view` / `cuhook export` lines: the user's path works end to end.
#[test]
fn the_readme_quick_start_runs_as_written() {
    if cuhook_fixtures::skip_when_cross("the quick start is this machine's") {
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let quick = readme_block("## Quick start", "sh");
    assert!(
        quick.contains("scripts/install-c.sh --prefix ~/.local"),
        "{quick}"
    );
    let script = quick.replace(
        "scripts/install-c.sh",
        &root.join("scripts/install-c.sh").display().to_string(),
    );
    let see = readme_block("### See it", "sh");
    let home = common::scratch("readme-home");
    let work = common::scratch("readme-work");
    std::os::unix::fs::symlink(
        common::fixtures_dir().join("demo_rt_static"),
        work.join("my_cuda_app"),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    for (what, text) in [
        ("quick start", script.as_str()),
        ("see it", &format!("export PATH=~/.local/bin:$PATH\n{see}")),
    ] {
        let out = Command::new("sh")
            .args(["-e", "-c", text])
            .current_dir(&*work)
            .env("HOME", &*home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("CC", cuhook_fixtures::CC)
            .env("CUHOOK_PREBUILT", profile)
            .env_remove("CUHOOK_LIB")
            .env_remove("LD_PRELOAD")
            .env_remove("CUHOOK_DISABLE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}:\n{text}\n--- stdout\n{}\n--- stderr\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(home.join(".local/bin/cuhook").is_file());
    assert!(home.join(".local/lib/libcuhook.so.0").exists());
    let page = std::fs::read_to_string(work.join("demo/memory.html")).unwrap();
    assert!(page.contains("demo_rt_shared.jsonl"));
    let report = std::fs::read_to_string(work.join("r.txt")).unwrap();
    assert!(
        report.contains("Live allocations at exit: 1 (2.0 MiB)"),
        "{report}"
    );
    assert!(work.join("memory.html").is_file() && work.join("t.json").is_file());
}

/// The README's C snippet compiles against the installed header, warnings as errors.
#[test]
fn the_readme_c_snippet_compiles() {
    let dir = common::scratch("readme-c");
    let src = dir.join("snippet.c");
    std::fs::write(&src, readme_block("## C API", "c")).unwrap();
    let status = cuhook_fixtures::cc()
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
        .arg(dir.join("snippet.o"))
        .arg(&src)
        .arg(format!(
            "-I{}",
            common::installed_c_prefix().join("include").display()
        ))
        .status()
        .unwrap();
    assert!(status.success(), "the README's C snippet does not compile");
}
