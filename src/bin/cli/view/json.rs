//! The model as JSON for the page's script. Only what the page needs: numbers, strings and
//! arrays of them, written straight into the `<script type="application/json">` element
//! (`<` escaped, so no string can end the element).

use std::fmt::Write;

use super::model::{Axis, Lane, Model, View};

/// `s` as a JSON string literal, safe inside an HTML `<script>` element: serde_json's literal,
/// with the characters that could end the element or a line of script escaped too.
pub fn string(s: &str) -> String {
    let literal = serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".to_owned());
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn numbers(v: &[u64]) -> String {
    let mut out = String::with_capacity(v.len() * 4);
    out.push('[');
    for (i, n) in v.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{n}");
    }
    out.push(']');
    out
}

fn lane(l: &Lane) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "{{\"name\":{},\"events\":{},\"skipped\":{},\"summary\":{},\"series\":[",
        string(&l.name),
        l.events,
        l.skipped,
        string(&l.summary)
    );
    for (i, s) in l.series.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"mem_type\":{},\"device\":{},\"min\":{},\"max\":{},\"last\":{},\"peak\":{},\"peak_x\":{}}}",
            string(s.mem_type),
            s.device,
            numbers(&s.min),
            numbers(&s.max),
            numbers(&s.last),
            s.peak,
            s.peak_x
        );
    }
    o.push_str("],\"buckets\":[");
    for (i, b) in l.buckets.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        o.push('[');
        for (j, r) in b.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            let _ = write!(
                o,
                "[{},{},{},{},{}]",
                r.api, r.allocs, r.frees, r.alloc_bytes, r.free_bytes
            );
        }
        o.push(']');
    }
    o.push_str("],\"largest\":[");
    for (i, b) in l.largest.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        match b {
            None => o.push_str("null"),
            Some(e) => {
                let other = e.other_x.map_or("null".to_owned(), |x| x.to_string());
                let _ = write!(
                    o,
                    "[{},{},{},\"{:#x}\",{},{},{other}]",
                    u8::from(e.alloc),
                    e.api,
                    e.size,
                    e.address,
                    e.series,
                    e.x
                );
            }
        }
    }
    o.push_str("],\"sites\":[");
    for (i, site) in l.sites.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let frames: Vec<String> = site.frames.iter().map(|f| string(f)).collect();
        let _ = write!(
            o,
            "{{\"frames\":[{}],\"end\":{},\"count\":{},\"peak\":{}}}",
            frames.join(","),
            site.end_bytes,
            site.end_count,
            site.peak_bytes
        );
    }
    o.push_str("]}");
    o
}

fn view(v: &View) -> String {
    let lanes: Vec<String> = v.lanes.iter().map(lane).collect();
    format!(
        "{{\"timed\":{},\"t0\":\"{}\",\"span\":{},\"lanes\":[{}]}}",
        v.axis == Axis::Time,
        v.t0,
        v.span,
        lanes.join(",")
    )
}

/// The whole model.
pub fn model(m: &Model) -> String {
    let apis: Vec<String> = m.apis.iter().map(|a| string(a)).collect();
    let views: Vec<String> = m.views.iter().map(view).collect();
    format!(
        "{{\"buckets\":{},\"apis\":[{}],\"views\":[{}]}}",
        super::model::BUCKETS,
        apis.join(","),
        views.join(",")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_cannot_close_the_script_element() {
        assert_eq!(
            super::string("a\"b\\</script>\n"),
            "\"a\\\"b\\\\\\u003c/script\\u003e\\n\""
        );
    }
}
