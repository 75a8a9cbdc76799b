//! Reading a trace back: one JSON object per line (what `cuhook run --trace` and
//! `CUHOOK_TRACE` write), parsed as JSON — any spacing, any key order, extra keys ignored —
//! into the library's [`TraceEvent`]. Lines that are not events are counted with the first
//! one's line number and reason, so the user hears about a damaged or foreign file.

use std::io::BufRead;

use cuhook::events::{EventKind, MemType};
use cuhook::report::replay::TraceEvent;
use serde_json::Value;

/// One JSON object as an event, or why it is not one.
pub fn event(v: &Value) -> Result<TraceEvent<'_>, String> {
    let Value::Object(o) = v else {
        return Err(format!("not a JSON object but {}", kind_of(v)));
    };
    let text = |key: &str| match o.get(key) {
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(other) => Err(format!("\"{key}\" is {}, not a string", kind_of(other))),
        None => Err(format!("no \"{key}\"")),
    };
    let number = |key: &str| match o.get(key) {
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("\"{key}\" is {n}, not an integer of 64 bits")),
        Some(other) => Err(format!("\"{key}\" is {}, not a number", kind_of(other))),
        None => Ok(None),
    };
    let kind = match text("event")? {
        "alloc" => EventKind::Alloc,
        "free" => EventKind::Free,
        other => {
            return Err(format!(
                "\"event\" is \"{other}\", neither \"alloc\" nor \"free\""
            ))
        }
    };
    let address = match o.get("address") {
        Some(Value::String(s)) => s
            .strip_prefix("0x")
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("\"address\" is \"{s}\", not a hexadecimal 0x… address"))?,
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(|| format!("\"address\" is {n}, not an address"))?,
        Some(other) => return Err(format!("\"address\" is {}, not an address", kind_of(other))),
        None => return Err("no \"address\"".to_owned()),
    };
    let size = match o.get("size") {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("\"size\" is {n}, not a byte count"))?,
        Some(other) => return Err(format!("\"size\" is {}, not a number", kind_of(other))),
        None => return Err("no \"size\"".to_owned()),
    };
    let mem_type = match o.get("mem_type") {
        Some(Value::String(s)) => [MemType::Host, MemType::Cuda, MemType::CudaManaged]
            .into_iter()
            .find(|t| t.name() == s)
            .unwrap_or(MemType::Unknown),
        _ => MemType::Unknown,
    };
    let device = match number("device")? {
        None => -1,
        Some(d) => i32::try_from(d).map_err(|_| format!("\"device\" is {d}, not a device"))?,
    };
    let flags = match number("flags")? {
        None => 0,
        Some(f) => u32::try_from(f).map_err(|_| format!("\"flags\" is {f}, not 32 flag bits"))?,
    };
    let time_ns = match o.get("time_ns") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .ok_or_else(|| format!("\"time_ns\" is {n}, not a time in ns"))?,
        ),
        Some(other) => return Err(format!("\"time_ns\" is {}, not a number", kind_of(other))),
    };
    Ok(TraceEvent {
        kind,
        api: text("api")?,
        address,
        size,
        mem_type,
        device,
        flags,
        tid: number("tid")?.unwrap_or(0),
        time_ns,
        stack: match number("stack")? {
            None => 0,
            Some(s) => u32::try_from(s).map_err(|_| format!("\"stack\" is {s}, not a stack id"))?,
        },
    })
}

/// A stack line's frames as text: each frame's symbol (`function (file:line)`), else its
/// module's file name and offset, else its address.
pub fn stack_frames(v: &Value) -> Vec<String> {
    let text = |f: &Value, key: &str| f[key].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    v["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .map(|f| {
                    text(f, "symbol")
                        .or_else(|| {
                            let module = text(f, "module")?;
                            let name = module.rsplit('/').next().unwrap_or(&module).to_owned();
                            Some(format!("{name}+{}", text(f, "offset").unwrap_or_default()))
                        })
                        .or_else(|| text(f, "address"))
                        .unwrap_or_else(|| "?".to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `v` is a stack line: an object with a numeric `"stack"`, a `"frames"` array and no
/// `"event"`.
fn is_stack_line(v: &Value) -> bool {
    v.get("event").is_none()
        && v.get("stack").is_some_and(Value::is_u64)
        && v.get("frames").is_some_and(Value::is_array)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What reading one trace found besides its events.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    /// Lines that hold anything but white space.
    pub lines: u64,
    /// Events read.
    pub events: u64,
    /// Stack lines read (`{"stack":ID,"frames":[…]}`, written at exit with `CUHOOK_STACKS`).
    pub stacks: u64,
    /// Lines that were not events.
    pub unreadable: u64,
    /// The first of those: line number (from 1) and why.
    pub first: Option<(u64, String)>,
}

impl Tally {
    /// "N of M lines unreadable (first at line K: why)", or `None` when every line was read.
    pub fn problem(&self) -> Option<String> {
        let (line, why) = self.first.as_ref()?;
        Some(format!(
            "{} of {} line{} unreadable (first at line {line}: {why})",
            self.unreadable,
            self.lines,
            if self.lines == 1 { "" } else { "s" }
        ))
    }
}

/// The message for traces `names` in which no event was found.
pub fn no_event_in(names: &[String]) -> String {
    format!(
        "no event in {} (a trace has one JSON object per line, as `cuhook run --trace FILE` writes it)",
        names.join(", ")
    )
}

/// A JSON error without serde_json's "at line 1 column N" (each line is parsed alone).
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let message = text
        .rfind(" at line ")
        .map_or(text.as_str(), |i| &text[..i]);
    format!("{message} at column {}", e.column())
}

/// Read every line of `input`, calling `each` with each event in order.
pub fn read(input: impl BufRead, each: impl FnMut(&TraceEvent)) -> std::io::Result<Tally> {
    read_with_stacks(input, each, |_, _| {})
}

/// [`read`], and `stack` with each stack line's id and frames as text ([`stack_frames`]).
pub fn read_with_stacks(
    mut input: impl BufRead,
    mut each: impl FnMut(&TraceEvent),
    mut stack: impl FnMut(u32, Vec<String>),
) -> std::io::Result<Tally> {
    let mut tally = Tally::default();
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        number += 1;
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        tally.lines += 1;
        let parsed = serde_json::from_slice::<Value>(&buf).map_err(|e| json_error(&e));
        if let Some(v) = parsed.as_ref().ok().filter(|v| is_stack_line(v)) {
            tally.stacks += 1;
            if let Some(id) = v["stack"].as_u64().and_then(|id| u32::try_from(id).ok()) {
                stack(id, stack_frames(v));
            }
            continue;
        }
        match parsed.and_then(|v| event(&v).map(|ev| each(&ev))) {
            Ok(()) => tally.events += 1,
            Err(why) => {
                tally.unreadable += 1;
                tally.first.get_or_insert((number, why));
            }
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"event":"alloc","api":"cudaMallocAsync","address":"0x7f0000001000","size":4096,"mem_type":"cuda","device":1,"flags":1,"stream":"0x0","pool":"0x0","tid":42,"time_ns":1700000000000000000}"#;

    fn events(text: &str) -> (Vec<String>, Tally) {
        let mut seen = Vec::new();
        let tally = read(text.as_bytes(), |ev| {
            seen.push(format!(
                "{:?} {} {:#x} {} {:?} {} {} {} {:?}",
                ev.kind,
                ev.api,
                ev.address,
                ev.size,
                ev.mem_type,
                ev.device,
                ev.flags,
                ev.tid,
                ev.time_ns
            ))
        })
        .unwrap();
        (seen, tally)
    }

    #[test]
    fn any_spacing_and_key_order_reads_the_same() {
        let expected =
            "Alloc cudaMallocAsync 0x7f0000001000 4096 Cuda 1 1 42 Some(1700000000000000000)";
        let respaced = r#"{ "time_ns": 1700000000000000000, "tid": 42, "pool": "0x0", "stream": "0x0",
            "flags": 1, "device": 1, "mem_type": "cuda", "size": 4096,
            "address": "0x7f0000001000", "api": "cudaMallocAsync", "event": "alloc", "new": [1, {"x": "}"}] }"#
            .replace('\n', " ");
        for text in [LINE.to_owned(), respaced, format!("\t{LINE}  \r")] {
            let (seen, tally) = events(&text);
            assert_eq!(seen, [expected], "{text}");
            assert_eq!(tally.problem(), None);
        }
    }

    #[test]
    fn unreadable_lines_are_counted_with_the_first_reason() {
        let text = format!(
            "{LINE}\n\n[1,2,3]\n{}\n{{\"event\":\"mark\"}}\n{LINE}\n",
            &LINE[..40]
        );
        let (seen, tally) = events(&text);
        assert_eq!(seen.len(), 2);
        assert_eq!((tally.lines, tally.events, tally.unreadable), (5, 2, 3));
        assert_eq!(
            tally.problem().unwrap(),
            "3 of 5 lines unreadable (first at line 3: not a JSON object but an array)"
        );
        let (_, t) = events(&LINE[..40]);
        assert_eq!(
            t.problem().unwrap(),
            "1 of 1 line unreadable (first at line 1: EOF while parsing an object at column 40)"
        );
        let (_, t) = events(&LINE.replace("4096", "-1"));
        assert_eq!(t.first.unwrap().1, "\"size\" is -1, not a byte count");
        let (_, t) = events("\u{1}\u{2}garbage");
        assert!(t.first.unwrap().1.starts_with("expected value at column 1"));
    }

    #[test]
    fn optional_fields_default_like_the_old_reader() {
        let (seen, tally) =
            events(r#"{"event":"free","api":"cuMemFree_v2","address":"0x10","size":0}"#);
        assert_eq!(tally.unreadable, 0);
        assert_eq!(seen, ["Free cuMemFree_v2 0x10 0 Unknown -1 0 0 None"]);
    }
}
