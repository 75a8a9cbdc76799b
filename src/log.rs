//! Diagnostics to stderr (the lowest layer with [`crate::output`]: every module may log), written
//! with `crate::sys::write::stderr` from a stack buffer: usable in constructors before std is ready, at exit, and
//! inside hooks (no allocation, no stdout lock).

use std::fmt::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// Severity, in increasing verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    pub const NAMES: &'static str = "error|warn|info|debug|trace";

    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            "trace" => Level::Trace,
            _ => return None,
        })
    }

    const fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Set the most verbose level that is printed.
pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages of `level` are printed.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// A fixed buffer that formats without allocating; overlong text is cut.
pub struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    pub const fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// End the text with a newline. Text that filled the buffer loses its tail to a `...` marker
    /// and the newline, so a cut line never runs into the next one.
    pub fn end_line(&mut self) {
        const CUT: &[u8] = b"...\n";
        if self.len < N {
            self.buf[self.len] = b'\n';
            self.len += 1;
        } else {
            let at = N.saturating_sub(CUT.len());
            let n = N - at;
            self.buf[at..].copy_from_slice(&CUT[CUT.len() - n..]);
        }
    }
}

impl<const N: usize> Default for StackBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Write for StackBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(N - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Print one line `cuhook[pid] level: message` to stderr if `level` is enabled.
pub fn log(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut line = StackBuf::<1024>::new();
    let _ = write!(line, "cuhook[{}] {}: ", std::process::id(), level.name());
    let _ = line.write_fmt(args);
    line.end_line();
    crate::sys::write::stderr(line.as_bytes());
}

/// `log!(Level::Warn, "format", args…)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        $crate::log::log($level, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended<const N: usize>(text: &str) -> Vec<u8> {
        let mut b = StackBuf::<N>::new();
        let _ = b.write_str(text);
        b.end_line();
        b.as_bytes().to_vec()
    }

    #[test]
    fn a_line_always_ends_with_its_newline() {
        assert_eq!(ended::<16>("abc"), b"abc\n");
        assert_eq!(ended::<4>("abc"), b"abc\n");
        assert_eq!(ended::<8>("abcdefghijkl"), b"abcd...\n");
        assert_eq!(ended::<2>("abc"), b".\n");
    }
}
