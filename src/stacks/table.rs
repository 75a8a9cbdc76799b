//! Unique stacks → [`StackId`]: a bounded table, allocated once when stacks are enabled and
//! filled from the hooks without a lock or an allocation.
//!
//! Two arrays: an open-addressing index of slots (`key` = the stack's hash with a "ready"
//! bit, `id`), at least twice as many slots as stacks so probes stay short; and the stacks
//! themselves, densely by id, `depth` frames each. Inserting claims an empty slot with one
//! compare-and-swap, takes the next id, writes the frames and then publishes the slot
//! (release); a thread that finds a slot claimed for its own hash waits (bounded) for it to be
//! published and compares frames, so concurrent inserts of one stack all get one id. Published
//! stacks are never written again, so reading their frames needs no synchronisation beyond
//! the acquire that found them.
//!
//! Beyond the bound (no id left, a probe sequence too long, a claimed slot that stays
//! unpublished for too long) a stack is [`StackId::OTHER`] and counted ([`TableStats::other`]).
//!
//! `fork`: nothing is held across it. A thread of the parent that was between claiming and
//! publishing a slot does not exist in the child; [`Table::after_fork_in_child`] marks such
//! slots dead (only when an insert was in flight) so that the child's inserts skip them
//! instead of waiting on them.
#![allow(unsafe_code)]

use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::{StackId, MAX_FRAMES};

/// The published bit of a slot's key.
const READY: u64 = 1 << 63;
/// A slot whose writer disappeared (a fork): never matched, never reused.
const DEAD: u64 = 1 << 62;
/// The hash bits of a key (never 0: an empty slot is 0).
const HASH: u64 = DEAD - 1;
/// Slots looked at before a stack is counted as "other".
const MAX_PROBES: usize = 256;
/// Spins waiting for a claimed slot of the same hash to be published (a writer needs a few
/// hundred nanoseconds; one interrupted or descheduled may need longer, and then this stack
/// is counted as "other" rather than waited for).
const MAX_SPINS: u32 = 1 << 14;

/// One index slot.
struct Slot {
    key: AtomicU64,
    id: AtomicU32,
}

/// A bounded, lock-free table of unique stacks (see the module doc).
pub struct Table {
    slots: Box<[Slot]>,
    mask: usize,
    depth: usize,
    capacity: u32,
    /// Ids handed out (may pass `capacity` by the number of racing inserts).
    next: AtomicU32,
    /// Per stack: its frame count once published, 0 before.
    lens: Box<[AtomicU32]>,
    /// `capacity × depth` frames.
    frames: Box<[AtomicUsize]>,
    /// Inserts counted as "other".
    other: AtomicU64,
    /// Inserts between claiming a slot and publishing it.
    writing: AtomicU32,
}

/// What a [`Table`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableStats {
    /// Unique stacks stored.
    pub stacks: u32,
    /// Stacks it can store.
    pub capacity: u32,
    /// Frames kept per stack.
    pub depth: usize,
    /// Inserts that got [`StackId::OTHER`] (no room).
    pub other: u64,
    /// Bytes allocated for it.
    pub bytes: usize,
}

impl Table {
    /// A table for `capacity` unique stacks of up to `depth` frames (clamped to
    /// `1..=`[`MAX_FRAMES`]; `capacity` to `1..=2^30`). Allocates everything now:
    /// `capacity × (depth × 8 + 4)` bytes of stacks and 16 bytes per slot.
    pub fn new(capacity: u32, depth: usize) -> Table {
        let capacity = capacity.clamp(1, 1 << 30);
        let depth = depth.clamp(1, MAX_FRAMES);
        let slots = (capacity as usize * 2).next_power_of_two();
        Table {
            slots: (0..slots)
                .map(|_| Slot {
                    key: AtomicU64::new(0),
                    id: AtomicU32::new(0),
                })
                .collect(),
            mask: slots - 1,
            depth,
            capacity,
            next: AtomicU32::new(0),
            lens: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            frames: (0..capacity as usize * depth)
                .map(|_| AtomicUsize::new(0))
                .collect(),
            other: AtomicU64::new(0),
            writing: AtomicU32::new(0),
        }
    }

    /// The id of `frames` (its first `depth` frames): the existing one, or a new one. Empty
    /// stacks are [`StackId::NONE`]; no room is [`StackId::OTHER`]. Lock-free, allocation-free.
    pub fn insert(&self, frames: &[usize]) -> StackId {
        let frames = &frames[..frames.len().min(self.depth)];
        if frames.is_empty() {
            return StackId::NONE;
        }
        let h = hash(frames);
        let mut i = h as usize & self.mask;
        for _ in 0..MAX_PROBES.min(self.slots.len()) {
            let slot = &self.slots[i];
            let mut key = slot.key.load(Ordering::Acquire);
            loop {
                if key == 0 {
                    if self.next.load(Ordering::Relaxed) >= self.capacity {
                        // Full: only stacks already in the table can still be found, and this
                        // one is not (an empty slot ends its probe sequence).
                        return self.count_other();
                    }
                    self.writing.fetch_add(1, Ordering::Acquire);
                    match slot
                        .key
                        .compare_exchange(0, h, Ordering::Acquire, Ordering::Acquire)
                    {
                        Ok(_) => {
                            let id = self.fill(slot, frames, h);
                            self.writing.fetch_sub(1, Ordering::Release);
                            return id;
                        }
                        Err(now) => {
                            self.writing.fetch_sub(1, Ordering::Release);
                            key = now;
                            continue;
                        }
                    }
                }
                if key & HASH != h || key & DEAD != 0 {
                    break;
                }
                if key & READY == 0 {
                    match self.wait_published(slot) {
                        Some(k) => {
                            key = k;
                            continue;
                        }
                        None => return self.count_other(),
                    }
                }
                let id = slot.id.load(Ordering::Relaxed);
                if id == StackId::OTHER.0 {
                    // This stack claimed a slot when the last id was just taken.
                    return self.count_other();
                }
                if self.stored(id) == Some(frames) {
                    return StackId(id);
                }
                break;
            }
            i = (i + 1) & self.mask;
        }
        self.count_other()
    }

    /// The frames of a stack in this table; `None` for [`StackId::NONE`], [`StackId::OTHER`]
    /// and ids it never handed out.
    pub fn frames(&self, id: StackId) -> Option<&[usize]> {
        self.stored(id.0)
    }

    /// Copy a stack's frames into `out` (as many as fit); returns the stack's frame count
    /// (0: no such stack), like the C API's `cuhook_stack_frames(id, buf, cap)` will.
    pub fn copy_frames(&self, id: StackId, out: &mut [usize]) -> usize {
        let Some(frames) = self.frames(id) else {
            return 0;
        };
        let n = frames.len().min(out.len());
        out[..n].copy_from_slice(&frames[..n]);
        frames.len()
    }

    /// Every stored stack, by id (for reports; may miss stacks published meanwhile).
    pub fn iter(&self) -> impl Iterator<Item = (StackId, &[usize])> + '_ {
        let n = self.next.load(Ordering::Acquire).min(self.capacity);
        (StackId::FIRST..StackId::FIRST + n)
            .filter_map(|id| self.stored(id).map(|f| (StackId(id), f)))
    }

    /// Counts and sizes.
    pub fn stats(&self) -> TableStats {
        TableStats {
            stacks: self.next.load(Ordering::Relaxed).min(self.capacity),
            capacity: self.capacity,
            depth: self.depth,
            other: self.other.load(Ordering::Relaxed),
            bytes: self.slots.len() * std::mem::size_of::<Slot>()
                + self.lens.len() * 4
                + self.frames.len() * std::mem::size_of::<usize>(),
        }
    }

    /// In a child just forked: slots a vanished thread of the parent had claimed but not
    /// published are marked dead, so that no insert waits for them. Costs one load unless an
    /// insert was in flight at the fork (then a pass over the slots).
    pub fn after_fork_in_child(&self) {
        if self.writing.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        for slot in self.slots.iter() {
            let key = slot.key.load(Ordering::Relaxed);
            if key != 0 && key & (READY | DEAD) == 0 {
                slot.key.store(DEAD, Ordering::Relaxed);
            }
        }
    }

    /// Store `frames` under a new id in the claimed `slot`, then publish it.
    fn fill(&self, slot: &Slot, frames: &[usize], h: u64) -> StackId {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if index >= self.capacity {
            slot.id.store(StackId::OTHER.0, Ordering::Relaxed);
            slot.key.store(h | READY, Ordering::Release);
            return self.count_other();
        }
        let at = index as usize * self.depth;
        for (cell, &f) in self.frames[at..at + frames.len()].iter().zip(frames) {
            cell.store(f, Ordering::Relaxed);
        }
        self.lens[index as usize].store(frames.len() as u32, Ordering::Release);
        let id = index + StackId::FIRST;
        slot.id.store(id, Ordering::Relaxed);
        slot.key.store(h | READY, Ordering::Release);
        StackId(id)
    }

    /// Wait (bounded) for a claimed slot to be published; its key then, or `None`.
    fn wait_published(&self, slot: &Slot) -> Option<u64> {
        for _ in 0..MAX_SPINS {
            std::hint::spin_loop();
            let key = slot.key.load(Ordering::Acquire);
            if key & (READY | DEAD) != 0 {
                return Some(key);
            }
        }
        None
    }

    /// The published frames of stack `id`.
    fn stored(&self, id: u32) -> Option<&[usize]> {
        let index = id.checked_sub(StackId::FIRST)? as usize;
        let len = self.lens.get(index)?.load(Ordering::Acquire) as usize;
        if len == 0 {
            return None;
        }
        let cells = &self.frames[index * self.depth..index * self.depth + len];
        // SAFETY: `AtomicUsize` has the size, alignment and bit validity of `usize`. These
        // cells were written before `lens[index]` was released (and the acquire above saw
        // it), and a published stack is never written again: plain reads race with nothing.
        Some(unsafe { std::slice::from_raw_parts(cells.as_ptr().cast::<usize>(), len) })
    }

    fn count_other(&self) -> StackId {
        self.other.fetch_add(1, Ordering::Relaxed);
        StackId::OTHER
    }
}

/// The key bits of a stack: FxHash of its frames, never 0, never with READY or DEAD.
fn hash(frames: &[usize]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    for &f in frames {
        h.write_usize(f);
    }
    h.write_usize(frames.len());
    (h.finish() & HASH).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stack_one_id_and_its_frames_come_back() {
        let t = Table::new(4, 3);
        let a = t.insert(&[1, 2, 3]);
        let b = t.insert(&[1, 2, 4]);
        assert!(a.is_stack() && b.is_stack() && a != b);
        assert_eq!(t.insert(&[1, 2, 3]), a);
        // Only `depth` frames count.
        assert_eq!(t.insert(&[1, 2, 3, 99]), a);
        assert_eq!(t.frames(a), Some(&[1, 2, 3][..]));
        let mut buf = [0; 2];
        assert_eq!(t.copy_frames(b, &mut buf), 3);
        assert_eq!(buf, [1, 2]);
        assert_eq!(t.insert(&[]), StackId::NONE);
        assert_eq!(t.frames(StackId::NONE), None);
        assert_eq!(t.frames(StackId::OTHER), None);
        assert_eq!(t.frames(StackId(1000)), None);
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn beyond_the_bound_stacks_are_counted_as_other() {
        let t = Table::new(2, 4);
        let a = t.insert(&[10]);
        let b = t.insert(&[20]);
        assert!(a.is_stack() && b.is_stack());
        assert_eq!(t.insert(&[30]), StackId::OTHER);
        assert_eq!(t.insert(&[40]), StackId::OTHER);
        // Known stacks are still found.
        assert_eq!(t.insert(&[20]), b);
        let s = t.stats();
        assert_eq!((s.stacks, s.capacity, s.other), (2, 2, 2));
    }

    #[test]
    fn a_dead_slot_is_skipped_after_fork() {
        let t = Table::new(8, 2);
        // A claim that was never published, as a thread vanished by a fork leaves it.
        let h = hash(&[7, 8]);
        t.slots[h as usize & t.mask].key.store(h, Ordering::Relaxed);
        t.writing.store(1, Ordering::Relaxed);
        t.after_fork_in_child();
        let id = t.insert(&[7, 8]);
        assert!(id.is_stack());
        assert_eq!(t.insert(&[7, 8]), id);
        assert_eq!(t.frames(id), Some(&[7, 8][..]));
    }

    #[test]
    fn an_unpublished_claim_is_waited_for_a_bounded_time() {
        let t = Table::new(8, 2);
        let h = hash(&[5]);
        t.slots[h as usize & t.mask].key.store(h, Ordering::Relaxed);
        assert_eq!(t.insert(&[5]), StackId::OTHER);
        assert_eq!(t.stats().other, 1);
    }
}
