//! What the page draws, computed from the traces: per lane (one trace file, one rank) the live
//! bytes of each (memory type, device) series over time, downsampled to a fixed number of
//! buckets (min, max and last value in each), the exact peaks, the events of each bucket
//! counted per API, the largest event of each bucket, and the exit report's summary. The page's
//! size depends on the number of buckets, not on the number of events.

use std::collections::HashMap;
use std::io::BufRead;

use cuhook::events::{EventKind, MemType};
use cuhook::report::replay::{Replay, SeriesKey};

use crate::cli::reader::{self, Tally};

/// Buckets across the time axis (about one per pixel of the chart).
pub const BUCKETS: usize = 1200;

/// One event, reduced to what the chart needs.
struct Point {
    x: u64,
    kind: EventKind,
    api: usize,
    size: u64,
    address: usize,
    series: usize,
    live: u64,
    /// The allocation's call stack id (0: none recorded).
    stack: u32,
}

/// Live bytes of one series in each bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Series {
    pub mem_type: &'static str,
    pub device: i32,
    pub min: Vec<u64>,
    pub max: Vec<u64>,
    pub last: Vec<u64>,
    /// The exact peak and the x where it was first reached.
    pub peak: u64,
    pub peak_x: u64,
}

/// Events of one API in one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiBucket {
    pub api: usize,
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
    pub free_bytes: u64,
}

/// The largest event of a bucket (what hovering shows in detail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Largest {
    pub alloc: bool,
    pub api: usize,
    pub size: u64,
    pub address: usize,
    pub series: usize,
    pub x: u64,
    /// The other end of the allocation's life: for an allocation, the x of its free; for a
    /// free, the x of its allocation; `None` when the trace does not have it (live at the
    /// end, or allocated before the trace began).
    pub other_x: Option<u64>,
}

/// One trace file.
#[derive(Debug, Clone, Default)]
pub struct Lane {
    pub name: String,
    pub events: u64,
    /// Lines that were not events (truncated or foreign).
    pub skipped: u64,
    pub series: Vec<Series>,
    pub buckets: Vec<Vec<ApiBucket>>,
    pub largest: Vec<Option<Largest>>,
    pub summary: String,
    /// The call sites holding the most memory at the end and at the lane's peak (traces made
    /// with `cuhook run --stacks`; empty otherwise).
    pub sites: Vec<Site>,
}

/// Sites shown per lane.
pub const SITES_SHOWN: usize = 15;

/// One call site: its frames (as the trace's stack lines name them), and the bytes and
/// allocations of it that were live at the end of the trace and at the moment the lane's total
/// live bytes peaked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    pub frames: Vec<String>,
    pub end_bytes: u64,
    pub end_count: u64,
    pub peak_bytes: u64,
}

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Wall-clock ns since the first event of all traces (lanes line up in time).
    Time,
    /// The event's position in its trace (short bursts spread out; lanes do not line up).
    Order,
}

/// Every lane on one x axis.
#[derive(Debug, Clone)]
pub struct View {
    pub axis: Axis,
    pub lanes: Vec<Lane>,
    pub t0: u64,
    pub span: u64,
}

/// The traces drawn both ways; the page switches between them.
#[derive(Debug, Clone)]
pub struct Model {
    pub apis: Vec<String>,
    /// The time view exists only when every event carried a time.
    pub views: Vec<View>,
    /// Per trace (in lane order): its name and what reading it found.
    pub tallies: Vec<(String, Tally)>,
}

struct Parsed {
    name: String,
    points: Vec<Point>,
    series: Vec<SeriesKey>,
    tally: Tally,
    summary: String,
    timed: bool,
    /// Stack id → frames, from the trace's stack lines.
    stacks: HashMap<u32, Vec<String>>,
}

fn parse(
    name: &str,
    input: impl BufRead,
    apis: &mut Vec<String>,
    api_index: &mut HashMap<String, usize>,
) -> std::io::Result<Parsed> {
    let mut replay = Replay::new();
    let mut series: Vec<SeriesKey> = Vec::new();
    let mut points = Vec::new();
    let mut timed = true;
    let mut last_t = 0;
    let mut stacks = HashMap::new();
    let tally = reader::read_with_stacks(
        input,
        |ev| {
            let (key, live) = replay.apply(ev);
            let s = match series.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    series.push(key);
                    series.len() - 1
                }
            };
            let api = *api_index.entry(ev.api.to_owned()).or_insert_with(|| {
                apis.push(ev.api.to_owned());
                apis.len() - 1
            });
            // Threads stamp their lines just before writing them: keep x from going backwards.
            let x = match ev.time_ns {
                Some(t) => {
                    last_t = last_t.max(t);
                    last_t
                }
                None => {
                    timed = false;
                    points.len() as u64
                }
            };
            points.push(Point {
                x,
                kind: ev.kind,
                api,
                size: ev.size,
                address: ev.address,
                series: s,
                live,
                stack: ev.stack,
            });
        },
        |id, frames| {
            stacks.insert(id, frames);
        },
    )?;
    let mut summary = String::new();
    replay.summary().write(&mut summary);
    Ok(Parsed {
        name: name.to_owned(),
        points,
        series,
        tally,
        summary,
        timed,
        stacks,
    })
}

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
fn call_sites(p: &Parsed) -> Vec<Site> {
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

fn bucket_of(x: u64, t0: u64, span: u64) -> usize {
    let off = x.saturating_sub(t0) as u128;
    ((off * BUCKETS as u128) / (span.max(1) as u128 + 1)) as usize
}

fn lane(p: &Parsed, axis: Axis, t0: u64, span: u64) -> Lane {
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

/// Build the model of `traces` (name, reader of its lines), one lane each. Each trace is read
/// once, line by line.
pub fn build<R: BufRead>(traces: Vec<(String, R)>) -> std::io::Result<Model> {
    let mut apis = Vec::new();
    let mut api_index = HashMap::new();
    let mut parsed = Vec::with_capacity(traces.len());
    for (name, input) in traces {
        parsed.push(parse(&name, input, &mut apis, &mut api_index)?);
    }
    let mut views = Vec::new();
    if parsed.iter().all(|p| p.timed) {
        let xs = parsed.iter().flat_map(|p| p.points.iter().map(|pt| pt.x));
        let (t0, t1) = xs.fold((u64::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let (t0, span) = if t0 == u64::MAX {
            (0, 0)
        } else {
            (t0, t1 - t0)
        };
        views.push(View {
            axis: Axis::Time,
            lanes: parsed
                .iter()
                .map(|p| lane(p, Axis::Time, t0, span))
                .collect(),
            t0,
            span,
        });
    }
    let span = parsed
        .iter()
        .map(|p| p.points.len() as u64)
        .max()
        .unwrap_or(1)
        .max(1)
        - 1;
    views.push(View {
        axis: Axis::Order,
        lanes: parsed
            .iter()
            .map(|p| lane(p, Axis::Order, 0, span))
            .collect(),
        t0: 0,
        span,
    });
    let tallies = parsed
        .iter()
        .map(|p| (p.name.clone(), p.tally.clone()))
        .collect();
    Ok(Model {
        apis,
        views,
        tallies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: &str, api: &str, addr: u64, size: u64, dev: i32, t: u64) -> String {
        format!("{{\"event\":\"{kind}\",\"api\":\"{api}\",\"address\":\"{addr:#x}\",\"size\":{size},\"mem_type\":\"cuda\",\"device\":{dev},\"flags\":0,\"stream\":\"0x0\",\"pool\":\"0x0\",\"tid\":1,\"time_ns\":{t}}}\n")
    }

    /// `line` with a stack id.
    fn with_stack(line: String, stack: u32) -> String {
        line.replace("}\n", &format!(",\"stack\":{stack}}}\n"))
    }

    fn stack_line(id: u32, symbol: &str) -> String {
        format!("{{\"stack\":{id},\"frames\":[{{\"module\":\"/bin/app\",\"offset\":\"0x10\",\"build_id\":\"\",\"symbol\":\"{symbol}\"}},{{\"module\":\"/lib/libc.so.6\",\"offset\":\"0x2724a\",\"build_id\":\"ab\",\"symbol\":\"\"}}]}}\n")
    }

    /// Call sites: live bytes per site at the end and at the peak of the lane's total, stacks
    /// that read the same merged, frames from the stack lines (symbol, else module+offset).
    #[test]
    fn call_sites_at_the_end_and_at_the_peak() {
        let mut text = String::new();
        // Site A: 100 bytes freed after the peak; site B (ids 3 and 4: the same frames): 50 +
        // 20 live to the end; site C: 5 live at the end, allocated after the peak.
        text += &with_stack(line("alloc", "cuMemAlloc_v2", 0x1000, 100, 0, 10), 2);
        text += &with_stack(line("alloc", "cuMemAlloc_v2", 0x2000, 50, 0, 20), 3);
        text += &with_stack(line("alloc", "cuMemAlloc_v2", 0x3000, 20, 0, 30), 4);
        text += &line("free", "cuMemFree_v2", 0x1000, 100, 0, 40);
        text += &with_stack(line("alloc", "cuMemAlloc_v2", 0x4000, 5, 0, 50), 5);
        text += &stack_line(2, "site_a (a.c:1)");
        text += &stack_line(3, "site_b (b.c:2)");
        text += &stack_line(4, "site_b (b.c:2)");
        text += &stack_line(5, "site_c (c.c:3)");
        let model = build(vec![("t.jsonl".to_owned(), text.as_bytes())]).unwrap();
        assert_eq!(model.tallies[0].1.unreadable, 0);
        assert_eq!(model.tallies[0].1.stacks, 4);
        let sites = &model.views[0].lanes[0].sites;
        let row = |name: &str| {
            sites
                .iter()
                .find(|s| s.frames[0].starts_with(name))
                .map(|s| (s.end_bytes, s.end_count, s.peak_bytes))
        };
        assert_eq!(row("site_b"), Some((70, 2, 70)));
        assert_eq!(row("site_a"), Some((0, 0, 100)));
        assert_eq!(row("site_c"), Some((5, 1, 0)));
        assert_eq!(sites[0].frames, ["site_b (b.c:2)", "libc.so.6+0x2724a"]);
        assert_eq!(sites.len(), 3);
    }

    #[test]
    fn buckets_keep_min_max_and_the_exact_peak() {
        let mut text = String::new();
        // 10000 alloc/free pairs of 1 MiB on device 0, one 64 MiB spike in the middle.
        let t0 = 1_000_000_000u64;
        for i in 0..10_000u64 {
            text += &line(
                "alloc",
                "cuMemAlloc_v2",
                0x1000,
                1 << 20,
                0,
                t0 + 2 * i * 1000,
            );
            if i == 5000 {
                text += &line(
                    "alloc",
                    "cudaMalloc",
                    0x9000_0000,
                    64 << 20,
                    0,
                    t0 + 2 * i * 1000 + 1,
                );
                text += &line(
                    "free",
                    "cudaFree",
                    0x9000_0000,
                    64 << 20,
                    0,
                    t0 + 2 * i * 1000 + 2,
                );
            }
            text += &line(
                "free",
                "cuMemFree_v2",
                0x1000,
                1 << 20,
                0,
                t0 + (2 * i + 1) * 1000,
            );
        }
        text += "{\"event\":\"alloc\",\"api\n";
        let model = build(vec![("t.0.jsonl".to_owned(), text.as_bytes())]).unwrap();
        assert_eq!(model.views.len(), 2);
        let m = &model.views[0];
        assert_eq!((m.axis, m.t0), (Axis::Time, t0));
        let lane = &m.lanes[0];
        assert_eq!((lane.events, lane.skipped), (20_002, 1));
        assert_eq!(lane.series.len(), 1);
        let s = &lane.series[0];
        assert_eq!(s.peak, (64 << 20) + (1 << 20));
        assert_eq!(s.peak_x, 2 * 5000 * 1000 + 1);
        let spike = bucket_of(t0 + s.peak_x, m.t0, m.span);
        assert_eq!(s.max[spike], s.peak);
        assert_eq!(s.max.iter().copied().max(), Some(s.peak));
        assert_eq!(s.last[BUCKETS - 1], 0);
        // Every event is counted once, per API, in some bucket.
        let count = |api: &str| -> u64 {
            let i = model.apis.iter().position(|a| a == api).unwrap();
            lane.buckets
                .iter()
                .flatten()
                .filter(|b| b.api == i)
                .map(|b| b.allocs + b.frees)
                .sum()
        };
        assert_eq!(
            (
                count("cuMemAlloc_v2"),
                count("cudaMalloc"),
                count("cudaFree")
            ),
            (10_000, 1, 1)
        );
        let big = lane.largest[spike].unwrap();
        assert_eq!((big.size, big.address), (64 << 20, 0x9000_0000));
        // Its life: freed 1 ns after it was made.
        assert_eq!(big.other_x, Some(big.x + 1));
        assert!(lane.summary.contains("Calls by API:"));
        // By event order, the spike is event 10 002 of 20 002.
        let o = &model.views[1];
        assert_eq!((o.axis, o.span), (Axis::Order, 20_001));
        assert_eq!(o.lanes[0].series[0].peak_x, 10_001);
        assert_eq!(o.lanes[0].series[0].peak, s.peak);
    }

    #[test]
    fn lanes_share_one_time_axis() {
        let a = line("alloc", "cudaMalloc", 0x10, 100, 0, 5_000)
            + &line("free", "cudaFree", 0x10, 100, 0, 6_000);
        let b = line("alloc", "cudaMalloc", 0x10, 300, 1, 9_000);
        let model = build(vec![
            ("t.0.jsonl".to_owned(), a.as_bytes()),
            ("t.1.jsonl".to_owned(), b.as_bytes()),
        ])
        .unwrap();
        let m = &model.views[0];
        assert_eq!((m.t0, m.span), (5_000, 4_000));
        assert_eq!(m.lanes[1].series[0].peak_x, 4_000);
        assert_eq!(m.lanes[1].series[0].last[BUCKETS - 1], 300);
        assert_eq!(m.lanes[0].series[0].last[BUCKETS - 1], 0);
    }
}
