//! `/proc/self/maps` read as text: what answers "which mapping, with which protection" where
//! the kernel's `PROCMAP_QUERY` cannot (kernels before 6.11, a sandbox that refuses the ioctl,
//! qemu-user), for `elf::protection` and the stack unwinder's bounds. The text is bytes: a
//! mapped file's path is whatever its name is, UTF-8 or not, so lines are parsed byte by byte
//! up to their permissions and the rest skipped.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};

use region::Protection;

use super::fd;

/// Each mapping that overlaps `[lo, hi)`, read from `/proc/self/maps` text (the fallback), as
/// (start, end, protection); else the errno.
///
/// Read as bytes, each line's `start-end perms` parsed and the rest (the path) skipped: a path
/// is whatever bytes the file's name has, and taking the text for UTF-8 (as
/// `region::query_range` does) failed every query of a process that had mapped one file whose
/// name is not, so that nothing loaded after it was patched.
pub(crate) fn read_text(
    lo: usize,
    hi: usize,
    mut each: impl FnMut(usize, usize, Protection),
) -> Result<(), i32> {
    let hi = hi.max(lo.saturating_add(1));
    let text = fd::open(c"/proc/self/maps", libc::O_RDONLY | libc::O_CLOEXEC, 0)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    // The text is ~100 bytes a mapping and the kernel makes it afresh on every read: few large
    // reads (a host has thousands of mappings). On the heap: the engine runs on its host's
    // threads, whose stacks may be small.
    let mut buf = vec![0u8; 16 * 1024];
    each_line(text.as_raw_fd(), &mut buf, |start, end, p| {
        if end > lo && start < hi {
            each(start, end, p);
        }
        // Mappings are listed in address order.
        start < hi
    })
}

/// Feeds every mapping line of the maps text open at `fd` to `line(start, end, protection)` in
/// the order listed, until it returns false or the text ends, reading through `buf`. Lines
/// that do not parse are skipped. Else the errno of a failed read. Allocates nothing: the
/// stack unwinder reads through it inside hooks, with a buffer on its stack.
pub(crate) fn each_line(
    fd: RawFd,
    buf: &mut [u8],
    mut line: impl FnMut(usize, usize, Protection) -> bool,
) -> Result<(), i32> {
    let mut parser = MapsLine::default();
    loop {
        // SAFETY: reads at most `buf.len()` bytes into the caller's buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno == libc::EINTR {
                continue;
            }
            return Err(errno);
        }
        if n == 0 {
            return Ok(());
        }
        let mut rest = &buf[..n as usize];
        while let Some((&b, after)) = rest.split_first() {
            rest = after;
            if let Some((start, end, p)) = parser.push(b) {
                if !line(start, end, p) {
                    return Ok(());
                }
            }
            // Past the permissions only the end of the line matters.
            if parser.field > 2 {
                let skip = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
                rest = &rest[skip..];
            }
        }
    }
}

/// A parser of `/proc/self/maps` lines fed one byte at a time: `start-end perms ...\n`, the
/// rest of the line (offset, device, inode, path) skipped whatever its bytes.
#[derive(Default)]
struct MapsLine {
    field: u8,
    start: usize,
    end: usize,
    protection: Protection,
    bad: bool,
}

impl MapsLine {
    /// Feeds one byte; at the end of a line that parsed, its `(start, end, protection)`.
    fn push(&mut self, b: u8) -> Option<(usize, usize, Protection)> {
        if b == b'\n' {
            let done =
                (!self.bad && self.field >= 3).then_some((self.start, self.end, self.protection));
            *self = MapsLine::default();
            return done;
        }
        match self.field {
            0 | 1 => match (b, (b as char).to_digit(16)) {
                (b'-', _) if self.field == 0 => self.field = 1,
                (b' ', _) if self.field == 1 => self.field = 2,
                (_, Some(d)) => {
                    let v = if self.field == 0 {
                        &mut self.start
                    } else {
                        &mut self.end
                    };
                    match v.checked_mul(16) {
                        Some(x) => *v = x + d as usize,
                        None => self.bad = true,
                    }
                }
                _ => self.bad = true,
            },
            // The permission letters: `r`, `w`, `x` in their places, then `p` or `s`.
            2 => {
                self.protection |= match b {
                    b'r' => Protection::READ,
                    b'w' => Protection::WRITE,
                    b'x' => Protection::EXECUTE,
                    b'-' | b'p' | b's' => Protection::NONE,
                    b' ' => {
                        self.field = 3;
                        Protection::NONE
                    }
                    _ => {
                        self.bad = true;
                        Protection::NONE
                    }
                };
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines parse whatever bytes their path has (a file name need not be UTF-8), and a line
    /// that is not a mapping is skipped.
    #[test]
    fn lines_of_the_maps_text_parse_whatever_the_path() {
        let text: &[u8] =
            b"55d0c0000000-55d0c0021000 r-xp 00000000 08:01 1 /opt/lib\xff\xfe/x.so\n\
                     7ffd00000000-7ffd00022000 rw-p 00000000 00:00 0 [stack]\n\
                     7ffd10000000-7ffd10001000 ---p 00000000 00:00 0\n\
                     garbage line\n\
                     7ffd20000000-7ffd20001000 r--s 00000000 00:05 9 /dev/shm/\x80 (deleted)\n";
        let mut p = MapsLine::default();
        let lines: Vec<_> = text.iter().filter_map(|&b| p.push(b)).collect();
        assert_eq!(
            lines,
            vec![
                (0x55d0c0000000, 0x55d0c0021000, Protection::READ_EXECUTE),
                (0x7ffd00000000, 0x7ffd00022000, Protection::READ_WRITE),
                (0x7ffd10000000, 0x7ffd10001000, Protection::NONE),
                (0x7ffd20000000, 0x7ffd20001000, Protection::READ),
            ]
        );
    }

    /// The text names this function's page executable and a stack variable's page writable,
    /// and stops at the first mapping past the range asked about.
    #[test]
    fn the_text_covers_code_and_stack() {
        let code = the_text_covers_code_and_stack as fn() as usize;
        let mut found = Vec::new();
        read_text(code, code + 1, |start, end, p| found.push((start, end, p))).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].0 <= code && code < found[0].1);
        assert!(found[0].2.contains(Protection::EXECUTE), "{found:?}");
        let local = 0u64;
        let at = &local as *const u64 as usize;
        // This thread's stack is anonymous: under qemu-user 7.2 the text can leave it out while
        // another test thread unmaps a neighbour the host merged with it (docs/development.md,
        // "fenced"), a window a second or third reading does not meet again. Natively, once.
        let readings = if cuhook_fixtures::CROSS { 3 } else { 1 };
        let mut stack = Vec::new();
        for _ in 0..readings {
            stack.clear();
            read_text(at, at + 8, |start, end, p| stack.push((start, end, p))).unwrap();
            if stack.iter().any(|&(s, e, _)| s <= at && at < e) {
                break;
            }
        }
        assert!(
            stack
                .iter()
                .any(|&(s, e, p)| s <= at && at < e && p.contains(Protection::READ_WRITE)),
            "{stack:?}"
        );
    }
}
