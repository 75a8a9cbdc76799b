//! The process as a whole: how it was started, what runs at its exit, its clock.
#![allow(unsafe_code)]

/// Whether the process runs in secure-execution mode (`AT_SECURE`: set-user-ID or set-group-ID,
/// or file capabilities): then the environment is not to be trusted.
pub(crate) fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Run `f` at process exit (`atexit`); false when it could not be registered.
pub(crate) fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: registering a plain extern "C" function that lives as long as the process (the
    // caller's object is never unloaded: `-z nodelete`).
    unsafe { libc::atexit(f) == 0 }
}

/// Wall-clock time in nanoseconds since the epoch (`CLOCK_REALTIME`: the vDSO, no lock).
pub(crate) fn realtime_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}

/// A yes/no setting: `Some(true)` for `1`, `true`, `yes` or `on`, `Some(false)` for nothing,
/// `0`, `false`, `no` or `off` (spaces around ignored), `None` for anything else.
pub(crate) fn parse_flag(value: &str) -> Option<bool> {
    match value.trim() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// The yes/no environment variable `name` ([`parse_flag`]); `default` when it is unset or not
/// a flag, and in secure execution (whose environment is not to be trusted).
pub(crate) fn env_flag_or(name: &str, default: bool) -> bool {
    if secure_execution() {
        return default;
    }
    std::env::var_os(name)
        .and_then(|v| v.to_str().and_then(parse_flag))
        .unwrap_or(default)
}
