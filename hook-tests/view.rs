//! `cuhook view`: the page for real traces (the demo programs under `cuhook run`, one lane per
//! rank) and for a million-event trace loads in headless Chromium without a script error, and
//! says what the exit report says.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Chromium (Debian's `chromium`, or `$CUHOOK_CHROMIUM`), headless, with a fresh profile and
/// nothing that reaches the network, bounded by `timeout` so a stuck browser fails the test.
fn chromium(dir: &Path, args: &[&str], url: &str) -> std::process::Output {
    let browser = std::env::var("CUHOOK_CHROMIUM").unwrap_or_else(|_| "chromium".to_owned());
    let profile = dir.join("chromium-profile");
    let out = Command::new("timeout")
        .args(["120", &browser])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {browser} (apt-get install chromium): {e}"));
    assert!(
        out.status.success(),
        "{browser} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn url(page: &Path, fragment: &str) -> String {
    format!("file://{}{fragment}", page.display())
}

/// Load the page; panic unless its script reported success. Returns the rendered DOM.
fn render(dir: &Path, url: &str) -> String {
    let dom = String::from_utf8_lossy(&chromium(dir, &["--dump-dom"], url).stdout).into_owned();
    assert!(
        dom.contains("<body data-status=\"ok\">"),
        "the page did not render:\n{}",
        &dom[dom.find("<body").unwrap_or(0)..]
    );
    dom
}

fn view(dir: &Path, traces: &[PathBuf]) -> PathBuf {
    let page = dir.join("memory.html");
    common::output_ok(
        common::cuhook_command()
            .arg("view")
            .arg("-o")
            .arg(&page)
            .args(traces),
    );
    page
}

#[test]
fn ranks_of_a_run_render_as_lanes_with_the_report_summary() {
    let dir = common::scratch("view-ranks");
    let programs = ["demo_driver", "demo_rt_shared", "demo_rt_static"];
    // Three "ranks" at once, as under mpirun.
    let children: Vec<_> = programs
        .iter()
        .enumerate()
        .map(|(rank, p)| {
            common::cuhook_command()
                .current_dir(&dir)
                .env("PMI_RANK", rank.to_string())
                .args(["run", "--report", "r.%r.txt", "--trace", "t.%r.jsonl", "--"])
                .arg(common::fixtures_dir().join(p))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let traces: Vec<PathBuf> = (0..3).map(|r| dir.join(format!("t.{r}.jsonl"))).collect();
    let page = view(&dir, &traces);
    let dom = render(&dir, &url(&page, ""));
    assert!(dom.contains("rendered 3 lanes"), "{dom}");
    assert!(dom.contains("lanes aligned in time"), "time view first");
    let by_order = render(&dir, &url(&page, "#order"));
    assert!(by_order.contains("x is each event's position in its trace"));
    // What hovering shows, pinned through the URL: demo_driver's first event (bucket 0 of the
    // event-order axis) is its 64 MiB cuMemAlloc_v2.
    let moment = render(&dir, &url(&page, "#order&bucket=0"));
    assert!(
        moment.contains("cuMemAlloc_v2: 1 alloc 64.0 MiB")
            && moment.contains("largest: alloc cuMemAlloc_v2 64.0 MiB at 0x"),
        "{}",
        &moment[moment.find("class=\"pinned\"").unwrap_or(0)..]
    );
    for r in 0..3 {
        assert!(
            dom.contains(&format!("t.{r}.jsonl")),
            "lane of rank {r} missing"
        );
        // The page's summary is the exit report's, line for line.
        let report = std::fs::read_to_string(dir.join(format!("r.{r}.txt"))).unwrap();
        let start = report.find("Calls by API:").unwrap();
        let end = report.find("Missed frees").unwrap();
        let expected = report[start..end]
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(
            dom.contains(&expected),
            "rank {r}: summary differs from\n{expected}"
        );
    }
    // A picture of it, for people (and proof that the canvas drew something).
    let shot = dir.join("shot.png");
    chromium(
        &dir,
        &[
            "--window-size=1280,1000",
            &format!("--screenshot={}", shot.display()),
        ],
        &url(&page, "#order"),
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}

#[test]
fn a_million_events_are_downsampled_and_summed_exactly() {
    use std::io::Write;
    let dir = common::scratch("view-million");
    let trace = dir.join("t.0.jsonl");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&trace).unwrap());
    // 500 000 alloc/free pairs on two devices, sizes varying, 1 µs apart; every 100 000th
    // allocation kept (5 live at the end, 1 GiB each).
    let t0 = 1_700_000_000_000_000_000u64;
    let mut kept = 0u64;
    for i in 0..500_000u64 {
        let dev = i % 2;
        let size = 4096 * (1 + i % 64);
        let addr = 0x7f00_0000_0000 + (i % 1024) * 0x100_0000 + dev * 0x10_0000_0000;
        let keep = i % 100_000 == 99_999;
        let (addr, size) = if keep {
            (0x7e00_0000_0000 + i * 0x4000_0000, 1 << 30)
        } else {
            (addr, size)
        };
        writeln!(w, "{{\"event\":\"alloc\",\"api\":\"cuMemAllocAsync\",\"address\":\"{addr:#x}\",\"size\":{size},\"mem_type\":\"cuda\",\"device\":{dev},\"flags\":1,\"stream\":\"0x1\",\"pool\":\"0x0\",\"tid\":7,\"time_ns\":{}}}", t0 + 2000 * i).unwrap();
        if keep {
            kept += 1;
            // The free that pairs with it is an unknown pointer instead.
            writeln!(w, "{{\"event\":\"free\",\"api\":\"cuMemFreeAsync\",\"address\":\"0x10\",\"size\":0,\"mem_type\":\"unknown\",\"device\":-1,\"flags\":1,\"stream\":\"0x1\",\"pool\":\"0x0\",\"tid\":7,\"time_ns\":{}}}", t0 + 2000 * i + 1000).unwrap();
        } else {
            writeln!(w, "{{\"event\":\"free\",\"api\":\"cuMemFreeAsync\",\"address\":\"{addr:#x}\",\"size\":{size},\"mem_type\":\"cuda\",\"device\":{dev},\"flags\":1,\"stream\":\"0x1\",\"pool\":\"0x0\",\"tid\":7,\"time_ns\":{}}}", t0 + 2000 * i + 1000).unwrap();
        }
    }
    w.flush().unwrap();
    drop(w);
    let page = view(&dir, &[trace]);
    let size = std::fs::metadata(&page).unwrap().len();
    let trace_size = std::fs::metadata(dir.join("t.0.jsonl")).unwrap().len();
    // Downsampled: the page is a small fraction of the 1 000 000-line trace.
    assert!(
        size < trace_size / 50,
        "page {size} bytes for a {trace_size}-byte trace"
    );
    let dom = render(&dir, &url(&page, ""));
    assert!(dom.contains("1,000,000 events"), "event count missing");
    // Exact numbers: every call counted, the kept allocations live, the stray frees unknown.
    assert!(
        dom.contains("cuMemAllocAsync                      500000"),
        "{}",
        &dom[dom.find("Calls by API").unwrap_or(0)..]
    );
    assert!(dom.contains(&format!("Live allocations at exit: {kept} (5.0 GiB)")));
    assert!(dom.contains(&format!("Frees of pointers never seen allocated: {kept}")));
}

/// `cuhook run --report r.txt --trace t.jsonl -- PROGRAM` in `dir`.
fn traced(dir: &Path, program: &str) {
    common::output_ok(
        common::cuhook_command()
            .current_dir(dir)
            .args(["run", "--report", "r.txt", "--trace", "t.jsonl", "--"])
            .arg(common::fixtures_dir().join(program)),
    );
}

/// The trace is read as JSON: re-serialised with other spacing and key order (Python's
/// `json.dumps`), it gives the same page, byte for byte (before: 0 events, an empty page).
#[test]
fn a_trace_with_any_json_spacing_and_key_order_reads_the_same() {
    let dir = common::scratch("view-json");
    let (ours, theirs) = (dir.join("ours"), dir.join("theirs"));
    std::fs::create_dir_all(&ours).unwrap();
    std::fs::create_dir_all(&theirs).unwrap();
    traced(&ours, "demo_rt_static");
    let script = "import json,sys\n\
        for i, line in enumerate(open(sys.argv[1])):\n\
        \x20   o = json.loads(line)\n\
        \x20   keys = sorted(o, reverse=(i % 2 == 0))\n\
        \x20   text = json.dumps({k: o[k] for k in keys}, indent=None if i % 3 else 1)\n\
        \x20   print(text.replace('\\n', ' '))\n";
    let out = common::output_ok(
        Command::new("python3")
            .args(["-c", script])
            .arg(ours.join("t.jsonl")),
    );
    let respaced = String::from_utf8(out.stdout).unwrap();
    assert!(respaced.contains("\"api\": \""), "{respaced}");
    std::fs::write(theirs.join("t.jsonl"), &respaced).unwrap();
    for d in [&ours, &theirs] {
        let out = common::output_ok(
            common::cuhook_command()
                .current_dir(d)
                .args(["view", "-o", "m.html", "t.jsonl"]),
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let a = std::fs::read_to_string(ours.join("m.html")).unwrap();
    let b = std::fs::read_to_string(theirs.join("m.html")).unwrap();
    assert!(a.contains("Live allocations at exit: 1 (2.0 MiB)"), "{a}");
    assert!(a == b, "the pages differ");
}

/// `cuhook view` of files with no event (empty, random bytes, JSON that is not an event)
/// fails and writes no page; a trace with some damaged lines is drawn, and one stderr line
/// says how many lines were unreadable and why the first was (before: exit 0, no word, an
/// empty page).
#[test]
fn unreadable_traces_are_refused_and_damaged_lines_counted() {
    let dir = common::scratch("view-unreadable");
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("random.bin"), random).unwrap();
    std::fs::write(dir.join("empty.jsonl"), "").unwrap();
    std::fs::write(dir.join("array.json"), "[1,2,3]\n").unwrap();
    for (file, says) in [
        ("empty.jsonl", "no event in empty.jsonl"),
        ("random.bin", "lines unreadable (first at line "),
        (
            "array.json",
            "array.json: 1 of 1 line unreadable (first at line 1: not a JSON object but an array)",
        ),
    ] {
        for sub in ["view", "export"] {
            let mut cmd = common::cuhook_command();
            cmd.current_dir(&dir).arg(sub);
            if sub == "export" {
                cmd.args(["--format", "perfetto"]);
            }
            let out = cmd.args(["-o", "out", file]).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{sub} {file}: {stderr}");
            assert!(stderr.contains(says), "{sub} {file}: {stderr}");
            assert!(!dir.join("out").exists(), "{sub} {file}: wrote a page");
        }
    }
    // A real trace, cut short and with a foreign line in it.
    traced(&dir, "demo_driver");
    let trace = std::fs::read_to_string(dir.join("t.jsonl")).unwrap();
    let mut lines: Vec<&str> = trace.lines().collect();
    let total = lines.len();
    lines.insert(3, "{\"event\":\"mark\",\"api\":\"x\"}");
    let cut = &lines[total][..20];
    lines[total] = cut;
    std::fs::write(dir.join("damaged.jsonl"), lines.join("\n")).unwrap();
    let out = common::cuhook_command()
        .current_dir(&dir)
        .args(["view", "-o", "d.html", "damaged.jsonl"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!("cuhook view: damaged.jsonl: 2 of {} lines unreadable (first at line 4: \"event\" is \"mark\", neither \"alloc\" nor \"free\")", total + 1)
    );
    let page = std::fs::read_to_string(dir.join("d.html")).unwrap();
    assert!(page.contains("\"skipped\":2"), "the lane says so too");
}

/// Every event of an export as (ph, ts, pid, tid, the rest); panics on one that lacks any.
fn exported(path: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the export is JSON");
    let events = v["traceEvents"]
        .as_array()
        .expect("a traceEvents array")
        .clone();
    for e in &events {
        assert!(e["ph"].is_string(), "{e}");
        assert!(e["ts"].is_number(), "{e}");
        assert!(e["pid"].is_u64(), "{e}");
        assert!(e["tid"].is_i64(), "{e}");
    }
    events
}

/// `cuhook export --format perfetto`: Chrome trace-event JSON with every event's ph, ts, pid and
/// tid; counters of live bytes per memory type and device, in time order, ending at what the
/// exit report says is live; one slice per allocation, every one closed, those live at exit
/// marked.
#[test]
fn perfetto_export_has_counters_and_one_closed_slice_per_allocation() {
    use std::collections::HashMap;
    let dir = common::scratch("view-export");
    traced(&dir, "demo_rt_static");
    // A second trace: a free of an unknown pointer, and an allocation over a live range.
    let line = |kind: &str, addr: u32, size: u32, t: u32| {
        format!("{{\"event\":\"{kind}\",\"api\":\"cudaMalloc\",\"address\":\"{addr:#x}\",\"size\":{size},\"mem_type\":\"cuda\",\"device\":1,\"flags\":0,\"tid\":9,\"time_ns\":{t}}}\n")
    };
    let other = line("alloc", 0x1000, 10, 1_000)
        + &line("free", 0x9000, 0, 2_000)
        + &line("alloc", 0x1000, 20, 3_000)
        + &line("free", 0x1000, 20, 4_000);
    std::fs::write(dir.join("other.jsonl"), other).unwrap();
    let out = common::output_ok(common::cuhook_command().current_dir(&dir).args([
        "export",
        "--format=perfetto",
        "-o",
        "p.json",
        "t.jsonl",
        "other.jsonl",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("wrote p.json"));
    let events = exported(&dir.join("p.json"));
    let trace_lines: Vec<String> = std::fs::read_to_string(dir.join("t.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let allocs = trace_lines
        .iter()
        .filter(|l| l.contains("\"event\":\"alloc\""))
        .count();

    // Counters: in time order per track; the last value of each is what is live at the end.
    let mut last: HashMap<(u64, String), (f64, u64)> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "C") {
        let key = (
            e["pid"].as_u64().unwrap(),
            e["name"].as_str().unwrap().to_owned(),
        );
        let ts = e["ts"].as_f64().unwrap();
        let bytes = e["args"]["bytes"].as_u64().unwrap();
        if let Some((prev, _)) = last.get(&key) {
            assert!(ts >= *prev, "counter {key:?} goes back in time");
        }
        last.insert(key, (ts, bytes));
    }
    assert_eq!(
        last[&(1, "live bytes cuda dev 0".to_owned())].1,
        2 << 20,
        "{last:?}"
    );
    assert_eq!(
        last[&(1, "live bytes managed dev 0".to_owned())].1,
        0,
        "{last:?}"
    );
    assert!(
        last.contains_key(&(2, "live bytes cuda dev 1".to_owned())),
        "{last:?}"
    );

    // Slices: every begin has one end, later, with the same name; none ends twice.
    let mut open: HashMap<(u64, String), (f64, String)> = HashMap::new();
    let mut ends: HashMap<String, usize> = HashMap::new();
    let mut begins = [0usize; 3];
    for e in &events {
        let key = || {
            (
                e["pid"].as_u64().unwrap(),
                e["id"].as_str().unwrap().to_owned(),
            )
        };
        match e["ph"].as_str().unwrap() {
            "b" => {
                begins[e["pid"].as_u64().unwrap() as usize] += 1;
                let name = e["name"].as_str().unwrap().to_owned();
                assert!(open
                    .insert(key(), (e["ts"].as_f64().unwrap(), name))
                    .is_none());
            }
            "e" => {
                let (ts, name) = open.remove(&key()).expect("an end without a begin");
                assert!(e["ts"].as_f64().unwrap() >= ts);
                assert_eq!(e["name"].as_str().unwrap(), name);
                let how = e["args"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .next()
                    .unwrap()
                    .clone();
                *ends.entry(how).or_default() += 1;
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "slices left open: {open:?}");
    assert_eq!(begins[1], allocs, "one slice per allocation of t.jsonl");
    assert_eq!(begins[2], 2);
    let report = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    assert!(
        report.contains("Live allocations at exit: 1 (2.0 MiB)"),
        "{report}"
    );
    assert_eq!(ends.get("live_at_exit"), Some(&1), "{ends:?}");
    assert_eq!(ends.get("missed_free"), Some(&1), "{ends:?}");
    let unknown = events.iter().filter(|e| e["ph"] == "i").count();
    assert_eq!(unknown, 1, "the free of 0x9000");
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["t.jsonl", "other.jsonl"]);
}

/// Tick labels as numbers ("20 MiB" → 20, "1,000" → 1000, "0" → 0), and whether they step by
/// one round amount (1, 2 or 5 times a power of ten) from a multiple of it.
fn round_ticks(labels: &str) -> bool {
    let values: Vec<f64> = labels
        .split(", ")
        .map(|l| {
            l.split(' ')
                .next()
                .unwrap()
                .replace(',', "")
                .parse()
                .unwrap()
        })
        .collect();
    if values.len() < 2 {
        return false;
    }
    let step = values[1] - values[0];
    let power = 10f64.powf(step.log10().floor());
    let mantissa = (step / power).round();
    [1.0, 2.0, 5.0].contains(&mantissa)
        && (step / power - mantissa).abs() < 1e-6
        && values
            .windows(2)
            .all(|w| ((w[1] - w[0]) - step).abs() < step * 1e-6)
        && ((values[0] / step) - (values[0] / step).round()).abs() < 1e-6
}

/// The value of attribute `name` of the first element that has it, in a rendered DOM.
fn attribute<'a>(dom: &'a str, name: &str) -> &'a str {
    let start = dom
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name}"))
        + name.len()
        + 2;
    &dom[start..start + dom[start..].find('"').unwrap()]
}

/// The viewer zooms (here through the URL, `zoom=LO-HI`, which the wheel and drag handlers
/// write as they go), labels its axes with round values, and shows the largest event's
/// allocation with its lifetime (before: five evenly split, unround ticks, no zoom, no
/// lifetime).
#[test]
fn the_page_zooms_labels_round_ticks_and_shows_lifetimes() {
    let dir = common::scratch("view-zoom");
    traced(&dir, "demo_rt_shared");
    let page = view(&dir, &[dir.join("t.jsonl")]);
    let whole = render(&dir, &url(&page, ""));
    assert!(
        whole.contains("the whole run (wheel over a chart zooms"),
        "{whole}"
    );
    assert_eq!(attribute(&whole, "data-hi"), "1200");
    for ticks in ["data-xticks", "data-yticks"] {
        assert!(
            round_ticks(attribute(&whole, ticks)),
            "{ticks}: {}",
            attribute(&whole, ticks)
        );
    }
    let zoomed = render(&dir, &url(&page, "#zoom=300-900&bucket=0"));
    assert_eq!(
        (attribute(&zoomed, "data-lo"), attribute(&zoomed, "data-hi")),
        ("300", "900")
    );
    assert!(
        zoomed.contains("zoomed to ") && zoomed.contains("(2.0×; double-click resets)"),
        "{zoomed}"
    );
    let x = attribute(&zoomed, "data-xticks");
    assert!(
        round_ticks(x) && x != attribute(&whole, "data-xticks"),
        "{x}"
    );
    // Bucket 0 holds the first allocation (cudaMalloc 32 MiB, freed later in the run).
    let pinned = &zoomed[zoomed.find("class=\"pinned\"").unwrap()..];
    let life = pinned
        .lines()
        .find(|l| l.starts_with("  freed at "))
        .unwrap_or_else(|| panic!("{pinned}"));
    assert!(life.contains(", lived "), "{life}");
    // By event order, the ticks are whole event numbers.
    let order = render(&dir, &url(&page, "#order"));
    let x = attribute(&order, "data-xticks");
    assert!(
        round_ticks(x) && !x.contains('.') && !x.contains(" ms"),
        "{x}"
    );
}
