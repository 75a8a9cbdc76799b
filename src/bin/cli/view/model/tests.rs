//! The model of small traces: call sites at the end and at the peak, buckets that keep min,
//! max and the exact peak, lanes on one time axis.

use super::lane::bucket_of;
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
