//! Pushes that never reallocate, for reading objects where nothing may allocate.
//!
//! Objects another thread may unload are read from inside a walk of the loader's list (see
//! `hooks/batch.rs`): the walk's lock keeps them mapped, but a `malloc` there could deadlock
//! (an allocator that calls the loader waits for a lock whose holder waits for ours). Storage
//! for such reads is reserved beforehand; a push beyond it fails with [`Full`] instead of
//! growing, and the caller indexes that object again later with more room.

/// The reserved storage is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// Push `item`; when `fixed`, only within `v`'s capacity.
pub(crate) fn push<T>(v: &mut Vec<T>, item: T, fixed: bool) -> Result<(), Full> {
    if fixed && v.len() == v.capacity() {
        return Err(Full);
    }
    v.push(item);
    Ok(())
}

/// Append `bytes`; when `fixed`, only within `v`'s capacity.
pub(crate) fn extend(v: &mut Vec<u8>, bytes: &[u8], fixed: bool) -> Result<(), Full> {
    if fixed && v.capacity() - v.len() < bytes.len() {
        return Err(Full);
    }
    v.extend_from_slice(bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_vector_never_grows() {
        let mut v: Vec<u8> = Vec::with_capacity(4);
        let cap = v.capacity();
        assert_eq!(extend(&mut v, b"abc", true), Ok(()));
        assert_eq!(extend(&mut v, b"de", true), Err(Full));
        assert_eq!(push(&mut v, b'd', true), Ok(()));
        assert_eq!(push(&mut v, b'e', true), Err(Full));
        assert_eq!((v.as_slice(), v.capacity()), (&b"abcd"[..], cap));
        // Growable: as Vec does.
        assert_eq!(push(&mut v, b'e', false), Ok(()));
        assert_eq!(extend(&mut v, b"fgh", false), Ok(()));
        assert_eq!(v, b"abcdefgh");
    }
}
