//! The real-GPU scripts (`hook-tests/gpu/`) run only on a machine with a GPU, which CI has not:
//! here each shell script is at least parsed (`bash -n`) and each Python one compiled, so that
//! a slip in one is found before device time is spent on it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{output_ok, scratch};

fn scripts(ext: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hook-tests/gpu");
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .expect("hook-tests/gpu")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    found.sort();
    found
}

#[test]
fn every_gpu_shell_script_parses() {
    let all = scripts("sh");
    assert!(all.len() >= 10, "the GPU scripts moved? found {all:?}");
    for script in all {
        output_ok(Command::new("bash").arg("-n").arg(&script));
    }
}

#[test]
fn every_gpu_python_script_compiles() {
    let all = scripts("py");
    assert!(all.len() >= 5, "the GPU scripts moved? found {all:?}");
    // Compiled into a scratch file: nothing is written beside the sources.
    let dir = scratch("gpu-pyc");
    let code =
        "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)";
    for script in all {
        output_ok(
            Command::new("python3")
                .args(["-c", code])
                .arg(&script)
                .arg(dir.join("x.pyc")),
        );
    }
}
