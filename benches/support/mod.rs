//! What the loader benchmarks share: a process that looks like a big host (N small libraries,
//! each calling the CUDA stream-ordered pair through its own GOT, plus optionally thousands of
//! extra memory mappings), the `dlopen` caller fixture, and the statistics printed.
//!
//! The libraries are generated at bench time: one `cc` compile of a tiny source, linked against
//! the fake `libcuda.so.1` fixture, then copied N times (each copy is a distinct object to the
//! loader: another path and inode). They live in `target/<profile>/bench-libs/`.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Command-line options: `--objects N` (default 50), `--maps M` extra anonymous mappings
/// (default 0), `--rounds R` (default 15), `--new K` objects one `dlopen` adds (default 1: the
/// library alone; K > 1: it brings K - 1 new dependencies).
pub struct Options {
    pub objects: usize,
    pub maps: usize,
    pub rounds: usize,
    pub new: usize,
    /// Remaining arguments (e.g. `--child`).
    pub rest: Vec<String>,
}

impl Options {
    pub fn parse() -> Options {
        let mut o = Options {
            objects: 50,
            maps: 0,
            rounds: 15,
            new: 1,
            rest: Vec::new(),
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut num = |what: &str| -> usize {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{what} needs a number"))
            };
            match a.as_str() {
                "--objects" => o.objects = num("--objects"),
                "--maps" => o.maps = num("--maps"),
                "--rounds" => o.rounds = num("--rounds"),
                "--new" => o.new = num("--new").max(1),
                "--bench" => {}
                _ => o.rest.push(a),
            }
        }
        o
    }
}

const SOURCE: &str = r#"
typedef unsigned long long CUdeviceptr;
typedef int CUresult;
typedef void *CUstream;
CUresult cuMemAllocAsync(CUdeviceptr *dptr, unsigned long bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
__attribute__((visibility("default"))) int bench_pair(void) {
    CUdeviceptr p;
    if (cuMemAllocAsync(&p, 64, 0)) return -1;
    return cuMemFreeAsync(p, 0);
}
#ifdef BENCH_DEP
/* A dependency's own export (every library exports names of its own). */
__attribute__((visibility("default"))) int BENCH_DEP(void) { return 0; }
#endif
"#;

fn fixtures() -> PathBuf {
    PathBuf::from(cuhook_fixtures::DIR)
}

fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<bench> → target/<profile>/bench-libs
    exe.parent()
        .and_then(Path::parent)
        .expect("bench executable inside target/<profile>/deps")
        .join("bench-libs")
}

/// Paths of `count` distinct copies of the bench library (built once, copied as needed).
pub fn libraries(count: usize) -> Vec<PathBuf> {
    let dir = lib_dir();
    std::fs::create_dir_all(&dir).expect("create bench-libs");
    let proto = dir.join("libbench_proto.so");
    let src = dir.join("bench_lib.c");
    let stale = std::fs::read_to_string(&src).ok().as_deref() != Some(SOURCE);
    if stale || !proto.exists() {
        std::fs::write(&src, SOURCE).expect("write bench source");
        let fx = fixtures();
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O1", "-shared", "-fPIC", "-o"])
            .arg(&proto)
            .arg(&src)
            .arg(format!("-L{}", fx.display()))
            .arg("-l:libcuda.so.1")
            .arg(format!("-Wl,-rpath,{}", fx.display()))
            .status()
            .expect("run cc");
        assert!(status.success(), "cc failed building the bench library");
        // Copies of an older prototype are stale.
        for e in std::fs::read_dir(&dir).expect("read bench-libs").flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("libbench_") && e.path() != proto {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    (0..count)
        .map(|i| {
            let p = dir.join(format!("libbench_{i}.so"));
            if !p.exists() {
                std::fs::copy(&proto, &p).expect("copy bench library");
            }
            p
        })
        .collect()
}

/// A library that brings `count - 1` new dependencies of its own when opened (`count` objects
/// in all; the bench library, each dependency with one export of its own as real libraries
/// have, named `libbench_dep<count>_<j>.so` and found through the top library's `$ORIGIN` run
/// path). Built once per count.
pub fn group(count: usize) -> PathBuf {
    let dir = lib_dir();
    let source = libraries(1).remove(0).with_file_name("bench_lib.c");
    let top = dir.join(format!("libbench_top{count}.so"));
    if top.exists() {
        return top;
    }
    let fx = fixtures();
    let compile = |out: &Path, extra: &[String]| {
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O1", "-shared", "-fPIC", "-o"])
            .arg(out)
            .arg(&source)
            .args(extra)
            .arg(format!("-L{}", fx.display()))
            .arg("-l:libcuda.so.1")
            .arg(format!("-Wl,-rpath,{}", fx.display()))
            .status()
            .expect("run cc");
        assert!(status.success(), "cc failed building {}", out.display());
    };
    let mut needed = vec![format!("-L{}", dir.display()), "-Wl,--no-as-needed".into()];
    for j in 1..count {
        let name = format!("libbench_dep{count}_{j}.so");
        compile(
            &dir.join(&name),
            &[format!("-DBENCH_DEP=bench_dep{count}_{j}")],
        );
        needed.push(format!("-l:{name}"));
    }
    needed.push("-Wl,-rpath,$ORIGIN".into());
    compile(&top, &needed);
    top
}

/// `dlopen` every path (plain, from the bench executable, `RTLD_NOW | RTLD_LOCAL`); the
/// handles are kept for the life of the process.
pub fn load_all(paths: &[PathBuf]) {
    for p in paths {
        let c = CString::new(p.to_str().expect("utf-8 path")).unwrap();
        // SAFETY: loading a library we just built; it has no constructors.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {} failed", p.display());
    }
}

/// Add `count` one-page anonymous mappings that the kernel cannot merge (alternating
/// protections), kept for the life of the process.
pub fn add_mappings(count: usize) {
    let page = 4096;
    for i in 0..count {
        let prot = if i % 2 == 0 {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
    }
}

/// Number of mappings of this process (lines of `/proc/self/maps`), for the report.
pub fn mapping_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Number of objects the loader lists.
pub fn object_count() -> usize {
    unsafe extern "C" fn count(_: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `usize` passed below.
        unsafe { *data.cast::<usize>() += 1 };
        0
    }
    let mut n = 0usize;
    // SAFETY: the callback matches dl_iterate_phdr's contract; `n` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(count), (&mut n as *mut usize).cast()) };
    n
}

type Open = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type Close = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `dlopen`/`dlclose` called from the fixture `libdlcaller.so`, an object cuhook patches (it
/// never patches its own object, which is this benchmark).
pub struct Caller {
    pub open: Open,
    pub close: Close,
}

pub fn caller() -> Caller {
    let path = CString::new(format!("{}/libdlcaller.so", fixtures().display())).unwrap();
    // SAFETY: loading a fixture library built by build.rs and looking up its two functions.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(
            !h.is_null(),
            "libdlcaller.so missing: build the fixtures first"
        );
        let open = libc::dlsym(h, c"dlcaller_open".as_ptr());
        let close = libc::dlsym(h, c"dlcaller_close".as_ptr());
        Caller {
            open: std::mem::transmute::<*mut c_void, Open>(open),
            close: std::mem::transmute::<*mut c_void, Close>(close),
        }
    }
}

static REAL_ALLOC: AtomicUsize = AtomicUsize::new(0);
static REAL_FREE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn alloc_async(p: *mut u64, size: usize, stream: *mut c_void) -> c_int {
    // SAFETY: the engine published the real cuMemAllocAsync before routing calls here.
    let real: extern "C" fn(*mut u64, usize, *mut c_void) -> c_int =
        unsafe { std::mem::transmute(REAL_ALLOC.load(Ordering::Acquire)) };
    real(p, size, stream)
}

extern "C" fn free_async(p: u64, stream: *mut c_void) -> c_int {
    // SAFETY: as above, for cuMemFreeAsync.
    let real: extern "C" fn(u64, *mut c_void) -> c_int =
        unsafe { std::mem::transmute(REAL_FREE.load(Ordering::Acquire)) };
    real(p, stream)
}

/// The hook set the benches install: a set of the stream-ordered pair the bench libraries
/// import; with `BENCH_SET=cuda`, cuhook's own CUDA set (every hooked name, ≈ 80: what an
/// install in a real process looks for in each object).
pub fn hook_set() -> cuhook::hooks::HookSet {
    use cuhook::hooks::{Hook, HookSet};
    if std::env::var_os("BENCH_SET").is_some_and(|s| s == "cuda") {
        return cuhook::cuda::hook_set().unwrap();
    }
    let hooks = vec![
        Hook::new(
            "cuMemAllocAsync",
            alloc_async as *const () as usize,
            &REAL_ALLOC,
        )
        .unwrap(),
        Hook::new(
            "cuMemFreeAsync",
            free_async as *const () as usize,
            &REAL_FREE,
        )
        .unwrap(),
    ];
    HookSet::new("bench", hooks).unwrap()
}

/// This thread's CPU time in seconds: unlike the wall clock it leaves out time spent
/// preempted by other jobs on a shared machine (kernel time on our behalf is included).
pub fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// This thread's minor page faults so far (fresh memory touched for the first time).
pub fn minor_faults() -> i64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    u.ru_minflt
}

/// Median, minimum and maximum of some samples.
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub fn summary(samples: &[f64]) -> Summary {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Summary {
        median,
        min: v[0],
        max: v[n - 1],
    }
}

/// `name: median (min–max) unit`.
pub fn show(s: &Summary, unit: &str) -> String {
    format!("{:.1} ({:.1}–{:.1}) {unit}", s.median, s.min, s.max)
}
