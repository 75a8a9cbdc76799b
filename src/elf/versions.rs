//! Symbol version names of one object, from `DT_VERNEED` (imports) and `DT_VERDEF` (its own
//! definitions), read without allocating when asked (inside walks of the loader's list).

use super::dynamic::DynamicTables;
use super::image::Image;
use super::records::{Verdaux, Verdef, Vernaux, Verneed};
use super::room::{push, Full};

/// Version index → version name, from `DT_VERNEED` (imports) and `DT_VERDEF` (own definitions),
/// as string-table offsets kept in a caller's buffer.
pub(crate) struct VersionNames<'v> {
    names: &'v [(u16, u32)],
}

/// Upper bound on version records walked (guards against corrupt `vn_next` chains).
const MAX_VERSIONS: usize = 4096;

impl<'v> VersionNames<'v> {
    /// Read the version records into `buf` (when `fixed`, within its capacity).
    pub(crate) fn read(
        img: &Image<'_>,
        t: &DynamicTables,
        buf: &'v mut Vec<(u16, u32)>,
        fixed: bool,
    ) -> std::result::Result<VersionNames<'v>, Full> {
        buf.clear();
        if let Some((mut at, count)) = t.verneed {
            for _ in 0..count.min(MAX_VERSIONS) {
                let Some(vn) = img.read::<Verneed>(at) else {
                    break;
                };
                let mut aux_at = at + vn.vn_aux as usize;
                for _ in 0..(vn.vn_cnt as usize).min(MAX_VERSIONS) {
                    let Some(aux) = img.read::<Vernaux>(aux_at) else {
                        break;
                    };
                    push(buf, (aux.vna_other & 0x7fff, aux.vna_name), fixed)?;
                    if aux.vna_next == 0 {
                        break;
                    }
                    aux_at += aux.vna_next as usize;
                }
                if vn.vn_next == 0 {
                    break;
                }
                at += vn.vn_next as usize;
            }
        }
        if let Some((mut at, count)) = t.verdef {
            for _ in 0..count.min(MAX_VERSIONS) {
                let Some(vd) = img.read::<Verdef>(at) else {
                    break;
                };
                if let Some(aux) = img.read::<Verdaux>(at + vd.vd_aux as usize) {
                    push(buf, (vd.vd_ndx & 0x7fff, aux.vda_name), fixed)?;
                }
                if vd.vd_next == 0 {
                    break;
                }
                at += vd.vd_next as usize;
            }
        }
        Ok(VersionNames { names: buf })
    }

    /// Indexes 0 and 1 mean local / unversioned global. The first record of `index` whose
    /// name can be read.
    pub(crate) fn name_of<'a>(
        &self,
        img: &Image<'a>,
        t: &DynamicTables,
        index: u16,
    ) -> Option<&'a [u8]> {
        if index < 2 {
            return None;
        }
        self.names
            .iter()
            .filter(|(i, _)| *i == index)
            .find_map(|&(_, name)| t.string(img, name as usize))
    }
}
