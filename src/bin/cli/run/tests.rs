//! `cuhook run`'s options and usage errors, spawn failures as a shell's exit statuses, and the
//! output paths checked before the run.

use std::path::Path;

use super::child::spawn_error;
use super::files::{directory_problem, per_process};
use super::*;

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[test]
fn options_and_command() {
    let o = parse(os(&[
        "--report",
        "r.txt",
        "--trace=t.json",
        "--lib",
        "/x/libcuhook.so",
        "--",
        "python3",
        "-c",
        "x",
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(o.report, Some("r.txt".into()));
    assert_eq!(o.trace, Some("t.json".into()));
    assert_eq!(o.lib, Some("/x/libcuhook.so".into()));
    assert_eq!(o.command, os(&["python3", "-c", "x"]));
    // The command's own options stay its own, `--` and `--report` included.
    assert_eq!(
        parse(os(&["ls", "-l", "--", "--report", "x"]))
            .unwrap()
            .unwrap()
            .command,
        os(&["ls", "-l", "--", "--report", "x"])
    );
    assert_eq!(parse(os(&["--help"])).unwrap(), None);
    assert_eq!(
        parse(os(&["--", "--help"])).unwrap().unwrap().command,
        os(&["--help"])
    );
}

#[test]
fn usage_errors_name_the_option() {
    let err = |v: &[&str]| super::super::args::explain(parse(os(v)).unwrap_err());
    assert_eq!(err(&[]), "no command given");
    assert_eq!(err(&["--report"]), "option `--report` needs a value");
    assert_eq!(err(&["--bogus", "x"]), "unknown option `--bogus`");
    assert_eq!(err(&["--trace=t", "-q", "x"]), "unknown option `-q`");
    assert_eq!(
        err(&["--stacks", "0", "x"]),
        "--stacks 0: the frames recorded per allocation must be 1 to 64"
    );
    assert_eq!(
        err(&["--stacks=65", "x"]),
        "--stacks 65: the frames recorded per allocation must be 1 to 64"
    );
    assert!(err(&["--stacks", "many", "x"]).contains("many"));
    assert_eq!(
        parse(os(&["--stacks", "16", "x"])).unwrap().unwrap().stacks,
        Some(16)
    );
}

#[test]
fn spawn_errors_map_to_shell_statuses() {
    let e = |errno: i32, prog: &str| {
        spawn_error(OsStr::new(prog), std::io::Error::from_raw_os_error(errno)).exit_code()
    };
    assert_eq!(e(libc::ENOENT, "nosuchcommand"), NOT_FOUND);
    assert_eq!(e(libc::ENOENT, "/no/such"), NOT_FOUND);
    assert_eq!(e(libc::EACCES, "/etc/passwd"), NOT_EXECUTABLE);
    assert_eq!(e(libc::ENOEXEC, "./script"), NOT_EXECUTABLE);
    assert_eq!(e(libc::EAGAIN, "x"), SETUP_FAILED);
}

#[test]
fn output_paths_are_checked_before_the_run() {
    assert!(per_process(OsStr::new("r.%p.txt")));
    assert!(!per_process(OsStr::new("r.%r.%%p.txt")));
    assert_eq!(
        directory_problem(Path::new("/nonexistent/r.txt")).as_deref(),
        Some("directory /nonexistent does not exist")
    );
    assert_eq!(
        directory_problem(Path::new("/etc/passwd/r.txt")).as_deref(),
        Some("/etc/passwd is not a directory")
    );
    assert_eq!(directory_problem(Path::new("r.txt")), None);
    assert!(check_trace(Path::new("/nonexistent/t.%p.jsonl"))
        .unwrap_err()
        .starts_with("--trace /nonexistent/t.%p.jsonl: directory /nonexistent"));
}
