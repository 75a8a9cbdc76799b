//! A fatbin container: a 16-byte header, then entries (a header and a payload each) back to
//! back. Only the fields the managed-variable scan needs are read; every offset is checked
//! against the container's bounds, so a malformed container ends the walk, never a read.

/// First word of a fatbin container.
pub(super) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// First word of the `__fatBinC_Wrapper_t` nvcc's host code registers; its `data` (at byte 8)
/// points at the container.
pub(super) const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Container header: magic, version, header size (u16 at 6), payload size (u64 at 8).
pub(super) const HEADER: usize = 16;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Ptx,
    Cubin,
    Other,
}

/// How an entry's payload is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Codec {
    Stored,
    /// LZ4 block format (toolkits before 12.8).
    Lz4,
    /// A zstd frame (12.8 and later).
    Zstd,
}

/// One entry of a container.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry<'a> {
    pub(super) kind: Kind,
    pub(super) codec: Codec,
    /// The stored bytes (compressed ones without the alignment padding).
    pub(super) payload: &'a [u8],
    /// Size once decoded.
    pub(super) size: usize,
}

const ENTRY_HEADER_MIN: usize = 64;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

pub(super) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

pub(super) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

pub(super) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The whole length of the container whose header `head` is (`HEADER` bytes at least), if it is
/// one.
pub(super) fn container_len(head: &[u8]) -> Option<usize> {
    if u32_at(head, 0)? != FATBIN_MAGIC {
        return None;
    }
    let header = usize::from(u16_at(head, 6)?);
    let body = usize::try_from(u64_at(head, 8)?).ok()?;
    header.max(HEADER).checked_add(body)
}

/// The entries of the container at the start of `fatbin` (its first container only: the
/// driver loads one per call).
pub(super) fn entries(fatbin: &[u8]) -> impl Iterator<Item = Entry<'_>> {
    let end = container_len(fatbin).map_or(0, |n| n.min(fatbin.len()));
    let body = &fatbin[..end];
    let mut at = u16_at(body, 6).map_or(usize::MAX, usize::from);
    core::iter::from_fn(move || {
        let e = entry_at(body, at)?;
        at = e.1;
        Some(e.0)
    })
}

/// The entry whose header starts at `at`, and where the next one starts.
fn entry_at(body: &[u8], at: usize) -> Option<(Entry<'_>, usize)> {
    let kind = match u16_at(body, at)? {
        1 => Kind::Ptx,
        2 => Kind::Cubin,
        _ => Kind::Other,
    };
    let header = usize::try_from(u32_at(body, at + 4)?).ok()?;
    let stored = usize::try_from(u64_at(body, at + 8)?).ok()?;
    let compressed = usize::try_from(u32_at(body, at + 16)?).ok()?;
    let flags = u64_at(body, at + 40)?;
    let decoded = usize::try_from(u64_at(body, at + 56)?).ok()?;
    if header < ENTRY_HEADER_MIN {
        return None;
    }
    let start = at.checked_add(header)?;
    let next = start.checked_add(stored)?;
    let region = body.get(start..next)?;
    let codec = if flags & FLAG_ZSTD != 0 {
        Codec::Zstd
    } else if flags & FLAG_LZ4 != 0 {
        Codec::Lz4
    } else {
        Codec::Stored
    };
    let (payload, size) = match codec {
        Codec::Stored => (region, region.len()),
        _ if compressed != 0 => (region.get(..compressed)?, decoded),
        _ => (region, decoded),
    };
    Some((
        Entry {
            kind,
            codec,
            payload,
            size,
        },
        next,
    ))
}
