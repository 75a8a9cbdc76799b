//! cuhook's own output (trace, exit report) never harms its host: no write into the host's files,
//! no death by SIGPIPE, no hang on a FIFO nobody reads, no write through a planted symlink.
//! Every scenario runs the `host_output` fixture under `LD_PRELOAD=libcuhook.so` with a
//! watchdog, several times over.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often each scenario is repeated (the races are in the host's timing, not ours).
const ROUNDS: usize = 5;
/// Longer than any of these runs takes; reaching it means the host hung.
const WATCHDOG: Duration = Duration::from_secs(20);

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("output-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// A new FIFO at `path` and its read end (opened first, so a writer's open succeeds).
fn fifo_with_reader(path: &Path) -> (PathBuf, File) {
    mkfifo(path);
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap();
    (path.to_path_buf(), reader)
}

/// `host_output ARGS` under cuhook with `env`, stdin piped.
fn spawn_host(args: &[&str], env: &[(&str, &Path)]) -> Child {
    let mut cmd = Command::new(common::fixtures_dir().join("host_output"));
    cmd.args(args)
        .env("LD_PRELOAD", common::libcuhook())
        .env_remove("CUHOOK_DISABLE")
        .env_remove("CUHOOK_REPORT")
        .env_remove("CUHOOK_TRACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("run host_output")
}

/// Wait for `child` with the watchdog; `None` (after killing it) when it hung.
fn wait_or_kill(child: &mut Child) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < WATCHDOG {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
    }
    s
}

/// Whether process `pid` holds an open descriptor on `path`.
fn holds_open(pid: u32, path: &Path) -> bool {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .any(|fd| fs::read_link(fd.path()).ok().as_deref() == Some(path))
        })
        .unwrap_or(false)
}

/// Item 15: a host that closes every descriptor and opens its own file gets the trace's old
/// descriptor number; the trace lines must not follow it there.
#[test]
fn trace_lines_never_land_in_a_file_the_host_opened_itself() {
    let dir = scratch("own");
    for round in 0..ROUNDS {
        let own = dir.join(format!("own-{round}.txt"));
        let trace = dir.join(format!("trace-{round}.jsonl"));
        let mut child = spawn_host(&["own", own.to_str().unwrap()], &[("CUHOOK_TRACE", &trace)]);
        let status = wait_or_kill(&mut child).expect("host hung");
        let err = stderr_of(&mut child);
        assert!(status.success(), "{status:?} {err}");
        assert_eq!(
            fs::read_to_string(&own).unwrap(),
            "mine\n",
            "round {round}: cuhook wrote into the host's own file"
        );
    }
}

/// Item 16: the trace goes to a FIFO whose reader leaves before the host allocates. The host
/// must not die of SIGPIPE (nor of anything else) and must finish its work.
#[test]
fn a_trace_reader_that_leaves_does_not_kill_the_host() {
    let dir = scratch("fifo-gone");
    for round in 0..ROUNDS {
        let (fifo, reader) = fifo_with_reader(&dir.join(format!("trace-{round}.fifo")));
        let mut child = spawn_host(&["wait", "20"], &[("CUHOOK_TRACE", &fifo)]);
        let start = Instant::now();
        while !holds_open(child.id(), &fifo) {
            assert!(
                start.elapsed() < WATCHDOG,
                "the host never opened the trace"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(reader);
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let status = wait_or_kill(&mut child).expect("host hung");
        let err = stderr_of(&mut child);
        assert!(
            status.success(),
            "round {round}: the host died: {status:?} {err}"
        );
    }
}

/// Item 16: a trace FIFO whose reader never reads fills up; the host must not block on it.
#[test]
fn a_trace_reader_that_never_reads_does_not_block_the_host() {
    let dir = scratch("fifo-full");
    for round in 0..ROUNDS {
        let (fifo, reader) = fifo_with_reader(&dir.join(format!("trace-{round}.fifo")));
        let mut child = spawn_host(&["wait", "5000"], &[("CUHOOK_TRACE", &fifo)]);
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let status = wait_or_kill(&mut child);
        drop(reader);
        let err = stderr_of(&mut child);
        assert!(
            status.is_some_and(|s| s.success()),
            "round {round}: {status:?} {err}"
        );
    }
}

/// Item 16: a trace or report FIFO nobody opened for reading: neither the constructor's open nor
/// the exit report's may wait for a reader.
#[test]
fn a_fifo_without_a_reader_blocks_neither_start_nor_exit() {
    let dir = scratch("fifo-none");
    for (variable, round) in ["CUHOOK_TRACE", "CUHOOK_REPORT"]
        .iter()
        .flat_map(|v| (0..ROUNDS).map(move |r| (*v, r)))
    {
        let fifo = dir.join(format!("{variable}-{round}.fifo"));
        mkfifo(&fifo);
        let mut child = spawn_host(&["wait", "2"], &[(variable, &fifo)]);
        // A blocked constructor never reads stdin: the write still succeeds (pipe buffer).
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let status = wait_or_kill(&mut child);
        let err = stderr_of(&mut child);
        assert!(
            status.is_some_and(|s| s.success()),
            "{variable} round {round}: {status:?} {err}"
        );
        assert!(err.contains(variable) || err.contains("report"), "{err}");
    }
}

/// Item 14 (library side): a report or trace path that is a symlink (planted in a shared
/// directory) is refused, never written through.
#[test]
fn report_and_trace_paths_that_are_symlinks_are_not_followed() {
    let dir = scratch("symlink");
    for variable in ["CUHOOK_TRACE", "CUHOOK_REPORT"] {
        let victim = dir.join(format!("{variable}-victim"));
        fs::write(&victim, "precious\n").unwrap();
        let link = dir.join(format!("{variable}-link"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let mut child = spawn_host(&["wait", "3"], &[(variable, &link)]);
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let status = wait_or_kill(&mut child).expect("host hung");
        let err = stderr_of(&mut child);
        assert!(status.success(), "{status:?} {err}");
        assert_eq!(
            fs::read_to_string(&victim).unwrap(),
            "precious\n",
            "{variable} was written through a symlink"
        );
        assert!(err.contains("symbolic link"), "{variable}: {err}");
    }
    // A plain path still works.
    let trace = dir.join("plain.jsonl");
    File::create(&trace).unwrap();
    let mut child = spawn_host(&["wait", "3"], &[("CUHOOK_TRACE", &trace)]);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_or_kill(&mut child).expect("host hung").success());
    assert_eq!(fs::read_to_string(&trace).unwrap().lines().count(), 6);
}

/// A trace whose last writer stopped mid-line (an `execve` on another thread of that process
/// cut its `write` short, and the new image appends to the same trace): the next writer starts
/// on a new line, so the torn fragment is one unreadable line and every event of the new
/// process reads back. (Before, its first event was glued to the fragment and lost.)
#[test]
fn a_trace_left_mid_line_gets_its_next_event_on_a_new_line() {
    let dir = scratch("torn");
    let trace = dir.join("t.jsonl");
    let fragment = "{\"event\":\"alloc\",\"api\":\"cuMemAll";
    fs::write(&trace, fragment).unwrap();
    let mut child = spawn_host(&["wait", "3"], &[("CUHOOK_TRACE", &trace)]);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_or_kill(&mut child).expect("host hung").success());
    let text = fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&fragment), "{text}");
    let events = &lines[1..];
    assert_eq!(events.len(), 6, "{text}");
    assert!(
        events
            .iter()
            .all(|l| l.starts_with("{\"event\":") && l.ends_with('}')),
        "{text}"
    );
    // A file that ends with a newline gets none added.
    let before = text.len();
    let mut child = spawn_host(&["wait", "3"], &[("CUHOOK_TRACE", &trace)]);
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_or_kill(&mut child).expect("host hung").success());
    let text = fs::read_to_string(&trace).unwrap();
    assert!(!text[before..].starts_with('\n'), "a blank line was added");
    assert_eq!(text.lines().count(), 13);
}

/// A preloaded process's first `open` gets descriptor 3, as without cuhook: cuhook keeps no
/// descriptor of its own once its constructor has installed (before, `/proc/self/maps` stayed
/// open at the lowest free number).
#[test]
fn a_preloaded_programs_first_descriptor_is_3() {
    let dir = scratch("first-fd");
    let src = dir.join("first_fd.c");
    fs::write(
        &src,
        "#include <fcntl.h>\n#include <stdio.h>\nint main(void) { printf(\"%d\\n\", open(\"/dev/null\", O_RDONLY)); return 0; }\n",
    )
    .unwrap();
    let exe = dir.join("first_fd");
    assert!(cuhook_fixtures::cc()
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    for preload in [None, Some(common::libcuhook())] {
        let mut cmd = Command::new(&exe);
        cmd.env_remove("CUHOOK_DISABLE")
            .env_remove("CUHOOK_REPORT")
            .env_remove("CUHOOK_TRACE");
        if let Some(lib) = &preload {
            cmd.env("LD_PRELOAD", lib);
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "3",
            "first descriptor with LD_PRELOAD={preload:?}"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Issue 40 item 5, for real: four threads allocate and free in a loop (so trace lines are being
/// written) while a fifth calls `execve` of the same program, 20 generations in a row, all
/// appending to one trace; the kernel kills the writers wherever they are, possibly inside a
/// `write`, which it then cuts short at a page boundary. The last image makes 100 pairs of a
/// size no earlier image uses. Every one of its 200 events must read back; a torn line is at
/// most one per exec, and no line is a torn fragment with a whole event glued to it (each
/// starts on a line of its own). (Torn lines happen: 29 in 50 runs of 20 execs here.)
#[test]
fn exec_from_a_thread_while_others_write_the_trace() {
    const EXECS: usize = 20;
    let dir = scratch("exec");
    let trace = dir.join("t.jsonl");
    let mut torn_total = 0;
    for round in 0..3 {
        let _ = fs::remove_file(&trace);
        let mut child = Command::new(common::fixtures_dir().join("host_exec"))
            .args(["0", &EXECS.to_string()])
            .env("LD_PRELOAD", common::libcuhook())
            .env("CUHOOK_TRACE", &trace)
            .env_remove("CUHOOK_DISABLE")
            .env_remove("CUHOOK_REPORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run host_exec");
        let status = wait_or_kill(&mut child).expect("host hung");
        let err = stderr_of(&mut child);
        assert!(status.success(), "round {round}: {status:?} {err}");
        let text = String::from_utf8_lossy(&fs::read(&trace).unwrap()).into_owned();
        assert!(
            text.ends_with('\n'),
            "round {round}: the last line is unfinished"
        );
        let (mut last_image, mut torn) = (0, 0);
        for line in text.lines() {
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(v) => {
                    assert!(v.get("event").is_some(), "round {round}: {line}");
                    last_image += usize::from(v.get("size") == Some(&7777.into()));
                }
                Err(_) => {
                    torn += 1;
                    assert!(
                        !line.get(1..).unwrap_or("").contains("{\"event\""),
                        "round {round}: an event glued to a torn fragment: {line}"
                    );
                }
            }
        }
        assert_eq!(last_image, 200, "round {round}: events of the last image");
        assert!(torn <= EXECS, "round {round}: {torn} torn lines");
        torn_total += torn;
    }
    eprintln!("{torn_total} torn lines in 3 × {EXECS} execs");
    let _ = fs::remove_dir_all(&dir);
}
