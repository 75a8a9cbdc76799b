//! Memory layout of tree nodes and allocation records.
//!
//! Every field is an atomic so that a reader may load it while a writer rewrites it (Relaxed loads,
//! validated afterwards by the latch). A node has separate arrays for child pointers and record
//! pointers, so a field only ever holds a value of its own kind: `kids` holds null or a node of this
//! registry, `recs` holds null or a record of this registry. A reader that misreads a leaf as an
//! internal node (because the node was recycled under it) therefore still follows a valid pointer.
//!
//! # Safety
//!
//! The one invariant this module relies on (the *pointer invariant*): every non-null pointer ever
//! stored in a `kids`/`recs` field or in a [`Root`] points at an element of a [`Slab`] owned by the
//! same registry, and slab memory lives until the registry is dropped. Dereferencing such a pointer
//! for the lifetime of a borrow of the registry is therefore sound, whatever its current contents.
//! Only the writer (in `tree.rs`, under the writer lock) stores pointers, and it only stores
//! pointers it got from its slabs or loaded from these fields.
//!
//! [`Slab`]: super::slab::Slab

use core::ffi::CStr;
use core::ptr;
use core::sync::atomic::{
    AtomicPtr, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

use super::slab::{Fresh, Ptr};
use super::Allocation;
use cuhook::events::MemType;

/// Entries per node. 16 keys fill two cache lines; 32 and 64 measured slower for hot lookups
/// (longer in-node scans) and only slightly faster for cold ones (see `docs/performance.md` as of
/// `3e3f66f`, before the page table replaced this tree).
pub(super) const B: usize = 16;

// Splits and merges assume room for a few entries; the writer's path stores indices in a `u8`.
const _: () = assert!(B >= 8 && B <= 256);

/// Tree height bound: readers never walk deeper, so a walk over a node that is being rewritten
/// ends. With at least `B / 4` entries per non-root node, 32 levels hold far more than 2^64 ranges.
pub(super) const MAX_HEIGHT: usize = 32;

/// Unused key slots hold this, so a search can scan all `B` slots without looking at `len` first.
const SENTINEL: usize = usize::MAX;

/// One B+tree node. Leaves use `keys` + `recs`; internal nodes use `keys` + `kids`, and their
/// `keys[0]` is 0 (every search goes right of it), `keys[i]` is the smallest start in child `i`.
#[repr(C, align(64))]
pub(super) struct Node {
    len: AtomicUsize,
    keys: [AtomicUsize; B],
    kids: [AtomicPtr<Node>; B],
    recs: [AtomicPtr<Record>; B],
}

impl Fresh for Node {
    fn fresh() -> Self {
        Node {
            len: AtomicUsize::new(0),
            keys: [const { AtomicUsize::new(SENTINEL) }; B],
            kids: [const { AtomicPtr::new(ptr::null_mut()) }; B],
            recs: [const { AtomicPtr::new(ptr::null_mut()) }; B],
        }
    }
}

/// Loads a pointer that obeys the pointer invariant.
///
/// Acquire, paired with the Release of every pointer store: a slab element's first contents are
/// written non-atomically (when its chunk is built), and a reader that reaches the element must
/// do so after those writes in the memory model, not merely in practice. (Free on x86-64.)
#[inline(always)]
fn load<T>(p: &AtomicPtr<T>) -> Option<&T> {
    let raw = p.load(Acquire);
    // SAFETY: pointer invariant (module doc): null or an element of a slab that outlives the
    // registry borrow `p` comes from; slab elements are all-atomic, so any contents are valid.
    unsafe { raw.as_ref() }
}

impl Node {
    /// Number of entries, clamped so a torn value never indexes out of bounds.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.len.load(Relaxed).min(B)
    }

    /// Number of keys `<= x`. Scans all slots branch-free (unused slots hold the sentinel, which
    /// only matches `x == usize::MAX`, hence the clamp to `len`).
    #[inline(always)]
    pub(super) fn rank(&self, x: usize) -> usize {
        let mut c = 0usize;
        for k in &self.keys {
            c += (k.load(Relaxed) <= x) as usize;
        }
        c.min(self.len())
    }

    #[inline(always)]
    pub(super) fn key(&self, i: usize) -> usize {
        self.keys.get(i).map_or(SENTINEL, |k| k.load(Relaxed))
    }

    #[inline(always)]
    pub(super) fn kid(&self, i: usize) -> Option<&Node> {
        load(self.kids.get(i)?)
    }

    #[inline(always)]
    pub(super) fn rec(&self, i: usize) -> Option<&Record> {
        load(self.recs.get(i)?)
    }

    // ---- writer side (called under the writer lock only) ----

    pub(super) fn set_len(&self, n: usize) {
        self.len.store(n, Relaxed);
    }

    pub(super) fn set_key(&self, i: usize, k: usize) {
        self.keys[i].store(k, Relaxed);
    }

    pub(super) fn set_kid(&self, i: usize, p: Ptr<Node>) {
        self.kids[i].store(p.as_mut_ptr(), Release);
    }

    pub(super) fn set_rec(&self, i: usize, p: Ptr<Record>) {
        self.recs[i].store(p.as_mut_ptr(), Release);
    }

    /// The record pointer of entry `i` as a handle the writer can free later.
    pub(super) fn rec_ptr(&self, i: usize) -> Option<Ptr<Record>> {
        Ptr::new(self.recs[i].load(Relaxed))
    }

    /// The child pointer of entry `i` as a handle the writer can free later.
    pub(super) fn kid_ptr(&self, i: usize) -> Option<Ptr<Node>> {
        Ptr::new(self.kids[i].load(Relaxed))
    }

    /// Copies entry `si` of `src` to slot `di` of `self` (key and the value array in use).
    pub(super) fn copy_entry(&self, di: usize, src: &Node, si: usize, leaf: bool) {
        self.keys[di].store(src.keys[si].load(Relaxed), Relaxed);
        if leaf {
            self.recs[di].store(src.recs[si].load(Relaxed), Release);
        } else {
            self.kids[di].store(src.kids[si].load(Relaxed), Release);
        }
    }

    /// Empties slot `i` (keeps the sentinel invariant; old pointers may stay, they are valid).
    pub(super) fn clear_slot(&self, i: usize) {
        self.keys[i].store(SENTINEL, Relaxed);
    }

    /// Makes a recycled node empty.
    pub(super) fn reset(&self) {
        self.len.store(0, Relaxed);
        for k in &self.keys {
            k.store(SENTINEL, Relaxed);
        }
    }
}

/// Root of one copy of the tree: the root node and the number of internal levels above the leaves.
pub(super) struct Root {
    node: AtomicPtr<Node>,
    height: AtomicUsize,
}

impl Root {
    pub(super) const fn new() -> Self {
        Root {
            node: AtomicPtr::new(ptr::null_mut()),
            height: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    pub(super) fn node(&self) -> Option<&Node> {
        load(&self.node)
    }

    #[inline(always)]
    pub(super) fn height(&self) -> usize {
        self.height.load(Relaxed).min(MAX_HEIGHT)
    }

    pub(super) fn set(&self, node: Ptr<Node>, height: usize) {
        self.node.store(node.as_mut_ptr(), Release);
        self.height.store(height, Relaxed);
    }

    pub(super) fn node_ptr(&self) -> Option<Ptr<Node>> {
        Ptr::new(self.node.load(Relaxed))
    }
}

/// Metadata of one range, everything but its start (the start is the leaf key). Records are
/// immutable while a reader may reach them: a change makes a new record. 64 bytes, one line.
#[repr(C, align(64))]
pub(super) struct Record {
    size: AtomicUsize,
    seq: AtomicU64,
    pool: AtomicUsize,
    stream: AtomicUsize,
    context: AtomicUsize,
    api_ptr: AtomicPtr<u8>,
    /// `api` length with NUL `<< 8 | mem_type`.
    api_len_type: AtomicUsize,
    /// `device as u32 | flags << 32`.
    dev_flags: AtomicU64,
}

impl Fresh for Record {
    fn fresh() -> Self {
        Record {
            size: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            pool: AtomicUsize::new(0),
            stream: AtomicUsize::new(0),
            context: AtomicUsize::new(0),
            api_ptr: AtomicPtr::new(ptr::null_mut()),
            api_len_type: AtomicUsize::new(0),
            dev_flags: AtomicU64::new(0),
        }
    }
}

/// A plain copy of a record's fields. Until validated it may be a mix of two records, so the only
/// thing done with it before validation is copying it.
#[derive(Clone, Copy)]
pub(super) struct RawRecord {
    pub(super) size: usize,
    seq: u64,
    pool: usize,
    stream: usize,
    context: usize,
    api_ptr: *const u8,
    api_len_type: usize,
    dev_flags: u64,
}

impl Record {
    #[inline(always)]
    pub(super) fn load(&self) -> RawRecord {
        RawRecord {
            size: self.size.load(Relaxed),
            seq: self.seq.load(Relaxed),
            pool: self.pool.load(Relaxed),
            stream: self.stream.load(Relaxed),
            context: self.context.load(Relaxed),
            api_ptr: self.api_ptr.load(Relaxed),
            api_len_type: self.api_len_type.load(Relaxed),
            dev_flags: self.dev_flags.load(Relaxed),
        }
    }

    /// Writer: the range size.
    pub(super) fn size(&self) -> usize {
        self.size.load(Relaxed)
    }

    /// Writer: fills a record that no reader can reach yet.
    pub(super) fn store(&self, a: &Allocation) {
        let api = a.api.to_bytes_with_nul();
        let mem_type = a.mem_type as i32 as u8 as usize;
        self.size.store(a.size, Relaxed);
        self.seq.store(a.seq, Relaxed);
        self.pool.store(a.pool, Relaxed);
        self.stream.store(a.stream, Relaxed);
        self.context.store(a.context, Relaxed);
        self.api_ptr.store(api.as_ptr().cast_mut(), Relaxed);
        self.api_len_type.store(api.len() << 8 | mem_type, Relaxed);
        self.dev_flags
            .store(a.device as u32 as u64 | (a.flags as u64) << 32, Relaxed);
    }
}

impl RawRecord {
    /// Rebuilds the allocation that starts at `start`.
    ///
    /// # Safety
    ///
    /// `self` must be a consistent copy of a record: loaded by the writer, or loaded by a reader
    /// whose latch read validated. Then `api_ptr`/length are exactly what [`Record::store`] took
    /// from a `&'static CStr`.
    #[inline(always)]
    pub(super) unsafe fn into_allocation(self, start: usize) -> Allocation {
        let len = self.api_len_type >> 8;
        // SAFETY: per the contract, (api_ptr, len) came from `to_bytes_with_nul` of a
        // `&'static CStr`: valid for 'static, NUL-terminated, no interior NUL.
        let api = unsafe {
            CStr::from_bytes_with_nul_unchecked(core::slice::from_raw_parts(self.api_ptr, len))
        };
        let mem_type = match self.api_len_type & 0xff {
            0 => MemType::Host,
            1 => MemType::Cuda,
            2 => MemType::CudaManaged,
            _ => MemType::Unknown,
        };
        Allocation {
            start,
            size: self.size,
            mem_type,
            device: self.dev_flags as u32 as i32,
            flags: (self.dev_flags >> 32) as u32,
            pool: self.pool,
            stream: self.stream,
            context: self.context,
            api,
            stack: cuhook::stacks::StackId::NONE,
            seq: self.seq,
        }
    }
}
