//! What the page draws, computed from the traces: per lane (one trace file, one rank) the live
//! bytes of each (memory type, device) series over time, downsampled to a fixed number of
//! buckets (min, max and last value in each), the exact peaks, the events of each bucket
//! counted per API, the largest event of each bucket, and the exit report's summary. The page's
//! size depends on the number of buckets, not on the number of events.
//!
//! Here: the model's types, reading each trace once, and the views; each lane's buckets are
//! built in `lane.rs`, its call sites in `sites.rs`.

mod lane;
mod sites;

use std::collections::HashMap;
use std::io::BufRead;

use cuhook::events::EventKind;
use cuhook::report::replay::{Replay, SeriesKey};

use crate::cli::reader::{self, Tally};
use lane::lane;

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
mod tests;
