//! `cuhook run` stands between a user and the command: a termination signal sent to it (by a
//! batch system's `kill`, a supervisor, `timeout`) is passed on to the command, and `cuhook run`
//! keeps waiting so that it still removes its directory and exits with the command's status.
//!
//! The signals are blocked in every thread of `cuhook` and taken by one forwarding thread with
//! `sigwaitinfo`; the command starts with them unblocked ([`unblock_in_child`]). A signal
//! the terminal sent (Ctrl-C, a hang-up: `si_code == SI_KERNEL`) already went to the command's
//! whole process group and is not sent twice.

use std::io;
use std::process::{Child, ExitStatus};
use std::sync::{Mutex, OnceLock};

/// What is passed on: the signals that ask a process to end, and the two user signals.
const FORWARDED: [i32; 6] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// The command being waited for, and a signal that came before it was started.
struct Target {
    pid: Option<libc::pid_t>,
    pending: Option<i32>,
}

static TARGET: Mutex<Target> = Mutex::new(Target {
    pid: None,
    pending: None,
});
static FORWARDER: OnceLock<()> = OnceLock::new();

fn forwarded_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data that these calls initialise.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block the forwarded signals in this thread (call it before any other thread starts, so all
/// inherit the mask) and start the forwarding thread once.
pub fn start_forwarding() {
    FORWARDER.get_or_init(|| {
        let set = forwarded_set();
        // SAFETY: a valid set; the old mask is not needed.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        std::thread::Builder::new()
            .name("cuhook-signals".into())
            .spawn(move || loop {
                // SAFETY: siginfo_t is plain data that sigwaitinfo fills.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: a valid set and a siginfo_t to fill.
                let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
                if sig > 0 && info.si_code != libc::SI_KERNEL {
                    forward(sig);
                }
            })
            .expect("start the signal forwarding thread");
    });
}

fn forward(sig: i32) {
    let mut t = TARGET.lock().unwrap_or_else(|e| e.into_inner());
    match t.pid {
        // SAFETY: `pid` is our child, not yet reaped (see `wait`): the id cannot be reused.
        Some(pid) => unsafe {
            libc::kill(pid, sig);
        },
        None => t.pending = Some(sig),
    }
}

/// Let `cmd`'s process start with the forwarded signals unblocked (the mask is inherited across
/// `fork` and `exec`, and std does not reset it).
pub fn unblock_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let set = forwarded_set();
    // SAFETY: the closure runs between fork and exec and only calls pthread_sigmask, which is
    // async-signal-safe, on a set built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
}

/// Wait for `child`, passing forwarded signals on to it meanwhile.
pub fn wait(child: &mut Child) -> io::Result<ExitStatus> {
    let pid = child.id() as libc::pid_t;
    {
        let mut t = TARGET.lock().unwrap_or_else(|e| e.into_inner());
        t.pid = Some(pid);
        if let Some(sig) = t.pending.take() {
            // SAFETY: our child, not yet reaped.
            unsafe { libc::kill(pid, sig) };
        }
    }
    // Wait without reaping, so the pid stays ours while the forwarder may still use it.
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid child id and a siginfo_t to fill.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    TARGET.lock().unwrap_or_else(|e| e.into_inner()).pid = None;
    child.wait()
}
