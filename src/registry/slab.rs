//! Type-stable arena: elements are allocated in chunks that live as long as the slab, and a freed
//! element is only ever reused as the same type. A lock-free reader holding a stale pointer thus
//! reads a valid (if meaningless) object, never freed memory.
//!
//! # Safety
//!
//! Chunks come from `Box::into_raw` and go back through `Box::from_raw` only in `Drop`, which has
//! exclusive access (no reader can hold a borrow of the owning registry then). A [`Ptr`] is only
//! made from a chunk element (or from a field that holds one, see `node.rs`), so it stays valid
//! while the slab lives.
#![allow(unsafe_code)]

use core::ptr::NonNull;

#[cfg(all(test, not(loom)))]
std::thread_local! {
    /// Tests: when set, this thread's writer gets no new memory (chunks, list growth), as a host
    /// whose `malloc` fails would.
    pub(super) static STARVED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
    /// Tests: removals this thread's writer made in place for lack of memory.
    pub(super) static IN_PLACE: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Whether the writer must act as if the memory it asks for could not be had (tests only).
#[inline(always)]
pub(super) fn starving() -> bool {
    #[cfg(all(test, not(loom)))]
    return STARVED.get();
    #[allow(unreachable_code)]
    false
}

/// Room for `n` more elements in `v`, growing it if needed; false, changing nothing, when the
/// memory cannot be had. The writer's lists grow through here, never through an aborting `push`.
pub(super) fn room<T>(v: &mut Vec<T>, n: usize) -> bool {
    v.capacity() - v.len() >= n || (!starving() && v.try_reserve(n).is_ok())
}

/// Types that can fill a new chunk.
pub(super) trait Fresh: Sized {
    fn fresh() -> Self;
}

/// A pointer to a slab element, handled by the writer. Sendable because the element type is all
/// atomics (`Sync`) and the owning slab travels with it inside the registry.
pub(super) struct Ptr<T>(NonNull<T>);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}

impl<T> PartialEq for Ptr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

// SAFETY: a `Ptr` is an address into a slab of `Sync` elements; sending it to another thread is
// like sending `&T`, which is fine for `T: Sync`.
unsafe impl<T: Sync> Send for Ptr<T> {}

impl<T> Ptr<T> {
    pub(super) fn new(p: *mut T) -> Option<Self> {
        NonNull::new(p).map(Ptr)
    }

    /// The element `r` borrows (no null test: a reference is never null).
    pub(super) fn of(r: &T) -> Self {
        Ptr(NonNull::from(r))
    }

    /// A placeholder that is never dereferenced (fills unused entries of fixed arrays).
    pub(super) const fn dangling() -> Self {
        Ptr(NonNull::dangling())
    }

    pub(super) fn as_mut_ptr(self) -> *mut T {
        self.0.as_ptr()
    }
}

/// First chunk size; chunks double up to `MAX_CHUNK` elements and `MAX_CHUNK_BYTES` bytes (page
/// tables are 4 KiB each).
#[cfg(not(any(loom, miri)))]
const FIRST_CHUNK: usize = 64;
/// Loom creates every atomic of a chunk in the model: keep chunks tiny there.
#[cfg(loom)]
const FIRST_CHUNK: usize = 2;
/// Miri interprets the construction of every atomic of a chunk (64 tables are 64K slots).
#[cfg(all(miri, not(loom)))]
const FIRST_CHUNK: usize = 4;
const MAX_CHUNK: usize = 1 << 13;
const MAX_CHUNK_BYTES: usize = 1 << 20;

/// `repr(C)` with the free list first: the hooks' pool case pops and pushes it, and it then
/// shares a cache line with the writer state around it (`write.rs`, `Writer`).
#[repr(C)]
pub(super) struct Slab<T> {
    free: Vec<Ptr<T>>,
    chunks: Vec<NonNull<[T]>>,
    /// Elements of the last chunk handed out so far.
    used: usize,
    /// Elements carved in all chunks: the free list's capacity is kept at least this, so that
    /// giving an element back never allocates.
    carved: usize,
    /// Elements currently handed out (tests check for leaks with it).
    #[cfg(test)]
    live: usize,
}

// SAFETY: the slab owns its chunks (like a `Vec<Box<[T]>>`), so it may move between threads
// whenever `T` may be shared.
unsafe impl<T: Sync> Send for Slab<T> {}

impl<T: Fresh> Slab<T> {
    pub(super) const fn new() -> Self {
        Slab {
            free: Vec::new(),
            chunks: Vec::new(),
            used: 0,
            carved: 0,
            #[cfg(test)]
            live: 0,
        }
    }

    /// An element that no reader can reach through the current trees. Recycled ones keep their
    /// old contents; the caller overwrites what it uses. The recycled case (every insert of a
    /// pool's steady state) is inlined into the caller; carving a fresh one is not.
    #[inline(always)]
    pub(super) fn alloc(&mut self) -> Ptr<T> {
        #[cfg(test)]
        {
            self.live += 1;
        }
        match self.free.pop() {
            Some(p) => p,
            None => self.carve(),
        }
    }

    /// Whether `n` elements can be handed out without allocating, adding a chunk if needed;
    /// false when its memory cannot be had. An edit that asks first never aborts the process
    /// for lack of memory.
    pub(super) fn spare(&mut self, n: usize) -> bool {
        // Chunks double, so this ends (small chunks under loom and Miri need several).
        while self.available() < n {
            if !self.add_chunk() {
                return false;
            }
        }
        true
    }

    fn available(&self) -> usize {
        let cap = self.chunks.last().map_or(0, |c| c.len());
        self.free.len() + (cap - self.used)
    }

    fn has_carvable(&self) -> bool {
        self.chunks.last().is_some_and(|c| self.used < c.len())
    }

    /// A fresh element from the last chunk, adding a chunk when it is full (aborting, as any
    /// allocation failure does, when even that fails: callers that cannot afford it ask
    /// [`Slab::spare`] first).
    #[inline(never)]
    fn carve(&mut self) -> Ptr<T> {
        if !self.has_carvable() && !self.add_chunk() {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<T>());
        }
        let chunk = *self.chunks.last().expect("a chunk was just ensured");
        // SAFETY: `used < chunk.len()`, so the offset stays inside the chunk allocation.
        let p = unsafe { chunk.cast::<T>().add(self.used) };
        self.used += 1;
        Ptr(p)
    }

    /// Add a chunk (twice the last, bounded), giving what is left of the last one to the free
    /// list; false, changing nothing that matters, when the memory cannot be had.
    #[cold]
    fn add_chunk(&mut self) -> bool {
        if starving() {
            return false;
        }
        let cap = self.chunks.last().map_or(0, |c| c.len());
        let max = (MAX_CHUNK_BYTES / core::mem::size_of::<T>().max(1)).clamp(1, MAX_CHUNK);
        let n = (cap * 2).clamp(FIRST_CHUNK.min(max), max);
        let Ok(layout) = std::alloc::Layout::array::<T>(n) else {
            return false;
        };
        // Room first, so that nothing below can fail half-way: the chunk's entry, and a free
        // list that can hold every element ever carved.
        if self.chunks.try_reserve(1).is_err()
            || self
                .free
                .try_reserve((self.carved + n).saturating_sub(self.free.len()))
                .is_err()
        {
            return false;
        }
        // SAFETY: a non-zero size (n >= 1 elements of a non-zero-sized T).
        let raw = unsafe { std::alloc::alloc(layout) }.cast::<T>();
        let Some(first) = NonNull::new(raw) else {
            return false;
        };
        for i in 0..n {
            // SAFETY: inside the fresh allocation of `n` elements, each written once.
            unsafe { first.add(i).write(T::fresh()) };
        }
        // What is left of the last chunk would never be handed out: into the free list
        // (within the capacity reserved above).
        if let Some(last) = self.chunks.last() {
            for i in self.used..last.len() {
                // SAFETY: an element of the last chunk, never handed out.
                self.free.push(Ptr(unsafe { last.cast::<T>().add(i) }));
            }
        }
        self.chunks.push(NonNull::slice_from_raw_parts(first, n));
        self.carved += n;
        self.used = 0;
        true
    }

    /// Returns an element for reuse. Readers may still be reading it; they will fail validation.
    pub(super) fn free(&mut self, p: Ptr<T>) {
        #[cfg(test)]
        {
            self.live -= 1;
        }
        self.free.push(p);
    }

    #[cfg(all(test, not(loom)))]
    pub(super) fn live(&self) -> usize {
        self.live
    }
}

impl<T> Drop for Slab<T> {
    fn drop(&mut self) {
        for c in self.chunks.drain(..) {
            // SAFETY: `c` came from `Box::leak` of a `Box<[T]>` and is freed once; `&mut self`
            // means no borrow of the owning registry (and so no reader) is alive.
            drop(unsafe { Box::from_raw(c.as_ptr()) });
        }
    }
}
