//! Configuration from the environment. A bad value never stops the process: it gets one
//! warning line naming the variable and the accepted values, and the default is used.

use std::ffi::OsString;

use crate::log::Level;

/// Where the exit report goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportTarget {
    /// Standard error.
    Stderr,
    /// A file; `%p` in the path is replaced by the process id, `%r` by the MPI rank.
    File(OsString),
}

/// Everything the environment can set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `CUHOOK_DISABLE=1`: do nothing at all.
    pub disabled: bool,
    /// `CUHOOK_LOG`.
    pub log: Level,
    /// `CUHOOK_REPORT=stderr|<path>`.
    pub report: Option<ReportTarget>,
    /// `CUHOOK_TRACE=<path>`: one JSON object per event.
    pub trace: Option<OsString>,
    /// `CUHOOK_EXCLUDE=<comma-separated object-name substrings>`.
    pub exclude: Vec<String>,
    /// `CUHOOK_SCAN_MANAGED=all|stored|off`: which loaded device code is read for
    /// `__managed__` variables.
    pub managed_scan: crate::cuda::ManagedScan,
    /// `CUHOOK_STACKS=N` (1..=64): record N frames of each allocation's call stack; 0 (the
    /// default) records none.
    pub stacks: usize,
    /// `CUHOOK_GROUP_DLOPEN=0`: handle a `dlopen` that brings new dependencies by a whole sync
    /// instead of from the object it opened (on by default: `crate::hooks::group_dlopen`).
    pub group_dlopen: bool,
    /// `CUHOOK_STACKS_MAX=N`: unique stacks kept (default
    /// [`crate::stacks::DEFAULT_CAPACITY`]); allocations from further ones count as "other".
    pub stacks_max: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            disabled: false,
            log: Level::Warn,
            report: None,
            trace: None,
            exclude: Vec::new(),
            managed_scan: crate::cuda::ManagedScan::All,
            stacks: 0,
            group_dlopen: true,
            stacks_max: crate::stacks::DEFAULT_CAPACITY,
        }
    }
}

/// One warning about a bad variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The variable's name.
    pub variable: &'static str,
    /// The value it had.
    pub value: String,
    /// The values it accepts.
    pub accepted: &'static str,
}

impl Config {
    /// Read the configuration through `get` (the environment, or a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> (Config, Vec<Warning>) {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        let text = |name: &str| get(name).map(|v| v.to_string_lossy().into_owned());
        for (variable, field) in [
            ("CUHOOK_DISABLE", &mut c.disabled),
            ("CUHOOK_GROUP_DLOPEN", &mut c.group_dlopen),
        ] {
            if let Some(v) = text(variable) {
                match crate::sys::process::parse_flag(&v) {
                    Some(on) => *field = on,
                    None => warnings.push(Warning {
                        variable,
                        value: v,
                        accepted: "1|0|true|false|yes|no|on|off",
                    }),
                }
            }
        }
        if let Some(v) = text("CUHOOK_LOG") {
            match Level::parse(&v) {
                Some(level) => c.log = level,
                None => warnings.push(Warning {
                    variable: "CUHOOK_LOG",
                    value: v,
                    accepted: Level::NAMES,
                }),
            }
        }
        if let Some(v) = get("CUHOOK_REPORT") {
            match v.to_str().map(str::trim) {
                Some("") => warnings.push(Warning {
                    variable: "CUHOOK_REPORT",
                    value: String::new(),
                    accepted: "stderr|<path>",
                }),
                Some("stderr") => c.report = Some(ReportTarget::Stderr),
                _ => c.report = Some(ReportTarget::File(v)),
            }
        }
        if let Some(v) = get("CUHOOK_TRACE") {
            if v.is_empty() {
                warnings.push(Warning {
                    variable: "CUHOOK_TRACE",
                    value: String::new(),
                    accepted: "<path>",
                });
            } else {
                c.trace = Some(v);
            }
        }
        if let Some(v) = text("CUHOOK_EXCLUDE") {
            c.exclude = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(v) = text("CUHOOK_SCAN_MANAGED") {
            match crate::cuda::ManagedScan::parse(&v) {
                Some(scan) => c.managed_scan = scan,
                None => warnings.push(Warning {
                    variable: "CUHOOK_SCAN_MANAGED",
                    value: v,
                    accepted: crate::cuda::ManagedScan::NAMES,
                }),
            }
        }
        if let Some(v) = text("CUHOOK_STACKS") {
            match v.trim().parse::<usize>() {
                Ok(n) if n <= crate::stacks::MAX_FRAMES => c.stacks = n,
                _ => warnings.push(Warning {
                    variable: "CUHOOK_STACKS",
                    value: v,
                    accepted: "0..=64 (frames per allocation; 0: off)",
                }),
            }
        }
        if let Some(v) = text("CUHOOK_STACKS_MAX") {
            match v.trim().parse::<u32>() {
                Ok(n) if (1..=1 << 24).contains(&n) => c.stacks_max = n,
                _ => warnings.push(Warning {
                    variable: "CUHOOK_STACKS_MAX",
                    value: v,
                    accepted: "1..=16777216 (unique stacks kept)",
                }),
            }
        }
        (c, warnings)
    }

    /// Read the process environment.
    pub fn from_env() -> (Config, Vec<Warning>) {
        Config::from_lookup(|name| std::env::var_os(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> (Config, Vec<Warning>) {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let (c, w) = read(&[]);
        assert_eq!(c, Config::default());
        assert!(w.is_empty());
        assert_eq!(c.log, Level::Warn);
    }

    #[test]
    fn every_variable_is_read() {
        let (c, w) = read(&[
            ("CUHOOK_DISABLE", "1"),
            ("CUHOOK_LOG", "DEBUG"),
            ("CUHOOK_REPORT", "/tmp/r-%p.txt"),
            ("CUHOOK_TRACE", "/tmp/t.jsonl"),
            ("CUHOOK_EXCLUDE", "libfoo, libbar,,"),
            ("CUHOOK_SCAN_MANAGED", "stored"),
        ]);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.managed_scan, crate::cuda::ManagedScan::Stored);
        assert!(c.disabled);
        assert_eq!(c.log, Level::Debug);
        assert_eq!(c.report, Some(ReportTarget::File("/tmp/r-%p.txt".into())));
        assert_eq!(c.trace, Some("/tmp/t.jsonl".into()));
        assert_eq!(c.exclude, vec!["libfoo".to_owned(), "libbar".to_owned()]);
        assert_eq!(
            read(&[("CUHOOK_REPORT", "stderr")]).0.report,
            Some(ReportTarget::Stderr)
        );
    }

    #[test]
    fn bad_values_warn_once_each_and_keep_defaults() {
        let (c, w) = read(&[
            ("CUHOOK_LOG", "loud"),
            ("CUHOOK_DISABLE", "maybe"),
            ("CUHOOK_REPORT", ""),
            ("CUHOOK_SCAN_MANAGED", "some"),
        ]);
        assert_eq!(c.log, Level::Warn);
        assert!(!c.disabled);
        assert_eq!(c.report, None);
        assert_eq!(c.managed_scan, crate::cuda::ManagedScan::All);
        let vars: Vec<&str> = w.iter().map(|w| w.variable).collect();
        assert_eq!(
            vars,
            [
                "CUHOOK_DISABLE",
                "CUHOOK_LOG",
                "CUHOOK_REPORT",
                "CUHOOK_SCAN_MANAGED"
            ]
        );
        assert!(w[1].accepted.contains("debug"));
    }
}
