//! The `__managed__` variables a PTX module defines: `.global` variables declared with
//! `.attribute(.managed)` (what nvcc writes for them), not `.extern` ones.

use std::ffi::CStr;

use memchr::memmem;

const MARK: &[u8] = b".attribute(.managed)";
/// Longest name handed on (with its NUL); longer ones are skipped.
const NAME_MAX: usize = 256;

/// Calls `found` with the name of each managed variable `text` defines (size unknown: 0).
pub(super) fn managed(text: &[u8], found: &mut dyn FnMut(&CStr, usize)) {
    for at in memmem::find_iter(text, MARK) {
        let begin = text[..at]
            .iter()
            .rposition(|&c| matches!(c, b';' | b'\n' | b'{' | b'}'))
            .map_or(0, |p| p + 1);
        if memmem::find(&text[begin..at], b".extern").is_some() {
            continue;
        }
        let rest = &text[at + MARK.len()..];
        let end = rest
            .iter()
            .position(|&c| matches!(c, b';' | b'=' | b'[' | b'\n'))
            .unwrap_or(rest.len());
        let Some(name) = rest[..end]
            .split(u8::is_ascii_whitespace)
            .rfind(|t| !t.is_empty())
        else {
            continue;
        };
        let ident = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%');
        if name.first() == Some(&b'.') || !name.iter().all(ident) || name.len() >= NAME_MAX {
            continue;
        }
        let mut buf = [0u8; NAME_MAX];
        buf[..name.len()].copy_from_slice(name);
        if let Ok(c) = CStr::from_bytes_until_nul(&buf) {
            found(c, 0);
        }
    }
}
