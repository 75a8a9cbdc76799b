use std::collections::BTreeMap;
use std::ffi::CString;

use super::container::{self, Codec, Kind, FATBIN_MAGIC, HEADER};
use super::*;

/// nvcc 13.0 builds of `fixtures/fatbin/managed.cu` (README there).
const DEFAULT: &[u8] = include_bytes!("../../../fixtures/fatbin/m_default.fatbin");
const SIZE: &[u8] = include_bytes!("../../../fixtures/fatbin/m_size.fatbin");
const NONE: &[u8] = include_bytes!("../../../fixtures/fatbin/m_none.fatbin");
const MULTI: &[u8] = include_bytes!("../../../fixtures/fatbin/m_multi.fatbin");

/// The containers of a `.nv_fatbin` section (zero padding may sit between them).
fn containers(section: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER <= section.len() {
        match container::container_len(&section[at..]) {
            Some(n) => {
                out.push(&section[at..at + n]);
                at += n;
            }
            None => at += 8,
        }
    }
    out
}

fn found(image: Image<'_>) -> (bool, BTreeMap<String, usize>) {
    found_with(image, ManagedScan::All)
}

fn found_with(image: Image<'_>, scan: ManagedScan) -> (bool, BTreeMap<String, usize>) {
    let mut names = BTreeMap::new();
    let ok = managed_variables(image, scan, &mut |n, size| {
        names.insert(n.to_string_lossy().into_owned(), size);
    });
    (ok, names)
}

fn expected(with_sizes: bool) -> BTreeMap<String, usize> {
    let size = |n| if with_sizes { n } else { 0 };
    BTreeMap::from([("m_other".into(), size(8)), ("m_shared".into(), size(128))])
}

#[test]
fn every_nvcc_build_yields_the_two_managed_variables() {
    for (name, section) in [
        ("default", DEFAULT),
        ("size", SIZE),
        ("none", NONE),
        ("multi", MULTI),
    ] {
        let c = containers(section);
        assert_eq!(c.len(), 2, "{name}: containers");
        // The runtime's own container: device code without managed variables.
        assert_eq!(
            found(Image::Fatbin(c[0])),
            (true, BTreeMap::new()),
            "{name}"
        );
        // The device variable `d_counter` is not managed, so it is not among them.
        assert_eq!(found(Image::Fatbin(c[1])), (true, expected(true)), "{name}");
    }
}

#[test]
fn the_fixtures_hold_what_their_readme_says() {
    let codecs = |s| {
        let c = containers(s)[1];
        container::entries(c)
            .map(|e| (e.kind, e.codec))
            .collect::<Vec<_>>()
    };
    use Codec::*;
    use Kind::*;
    assert_eq!(codecs(DEFAULT), [(Cubin, Stored), (Ptx, Zstd)]);
    assert_eq!(codecs(SIZE), [(Cubin, Zstd), (Ptx, Zstd)]);
    assert_eq!(codecs(NONE), [(Cubin, Stored), (Ptx, Stored)]);
    assert_eq!(
        codecs(MULTI),
        [(Cubin, Stored), (Cubin, Stored), (Ptx, Zstd)]
    );
}

#[test]
fn a_compressed_cubin_decodes_to_the_stored_one() {
    let e = container::entries(containers(SIZE)[1])
        .find(|e| e.kind == Kind::Cubin)
        .unwrap();
    assert_eq!(e.codec, Codec::Zstd);
    let mut scratch = Vec::new();
    let zstd = decode::decoded(&e, &mut scratch).unwrap();
    assert_eq!(zstd, payload_of(NONE, Kind::Cubin));
}

/// A container of the given entries (kind, flags, stored bytes, decoded size).
fn build(entries: &[(u16, u64, &[u8], usize)]) -> Vec<u8> {
    let mut body = Vec::new();
    for &(kind, flags, payload, size) in entries {
        let stored = payload.len().next_multiple_of(8);
        let mut h = [0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..16].copy_from_slice(&(stored as u64).to_le_bytes());
        if flags != 0 {
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[56..64].copy_from_slice(&(size as u64).to_le_bytes());
        }
        h[40..48].copy_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&h);
        body.extend_from_slice(payload);
        body.resize(body.len() + stored - payload.len(), 0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(HEADER as u16).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn payload_of(section: &[u8], kind: Kind) -> Vec<u8> {
    let c = containers(section)[1];
    let e = container::entries(c).find(|e| e.kind == kind).unwrap();
    let mut scratch = Vec::new();
    decode::decoded(&e, &mut scratch).unwrap().to_vec()
}

#[test]
fn lz4_compressed_cubins_are_read() {
    let cubin = payload_of(NONE, Kind::Cubin);
    let packed = lz4_flex::block::compress(&cubin);
    let c = build(&[(2, 0x2011, &packed, cubin.len())]);
    assert_eq!(container::entries(&c).next().unwrap().codec, Codec::Lz4);
    assert_eq!(found(Image::Fatbin(&c)), (true, expected(true)));
}

#[test]
fn ptx_is_read_when_no_cubin_is() {
    let ptx = payload_of(NONE, Kind::Ptx);
    // Stored PTX, and the zstd-compressed PTX nvcc wrote by default.
    let zstd = containers(DEFAULT)[1];
    let e = container::entries(zstd)
        .find(|e| e.kind == Kind::Ptx)
        .unwrap();
    for c in [
        build(&[(1, 0x11, &ptx, ptx.len())]),
        build(&[(1, 0x8011, e.payload, e.size)]),
    ] {
        assert_eq!(found(Image::Fatbin(&c)), (true, expected(false)));
    }
    // A cubin that does not decode (garbage under the zstd flag) falls back to the PTX.
    let c = build(&[(2, 0x8011, b"not zstd", 4096), (1, 0x11, &ptx, ptx.len())]);
    assert_eq!(found(Image::Fatbin(&c)), (true, expected(false)));
    // Nothing readable at all.
    let c = build(&[(2, 0x8011, b"not zstd", 4096)]);
    assert_eq!(found(Image::Fatbin(&c)), (false, BTreeMap::new()));
}

#[test]
fn ptx_declarations_are_told_apart() {
    let text = b".version 8.0\n.target sm_90\n.address_size 64\n\
        .visible .global .attribute(.managed) .align 4 .b8 arr[256];\n\
        .global .attribute(.managed) .align 8 .u64 with_init = 7;\n\
        .extern .global .attribute(.managed) .align 4 .u32 elsewhere;\n\
        .global .align 4 .u32 plain;\n\
        .visible .global .attribute(.managed) .align 4 .u32 _ZN2ns5countE;";
    let (ok, names) = found(Image::Ptx(text));
    assert!(ok);
    let names: Vec<_> = names.into_keys().collect();
    assert_eq!(names, ["_ZN2ns5countE", "arr", "with_init"]);
}

/// `image_at` for a test's own bytes.
fn image<'a>(p: *const u8, _alive: &'a [u8]) -> Option<Image<'a>> {
    // SAFETY: each test passes one of the image kinds, whose bytes `_alive` keeps alive.
    unsafe { image_at(p) }
}

#[test]
fn images_are_recognised_from_their_first_bytes() {
    let c = containers(NONE)[1].to_vec();
    let fatbin = image(c.as_ptr(), &c);
    assert!(matches!(fatbin, Some(Image::Fatbin(b)) if b.len() == c.len()));
    // nvcc's wrapper: magic, version, the container's address, a file name pointer.
    let mut wrapper = Vec::new();
    wrapper.extend_from_slice(&0x4662_43B1u32.to_le_bytes());
    wrapper.extend_from_slice(&1u32.to_le_bytes());
    wrapper.extend_from_slice(&(c.as_ptr() as usize).to_le_bytes());
    wrapper.extend_from_slice(&0usize.to_le_bytes());
    let wrapped = image(wrapper.as_ptr(), &c);
    assert!(matches!(wrapped, Some(Image::Fatbin(b)) if b.as_ptr() == c.as_ptr()));
    // A cubin: the view covers the headers and tables the scan reads, not more than the object.
    let cubin = payload_of(NONE, Kind::Cubin);
    match image(cubin.as_ptr(), &cubin) {
        Some(Image::Cubin(b)) => {
            assert!(b.len() <= cubin.len());
            assert_eq!(found(Image::Cubin(b)), (true, expected(true)));
        }
        other => panic!("cubin read as {other:?}"),
    }
    let ptx = CString::new(
        payload_of(NONE, Kind::Ptx)
            .split(|&b| b == 0)
            .next()
            .unwrap(),
    )
    .unwrap();
    match image(ptx.as_ptr().cast(), ptx.as_bytes()) {
        Some(Image::Ptx(t)) => assert_eq!(t, ptx.as_bytes()),
        other => panic!("PTX read as {other:?}"),
    }
    assert!(image(c"ab".as_ptr().cast(), b"ab").is_none());
    assert!(image(std::ptr::null(), b"").is_none());
}

/// Damaged containers never panic or read out of bounds: every byte of the compressed and the
/// stored fixture flipped in turn, and cut at every length.
#[test]
fn damaged_containers_are_survived() {
    for section in [SIZE, NONE] {
        let c = containers(section)[1];
        for i in 0..c.len() {
            let mut bad = c.to_vec();
            bad[i] ^= 0xff;
            found(Image::Fatbin(&bad));
            found(Image::Fatbin(&c[..i]));
        }
    }
    // Several bytes at once, seeded: headers whose sizes and offsets point anywhere.
    let mut rng = fastrand::Rng::with_seed(0x0c0d_e5ca);
    let mut damaged = |good: &[u8]| {
        let mut bad = good.to_vec();
        for _ in 0..rng.usize(1..8) {
            let i = rng.usize(..bad.len());
            bad[i] = rng.u8(..);
        }
        bad
    };
    for section in [SIZE, NONE, DEFAULT] {
        let c = containers(section)[1];
        for _ in 0..2_000 {
            found(Image::Fatbin(&damaged(c)));
        }
    }
    let cubin = payload_of(NONE, Kind::Cubin);
    for _ in 0..2_000 {
        found(Image::Cubin(&damaged(&cubin)));
    }
    for i in 0..cubin.len() {
        let mut bad = cubin.clone();
        bad[i] = bad[i].wrapping_add(0x41);
        found(Image::Cubin(&bad));
        found(Image::Cubin(&cubin[..i]));
    }
}

#[test]
fn the_scan_setting_limits_what_is_decoded() {
    let stored = containers(DEFAULT)[1];
    let compressed = containers(SIZE)[1];
    use ManagedScan::*;
    let (nothing, both) = ((false, BTreeMap::new()), (true, expected(true)));
    // Only compressed device code under `Stored`: nothing read.
    for (image, scan, want) in [
        (stored, Stored, &both),
        (compressed, Stored, &nothing),
        (compressed, All, &both),
        (stored, Off, &nothing),
    ] {
        assert_eq!(&found_with(Image::Fatbin(image), scan), want, "{scan:?}");
    }
    assert_eq!(ManagedScan::parse(" stored "), Some(Stored));
    assert_eq!(ManagedScan::parse("some"), None);
}
