//! The demo's programs, compiled when `cuhook demo` runs: the fake CUDA driver and runtime and
//! the demo workload, embedded here as C source, built with the system C compiler (`$CC`, else
//! `cc`) into a fresh directory. So the crate's own build compiles no fixtures, and the demo
//! works from an installed `cuhook` as well as from the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (file name, contents) of every source the demo compiles.
const SOURCES: [(&str, &str); 6] = [
    (
        "fake_libcuda.c",
        include_str!("../../../fixtures/cuda/fake_libcuda.c"),
    ),
    (
        "fake_cudart.c",
        include_str!("../../../fixtures/cuda/fake_cudart.c"),
    ),
    (
        "fake_cuda.h",
        include_str!("../../../fixtures/cuda/fake_cuda.h"),
    ),
    (
        "fake_fatbin.h",
        include_str!("../../../fixtures/cuda/fake_fatbin.h"),
    ),
    (
        "fake_trace.h",
        include_str!("../../../fixtures/cuda/fake_trace.h"),
    ),
    ("demo.c", include_str!("../../../fixtures/demo/demo.c")),
];

/// Flags of the fake CUDA libraries: C11, only the CUDA API exported.
const CUDA_FLAGS: [&str; 3] = ["-std=c11", "-fvisibility=hidden", "-fPIC"];

/// The compiler invocations, in order: (output, arguments). Everything is relative to the build
/// directory, which is also each program's `$ORIGIN` RUNPATH.
fn steps() -> Vec<(&'static str, Vec<&'static str>)> {
    let app = |out: &'static str, extra: &[&'static str]| {
        let mut a = vec!["-o", out, "demo.c", "-L.", "-Wl,-rpath,$ORIGIN"];
        a.extend(extra);
        a.extend(["-ldl", "-lpthread"]);
        (out, a)
    };
    vec![
        (
            "libcuda.so.1",
            [
                &["-shared", "-Wl,-soname,libcuda.so.1", "-o", "libcuda.so.1"][..],
                &CUDA_FLAGS,
                &["fake_libcuda.c", "-lpthread"],
            ]
            .concat(),
        ),
        (
            "libcudart.so.13",
            [
                &[
                    "-shared",
                    "-Wl,-soname,libcudart.so.13",
                    "-o",
                    "libcudart.so.13",
                ][..],
                &CUDA_FLAGS,
                &["fake_cudart.c", "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread"],
            ]
            .concat(),
        ),
        (
            "fake_cudart.o",
            [
                &["-c", "-o", "fake_cudart.o"][..],
                &CUDA_FLAGS,
                &["fake_cudart.c"],
            ]
            .concat(),
        ),
        app("demo_driver", &["-DDEMO_DRIVER", "-l:libcuda.so.1"]),
        app("demo_rt_shared", &["-l:libcudart.so.13"]),
        // The runtime's object linked into the program: what nvcc's static runtime amounts to.
        app("demo_rt_static", &["fake_cudart.o"]),
    ]
}

/// Compile the demo into `dir` (created if needed) and return it.
pub fn build(dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, text) in SOURCES {
        std::fs::write(dir.join(name), text)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))?;
    }
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    for (out, args) in steps() {
        let result = Command::new(&cc)
            .args(["-O1", "-g"])
            .args(&args)
            .current_dir(dir)
            .output()
            .map_err(|e| {
                format!(
                    "cannot run the C compiler `{}` (install gcc, or set CC): {e}",
                    cc.to_string_lossy()
                )
            })?;
        if !result.status.success() {
            return Err(format!(
                "compiling the demo's {out} failed:\n{}",
                String::from_utf8_lossy(&result.stderr)
            ));
        }
    }
    Ok(dir.to_path_buf())
}
