//! The private directory `cuhook run` collects its processes' reports in: made atomically with
//! a name nobody can predict (`mkdtemp`, mode 0700), removed on every way out of the run.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A directory of our own, removed when dropped.
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Make `$TMPDIR/<prefix>XXXXXX`.
    pub fn new(prefix: &str) -> io::Result<PrivateDir> {
        let mut template = std::env::temp_dir()
            .join(format!("{prefix}XXXXXX"))
            .into_os_string()
            .into_vec();
        template.push(0);
        // SAFETY: `template` is a writable, NUL-terminated buffer ending in six `X`, which
        // mkdtemp replaces in place.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(io::Error::last_os_error());
        }
        template.pop();
        Ok(PrivateDir {
            path: PathBuf::from(OsString::from_vec(template)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read a regular file inside, never following a symlink nor waiting on a FIFO that the
    /// command (our own user's program, but a program) may have put there.
    pub fn read(&self, name: impl AsRef<Path>) -> Option<String> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(self.path.join(name))
            .ok()?;
        if !f.metadata().ok()?.is_file() {
            return None;
        }
        let mut s = String::new();
        f.read_to_string(&mut s).ok()?;
        Some(s)
    }

    /// Names of the entries inside, sorted.
    pub fn names(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.path)
            .map(|d| d.flatten().map(|e| PathBuf::from(e.file_name())).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
        v
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // remove_dir_all never follows symlinks inside.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
