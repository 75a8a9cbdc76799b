//! A registration cache for GPU buffers in Rust — the same cache as `examples/regcache/regcache.c`.
//!
//! The send path asks cuhook which allocation a buffer belongs to ([`cuhook::lookup_span`]: a
//! registry lookup, no driver call) and registers that whole allocation once; cuhook's free event
//! drops the registration before the driver releases the memory, so an allocation that later
//! gets the same address is never sent through a stale registration.
//!
//! Run it, with no GPU, on cuhook's fake driver: `scripts/run-example.sh regcache`. On a machine
//! with CUDA 13: `cargo run --release --example regcache` (another runtime:
//! `CUDART=libcudart.so.12 cargo run --release --example regcache`). The test suite runs it
//! (hook-tests/examples.rs).

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::Mutex;

use cuhook::events::{mask, MemEvent, MemType};

/// One registration: the allocation it covers and what the NIC handed back for it.
#[derive(Debug, Clone, Copy)]
struct Registration {
    size: usize,
    /// The allocation's identity: a reused address gets a new `seq`.
    seq: u64,
    key: u32,
}

/// Registrations by start address, plus counters.
#[derive(Default)]
struct Cache {
    by_start: HashMap<usize, Registration>,
    next_key: u32,
    hits: u32,
    misses: u32,
    invalidations: u32,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn with_cache<T>(f: impl FnOnce(&mut Cache) -> T) -> T {
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(Cache::default))
}

/// Runs on the freeing thread before the memory goes back to the driver: drop every
/// registration the freed range overlaps (it must not call CUDA).
fn on_free(ev: &MemEvent) {
    let (lo, hi) = (ev.range.start, ev.range.start + ev.range.size.max(1));
    with_cache(|c| {
        let before = c.by_start.len();
        c.by_start
            .retain(|&start, r| !(start < hi && lo < start + r.size));
        c.invalidations += (before - c.by_start.len()) as u32;
    });
}

/// The send path: the key of a registration covering `[buf, buf+len)`, registering the whole
/// allocation on first use; `None` when the range is not entirely GPU memory (send by copy).
fn registration_key(buf: usize, len: usize) -> Option<u32> {
    let a = cuhook::lookup_span(buf, len).filter(|a| a.mem_type == MemType::Cuda)?;
    Some(with_cache(|c| match c.by_start.get(&a.start) {
        Some(r) if r.seq == a.seq => {
            c.hits += 1;
            r.key
        }
        _ => {
            c.misses += 1;
            c.next_key += 1; // ibv_reg_mr(a.start, a.size) would go here
            let r = Registration {
                size: a.size,
                seq: a.seq,
                key: c.next_key,
            };
            c.by_start.insert(a.start, r);
            r.key
        }
    }))
}

/// The CUDA runtime calls this example makes. cuhook never patches the object it is linked
/// into, so a Rust program sees the allocations of the libraries it loads (the CUDA runtime,
/// libtorch, ...), here the runtime's, whose calls into the driver cuhook hooks.
struct Runtime {
    malloc: MallocFn,
    free: FreeFn,
}

/// `cudaMalloc`.
type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
/// `cudaFree`.
type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;

impl Runtime {
    /// Load the CUDA runtime (`libcudart.so.13`, or the name in `$CUDART`).
    fn load() -> Result<Runtime, String> {
        let name = std::env::var("CUDART").unwrap_or_else(|_| "libcudart.so.13".to_owned());
        let c_name = CString::new(name.clone()).map_err(|e| e.to_string())?;
        // SAFETY: dlopen and dlsym with NUL-terminated names; each symbol is the runtime export
        // of that name, whose C signature the field's type spells out.
        unsafe {
            let lib = libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if lib.is_null() {
                return Err(format!("cannot load {name} (no CUDA runtime?)"));
            }
            let sym = |s: &CStr| -> Result<*mut c_void, String> {
                let p = libc::dlsym(lib, s.as_ptr());
                if p.is_null() {
                    Err(format!("{name} has no {s:?}"))
                } else {
                    Ok(p)
                }
            };
            Ok(Runtime {
                malloc: std::mem::transmute::<*mut c_void, MallocFn>(sym(c"cudaMalloc")?),
                free: std::mem::transmute::<*mut c_void, FreeFn>(sym(c"cudaFree")?),
            })
        }
    }

    fn alloc(&self, size: usize) -> usize {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { (self.malloc)(&mut p, size) };
        p as usize
    }

    fn free(&self, p: usize) {
        // SAFETY: `p` came from `alloc` and is freed once.
        unsafe { (self.free)(p as *mut c_void) };
    }
}

fn check(name: &str, ok: bool, failures: &mut u32) {
    println!("check {name} {}", if ok { "ok" } else { "FAIL" });
    *failures += u32::from(!ok);
}

fn invalidations() -> u32 {
    with_cache(|c| c.invalidations)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The runtime is loaded first: cuhook patches it when it installs.
    let cu = Runtime::load()?;
    let _hooks = cuhook::install()?;
    let _subscription = cuhook::subscribe(mask::FREE, 0, on_free)?;
    let mut failures = 0;
    let (a, b) = (cu.alloc(1 << 20), cu.alloc(4 << 20));
    let ka = registration_key(a, 4096);
    let ka_inside = registration_key(a + 65536, 4096);
    let kb = registration_key(b, 1 << 20);
    check(
        "first_send_registers",
        ka.is_some() && kb.is_some() && ka != kb,
        &mut failures,
    );
    check(
        "same_allocation_reuses_registration",
        ka_inside == ka,
        &mut failures,
    );

    cu.free(a); // the free event drops a's registration before the memory goes
    check(
        "free_invalidates_before_release",
        invalidations() == 1,
        &mut failures,
    );
    let c = cu.alloc(1 << 20); // the driver may hand a's address out again
    let kc = registration_key(c, 4096);
    check(
        "new_allocation_gets_new_registration",
        kc.is_some() && kc != ka,
        &mut failures,
    );
    println!("address reused: {}", if c == a { "yes" } else { "no" });

    let on_stack = 0u64;
    let host = registration_key(&on_stack as *const u64 as usize, 8);
    check(
        "host_memory_is_not_registered",
        host.is_none(),
        &mut failures,
    );
    let past_end = registration_key(b + (4 << 20) - 16, 64);
    check(
        "range_past_the_end_is_not_registered",
        past_end.is_none(),
        &mut failures,
    );

    cu.free(b);
    cu.free(c);
    check(
        "every_registration_dropped",
        invalidations() == 3,
        &mut failures,
    );
    with_cache(|c| {
        println!(
            "hits {} misses {} invalidations {}",
            c.hits, c.misses, c.invalidations
        )
    });
    if failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
