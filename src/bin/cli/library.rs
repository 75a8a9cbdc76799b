//! Where `cuhook run` and `cuhook demo` find the libcuhook.so they preload, in this order (the
//! first that applies wins):
//!
//! 1. `--lib PATH`;
//! 2. `$CUHOOK_LIB` (when set and not empty);
//! 3. beside the `cuhook` binary: `libcuhook.so`, or — in a cargo target directory, where
//!    `cargo build` leaves `libcuhook.so` and `cargo test` refreshes only `deps/libcuhook.so` —
//!    the newer of the two;
//! 4. the library directory next to the binary's: `../lib`, `../lib64`,
//!    `../lib/<arch>-linux-gnu` (`libcuhook.so.0`, then `libcuhook.so`), where
//!    `scripts/install-c.sh` installs it.
//!
//! The binary's own path is the kernel's (`/proc/self/exe`), with symbolic links resolved: a
//! link to an installed `cuhook` finds the library of the installation it points into.
//!
//! A path named by `--lib` or `$CUHOOK_LIB` that is not a file is an error, never a reason to
//! look elsewhere: a user who names a library means that one.

use std::path::{Path, PathBuf};

/// The name the loader and the install script give the library (its soname).
const SONAME: &str = "libcuhook.so.0";

/// The library to preload, by the order above.
pub fn find(flag: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return named(path, "--lib");
    }
    if let Some(path) = std::env::var_os("CUHOOK_LIB").filter(|v| !v.is_empty()) {
        return named(Path::new(&path), "CUHOOK_LIB");
    }
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find the cuhook binary's own path ({e}); name the library with --lib PATH")
    })?;
    let candidates = beside(&exe);
    if let Some(found) = candidates.iter().find_map(|group| newest(group)) {
        return Ok(found);
    }
    let looked: Vec<String> = candidates
        .iter()
        .flatten()
        .map(|p| format!("  {}", p.display()))
        .collect();
    Err(format!(
        "cannot find libcuhook.so, the library `cuhook run` preloads. Looked for --lib PATH \
         (not given), $CUHOOK_LIB (not set), then:\n{}\n\
         Get one from cuhook's source (a clone, or the crate's source that `cargo install` \
         downloaded): `scripts/install-c.sh --prefix DIR` builds and installs DIR/bin/cuhook \
         with DIR/lib/libcuhook.so.0, where it finds it (--prefix ~/.cargo puts the library \
         beside a cargo-installed cuhook); or `cargo build --release` and name \
         target/release/libcuhook.so with --lib PATH or CUHOOK_LIB=PATH. (`cargo install` \
         installs the binary alone: cargo installs no library.)",
        looked.join("\n")
    ))
}

/// A library the user named: it must be a file; made absolute so that the command finds it
/// from any directory it changes to.
fn named(path: &Path, what: &str) -> Result<PathBuf, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {
            std::path::absolute(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        }
        Ok(_) => Err(format!("{what} {}: not a file", path.display())),
        Err(e) => Err(format!("{what} {}: {e}", path.display())),
    }
}

/// The candidates of steps 3 and 4 for a binary at `exe`, in groups: within a group the newest
/// file wins, the first group with a file wins.
pub fn beside(exe: &Path) -> Vec<Vec<PathBuf>> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    let mut groups = vec![vec![
        dir.join("libcuhook.so"),
        dir.join("deps/libcuhook.so"),
    ]];
    if let Some(prefix) = dir.parent() {
        let multiarch = format!("lib/{}-linux-gnu", std::env::consts::ARCH);
        for libdir in ["lib", "lib64", &multiarch] {
            for name in [SONAME, "libcuhook.so"] {
                groups.push(vec![prefix.join(libdir).join(name)]);
            }
        }
    }
    groups
}

/// The most recently modified regular file of `group` (following symbolic links).
fn newest(group: &[PathBuf]) -> Option<PathBuf> {
    group
        .iter()
        .filter_map(|p| {
            let m = std::fs::metadata(p).ok().filter(|m| m.is_file())?;
            Some((m.modified().ok()?, p))
        })
        .max_by_key(|(time, _)| *time)
        .map(|(_, p)| p.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fresher_of_two_cargo_outputs_wins() {
        let dir = std::env::temp_dir().join(format!("cuhook-libsearch-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("deps")).unwrap();
        let (top, deps) = (dir.join("libcuhook.so"), dir.join("deps/libcuhook.so"));
        std::fs::write(&top, "stale").unwrap();
        std::fs::write(&deps, "fresh").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&top)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let groups = beside(&dir.join("cuhook"));
        assert_eq!(newest(&groups[0]), Some(deps.clone()));
        std::fs::remove_file(&deps).unwrap();
        assert_eq!(newest(&groups[0]), Some(top));
        // Installed layout: bin/cuhook finds lib/libcuhook.so.0 first.
        let installed = beside(Path::new("/opt/x/bin/cuhook"));
        assert_eq!(
            installed[1],
            vec![PathBuf::from("/opt/x/lib/libcuhook.so.0")]
        );
        assert!(installed
            .iter()
            .flatten()
            .any(|p| p.ends_with("lib64/libcuhook.so.0")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_named_library_must_exist() {
        let e = named(Path::new("/nonexistent/libcuhook.so"), "--lib").unwrap_err();
        assert!(e.starts_with("--lib /nonexistent/libcuhook.so: "), "{e}");
        let e = named(Path::new("/"), "CUHOOK_LIB").unwrap_err();
        assert_eq!(e, "CUHOOK_LIB /: not a file");
    }
}
