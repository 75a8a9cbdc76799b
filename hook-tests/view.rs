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
    let dir = common::scratch_dir("view-ranks");
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
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_million_events_are_downsampled_and_summed_exactly() {
    use std::io::Write;
    let dir = common::scratch_dir("view-million");
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
    let _ = std::fs::remove_dir_all(&dir);
}
