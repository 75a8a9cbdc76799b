//! `cuhook export --format perfetto TRACE.jsonl... -o out.json`: the traces as Chrome
//! trace-event JSON, which Perfetto and `chrome://tracing` open. Each trace is a process (its
//! file name as the process name); in it, one counter track of live bytes per memory type and
//! device, and one slice per allocation's lifetime — an async slice named after the API that
//! made it, so that each API gets its own group of tracks. Allocations still live when the
//! trace ends close at its last event, marked `live_at_exit`; a free of a pointer never seen
//! allocated is an instant event.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use cuhook::events::EventKind;
use cuhook::report::replay::Replay;

const HELP: &str = "\
Usage: cuhook export --format perfetto [-o FILE] TRACE.jsonl...

Writes FILE (default perfetto.json): the traces as Chrome trace-event JSON, for Perfetto
(open the file in its UI; nothing is uploaded by the file itself) or chrome://tracing. Each
trace becomes a process; in it, a counter of live bytes per memory type and device, and one
slice per allocation from its allocation to its free, grouped by the API that made it.
Allocations live at the end close at the trace's last event (args.live_at_exit). Times are
the trace's wall-clock times, from the earliest event of all traces; a trace without times
(an old version's) counts one microsecond per event.

  --format perfetto   the output format (the only one so far)
  -o, --output FILE   where to write
  -h, --help          this text
";

/// Parsed `export` options.
#[derive(Debug, PartialEq)]
struct Options {
    output: PathBuf,
    traces: Vec<PathBuf>,
}

/// `None` when `--help` was asked for.
fn parse(args: Vec<OsString>) -> Result<Option<Options>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut output = PathBuf::from("perfetto.json");
    let mut format = None;
    let mut traces = Vec::new();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Long("format") => format = Some(p.value()?),
            Short('o') | Long("output") => output = p.value()?.into(),
            Short('h') | Long("help") => return Ok(None),
            Value(t) => traces.push(t.into()),
            other => return Err(other.unexpected()),
        }
    }
    match format {
        None => return Err("--format is required (--format perfetto)".into()),
        Some(f) if f == "perfetto" => {}
        Some(f) => {
            return Err(format!(
                "unknown --format `{}` (known: perfetto)",
                f.to_string_lossy()
            )
            .into())
        }
    }
    if traces.is_empty() {
        return Err("no trace file given".into());
    }
    Ok(Some(Options { output, traces }))
}

/// One event of one trace, as the export needs it.
struct Row {
    ns: u64,
    kind: EventKind,
    api: String,
    address: usize,
    size: u64,
    series: String,
    live: u64,
    tid: i64,
    /// The allocation's call stack (`cuhook run --stacks`), 0 when none was recorded.
    stack: u32,
    /// Its frames as text, from the trace's stack lines (shared between rows).
    frames: Option<std::rc::Rc<[String]>>,
}

/// Read one trace: its rows, times made monotonic (a trace without times counts 1 µs an event).
fn rows_of(path: &std::path::Path) -> Result<(Vec<Row>, super::reader::Tally), String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut replay = Replay::new();
    let mut rows = Vec::new();
    let mut last = 0u64;
    let mut timed = true;
    let mut stacks: HashMap<u32, std::rc::Rc<[String]>> = HashMap::new();
    let tally = super::reader::read_with_stacks(
        std::io::BufReader::with_capacity(1 << 20, f),
        |ev| {
            let ((mem_type, device), live) = replay.apply(ev);
            let ns = match ev.time_ns {
                Some(t) => {
                    last = last.max(t);
                    last
                }
                None => {
                    timed = false;
                    0
                }
            };
            let series = if device < 0 {
                format!("live bytes {}", mem_type.name())
            } else {
                format!("live bytes {} dev {device}", mem_type.name())
            };
            rows.push(Row {
                ns,
                kind: ev.kind,
                api: ev.api.to_owned(),
                address: ev.address,
                size: ev.size,
                series,
                live,
                tid: ev.tid,
                stack: ev.stack,
                frames: None,
            });
        },
        |id, frames| {
            stacks.insert(id, frames.into());
        },
    )
    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // Stack lines come at the end of a trace: each allocation gets its frames now.
    for r in rows.iter_mut().filter(|r| r.stack != 0) {
        r.frames = stacks.get(&r.stack).cloned();
    }
    if !timed {
        // One microsecond per event, from 0.
        for (i, r) in rows.iter_mut().enumerate() {
            r.ns = i as u64 * 1000;
        }
    }
    Ok((rows, tally))
}

/// Microseconds with nanosecond precision, as trace-event JSON wants `ts`.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".to_owned())
}

/// Write the trace-event JSON of `lanes` (name, rows) to `out`.
fn write_json(lanes: &[(String, Vec<Row>)], out: &mut impl Write) -> std::io::Result<()> {
    let t0 = lanes
        .iter()
        .filter_map(|(_, rows)| rows.first().map(|r| r.ns))
        .min()
        .unwrap_or(0);
    writeln!(out, "{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
    let mut first = true;
    let mut emit = |out: &mut dyn Write, text: String| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",\n")?;
        }
        out.write_all(text.as_bytes())
    };
    let mut next_id = 1u64;
    for (lane, (name, rows)) in lanes.iter().enumerate() {
        let pid = lane + 1;
        emit(
            out,
            format!(
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"ts\":0,\"args\":{{\"name\":{}}}}}",
                quoted(name)
            ),
        )?;
        emit(
            out,
            format!("{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{pid},\"tid\":0,\"ts\":0,\"args\":{{\"sort_index\":{lane}}}}}"),
        )?;
        // Open allocations by address: (slice id, API).
        let mut open: HashMap<usize, (u64, &str)> = HashMap::new();
        let end_ns = rows.last().map_or(t0, |r| r.ns);
        for r in rows {
            let ts = micros(r.ns - t0);
            emit(
                out,
                format!(
                    "{{\"ph\":\"C\",\"name\":{},\"pid\":{pid},\"tid\":0,\"ts\":{ts},\"args\":{{\"bytes\":{}}}}}",
                    quoted(&r.series),
                    r.live
                ),
            )?;
            match r.kind {
                EventKind::Alloc => {
                    if let Some((id, api)) = open.remove(&r.address) {
                        // Allocated over a live range: its free was never seen.
                        emit(out, close(pid, r.tid, &ts, id, api, "missed_free"))?;
                    }
                    let id = next_id;
                    next_id += 1;
                    open.insert(r.address, (id, &r.api));
                    // The call stack as an argument, one frame per line.
                    let stack = r.frames.as_ref().map_or(String::new(), |f| {
                        format!(",\"stack\":{}", quoted(&f.join("\n")))
                    });
                    emit(
                        out,
                        format!(
                            "{{\"ph\":\"b\",\"cat\":\"allocation\",\"name\":{},\"id\":\"{id:#x}\",\"pid\":{pid},\"tid\":{},\"ts\":{ts},\"args\":{{\"address\":\"{:#x}\",\"size\":{}{stack}}}}}",
                            quoted(&r.api),
                            r.tid,
                            r.address,
                            r.size
                        ),
                    )?;
                }
                EventKind::Free => match open.remove(&r.address) {
                    Some((id, api)) => emit(out, close(pid, r.tid, &ts, id, api, "freed"))?,
                    None => emit(
                        out,
                        format!(
                            "{{\"ph\":\"i\",\"s\":\"p\",\"name\":\"free of a pointer never seen allocated\",\"pid\":{pid},\"tid\":{},\"ts\":{ts},\"args\":{{\"api\":{},\"address\":\"{:#x}\"}}}}",
                            r.tid,
                            quoted(&r.api),
                            r.address
                        ),
                    )?,
                },
            }
        }
        // Live at the end: close at the trace's last event, in the order they were opened.
        let mut left: Vec<(u64, &str)> = open.into_values().collect();
        left.sort_unstable();
        let ts = micros(end_ns - t0);
        for (id, api) in left {
            emit(out, close(pid, 0, &ts, id, api, "live_at_exit"))?;
        }
    }
    writeln!(out, "\n]}}")
}

/// The end of allocation slice `id`, with a boolean arg saying how it ended.
fn close(pid: usize, tid: i64, ts: &str, id: u64, api: &str, how: &str) -> String {
    format!(
        "{{\"ph\":\"e\",\"cat\":\"allocation\",\"name\":{},\"id\":\"{id:#x}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts},\"args\":{{\"{how}\":true}}}}",
        quoted(api)
    )
}

pub fn main(args: Vec<OsString>) -> i32 {
    let opts = match super::args::options_or_exit(parse(args), "export", HELP) {
        Ok(o) => o,
        Err(status) => return status,
    };
    let mut lanes = Vec::new();
    for path in &opts.traces {
        let (rows, tally) = match rows_of(path) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cuhook export: {e}; nothing written.");
                return 1;
            }
        };
        if let Some(problem) = tally.problem() {
            eprintln!("cuhook export: {}: {problem}", path.display());
        }
        lanes.push((path.display().to_string(), rows));
    }
    if lanes.iter().all(|(_, rows)| rows.is_empty()) {
        let names: Vec<String> = lanes.iter().map(|(n, _)| n.clone()).collect();
        eprintln!(
            "cuhook export: {}; nothing written.",
            super::reader::no_event_in(&names)
        );
        return 1;
    }
    let written = std::fs::File::create(&opts.output).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        write_json(&lanes, &mut w)?;
        w.flush()
    });
    if let Err(e) = written {
        eprintln!("cuhook export: cannot write {}: {e}", opts.output.display());
        return 1;
    }
    let events: usize = lanes.iter().map(|(_, r)| r.len()).sum();
    println!(
        "cuhook export: wrote {} ({events} events of {} trace{}; open it in Perfetto or chrome://tracing)",
        opts.output.display(),
        lanes.len(),
        if lanes.len() == 1 { "" } else { "s" }
    );
    0
}
