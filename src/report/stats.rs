//! Counters behind the exit report, kept by a subscriber: per API (calls and bytes), and live /
//! peak bytes per memory type and device. Lock-free and allocation-free (it runs inside hooks).

use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::events::{EventKind, MemEvent, MemType};

/// Distinct API names tracked (the hook table has fewer).
const MAX_APIS: usize = 96;
/// Devices tracked individually; higher ordinals share the last row.
pub const MAX_DEVICES: usize = 16;
const MEM_TYPES: usize = 4;

struct ApiRow {
    /// Address of the API name (a `&'static CStr`), 0 while the row is free.
    name: AtomicUsize,
    allocs: AtomicU64,
    alloc_bytes: AtomicU64,
    frees: AtomicU64,
    free_bytes: AtomicU64,
}

impl ApiRow {
    const fn new() -> ApiRow {
        ApiRow {
            name: AtomicUsize::new(0),
            allocs: AtomicU64::new(0),
            alloc_bytes: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            free_bytes: AtomicU64::new(0),
        }
    }
}

static APIS: [ApiRow; MAX_APIS] = [const { ApiRow::new() }; MAX_APIS];
static LIVE: [[AtomicU64; MAX_DEVICES + 1]; MEM_TYPES] =
    [const { [const { AtomicU64::new(0) }; MAX_DEVICES + 1] }; MEM_TYPES];
static PEAK: [[AtomicU64; MAX_DEVICES + 1]; MEM_TYPES] =
    [const { [const { AtomicU64::new(0) }; MAX_DEVICES + 1] }; MEM_TYPES];
static OVERFLOW: AtomicU64 = AtomicU64::new(0);

fn row(api: &'static CStr) -> Option<&'static ApiRow> {
    let key = api.as_ptr() as usize;
    for r in APIS.iter() {
        match r.name.load(Ordering::Acquire) {
            k if k == key => return Some(r),
            0 => match r
                .name
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(r),
                Err(k) if k == key => return Some(r),
                Err(_) => continue,
            },
            _ => continue,
        }
    }
    OVERFLOW.fetch_add(1, Ordering::Relaxed);
    None
}

/// Column of a device ordinal (-1, host or unknown, is column 0).
fn column(device: i32) -> usize {
    if device < 0 {
        0
    } else {
        (device as usize + 1).min(MAX_DEVICES)
    }
}

/// The subscriber.
pub fn on_event(ev: &MemEvent, _context: usize) {
    let size = ev.range.size as u64;
    let (t, d) = (
        ev.range.mem_type as usize % MEM_TYPES,
        column(ev.range.device),
    );
    match ev.kind {
        EventKind::Alloc => {
            if let Some(r) = row(ev.api) {
                r.allocs.fetch_add(1, Ordering::Relaxed);
                r.alloc_bytes.fetch_add(size, Ordering::Relaxed);
            }
            let live = LIVE[t][d].fetch_add(size, Ordering::Relaxed) + size;
            PEAK[t][d].fetch_max(live, Ordering::Relaxed);
        }
        EventKind::Free => {
            if let Some(r) = row(ev.api) {
                r.frees.fetch_add(1, Ordering::Relaxed);
                r.free_bytes.fetch_add(size, Ordering::Relaxed);
            }
            let _ = LIVE[t][d].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(size))
            });
        }
    }
}

/// Counts of one API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCounts {
    /// The API's name.
    pub api: String,
    /// Allocations made through it.
    pub allocs: u64,
    /// Bytes those allocations asked for.
    pub alloc_bytes: u64,
    /// Frees made through it.
    pub frees: u64,
    /// Bytes those frees released.
    pub free_bytes: u64,
}

/// Every API seen so far.
pub fn api_counts() -> Vec<ApiCounts> {
    APIS.iter()
        .filter_map(|r| {
            let p = r.name.load(Ordering::Acquire);
            if p == 0 {
                return None;
            }
            // SAFETY: only addresses of `&'static CStr` API names are ever stored.
            #[allow(unsafe_code)]
            let name = unsafe { CStr::from_ptr(p as *const std::ffi::c_char) };
            Some(ApiCounts {
                api: name.to_str().unwrap_or("?").to_owned(),
                allocs: r.allocs.load(Ordering::Relaxed),
                alloc_bytes: r.alloc_bytes.load(Ordering::Relaxed),
                frees: r.frees.load(Ordering::Relaxed),
                free_bytes: r.free_bytes.load(Ordering::Relaxed),
            })
        })
        .collect()
}

/// Live and peak bytes of one memory type on one device (-1: host / unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for host or unknown.
    pub device: i32,
    /// Bytes live now.
    pub live: u64,
    /// The most bytes live at once.
    pub peak: u64,
}

/// Every (memory type, device) that ever held memory.
pub fn usage() -> Vec<Usage> {
    let types = [
        MemType::Host,
        MemType::Cuda,
        MemType::CudaManaged,
        MemType::Unknown,
    ];
    let mut out = Vec::new();
    for (t, mem_type) in types.iter().enumerate() {
        for d in 0..=MAX_DEVICES {
            let peak = PEAK[t][d].load(Ordering::Relaxed);
            if peak > 0 {
                out.push(Usage {
                    mem_type: *mem_type,
                    device: d as i32 - 1,
                    live: LIVE[t][d].load(Ordering::Relaxed),
                    peak,
                });
            }
        }
    }
    out
}
