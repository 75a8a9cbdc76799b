//! Builds the C fixtures (fake libraries and apps in every link mode) that the hook tests run.
//! They land in `$OUT_DIR/fixtures`, exported to the crate's tests as `CUHOOK_FIXTURES_DIR`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How an app or library is linked: the columns of the fixture matrix.
struct Mode {
    name: &'static str,
    cflags: &'static [&'static str],
    ldflags: &'static [&'static str],
}

/// `lazy` links with gold: GNU ld routes PLT calls of an address-taken function through its
/// GLOB_DAT entry (`.plt.got`), so only gold (like lld) gives the JUMP_SLOT + GLOB_DAT pair
/// for one symbol that the engine must patch both of.
const MODES: &[Mode] = &[
    Mode {
        name: "lazy",
        cflags: &[],
        ldflags: &["-fuse-ld=gold", "-Wl,-z,lazy"],
    },
    Mode {
        name: "now",
        cflags: &[],
        ldflags: &["-Wl,-z,relro,-z,now"],
    },
    Mode {
        name: "noplt",
        cflags: &["-fno-plt"],
        ldflags: &["-Wl,-z,lazy"],
    },
];

struct Gcc {
    compiler: PathBuf,
    src: PathBuf,
    out: PathBuf,
    includes: Vec<PathBuf>,
}

impl Gcc {
    fn run(&self, what: &str, args: &[String]) {
        let mut cmd = Command::new(&self.compiler);
        cmd.args(["-O1", "-g", "-Wall", "-Wextra", "-Werror"]);
        for dir in &self.includes {
            cmd.arg("-I").arg(dir);
        }
        let status = cmd
            .args(args)
            .current_dir(&self.out)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run the C compiler {:?} for {what}: {e}",
                    self.compiler
                )
            });
        assert!(
            status.success(),
            "building fixture {what} failed ({status}); command: {:?} {args:?}",
            self.compiler
        );
    }

    fn src(&self, file: &str) -> String {
        self.src.join(file).display().to_string()
    }

    fn shared(&self, out: &str, sources: &[&str], flags: &[&str], libs: &[&str]) {
        let mut args: Vec<String> = vec![
            "-shared".into(),
            "-fPIC".into(),
            format!("-Wl,-soname,{out}"),
            "-o".into(),
            out.into(),
        ];
        args.extend(flags.iter().map(|s| s.to_string()));
        args.extend(sources.iter().map(|s| self.src(s)));
        args.extend(["-L.".into(), "-Wl,-rpath,$ORIGIN".into()]);
        args.extend(libs.iter().map(|s| s.to_string()));
        self.run(out, &args);
    }

    fn app(&self, out: &str, sources: &[&str], flags: &[&str], libs: &[&str]) {
        let mut args: Vec<String> = vec!["-o".into(), out.into()];
        args.extend(flags.iter().map(|s| s.to_string()));
        args.extend(sources.iter().map(|s| self.src(s)));
        args.extend(["-L.".into(), "-Wl,-rpath,$ORIGIN".into()]);
        args.extend(libs.iter().map(|s| s.to_string()));
        args.extend(["-ldl".into(), "-lpthread".into()]);
        self.run(out, &args);
    }
}

fn engine_fixtures(gcc: &Gcc) {
    let map = format!("-Wl,--version-script={}", gcc.src("target.map"));
    gcc.shared("libtarget.so", &["target.c"], &[&map], &[]);
    gcc.shared("libnoplt.so", &["noplt.c"], &[], &[]);
    for m in MODES {
        let lib = format!("libcaller_{}.so", m.name);
        let flags: Vec<&str> = m.cflags.iter().chain(m.ldflags).copied().collect();
        gcc.shared(
            &lib,
            &["caller.c", "caller_direct.c"],
            &flags,
            &["-ltarget"],
        );
        let mut app_flags = vec!["-fPIE", "-pie"];
        app_flags.extend(&flags);
        let caller = format!("-lcaller_{}", m.name);
        gcc.app(
            &format!("app_{}", m.name),
            &["app.c"],
            &app_flags,
            &["-ltarget", &caller, "-lnoplt"],
        );
    }
    // Non-PIE: address-taken functions get canonical PLT entries in the executable.
    gcc.app(
        "app_nopie",
        &["app.c"],
        &["-fno-pie", "-no-pie", "-Wl,-z,lazy"],
        &["-ltarget", "-lcaller_lazy", "-lnoplt"],
    );
}

fn dl_fixtures(gcc: &Gcc) {
    let dl = |f: &str| format!("../dl/{f}");
    gcc.shared("libplugin.so", &[&dl("plugin.c")], &[], &["-ltarget"]);
    gcc.shared("libdep.so", &[&dl("dep.c")], &[], &["-ltarget"]);
    gcc.shared("libplugin_dep.so", &[&dl("plugin_dep.c")], &[], &["-ldep"]);
    gcc.shared("libsecond.so", &[&dl("second.c")], &[], &["-ltarget"]);
    gcc.shared("libplugin_ctor.so", &[&dl("plugin_ctor.c")], &[], &["-ldl"]);
    std::fs::create_dir_all(gcc.out.join("sub")).expect("create fixtures/sub");
    gcc.shared("sub/libsubonly.so", &[&dl("subonly.c")], &[], &[]);
    gcc.shared(
        "libloader.so",
        &[&dl("loader.c")],
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub"],
        &["-ldl"],
    );
    let map = format!("-Wl,--version-script={}", gcc.src(&dl("nexty.map")));
    gcc.shared("libnexty.so", &[&dl("nexty.c")], &[&map], &[]);
    gcc.shared("libnextx.so", &[&dl("nextx.c")], &[], &["-ldl"]);
    gcc.shared("libdlcaller.so", &[&dl("dlcaller.c")], &[], &["-ldl"]);
    gcc.app(
        "app_dl",
        &[&dl("app_dl.c")],
        &[
            "-fPIE",
            "-pie",
            "-Wl,--enable-new-dtags",
            "-Wl,--no-as-needed",
        ],
        &["-ltarget", "-lloader", "-lnextx", "-lnexty", "-lnoplt"],
    );
    gcc.shared(
        "libdefault_user.so",
        &[&dl("default_user.c")],
        &[],
        &["-ldep", "-ldl"],
    );
    // A second file with the soname of an already-loaded library, found only through RUNPATH.
    gcc.shared(
        "sub/libtarget.so",
        &["target.c"],
        &[&format!("-Wl,--version-script={}", gcc.src("target.map"))],
        &[],
    );
}

/// The fake driver (`libcuda.so.1`) and runtime (`libcudart.so.13`, `libcudart_static.a`).
fn fake_cuda(gcc: &Gcc) {
    let cuda = |f: &str| format!("../cuda/{f}");
    let c11 = ["-std=c11", "-fvisibility=hidden"];
    gcc.shared(
        "libcuda.so.1",
        &[&cuda("fake_libcuda.c")],
        &c11,
        &["-lpthread"],
    );
    gcc.shared(
        "libcudart.so.13",
        &[&cuda("fake_cudart.c")],
        &c11,
        &["-ldl", "-lpthread"],
    );
    let obj = "fake_cudart_static.o";
    let mut args: Vec<String> = c11.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-fPIC".into(),
        "-c".into(),
        "-o".into(),
        obj.into(),
        gcc.src(&cuda("fake_cudart.c")),
    ]);
    gcc.run(obj, &args);
    let _ = std::fs::remove_file(gcc.out.join("libcudart_static.a"));
    let status = Command::new("ar")
        .args(["rcs", "libcudart_static.a", obj])
        .current_dir(&gcc.out)
        .status()
        .expect("run ar");
    assert!(status.success(), "ar failed for libcudart_static.a");
}

/// The CPU coverage matrix: every call path to the driver and runtime (hook-tests/coverage.rs).
fn coverage_fixtures(gcc: &Gcc) {
    let cov = |f: &str| format!("../coverage/{f}");
    for m in MODES {
        let flags: Vec<&str> = ["-fPIE", "-pie"]
            .iter()
            .chain(m.cflags)
            .chain(m.ldflags)
            .copied()
            .collect();
        gcc.app(
            &format!("app_cov_drv_{}", m.name),
            &[&cov("app_cov_drv.c")],
            &flags,
            &["-l:libcuda.so.1"],
        );
    }
    gcc.shared(
        "libcov_plugin.so",
        &[&cov("cov_plugin.c")],
        &[],
        &["-l:libcuda.so.1", "-ldl"],
    );
    gcc.shared("libcov_local.so", &[&cov("cov_local.c")], &[], &["-ldl"]);
    gcc.app(
        "app_cov_local",
        &[&cov("app_cov_local.c")],
        &["-fPIE", "-pie"],
        &[],
    );
    gcc.app(
        "app_cov_rt_shared",
        &[&cov("app_cov_rt.c")],
        &["-fPIE", "-pie"],
        &["-l:libcudart.so.13"],
    );
    gcc.app(
        "app_cov_rt_static",
        &[&cov("app_cov_rt.c")],
        &["-fPIE", "-pie"],
        &["libcudart_static.a"],
    );
}

/// The programs `cuhook demo` runs.
fn demo_fixtures(gcc: &Gcc) {
    let demo = "../demo/demo.c";
    gcc.app(
        "demo_rt_static",
        &[demo],
        &["-fPIE", "-pie"],
        &["libcudart_static.a"],
    );
    gcc.app(
        "demo_rt_shared",
        &[demo],
        &["-fPIE", "-pie"],
        &["-l:libcudart.so.13"],
    );
    gcc.app(
        "demo_driver",
        &[demo],
        &["-fPIE", "-pie", "-DDEMO_DRIVER"],
        &["-l:libcuda.so.1"],
    );
}

/// A static-runtime program that loads cuhook too late (the report's coverage warning).
fn late_fixtures(gcc: &Gcc) {
    gcc.app(
        "late_static",
        &["../demo/late_static.c"],
        &["-fPIE", "-pie"],
        &["libcudart_static.a"],
    );
}

/// Pointer classification of memory allocated before install (hook-tests/classify.rs).
fn classify_fixtures(gcc: &Gcc) {
    gcc.app(
        "app_classify",
        &["../classify/app_classify.c"],
        &["-fPIE", "-pie"],
        &["-l:libcuda.so.1"],
    );
}

/// A host that closes its descriptors and feeds FIFOs (hook-tests/output.rs).
fn host_fixtures(gcc: &Gcc) {
    gcc.app(
        "host_output",
        &["../host/host_output.c"],
        &["-fPIE", "-pie"],
        &["-l:libcuda.so.1"],
    );
}

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("fixtures");
    std::fs::create_dir_all(&out).expect("create fixtures dir");
    let compiler = cc::Build::new().get_compiler().path().to_path_buf();
    let fixtures = manifest.join("fixtures");
    let includes = vec![
        manifest.join("include"),
        fixtures.join("engine"),
        fixtures.join("cuda"),
        fixtures.join("coverage"),
    ];
    let gcc = Gcc {
        compiler,
        src: fixtures.join("engine"),
        out: out.clone(),
        includes,
    };
    engine_fixtures(&gcc);
    dl_fixtures(&gcc);
    fake_cuda(&gcc);
    coverage_fixtures(&gcc);
    demo_fixtures(&gcc);
    classify_fixtures(&gcc);
    late_fixtures(&gcc);
    host_fixtures(&gcc);
    println!("cargo:rustc-env=CUHOOK_FIXTURES_DIR={}", out.display());
    // Hooks point into libcuhook.so: it must never be unloaded while any slot does.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    for dir in ["fixtures", "include"] {
        rerun_tree(&manifest.join(dir));
    }
}

fn rerun_tree(dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                rerun_tree(&p);
            } else {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}
