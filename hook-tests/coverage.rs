//! The CPU coverage matrix: every hooked CUDA symbol × every call path, on the fake driver and
//! runtime. Each path is a fixture app or plugin run in its own process; each call it makes is
//! printed ("call …") after the events cuhook dispatched during it ("event …"). A cell is seen
//! when every call of that symbol on that path produced exactly the expected event (address,
//! size, type, api) and left the result unchanged. The matrix is printed and written to
//! docs/coverage.md; any missed or duplicated cell fails the test.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use common::{run_fixture, Run};

/// One call path: a column of the matrix.
struct Path {
    column: &'static str,
    what: &'static str,
    program: &'static str,
    args: &'static [&'static str],
    /// The api an event should name for a call of `symbol` on this path.
    api: fn(&str) -> &str,
}

fn same(symbol: &str) -> &str {
    symbol
}

/// The shared runtime: runtime entry points are hooked in the GOT; driver pointers the runtime
/// hands out are hooked through cuGetProcAddress.
fn shared_runtime(symbol: &str) -> &str {
    match symbol {
        "cudaGetDriverEntryPoint" => "cuMemAlloc_v2",
        // The runtime's device variables come from cuLibraryGetGlobal, through its own pointer;
        // a managed one is registered when the runtime loads its library.
        "cudaGetSymbolAddress" => "cuLibraryGetGlobal",
        "cudaGetSymbolAddress(managed)" => "cuLibraryLoadData",
        "cudaGetDriverEntryPointByVersion" => "cuMemAllocAsync_ptsz",
        "cudaGetDriverEntryPoint_ptsz" => "cuMemAllocAsync_ptsz",
        "cudaGetDriverEntryPointByVersion_ptsz" => "cuMemAlloc_v2",
        // Graph memory nodes: the runtime passes them to the driver, through its own pointers
        // (the generic entry point as the CUDA 12.3+ variant).
        "cudaGraphAddMemAllocNode" => "cuGraphAddMemAllocNode",
        "cudaGraphAddMemFreeNode" => "cuGraphAddMemFreeNode",
        "cudaGraphAddNode" => "cuGraphAddNode_v2",
        s => s,
    }
}

/// The static runtime lives inside the executable: only its driver calls are visible, through
/// the pointers it got from cuGetProcAddress_v2.
fn static_runtime(symbol: &str) -> &str {
    match symbol {
        "cudaMalloc" => "cuMemAlloc_v2",
        "cudaMallocPitch" => "cuMemAllocPitch_v2",
        "cudaMallocManaged" => "cuMemAllocManaged",
        "cudaFree" => "cuMemFree_v2",
        "cudaMallocAsync" => "cuMemAllocAsync",
        "cudaMallocAsync_ptsz" => "cuMemAllocAsync_ptsz",
        "cudaMallocFromPoolAsync" => "cuMemAllocFromPoolAsync",
        "cudaMallocFromPoolAsync_ptsz" => "cuMemAllocFromPoolAsync_ptsz",
        "cudaFreeAsync" => "cuMemFreeAsync",
        "cudaFreeAsync_ptsz" => "cuMemFreeAsync_ptsz",
        "cudaMallocHost" | "cudaHostAlloc" => "cuMemHostAlloc",
        "cudaFreeHost" => "cuMemFreeHost",
        "cudaHostRegister" => "cuMemHostRegister_v2",
        "cudaHostUnregister" => "cuMemHostUnregister",
        "cudaDeviceReset" => "cuDevicePrimaryCtxReset_v2",
        "cudaIpcOpenMemHandle" => "cuIpcOpenMemHandle_v2",
        "cudaIpcCloseMemHandle" => "cuIpcCloseMemHandle",
        s => shared_runtime(s),
    }
}

const PATHS: &[Path] = &[
    Path {
        column: "1 lazy",
        what: "app linked to the driver, lazy binding",
        program: "app_cov_drv_lazy",
        args: &["direct"],
        api: same,
    },
    Path {
        column: "2 relro",
        what: "full RELRO (-z relro -z now)",
        program: "app_cov_drv_now",
        args: &["direct"],
        api: same,
    },
    Path {
        column: "3 noplt",
        what: "-fno-plt (GLOB_DAT only)",
        program: "app_cov_drv_noplt",
        args: &["direct"],
        api: same,
    },
    Path {
        column: "4 taken",
        what: "function addresses taken (GLOB_DAT)",
        program: "app_cov_drv_lazy",
        args: &["taken"],
        api: same,
    },
    Path {
        column: "5 rt-shared",
        what: "shared runtime libcudart.so",
        program: "app_cov_rt_shared",
        args: &[],
        api: shared_runtime,
    },
    Path {
        column: "6 rt-static",
        what: "static runtime (dlsym → cuGetProcAddress_v2)",
        program: "app_cov_rt_static",
        args: &[],
        api: static_runtime,
    },
    Path {
        column: "7 plugin",
        what: "plugin dlopen'd after install",
        program: "app_cov_drv_lazy",
        args: &["plugin"],
        api: same,
    },
    Path {
        column: "8 dlsym",
        what: "the app's own dlsym of each driver symbol",
        program: "app_cov_drv_lazy",
        args: &["dlsym"],
        api: same,
    },
    Path {
        column: "9 procaddr",
        what: "the app's own cuGetProcAddress (per-thread flag → _ptsz)",
        program: "app_cov_drv_lazy",
        args: &["procaddr"],
        api: same,
    },
    Path {
        column: "10 late",
        what: "install after lazy slots were resolved by earlier calls",
        program: "app_cov_drv_lazy",
        args: &["late"],
        api: same,
    },
    Path {
        column: "11 local",
        what: "plugin dlopens libcuda.so.1 RTLD_LOCAL",
        program: "app_cov_local",
        args: &[],
        api: same,
    },
];

#[derive(Debug, Clone)]
struct Event {
    kind: String,
    api: String,
    addr: String,
    size: usize,
    flags: u32,
    mem_type: i32,
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|f| f.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or("")
}

/// What a workload line may expect: one event each (the others are `none`).
const EVENT_KINDS: &[&str] = &[
    "alloc",
    "free",
    "purge",
    "global",
    "global-managed",
    "imported",
    "graph",
    "graph-free",
    "graph-node",
    "graph-node-free",
];
/// Of those, the ones that expect an alloc event.
const ALLOC_KINDS: &[&str] = &[
    "alloc",
    "global",
    "global-managed",
    "imported",
    "graph",
    "graph-node",
];

/// (symbol, problem or None) for every call the app made after subscribing.
fn judge(run: &Run, path: &Path) -> Vec<(String, Option<String>)> {
    let mut verdicts = Vec::new();
    let mut pending: Vec<Event> = Vec::new();
    let mut live = false;
    for line in run.stdout.lines() {
        if line.starts_with("setup ") {
            // Events of the workload's own preparation (the allocation a teardown will purge).
            pending.clear();
            continue;
        }
        if line == "subscribed" {
            live = true;
            pending.clear();
            continue;
        }
        if !live {
            continue;
        }
        if let Some(rest) = line.strip_prefix("event ") {
            pending.push(Event {
                kind: rest.split(' ').next().unwrap_or("").to_owned(),
                api: field(rest, "api").to_owned(),
                addr: field(rest, "addr").to_owned(),
                size: field(rest, "size").parse().unwrap_or(usize::MAX),
                flags: u32::from_str_radix(field(rest, "flags").trim_start_matches("0x"), 16)
                    .unwrap_or(0),
                mem_type: field(rest, "type").parse().unwrap_or(-1),
            });
            continue;
        }
        let Some(rest) = line.strip_prefix("call ") else {
            continue;
        };
        let symbol = rest.split(' ').next().unwrap_or("").to_owned();
        let rc = field(rest, "rc");
        let kind = field(rest, "kind");
        let addr = field(rest, "addr");
        let size: usize = field(rest, "size").parse().unwrap_or(0);
        let events = std::mem::take(&mut pending);
        let want_api = (path.api)(&symbol);
        let problem = match kind {
            // A free the driver refused: announced before the call, then taken back (the range
            // announced again, flagged EXISTING).
            "refused" if rc == "0" => Some("call succeeded, want a refusal".to_owned()),
            "refused" => match events.as_slice() {
                [f, a]
                    if f.kind == "free"
                        && a.kind == "alloc"
                        && f.addr == addr
                        && a.addr == addr
                        && f.size == size
                        && a.size == size
                        && f.api == want_api
                        && a.flags & 0x20 != 0 =>
                {
                    None
                }
                _ => Some(format!(
                    "want the free and its EXISTING re-announcement, got {events:?}"
                )),
            },
            "none" if events.is_empty() => None,
            "none" => Some(format!("expected no event, got {events:?}")),
            k if EVENT_KINDS.contains(&k) && rc != "0" => Some(format!("call failed rc={rc}")),
            k if EVENT_KINDS.contains(&k) => {
                let want_kind = if ALLOC_KINDS.contains(&k) {
                    "alloc"
                } else {
                    "free"
                };
                // Teardown and unload: PURGED; globals: GLOBAL (and managed where asked).
                let flags_ok = |e: &Event| match kind {
                    "purge" => e.flags & 0x40 != 0,
                    "global" => e.flags & 0x80 != 0 && e.mem_type == 1,
                    "global-managed" => e.flags & 0x80 != 0 && e.mem_type == 2,
                    // Memory of another process: IMPORTED, device memory.
                    "imported" => e.flags & 0x100 != 0 && e.mem_type == 1,
                    // On a capturing stream: GRAPH (and stream-ordered); never otherwise.
                    "graph" | "graph-free" => e.flags & 0x201 == 0x201,
                    // A memory node added to a graph: GRAPH, device memory, no stream.
                    "graph-node" | "graph-node-free" => e.flags & 0x201 == 0x200 && e.mem_type == 1,
                    _ => e.flags & 0x200 == 0,
                };
                // A teardown purges everything of its context or device: besides the range the
                // workload set up, only other PURGED frees may come with it.
                let events: Vec<Event> =
                    if kind == "purge" && events.iter().all(|e| e.flags & 0x40 != 0) {
                        events.into_iter().filter(|e| e.addr == addr).collect()
                    } else {
                        events
                    };
                match events.as_slice() {
                    [e] if e.kind == want_kind && e.addr == addr && e.size == size && e.api == want_api && flags_ok(e) => None,
                    [] => Some("missed: no event".to_owned()),
                    [_] => Some(format!("wrong event {events:?}, want {want_kind} {addr} size {size} api {want_api}")),
                    _ => Some(format!("duplicated: {events:?}")),
                }
            }
            other => Some(format!("workload reported `{other}`")),
        };
        verdicts.push((symbol, problem));
    }
    for (name, ok, detail) in run.checks() {
        verdicts.push((format!("check:{name}"), (!ok).then_some(detail)));
    }
    verdicts
}

#[test]
fn coverage_matrix() {
    // symbol -> column -> problems (empty: seen)
    let mut cells: BTreeMap<String, BTreeMap<&str, Vec<String>>> = BTreeMap::new();
    let mut failures = Vec::new();
    for path in PATHS {
        let run = run_fixture(path.program, path.args, &[]);
        if !run.status.success() || !run.stdout.contains("subscribed") {
            failures.push(format!(
                "{}: exit {:?}\n{}\n{}",
                path.column, run.status, run.stdout, run.stderr
            ));
            continue;
        }
        for (symbol, problem) in judge(&run, path) {
            let row = match symbol.as_str() {
                "check:procaddr_all_found"
                | "check:procaddr_returns_wrapper"
                | "check:procaddr_unknown_untouched" => "cuGetProcAddress_v2".to_owned(),
                "check:procaddr_v1_maps" => "cuGetProcAddress".to_owned(),
                // A library's managed variable outlives a device reset; a device one does not.
                "check:managed_kept_after_reset" => "cuLibraryLoadData".to_owned(),
                "check:device_var_gone_after_reset" => "cuDevicePrimaryCtxReset_v2".to_owned(),
                "cudaGetSymbolAddress" => "cuLibraryGetGlobal".to_owned(),
                "cudaGetSymbolAddress(managed)" => "cuLibraryLoadData".to_owned(),
                "cudaGraphAddMemAllocNode" => "cuGraphAddMemAllocNode".to_owned(),
                "cudaGraphAddMemFreeNode" => "cuGraphAddMemFreeNode".to_owned(),
                "cudaGraphAddNode" => "cuGraphAddNode_v2".to_owned(),
                s if s.starts_with("check:") => continue,
                s => s.to_owned(),
            };
            let cell = cells
                .entry(row)
                .or_default()
                .entry(path.column)
                .or_default();
            if let Some(p) = problem {
                failures.push(format!("{} × {}: {p}", path.column, symbol));
                cell.push(p);
            }
        }
        // Every driver call of the static runtime went through pointers from cuGetProcAddress_v2.
        if path.column == "6 rt-static" {
            cells
                .entry("cuGetProcAddress_v2".to_owned())
                .or_default()
                .entry(path.column)
                .or_default();
        }
    }
    let mut rows: Vec<&str> = cuhook::cuda::HOOKS.iter().map(|h| h.symbol).collect();
    rows.sort_by_key(|s| (cuhook::cuda::HOOKS.iter().position(|h| h.symbol == *s), *s));
    let mut table = String::from("| symbol |");
    for p in PATHS {
        let _ = write!(table, " {} |", p.column);
    }
    table.push_str("\n|---|");
    table.push_str(&"---|".repeat(PATHS.len()));
    table.push('\n');
    let mut unexercised = Vec::new();
    for row in &rows {
        let _ = write!(table, "| `{row}` |");
        let mut any = false;
        for p in PATHS {
            let cell = match cells.get(*row).and_then(|c| c.get(p.column)) {
                Some(problems) if problems.is_empty() => {
                    any = true;
                    "seen"
                }
                Some(_) => {
                    any = true;
                    "**MISSED**"
                }
                None => "·",
            };
            let _ = write!(table, " {cell} |");
        }
        table.push('\n');
        if !any {
            unexercised.push(*row);
        }
    }
    let mut doc = String::from(
        "# Hook coverage on the CPU (fake driver and runtime)\n\nWritten by `cargo test --release --test coverage` (hook-tests/coverage.rs). \
         `seen`: every call of the symbol on that path produced exactly the expected event (address, size, memory type, api; \
         frees with the registry's size; teardown purges with the PURGED flag) and returned the driver's result unchanged; \
         failures, `free(NULL)` and out-of-memory produced none. `·`: the path does not call that symbol.\n\nPaths:\n\n",
    );
    for p in PATHS {
        let _ = writeln!(
            doc,
            "- **{}**: {} (`{}{}`)",
            p.column,
            p.what,
            p.program,
            p.args.iter().map(|a| format!(" {a}")).collect::<String>()
        );
    }
    doc.push('\n');
    doc.push_str(&table);
    println!("{doc}");
    if failures.is_empty() && unexercised.is_empty() {
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/coverage.md");
        std::fs::write(&out, &doc).expect("write docs/coverage.md");
    }
    assert!(
        unexercised.is_empty(),
        "hooked symbols no path exercises: {unexercised:?}"
    );
    assert!(
        failures.is_empty(),
        "{} failing cells:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Registry view of stream-ordered memory, pool address reuse, allocations from callbacks, and
/// the C API's argument checks.
#[test]
fn registry_reuse_callbacks_and_api_errors() {
    run_fixture("app_cov_drv_lazy", &["extras"], &[]).assert_passed(&[
        "registry_knows_async",
        "span_past_end_not_found",
        "freed_not_found",
        "pool_reuse_same_address",
        "pool_reuse_fresh_entry",
        "callback_allocation_seen",
        "unset_handler",
        "unset_again_refused",
        "null_handler_refused",
        "bad_events_refused",
        "null_info_refused",
        "refused_free_error_unchanged",
        "refused_free_reannounced",
        "refused_free_still_registered",
        "global_managed_typed",
        "global_device_typed",
        "globals_gone_with_context",
    ]);
}

/// Memory allocated before install and freed after: each free is announced before the real free
/// (the driver still holds the memory during the callback) with the driver's size, type and
/// device, found in the pointer's own context.
#[test]
fn late_install_free_sized_up_front() {
    run_fixture("app_cov_drv_lazy", &["late_free"], &[]).assert_passed(&[
        "installed",
        "late_free_device",
        "late_free_managed",
        "late_free_stream_ordered",
        "late_free_pinned_host",
        "late_free_other_context",
        "late_free_no_context_current",
        "late_free_unknown_silent",
        "late_free_context_restored",
    ]);
}

/// A graph allocation node on a peer device is registered on that device, without the current
/// context (which belongs to another device); on the current device it keeps the context.
#[test]
fn graph_allocation_node_on_a_peer_device() {
    run_fixture(
        "app_cov_drv_lazy",
        &["graph_peer"],
        &[("FAKECUDA_DEVICES", "2")],
    )
    .assert_passed(&[
        "graph_peer_installed",
        "graph_peer_device",
        "graph_current_device",
    ]);
}

/// A stream-ordered allocation belongs to its stream's context and device, whichever context
/// is current (none: CUDA 13's runtime leaves none current on the threads it serves; before,
/// such allocations were registered on device -1 with no context, and asking the driver for
/// the missing context's device cost PyTorch a few microseconds per allocation on the H200).
/// The stream's context is asked once per thread and stream (a driver call that waited behind
/// other threads' driver calls: ×1.32 for 16 threads' pairs on the H200), and forgotten when a
/// stream is destroyed: a handle that comes back for another context's stream gives that one.
#[test]
fn stream_ordered_allocations_take_their_streams_device() {
    run_fixture(
        "app_cov_drv_lazy",
        &["stream_device"],
        &[("FAKECUDA_DEVICES", "2")],
    )
    .assert_passed(&[
        "stream_device_installed",
        "stream_device_no_context_current",
        "stream_device_other_context_current",
        "stream_device_default_stream",
        "stream_device_own_context_current",
        "stream_context_asked_once",
        "stream_handle_reused",
        "stream_reused_handle_new_context",
    ]);
}

/// Branch protection (aarch64): every driver-app path of the matrix again, with the app and the
/// fake driver built with BTI + PAC and BTI-marked, so their pages are guarded (hook-tests/bti.rs
/// proves the guard is enforced here). The hooks call the driver through pointers: its entry
/// points must be landing pads, and the app's calls into libcuhook.so must come back intact.
#[cfg(target_arch = "aarch64")]
#[test]
fn driver_paths_under_branch_protection() {
    let mut failures = Vec::new();
    for path in PATHS.iter().filter(|p| p.program == "app_cov_drv_lazy") {
        let run = run_fixture("bti/app_cov_drv_bti", path.args, &[]);
        if !run.status.success() || !run.stdout.contains("subscribed") {
            failures.push(format!(
                "{}: exit {:?}\n{}\n{}",
                path.column, run.status, run.stdout, run.stderr
            ));
            continue;
        }
        let verdicts = judge(&run, path);
        assert!(!verdicts.is_empty(), "{}: no calls judged", path.column);
        for (symbol, problem) in verdicts {
            if let Some(p) = problem {
                failures.push(format!("{} × {symbol}: {p}", path.column));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The runtime loads its code inside the call that starts it. Shared runtime: that call
/// (`cudaMalloc`) is hooked, so the load is nested — its managed variable is registered but no
/// event goes out (a callback could re-enter the starting runtime). Static runtime: the load is
/// the outermost hooked call — registered and dispatched once, named for the load.
#[test]
fn managed_variable_loaded_inside_a_hooked_runtime_call() {
    for (program, dispatched) in [
        ("app_rt_nested_load_shared", false),
        ("app_rt_nested_load_static", true),
    ] {
        let run = run_fixture(program, &[], &[]);
        assert!(
            run.status.success(),
            "{program}: {}\n{}",
            run.stdout,
            run.stderr
        );
        for (name, ok, detail) in run.checks() {
            assert!(ok, "{program}: check {name}: {detail}");
        }
        assert!(
            run.checks().iter().any(|c| c.0 == "managed_registered"),
            "{program}: {}",
            run.stdout
        );
        let addr = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("managed rc=0 addr="))
            .unwrap_or_else(|| panic!("{program}: no address\n{}", run.stdout))
            .to_owned();
        let globals: Vec<&str> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("event alloc") && l.contains("flags=0x80 "))
            .collect();
        if dispatched {
            assert_eq!(globals.len(), 1, "{program}: {globals:?}");
            assert!(
                globals[0].contains("api=cuLibraryLoadData")
                    && globals[0].contains(&format!("addr={addr} ")),
                "{program}: {globals:?}"
            );
        } else {
            assert!(globals.is_empty(), "{program}: {globals:?}");
        }
    }
}
