//! cuhook embedded in a Rust program that uses the GPU through [cudarc]'s safe API.
//!
//! cudarc (0.19, `dynamic-loading`) dlopens the driver (`libcuda.so`, ..., `libcuda.so.1`) and
//! resolves each entry point with `dlsym` on its first call; with a context that supports memory
//! pools, as every current GPU does, its buffers are stream-ordered: `cuMemAllocAsync` and
//! `cuMemFreeAsync` on the buffer's stream. The program subscribes to cuhook's events, makes
//! eight buffers of different sizes (`alloc_zeros` and `clone_htod`), checks that the registry
//! knows each one exactly, reads buffers back, drops them all, and checks that every range left
//! the registry and that it saw eight alloc and eight free events. One line per check
//! (`check NAME ok|FAIL detail`), then `cudarc example: N passed, M failed`; exit 1 on a failure.
//!
//! Run it, with no GPU, on cuhook's fake driver: `scripts/run-example.sh cudarc`. On a machine
//! with a GPU: `cargo run --release --example cudarc`. (The test suite runs it both ways:
//! hook-tests/examples.rs.)
//!
//! cudarc's `dlopen`/`dlsym` calls are made from this executable, the very object cuhook is
//! linked into: cuhook patches that object like any other (only `libcuhook.so` itself is
//! skipped), so the pointers cudarc resolves are cuhook's hooks.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DriverError};
use cuhook::events::{EventKind, EventMask, MemEvent};

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);

/// Element counts of the eight buffers (f32): sizes from 4 bytes to 4 MiB, none equal.
const LENS: [usize; 8] = [1, 100, 1000, 4096, 10_000, 65_536, 250_000, 1 << 20];

#[derive(Default)]
struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        println!("check {name} {} {detail}", if ok { "ok" } else { "FAIL" });
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
    }
}

/// The host data of buffer `i` when it is made by a host-to-device copy.
fn pattern(i: usize, len: usize) -> Vec<f32> {
    (0..len).map(|k| (i * 1_000_003 + k) as f32).collect()
}

fn run(checks: &mut Checks) -> Result<(), DriverError> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    println!(
        "context on device 0, stream-ordered allocation: {}",
        ctx.has_async_alloc()
    );

    // Even buffers zeroed on the device, odd ones copied from the host.
    let mut bufs: Vec<CudaSlice<f32>> = Vec::with_capacity(LENS.len());
    for (i, &len) in LENS.iter().enumerate() {
        bufs.push(if i % 2 == 0 {
            stream.alloc_zeros::<f32>(len)?
        } else {
            stream.clone_htod(&pattern(i, len))?
        });
    }
    let mut addrs = Vec::with_capacity(bufs.len());
    for (i, buf) in bufs.iter().enumerate() {
        let (dptr, _record) = buf.device_ptr(&stream);
        let (ptr, bytes) = (dptr as usize, buf.num_bytes());
        addrs.push(ptr);
        // A CUdeviceptr as cudarc hands it out.
        let found = cuhook::lookup(dptr);
        let ok = found.is_some_and(|a| a.start == ptr && a.size == bytes && a.device == 0);
        let detail = match found {
            Some(a) => format!(
                "{ptr:#x} {bytes} B: registry {:#x} {} B device {} {:?}",
                a.start, a.size, a.device, a.api
            ),
            None => format!("{ptr:#x} {bytes} B: not in the registry"),
        };
        checks.check(&format!("buffer_{i}_registered"), ok, detail);
    }

    let back = stream.clone_dtoh(&bufs[7])?;
    let want = pattern(7, LENS[7]);
    let same = back.len() == want.len()
        && back
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    checks.check(
        "htod_bytes_read_back",
        same,
        format!("{} floats of buffer 7", back.len()),
    );
    let zeros = stream.clone_dtoh(&bufs[6])?;
    checks.check(
        "zeroed_bytes_read_back",
        zeros.len() == LENS[6] && zeros.iter().all(|x| x.to_bits() == 0),
        format!("{} floats of buffer 6", zeros.len()),
    );

    drop(bufs); // cuMemFreeAsync on the stream, one per buffer
    stream.synchronize()?;
    let left: Vec<String> = addrs
        .iter()
        .filter(|&&p| cuhook::lookup(p).is_some())
        .map(|p| format!("{p:#x}"))
        .collect();
    checks.check(
        "every_buffer_left_the_registry",
        left.is_empty(),
        format!("still registered: [{}]", left.join(", ")),
    );
    drop(stream);
    drop(ctx);
    Ok(())
}

fn main() -> ExitCode {
    let hooks = match cuhook::install() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("cuhook::install: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Counts the events (it must not call CUDA: it runs inside the hooked call).
    let on_event = |ev: &MemEvent| {
        match ev.kind {
            EventKind::Alloc => ALLOCS.fetch_add(1, Ordering::Relaxed),
            EventKind::Free => FREES.fetch_add(1, Ordering::Relaxed),
        };
    };
    let subscription = match cuhook::subscribe(EventMask::ALL, 0, on_event) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cuhook::subscribe: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut checks = Checks::default();
    if let Err(e) = run(&mut checks) {
        checks.check("cuda_calls_succeed", false, format!("driver error: {e}"));
    }
    let (allocs, frees) = (
        ALLOCS.load(Ordering::Relaxed),
        FREES.load(Ordering::Relaxed),
    );
    checks.check(
        "eight_alloc_events",
        allocs == LENS.len(),
        format!("{allocs} alloc events"),
    );
    checks.check(
        "eight_free_events",
        frees == LENS.len(),
        format!("{frees} free events"),
    );
    drop(subscription);
    drop(hooks);
    println!(
        "cudarc example: {} passed, {} failed",
        checks.passed, checks.failed
    );
    if checks.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
