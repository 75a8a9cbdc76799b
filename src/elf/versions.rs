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

/// Upper bound on version records kept, in all (guards against corrupt chains: bounding each
/// level alone would allow 4,096 × 4,096 records).
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
            'needed: for _ in 0..count.min(MAX_VERSIONS) {
                let Some(vn) = img.read::<Verneed>(at) else {
                    break;
                };
                let mut aux_at = at + vn.vn_aux as usize;
                for _ in 0..vn.vn_cnt {
                    if buf.len() >= MAX_VERSIONS {
                        break 'needed;
                    }
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
                if buf.len() >= MAX_VERSIONS {
                    break;
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::LoadedObject;
    use libc::{Elf64_Phdr, PF_R, PT_LOAD};

    /// A corrupt `DT_VERNEED` whose every record claims 4,096 entries after it, each pointing
    /// on to the next 16 bytes: the records kept stay bounded in all (before, 16.7 million,
    /// 134 MB, from 128 KiB of input).
    #[test]
    fn corrupt_version_chains_keep_a_bounded_number_of_records() {
        // One 16-byte pattern read both as Verneed (version 1, count 4,096, aux 16, next 16)
        // and as Vernaux (name 16, next 16).
        let mut record = [0u8; 16];
        record[0..2].copy_from_slice(&1u16.to_le_bytes());
        record[2..4].copy_from_slice(&4096u16.to_le_bytes());
        record[8..12].copy_from_slice(&16u32.to_le_bytes());
        record[12..16].copy_from_slice(&16u32.to_le_bytes());
        let bytes: Vec<u8> = record.iter().copied().cycle().take(160 << 10).collect();
        let start = bytes.as_ptr() as usize;
        let obj = LoadedObject {
            base: 0,
            name: "corrupt-versions".into(),
            phdrs: vec![Elf64_Phdr {
                p_type: PT_LOAD,
                p_flags: PF_R,
                p_offset: 0,
                p_vaddr: start as u64,
                p_paddr: start as u64,
                p_filesz: bytes.len() as u64,
                p_memsz: bytes.len() as u64,
                p_align: 1,
            }],
            position: LoadedObject::UNKNOWN_POSITION,
        };
        let img = Image::new(&obj);
        let t = DynamicTables {
            verneed: Some((start, 4096)),
            ..Default::default()
        };
        let mut buf = Vec::new();
        let names = VersionNames::read(&img, &t, &mut buf, false).unwrap();
        assert_eq!(names.names.len(), MAX_VERSIONS);
    }
}
