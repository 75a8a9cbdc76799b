//! Clearing a span: one range cut back to its parts outside the span (a trim, a split, or the
//! whole range), and the removals made of such cuts (a VMM unmap of part of a mapping, an
//! insert over ranges whose frees were missed). Exclusive edits (`lanes.rs`).

use super::level::{Level, Piece};
use super::record::Record;
use super::slab::Ptr;
use super::write::{rec, Writer};
use super::{Allocation, Registry, Removed};
use crate::atomics::Ordering;

impl Writer {
    /// Clears `[lo, hi]` from range `h`, which meets it: its parts outside become new records
    /// (same metadata and seq), or, when their memory cannot be had, go with the rest (never a
    /// stale byte; they are then counted untracked).
    pub(super) fn cut_one(&mut self, top: Level<'_>, lo: usize, hi: usize, h: Ptr<Record>) -> Cut {
        let old = rec(h).get();
        let last = old.last();
        let (from, to) = (old.start.max(lo), last.min(hi));
        let mut buf: [Piece; 2] = [(h, 0, 0); 2];
        let mut n = 0;
        let parts = usize::from(old.start < lo) + usize::from(last > hi);
        let lost = if parts == 0 || self.room_for_edit(parts) {
            if old.start < lo {
                let left = Allocation {
                    size: lo - old.start,
                    ..old
                };
                buf[n] = (self.new_record(&left), left.start, lo - 1);
                n += 1;
            }
            if last > hi {
                let right = Allocation {
                    start: hi + 1,
                    size: last - hi,
                    ..old
                };
                buf[n] = (self.new_record(&right), hi + 1, last);
                n += 1;
            }
            (0, 0)
        } else {
            (parts, old.size - (to - from + 1))
        };
        let pieces = &buf[..n];
        self.rewrite(top, old.start, last, h, pieces);
        self.recs.free(h);
        self.count = self.count + pieces.len() - 1;
        Cut {
            cleared: Allocation {
                start: from,
                size: to - from + 1,
                ..old
            },
            whole: parts == 0,
            lost,
        }
    }
}

/// What [`Writer::cut_one`] did to one range.
pub(super) struct Cut {
    /// The part cleared (inside the span), with the range's metadata.
    pub(super) cleared: Allocation,
    /// Whether that was the whole range.
    pub(super) whole: bool,
    /// Pieces outside the span dropped for lack of memory, and their bytes.
    pub(super) lost: (usize, usize),
}

impl Registry {
    /// Unregisters `[start, start + len)` (clipped at `usize::MAX`), trimming or splitting the
    /// ranges it covers in part (a VMM unmap of a sub-range).
    pub fn remove(&self, start: usize, len: usize) -> Removed {
        self.remove_span(start, len, None)
    }

    /// Like [`Self::remove`], and hands each removed piece (clipped to the span, with its range's
    /// metadata) to `out`, in address order, without the lock: the span is cleared a few ranges
    /// at a time, each batch handed out before the next is cleared, so nothing is allocated
    /// however many ranges it covers.
    pub fn remove_with(
        &self,
        start: usize,
        len: usize,
        mut out: impl FnMut(Allocation),
    ) -> Removed {
        self.remove_span(start, len, Some(&mut out))
    }

    fn remove_span(
        &self,
        start: usize,
        len: usize,
        mut out: Option<&mut dyn FnMut(Allocation)>,
    ) -> Removed {
        /// Pieces cleared under one hold of the lock when they are handed out.
        const BATCH: usize = 8;
        let mut removed = Removed::default();
        if len == 0 {
            return removed;
        }
        let last = start.saturating_add(len - 1);
        let mut lo = start;
        loop {
            let mut batch: [Option<Allocation>; BATCH] = [None; BATCH];
            let mut n = 0;
            let mut more = false;
            {
                let mut guard = self.exclusive();
                let w = &mut *guard;
                let Some(top) = w.top_if_any(self) else {
                    break;
                };
                while let Some(h) = Writer::first_meeting(top, lo, last) {
                    let cut = w.cut_one(top, lo, last, h);
                    self.account(w, &cut);
                    removed.bytes += cut.cleared.size;
                    if cut.whole {
                        removed.whole += 1;
                    } else {
                        removed.partial += 1;
                    }
                    if out.is_some() {
                        batch[n] = Some(cut.cleared);
                        n += 1;
                    }
                    match cut.cleared.last().checked_add(1) {
                        Some(next) if next <= last => lo = next,
                        _ => break,
                    }
                    if n == BATCH {
                        more = true;
                        break;
                    }
                }
                self.publish(w);
            }
            if let Some(out) = out.as_deref_mut() {
                batch[..n].iter().flatten().for_each(|&a| out(a));
            }
            if !more {
                break;
            }
        }
        removed
    }

    /// Books what a cut took: the bytes cleared and lost leave the live total, and pieces lost
    /// for lack of memory count as untracked.
    pub(super) fn account(&self, w: &mut Writer, cut: &Cut) {
        let (pieces, bytes) = cut.lost;
        w.live = w.live.wrapping_sub(cut.cleared.size).wrapping_sub(bytes);
        if pieces > 0 {
            self.stats
                .untracked
                .fetch_add(pieces as u64, Ordering::Relaxed);
        }
    }
}
