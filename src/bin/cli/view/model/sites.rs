//! The lane's call sites (traces made with `cuhook run --stacks`): the allocations live at the
//! end and at the lane's peak, added up per stack and merged per site. A replay of its own,
//! by address, apart from the bucketing.

use std::collections::HashMap;

use cuhook::events::EventKind;

use super::{Parsed, Point, Site, SITES_SHOWN};

/// Replays `points` by address, calling `each(i, open, total)` after point `i` with the
/// allocations live then (address → (size, stack)) and their total bytes.
fn replay_open(points: &[Point], mut each: impl FnMut(usize, &HashMap<usize, (u64, u32)>, u64)) {
    let mut open: HashMap<usize, (u64, u32)> = HashMap::new();
    let mut total = 0u64;
    for (i, pt) in points.iter().enumerate() {
        let gone = match pt.kind {
            EventKind::Alloc => open.insert(pt.address, (pt.size, pt.stack)),
            EventKind::Free => open.remove(&pt.address),
        };
        total -= gone.map_or(0, |(size, _)| size);
        if pt.kind == EventKind::Alloc {
            total += pt.size;
        }
        each(i, &open, total);
    }
}

/// The lane's call sites ([`Site`]), largest at the end first (then at the peak). Two passes:
/// the first finds when the total of live bytes peaked, the second adds up each stack's live
/// bytes to that moment and to the end; stacks whose frames read the same are one site.
pub(super) fn call_sites(p: &Parsed) -> Vec<Site> {
    if p.stacks.is_empty() {
        return Vec::new();
    }
    let (mut peak, mut peak_at) = (0u64, 0usize);
    replay_open(&p.points, |i, _, total| {
        if total > peak {
            (peak, peak_at) = (total, i);
        }
    });
    let last = p.points.len().saturating_sub(1);
    let mut peak_by_stack: HashMap<u32, u64> = HashMap::new();
    let mut end_by_stack: HashMap<u32, (u64, u64)> = HashMap::new();
    replay_open(&p.points, |i, open, _| {
        if i == peak_at {
            for &(size, stack) in open.values() {
                *peak_by_stack.entry(stack).or_default() += size;
            }
        }
        if i == last {
            for &(size, stack) in open.values() {
                let e = end_by_stack.entry(stack).or_default();
                e.0 += size;
                e.1 += 1;
            }
        }
    });
    let mut sites: Vec<Site> = Vec::new();
    let mut add = |stack: u32, end: (u64, u64), peak: u64| {
        let frames = match p.stacks.get(&stack) {
            Some(f) => f.clone(),
            None if stack == 1 => vec!["(other: the stack table was full)".to_owned()],
            None => vec!["(no stack recorded)".to_owned()],
        };
        let site = match sites.iter_mut().find(|s| s.frames == frames) {
            Some(s) => s,
            None => {
                sites.push(Site {
                    frames,
                    ..Site::default()
                });
                sites.last_mut().expect("just pushed")
            }
        };
        site.end_bytes += end.0;
        site.end_count += end.1;
        site.peak_bytes += peak;
    };
    let mut stacks: Vec<u32> = end_by_stack
        .keys()
        .chain(peak_by_stack.keys())
        .copied()
        .collect();
    stacks.sort_unstable();
    stacks.dedup();
    for stack in stacks {
        add(
            stack,
            end_by_stack.get(&stack).copied().unwrap_or_default(),
            peak_by_stack.get(&stack).copied().unwrap_or_default(),
        );
    }
    sites.sort_by_key(|s| std::cmp::Reverse((s.end_bytes, s.peak_bytes)));
    sites.truncate(SITES_SHOWN);
    sites
}
