//! An entry's payload, decoded. A cubin's section headers sit at its end (measured on
//! libcurand's and PyTorch's), so a cubin is decoded whole: the one in a container that
//! decodes to the fewest bytes is chosen by the caller.

use super::container::{Codec, Entry};

/// The most one entry may decode to: it bounds the memory a corrupt size field could ask for.
pub(super) const MAX_DECODED: usize = 256 << 20;

/// The decoded bytes of `entry`; `None` when the payload does not decode to its stated size.
/// Stored entries are borrowed; compressed ones are decoded into `scratch`.
pub(super) fn decoded<'a>(entry: &Entry<'a>, scratch: &'a mut Vec<u8>) -> Option<&'a [u8]> {
    if entry.codec == Codec::Stored {
        return Some(entry.payload);
    }
    if entry.size > MAX_DECODED {
        return None;
    }
    scratch.clear();
    scratch.resize(entry.size, 0);
    let n = match entry.codec {
        Codec::Lz4 => lz4_flex::block::decompress_into(entry.payload, scratch).ok()?,
        _ => zstd::bulk::decompress_to_buffer(entry.payload, &mut scratch[..]).ok()?,
    };
    scratch.truncate(n);
    Some(scratch)
}
