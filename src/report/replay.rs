//! Reading a trace back (`CUHOOK_TRACE`, one JSON object per line, as [`super::trace::format`]
//! writes it) and replaying its events into the same [`Summary`] the exit report prints.
//! The reader knows only our own flat format: no nesting, no escapes in names it must read.

use std::collections::{BTreeMap, HashMap};

use super::stats::{ApiCounts, Usage};
use super::summary::{LiveAllocation, Summary};
use crate::events::{EventKind, MemType};

/// The value of `key` in one trace line: the text after `"key":`, without quotes, up to the next
/// `"`, `,` or `}`; empty when the key is absent.
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let mut search = line;
    while let Some(i) = search.find(key) {
        let before = &search[..i];
        let rest = &search[i + key.len()..];
        if before.ends_with('"') {
            if let Some(value) = rest.strip_prefix("\":") {
                let value = value.strip_prefix('"').unwrap_or(value);
                let end = value.find(['"', ',', '}']).unwrap_or(value.len());
                return &value[..end];
            }
        }
        search = rest;
    }
    ""
}

/// One event read back from a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent<'a> {
    /// Allocation or free.
    pub kind: EventKind,
    /// The API entry point the application called.
    pub api: &'a str,
    /// First byte.
    pub address: usize,
    /// Length in bytes.
    pub size: u64,
    /// Memory type.
    pub mem_type: MemType,
    /// Device ordinal, -1 for host or unknown.
    pub device: i32,
    /// [`crate::events::flags`] bits.
    pub flags: u32,
    /// Thread that made the call.
    pub tid: i64,
    /// Wall-clock time of the event in ns since the Unix epoch (traces of older versions lack it).
    pub time_ns: Option<u64>,
    /// The call stack that allocated it (`CUHOOK_STACKS`; the trace's `"stack"` lines give its
    /// frames), 0 when none was recorded.
    pub stack: u32,
}

fn mem_type(name: &str) -> MemType {
    [MemType::Host, MemType::Cuda, MemType::CudaManaged]
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or(MemType::Unknown)
}

/// Parse one trace line; `None` for a line that is not an event (blank, truncated, foreign).
///
/// ```
/// use cuhook::events::{EventKind, MemType};
/// use cuhook::report::replay::{parse_line, Replay};
///
/// let line = r#"{"event":"alloc","api":"cudaMalloc","address":"0x7f0000000000","size":4096,"mem_type":"cuda","device":0,"flags":0,"stream":"0x0","pool":"0x0","tid":7,"time_ns":1}"#;
/// let ev = parse_line(line).unwrap();
/// assert_eq!((ev.kind, ev.api, ev.size, ev.mem_type), (EventKind::Alloc, "cudaMalloc", 4096, MemType::Cuda));
///
/// let mut replay = Replay::new();
/// replay.apply(&ev);
/// let mut report = String::new();
/// replay.summary().write(&mut report);
/// assert!(report.contains("Live allocations at exit: 1 (4.0 KiB)"));
/// ```
pub fn parse_line(line: &str) -> Option<TraceEvent<'_>> {
    let kind = match field(line, "event") {
        "alloc" => EventKind::Alloc,
        "free" => EventKind::Free,
        _ => return None,
    };
    let address = field(line, "address");
    let address = usize::from_str_radix(address.strip_prefix("0x")?, 16).ok()?;
    Some(TraceEvent {
        kind,
        api: field(line, "api"),
        address,
        size: field(line, "size").parse().ok()?,
        mem_type: mem_type(field(line, "mem_type")),
        device: field(line, "device").parse().unwrap_or(-1),
        flags: field(line, "flags").parse().unwrap_or(0),
        tid: field(line, "tid").parse().unwrap_or(0),
        time_ns: field(line, "time_ns").parse().ok(),
        stack: field(line, "stack").parse().unwrap_or(0),
    })
}

/// A series of the memory chart: one memory type on one device.
pub type SeriesKey = (MemType, i32);

/// The counters of the exit report, fed from trace events instead of hooks.
#[derive(Debug, Default)]
pub struct Replay {
    apis: HashMap<String, ApiCounts>,
    usage: BTreeMap<(u8, i32), (u64, u64)>,
    live: HashMap<usize, LiveAllocation>,
    live_bytes: u64,
    unknown_frees: u64,
    missed_frees: u64,
}

impl Replay {
    /// An empty replay.
    pub fn new() -> Replay {
        Replay::default()
    }

    /// Count one event as the report's subscriber and the registry would; returns the series it
    /// changed and that series' live bytes afterwards.
    pub fn apply(&mut self, ev: &TraceEvent) -> (SeriesKey, u64) {
        let api = self
            .apis
            .entry(ev.api.to_owned())
            .or_insert_with(|| ApiCounts {
                api: ev.api.to_owned(),
                allocs: 0,
                alloc_bytes: 0,
                frees: 0,
                free_bytes: 0,
            });
        let usage = self
            .usage
            .entry((ev.mem_type as u8, ev.device))
            .or_default();
        match ev.kind {
            EventKind::Alloc => {
                api.allocs += 1;
                api.alloc_bytes += ev.size;
                usage.0 += ev.size;
                usage.1 = usage.1.max(usage.0);
                let old = self.live.insert(
                    ev.address,
                    LiveAllocation {
                        start: ev.address,
                        size: ev.size,
                        mem_type: ev.mem_type,
                        device: ev.device,
                        api: ev.api.to_owned(),
                    },
                );
                self.live_bytes += ev.size;
                if let Some(old) = old {
                    self.missed_frees += 1;
                    self.live_bytes -= old.size;
                }
            }
            EventKind::Free => {
                api.frees += 1;
                api.free_bytes += ev.size;
                usage.0 = usage.0.saturating_sub(ev.size);
                match self.live.remove(&ev.address) {
                    Some(a) => self.live_bytes -= a.size,
                    None => self.unknown_frees += 1,
                }
            }
        }
        ((ev.mem_type, ev.device), usage.0)
    }

    /// What the events so far add up to.
    pub fn summary(&self) -> Summary {
        let types = [
            MemType::Host,
            MemType::Cuda,
            MemType::CudaManaged,
            MemType::Unknown,
        ];
        Summary {
            apis: self.apis.values().cloned().collect(),
            usage: self
                .usage
                .iter()
                .filter(|(_, (_, peak))| *peak > 0)
                .map(|(&(t, device), &(live, peak))| Usage {
                    mem_type: types[t as usize % types.len()],
                    device,
                    live,
                    peak,
                })
                .collect(),
            live: self.live.values().cloned().collect(),
            live_bytes: self.live_bytes,
            unknown_frees: self.unknown_frees,
            missed_frees: self.missed_frees,
            failed_frees: 0,
            untracked: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOC: &str = "{\"event\":\"alloc\",\"api\":\"cudaMallocAsync\",\"address\":\"0x7f0000001000\",\"size\":4096,\"mem_type\":\"cuda\",\"device\":1,\"flags\":1,\"stream\":\"0x0\",\"pool\":\"0x0\",\"tid\":42,\"time_ns\":1700000000000000000}";

    #[test]
    fn a_written_line_reads_back() {
        let mut ev = crate::events::MemEvent::alloc(crate::events::Allocation::new(
            0x7f00_0000_1000,
            4096,
            c"cudaMallocAsync",
        ));
        ev.range.mem_type = MemType::Cuda;
        ev.range.device = 1;
        ev.range.flags = 1;
        let mut written = String::new();
        super::super::trace::format(&ev, 42, 1_700_000_000_000_000_000, &mut written).unwrap();
        assert_eq!(written.trim_end(), ALLOC);
        let ev = parse_line(ALLOC).unwrap();
        assert_eq!(ev.kind, EventKind::Alloc);
        assert_eq!(ev.api, "cudaMallocAsync");
        assert_eq!(ev.address, 0x7f00_0000_1000);
        assert_eq!(
            (ev.size, ev.mem_type, ev.device, ev.flags),
            (4096, MemType::Cuda, 1, 1)
        );
        assert_eq!((ev.tid, ev.time_ns), (42, Some(1_700_000_000_000_000_000)));
        assert_eq!(field(ALLOC, "pool"), "0x0");
        assert!(parse_line("").is_none());
        assert!(parse_line("{\"event\":\"alloc\",\"api\":\"x\"").is_none());
    }

    #[test]
    fn replay_counts_like_the_report() {
        let free = ALLOC
            .replace("\"alloc\"", "\"free\"")
            .replace("cudaMallocAsync", "cudaFreeAsync");
        let mut r = Replay::new();
        for line in [ALLOC, &free, ALLOC, ALLOC, &free, &free] {
            r.apply(&parse_line(line).unwrap());
        }
        let s = r.summary();
        // alloc, free, alloc, alloc over a live range (a missed free), free, free of nothing.
        assert_eq!((s.missed_frees, s.unknown_frees), (1, 1));
        assert_eq!((s.live.len(), s.live_bytes), (0, 0));
        let u = s.usage[0];
        assert_eq!(
            (u.mem_type, u.device, u.live, u.peak),
            (MemType::Cuda, 1, 0, 8192)
        );
        let mut text = String::new();
        s.write(&mut text);
        assert!(text.contains("cudaMallocAsync"), "{text}");
        assert!(
            text.contains("Missed frees (a live range allocated over again): 1"),
            "{text}"
        );
    }
}
