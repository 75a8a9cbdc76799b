//! One lane on one x axis: its events downsampled into [`BUCKETS`] buckets (each series'
//! min, max and last value, the events per API, the largest event and its lifetime), with
//! the exact peaks kept.

use std::collections::HashMap;

use cuhook::events::{EventKind, MemType};

use super::sites::call_sites;
use super::{ApiBucket, Axis, Lane, Largest, Parsed, Series, BUCKETS};

pub(super) fn bucket_of(x: u64, t0: u64, span: u64) -> usize {
    let off = x.saturating_sub(t0) as u128;
    ((off * BUCKETS as u128) / (span.max(1) as u128 + 1)) as usize
}

pub(super) fn lane(p: &Parsed, axis: Axis, t0: u64, span: u64) -> Lane {
    let mut series: Vec<Series> = p
        .series
        .iter()
        .map(|&(t, d): &(MemType, i32)| Series {
            mem_type: t.name(),
            device: d,
            min: vec![u64::MAX; BUCKETS],
            max: vec![0; BUCKETS],
            last: vec![u64::MAX; BUCKETS],
            peak: 0,
            peak_x: 0,
        })
        .collect();
    let mut buckets: Vec<Vec<ApiBucket>> = vec![Vec::new(); BUCKETS];
    let mut largest: Vec<Option<Largest>> = vec![None; BUCKETS];
    // Live allocations by address: (x of the allocation, the bucket it is the largest of).
    let mut open: HashMap<usize, (u64, Option<usize>)> = HashMap::new();
    for (i, pt) in p.points.iter().enumerate() {
        let x = match axis {
            Axis::Time => pt.x,
            Axis::Order => i as u64,
        };
        let b = bucket_of(x, t0, span);
        let s = &mut series[pt.series];
        s.min[b] = s.min[b].min(pt.live);
        s.max[b] = s.max[b].max(pt.live);
        s.last[b] = pt.live;
        if pt.live > s.peak {
            s.peak = pt.live;
            s.peak_x = x - t0;
        }
        let alloc = pt.kind == EventKind::Alloc;
        let row = match buckets[b].iter().position(|r| r.api == pt.api) {
            Some(i) => &mut buckets[b][i],
            None => {
                buckets[b].push(ApiBucket {
                    api: pt.api,
                    ..ApiBucket::default()
                });
                buckets[b].last_mut().expect("just pushed")
            }
        };
        if alloc {
            row.allocs += 1;
            row.alloc_bytes += pt.size;
        } else {
            row.frees += 1;
            row.free_bytes += pt.size;
        }
        // The other end of this event's allocation, and the largest event that it ends.
        let other_x = if alloc {
            None
        } else {
            open.remove(&pt.address).map(|(ax, owner)| {
                if let Some(l) = owner.and_then(|ob| largest[ob].as_mut()) {
                    if l.alloc && l.address == pt.address && l.x == ax - t0 {
                        l.other_x = Some(x - t0);
                    }
                }
                ax - t0
            })
        };
        let biggest = largest[b].is_none_or(|l| pt.size > l.size);
        if biggest {
            largest[b] = Some(Largest {
                alloc,
                api: pt.api,
                size: pt.size,
                address: pt.address,
                series: pt.series,
                x: x - t0,
                other_x,
            });
        }
        if alloc {
            open.insert(pt.address, (x, biggest.then_some(b)));
        }
    }
    // A bucket without events of a series holds the value the series had before it.
    for s in &mut series {
        let mut carried = 0;
        for b in 0..BUCKETS {
            if s.last[b] == u64::MAX {
                s.min[b] = carried;
                s.max[b] = carried;
                s.last[b] = carried;
            } else {
                s.min[b] = s.min[b].min(carried);
                s.max[b] = s.max[b].max(carried);
                carried = s.last[b];
            }
        }
    }
    Lane {
        name: p.name.clone(),
        events: p.points.len() as u64,
        skipped: p.tally.unreadable,
        series,
        buckets,
        largest,
        summary: p.summary.clone(),
        sites: call_sites(p),
    }
}
