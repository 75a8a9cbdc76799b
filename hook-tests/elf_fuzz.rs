//! Property test of the ELF readers (`cuhook::elf`: dynamic section, relocations, symbol
//! versions, hash tables) over mutated and arbitrary bytes: no panic, no read outside what the
//! object declares readable (the harness maps the input with nothing readable around it, so such
//! a read faults and fails the run). The `cargo fuzz` target in fuzz/ runs the same harness
//! under coverage guidance.
//!
//! Short by default (part of `cargo test --release`). Longer:
//! `CUHOOK_FUZZ_SECS=600 cargo test --test elf_fuzz` (a debug build: integer overflow panics
//! too). A failing case is replayed with the `CUHOOK_FUZZ_SEED` and `CUHOOK_FUZZ_CASE` it
//! prints (or, after a fault, finds in `target/tmp/elf_fuzz.last`).

mod common;
#[path = "elf_fuzz/image.rs"]
mod image;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Cases of a default run (about 8 s on a loaded 2-core machine)...
const DEFAULT_CASES: u64 = 20_000;
/// ...or fewer, if they take longer than this (an emulated run).
const DEFAULT_SECS: u64 = 15;

/// Seeded choices (fastrand: reproducible from the seed a failure prints).
struct Rng(fastrand::Rng);

impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.0.usize(..n)
        }
    }
    /// A value a corrupt table might hold: small, near a power of two, huge, or anything.
    fn interesting(&mut self, near: u64) -> u64 {
        match self.below(8) {
            0 => 0,
            1 => u64::MAX - self.below(16) as u64,
            2 => 1u64 << self.below(64),
            3 => near.wrapping_add(self.below(64) as u64).wrapping_sub(32),
            4 => self.below(256) as u64,
            5 => u32::MAX as u64 - self.below(16) as u64,
            6 => (1u64 << 63).wrapping_add(self.below(4096) as u64),
            _ => self.next(),
        }
    }
}

/// Real objects to start from: every fixture (executables and libraries of several link
/// modes, with and without symbol versions) and two system libraries.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(common::fixtures_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    for lib in ["libc.so.6", "libm.so.6"] {
        paths.push(PathBuf::from("/lib/x86_64-linux-gnu").join(lib));
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            (bytes.starts_with(b"\x7fELF") && image::map(&bytes).is_some())
                .then(|| (p.display().to_string(), bytes))
        })
        .collect()
}

/// File offsets of the dynamic section and of the tables its entries point at (by virtual
/// address, through the `PT_LOAD` that maps it): where mutations hurt most.
fn hot_spots(data: &[u8]) -> Vec<(usize, usize)> {
    let phdrs = image::program_headers(data);
    let to_offset = |vaddr: u64| {
        phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD)
            .find(|p| vaddr >= p.p_vaddr && vaddr < p.p_vaddr.saturating_add(p.p_filesz))
            .map(|p| (vaddr - p.p_vaddr + p.p_offset) as usize)
    };
    let mut spots = Vec::new();
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
        return spots;
    };
    let (off, len) = (dynamic.p_offset as usize, dynamic.p_filesz as usize);
    spots.push((off, len));
    for i in 0..len / 16 {
        let at = off + i * 16;
        let Some(entry) = data.get(at..at + 16) else {
            break;
        };
        let tag = u64::from_le_bytes(entry[..8].try_into().unwrap());
        let val = u64::from_le_bytes(entry[8..].try_into().unwrap());
        // The d_ptr tags: tables the readers walk.
        if matches!(
            tag,
            4 | 5 | 6 | 7 | 17 | 23 | 0x6fff_fef5 | 0x6fff_fff0 | 0x6fff_fffc | 0x6fff_fffe
        ) {
            if let Some(o) = to_offset(val) {
                spots.push((o, 512));
            }
        }
    }
    spots
}

const DT_TAGS: [u64; 24] = [
    0,
    1,
    2,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
    17,
    18,
    19,
    20,
    23,
    26,
    27,
    0x6fff_fef5,
    0x6fff_fff0,
    0x6fff_fffc,
    0x6fff_fffd,
    0x6fff_fffe,
];

/// One mutated input from `seed`.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    let spots = hot_spots(&d);
    for _ in 0..1 + rng.below(12) {
        let (off, len) = if !spots.is_empty() && rng.below(4) != 0 {
            spots[rng.below(spots.len())]
        } else {
            (0, d.len())
        };
        let at = off + rng.below(len.max(1));
        match rng.below(7) {
            // A word of a table or of the dynamic section.
            0 | 1 => {
                let at = at & !7;
                if let Some(w) = d.get_mut(at..at + 8) {
                    let old = u64::from_le_bytes(w.try_into().unwrap());
                    w.copy_from_slice(&rng.interesting(old).to_le_bytes());
                }
            }
            // A 32-bit field (hash buckets, chains, version records, st_name).
            2 => {
                let at = at & !3;
                if let Some(w) = d.get_mut(at..at + 4) {
                    let old = u32::from_le_bytes(w.try_into().unwrap()) as u64;
                    w.copy_from_slice(&(rng.interesting(old) as u32).to_le_bytes());
                }
            }
            // A dynamic tag turned into another.
            3 if !spots.is_empty() => {
                let at = spots[0].0 + 16 * rng.below(spots[0].1 / 16 + 1);
                if let Some(w) = d.get_mut(at..at + 8) {
                    w.copy_from_slice(&DT_TAGS[rng.below(DT_TAGS.len())].to_le_bytes());
                }
            }
            // A byte.
            4 => {
                if let Some(b) = d.get_mut(at) {
                    *b = rng.next() as u8;
                }
            }
            // A program header field (flags, addresses, sizes).
            5 => {
                let phoff = u64::from_le_bytes(d[32..40].try_into().unwrap()) as usize;
                let phnum = u16::from_le_bytes(d[56..58].try_into().unwrap()) as usize;
                let field = phoff
                    .wrapping_add(56 * rng.below(phnum.max(1)))
                    .wrapping_add([4, 16, 32, 40][rng.below(4)]);
                let width = if field % 8 == 4 { 4 } else { 8 };
                if let Some(w) = d.get_mut(field..field.saturating_add(width)) {
                    let old = w.iter().rev().fold(0u64, |a, &b| a << 8 | b as u64);
                    let v = rng.interesting(old).to_le_bytes();
                    w.copy_from_slice(&v[..width]);
                }
            }
            // Cut short.
            _ => {
                let keep = 64 + rng.below(d.len().saturating_sub(64));
                d.truncate(keep);
            }
        }
    }
    d
}

/// Arbitrary bytes behind an ELF header with one readable `PT_LOAD` over all of them and a
/// `PT_DYNAMIC` somewhere inside: the readers see garbage tables.
fn random_object(rng: &mut Rng) -> Vec<u8> {
    let len = 256 + rng.below(16 << 10);
    let mut d: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    // Small values make many d_ptr readings land inside the object.
    if rng.below(2) == 0 {
        for b in d.iter_mut().skip(176).step_by(2) {
            *b &= 0x0f;
        }
    }
    d[..4].copy_from_slice(b"\x7fELF");
    d[32..40].copy_from_slice(&64u64.to_le_bytes());
    d[54..56].copy_from_slice(&56u16.to_le_bytes());
    d[56..58].copy_from_slice(&2u16.to_le_bytes());
    let phdr = |d: &mut Vec<u8>, at: usize, p_type: u32, flags: u32, off: u64, size: u64| {
        d[at..at + 4].copy_from_slice(&p_type.to_le_bytes());
        d[at + 4..at + 8].copy_from_slice(&flags.to_le_bytes());
        d[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
        d[at + 16..at + 24].copy_from_slice(&off.to_le_bytes());
        d[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        d[at + 40..at + 48].copy_from_slice(&size.to_le_bytes());
    };
    let flags = if rng.below(8) == 0 { 6 } else { 4 };
    phdr(&mut d, 64, libc::PT_LOAD, flags, 0, len as u64);
    let dyn_at = 176 + rng.below(len - 176) as u64;
    phdr(&mut d, 120, libc::PT_DYNAMIC, 6, dyn_at, 16 * 32);
    d
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| {
        v.strip_prefix("0x")
            .map_or_else(|| v.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
    })
}

/// A case runs in milliseconds (under qemu, a tenth of a second); one that has used this much
/// CPU is a reader that loops, or walks a corrupt count of billions, and fails the run with its
/// replay line instead of stalling it. CPU time, not wall time: a starved run (`nice`, a loaded
/// machine) must not trip it.
const CASE_CPU_LIMIT: Duration = Duration::from_secs(10);
/// A case that neither ends nor uses CPU for this long waits on something: also a hang.
const CASE_WALL_LIMIT: Duration = Duration::from_secs(300);

/// CPU time of the whole process (the fuzzing thread; the watchdog sleeps).
fn process_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A thread told each case as it starts; when one has run past [`CASE_CPU_LIMIT`] of CPU or
/// [`CASE_WALL_LIMIT`], it names it and aborts the process. It ends when the sender is dropped.
fn watchdog(seed: u64) -> std::sync::mpsc::Sender<u64> {
    use std::sync::mpsc::RecvTimeoutError;
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    std::thread::spawn(move || {
        let mut running: Option<(u64, Duration, Instant)> = None;
        loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(case) => running = Some((case, process_cpu(), Instant::now())),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let Some((case, cpu, wall)) = running else {
                        continue;
                    };
                    let (cpu, wall) = (process_cpu() - cpu, wall.elapsed());
                    if cpu > CASE_CPU_LIMIT || wall > CASE_WALL_LIMIT {
                        // Straight to the descriptor: the test harness captures `eprintln!`
                        // (in this thread too) and would lose it in the abort.
                        use std::io::Write;
                        let _ = writeln!(
                            std::io::stderr(),
                            "elf_fuzz: a case ran {:.1} s of CPU, {:.1} s in all (a reader \
                             loops?): replay with CUHOOK_FUZZ_SEED={seed:#x} CUHOOK_FUZZ_CASE={case}",
                            cpu.as_secs_f64(),
                            wall.as_secs_f64()
                        );
                        std::process::abort();
                    }
                }
            }
        }
    });
    tx
}

#[test]
fn elf_readers_survive_mutated_and_arbitrary_objects() {
    let seeds = seeds();
    assert!(seeds.len() >= 20, "only {} seed objects", seeds.len());
    let seed = env_u64("CUHOOK_FUZZ_SEED").unwrap_or(0xc0ffee);
    let only = env_u64("CUHOOK_FUZZ_CASE");
    // A default run stops at whichever limit comes first (an emulated run gets fewer cases).
    let (cases, secs) = match (env_u64("CUHOOK_FUZZ_CASES"), env_u64("CUHOOK_FUZZ_SECS")) {
        (Some(cases), secs) => (cases, secs),
        (None, Some(secs)) => (u64::MAX, Some(secs)),
        (None, None) => (DEFAULT_CASES, Some(DEFAULT_SECS)),
    };
    let deadline = secs.map(|s| Instant::now() + Duration::from_secs(s));
    let last = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("elf_fuzz.last");
    let start = Instant::now();
    let (mut dynamic, mut symtab, mut slots, mut versioned, mut defined) = (0, 0, 0, 0, 0);
    let mut ran = 0u64;
    let watchdog = watchdog(seed);
    for case in only.map_or(0..cases, |c| c..c + 1) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        watchdog.send(case).unwrap();
        let mut rng = Rng::seeded(seed ^ case.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let input = if rng.below(10) == 0 {
            random_object(&mut rng)
        } else {
            let (_, bytes) = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, bytes)
        };
        if case % 64 == 0 || only.is_some() {
            let _ = std::fs::write(
                &last,
                format!("CUHOOK_FUZZ_SEED={seed:#x} CUHOOK_FUZZ_CASE={case} (or up to 63 after)\n"),
            );
        }
        let r = std::panic::catch_unwind(|| image::check(&input));
        let r = r.unwrap_or_else(|_| {
            panic!("case failed: replay with CUHOOK_FUZZ_SEED={seed:#x} CUHOOK_FUZZ_CASE={case}")
        });
        ran += 1;
        dynamic += r.dynamic as u64;
        symtab += r.symtab as u64;
        slots += (r.slots > 0) as u64;
        versioned += (r.versioned > 0) as u64;
        defined += (r.defined > 0) as u64;
    }
    eprintln!(
        "elf_fuzz: seed {seed:#x}, {ran} cases in {:.1} s; reached a dynamic section {dynamic}, \
         a symbol table {symtab}, slots {slots}, versioned slots {versioned}, a defined symbol {defined}",
        start.elapsed().as_secs_f64()
    );
    if only.is_none() && ran >= 1000 {
        // The generator must reach every reader, or the run proves little.
        for (what, n) in [
            ("dynamic", dynamic),
            ("symtab", symtab),
            ("slots", slots),
            ("versioned", versioned),
            ("defined", defined),
        ] {
            assert!(n * 20 >= ran, "only {n} of {ran} cases reached {what}");
        }
    }
}
