//! The real-GPU scripts (`hook-tests/gpu/`) run only on a machine with a GPU, which CI has not:
//! here each shell script is at least parsed (`bash -n`) and each Python one compiled, so that
//! a slip in one is found before device time is spent on it.

use std::path::Path;
use std::process::Command;

fn scripts(ext: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("hook-tests/gpu");
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .expect("hook-tests/gpu")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    found.sort();
    found
}

/// Runs `checker` on `script` and fails the test with its complaint if it refuses it.
fn passes(script: &Path, checker: &mut Command) {
    let out = checker.output().expect("the checker runs");
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_gpu_shell_script_parses() {
    let all = scripts("sh");
    assert!(all.len() >= 10, "the GPU scripts moved? found {all:?}");
    for script in all {
        passes(&script, Command::new("bash").arg("-n").arg(&script));
    }
}

#[test]
fn every_gpu_python_script_compiles() {
    let all = scripts("py");
    assert!(all.len() >= 5, "the GPU scripts moved? found {all:?}");
    let out_dir = std::env::temp_dir().join(format!("cuhook-gpu-pyc-{}", std::process::id()));
    for script in all {
        // Compiled to a scratch file: nothing is written beside the sources.
        let code = "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)";
        passes(
            &script,
            Command::new("python3")
                .args(["-c", code])
                .arg(&script)
                .arg(out_dir.join("x.pyc")),
        );
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}
