//! The `--report` and `--trace` files: checked before the command starts (a path that cannot
//! be written costs no run), and the report written where `--report` said once it ends.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::Path;

/// Whether `%p` in `template` changes the name (a name per process).
pub(super) fn per_process(template: &OsStr) -> bool {
    cuhook::report::expand_path_for(template, 1) != cuhook::report::expand_path_for(template, 2)
}

/// Why a file at `path` cannot be made, in words, or `None` when its directory looks fine.
pub(super) fn directory_problem(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("directory {} does not exist", dir.display()))
        }
        Err(e) => return Some(format!("directory {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => return Some(format!("{} is not a directory", dir.display())),
        Ok(_) => {}
    }
    let mut c = dir.as_os_str().as_bytes().to_vec();
    c.push(0);
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr().cast(), libc::W_OK | libc::X_OK) } != 0 {
        return Some(format!(
            "directory {} is not writable ({})",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Some("is a directory".to_owned());
    }
    None
}

/// Where `--report` goes: a file opened before the command starts, or (with `%p`) a name that
/// is known only once the command has its process id.
pub(super) enum ReportSink {
    /// The file, its name, and whether this run created it.
    Opened(File, OsString, bool),
    PerProcess(OsString),
}

/// Open `path` for writing the report: never through a symbolic link (one planted in a shared
/// directory would redirect it; the same rule the library keeps for `CUHOOK_REPORT`), never
/// waiting for a reader of a FIFO. Not truncated until the report is written.
fn open_report(path: &OsStr) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    // Writes may block again once the file is open (a FIFO whose reader is there).
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// The reason `open_report` failed, in words.
fn open_problem(path: &Path, e: &std::io::Error) -> String {
    if let Some(p) = directory_problem(path) {
        return p;
    }
    match e.raw_os_error() {
        Some(libc::ELOOP) => "is a symbolic link (name the file itself)".to_owned(),
        Some(libc::ENXIO) => "is a FIFO that nobody reads".to_owned(),
        _ => e.to_string(),
    }
}

/// Check `--report` before the command starts.
pub(super) fn prepare_report(template: &Path) -> Result<ReportSink, String> {
    let t = template.as_os_str();
    let refuse = |why: String| format!("--report {}: {why}", template.display());
    if per_process(t) {
        let example = cuhook::report::expand_path_for(t, std::process::id());
        if let Some(why) = directory_problem(Path::new(&example)) {
            return Err(refuse(why));
        }
        return Ok(ReportSink::PerProcess(t.to_owned()));
    }
    let path = cuhook::report::expand_path_for(t, 0);
    let existed = std::fs::symlink_metadata(&path).is_ok();
    match open_report(&path) {
        Ok(f) => Ok(ReportSink::Opened(f, path, !existed)),
        Err(e) => Err(refuse(open_problem(Path::new(&path), &e))),
    }
}

/// Check `--trace` before the command starts: its directory must be there and writable (each
/// process of the command opens the file itself).
pub(super) fn check_trace(template: &Path) -> Result<(), String> {
    let example = cuhook::report::expand_path_for(template.as_os_str(), std::process::id());
    match directory_problem(Path::new(&example)) {
        Some(why) => Err(format!("--trace {}: {why}", template.display())),
        None => Ok(()),
    }
}

/// Write the report to where `--report` said.
pub(super) fn write_report(sink: ReportSink, pid: u32, text: &str) -> Result<(), String> {
    use std::io::Write;
    let (mut file, path) = match sink {
        ReportSink::Opened(f, path, _) => (f, path),
        ReportSink::PerProcess(template) => {
            let path = cuhook::report::expand_path_for(&template, pid);
            let f = open_report(&path).map_err(|e| {
                format!(
                    "{}: {}",
                    path.to_string_lossy(),
                    open_problem(Path::new(&path), &e)
                )
            })?;
            (f, path)
        }
    };
    // A FIFO or a terminal cannot be truncated; a regular file must be.
    if file.metadata().is_ok_and(|m| m.is_file()) {
        file.set_len(0)
            .map_err(|e| format!("{}: {e}", path.to_string_lossy()))?;
    }
    file.write_all(text.as_bytes())
        .map_err(|e| format!("{}: {e}", path.to_string_lossy()))
}
