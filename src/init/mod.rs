//! Start-up: the constructor that installs cuhook when `libcuhook.so` is loaded (LD_PRELOAD, or
//! a host library's dependency), the environment configuration, and logging.
//!
//! The constructor must be harmless in every process it lands in (LD_PRELOAD is inherited by
//! compilers, package managers, `nvidia-smi`…): it loads no CUDA library, starts no thread and
//! prints nothing unless asked. It does nothing at all in a secure-execution process
//! (`AT_SECURE`), with `CUHOOK_DISABLE=1`, or when cuhook is linked into a program as a Rust
//! library (then the program calls [`crate::cuda::install`] itself).

pub mod config;

use crate::log;

use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::log::Level;
pub use config::{Config, ReportTarget, Warning};

use crate::report;
use crate::Result;

static STARTED: AtomicBool = AtomicBool::new(false);
static REPORT: spin::mutex::SpinMutex<Option<ReportTarget>, spin::relax::Yield> =
    spin::mutex::SpinMutex::new(None);

/// Runs when the object containing cuhook is loaded.
// SAFETY: `.init_array` holds pointers to `extern "C" fn()` run by the loader at load time; this
// entry is exactly such a pointer, and the function catches every panic.
// Not under Miri, which runs `.init_array` too but cannot call `getauxval`/`dladdr` (a test
// binary is never `libcuhook*.so` anyway).
#[allow(unsafe_code)]
#[cfg(not(miri))]
#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

#[cfg_attr(miri, allow(dead_code))] // not registered under Miri
extern "C" fn constructor() {
    crate::sys::boundary::guarded(
        || {
            // The loader functions cuhook calls for itself, read before any copy of cuhook that
            // serves the process patches this object.
            crate::sys::real::capture();
            if secure_execution() {
                return;
            }
            crate::instance::discover_at_start();
            if !loaded_as_libcuhook() {
                return;
            }
            let (config, warnings) = Config::from_env();
            log::set_level(config.log);
            for w in &warnings {
                crate::log!(
                    Level::Warn,
                    "{}={:?} is not valid (accepted: {}); using the default",
                    w.variable,
                    w.value,
                    w.accepted
                );
            }
            if config.disabled {
                crate::log!(Level::Info, "CUHOOK_DISABLE is set: not installing");
                return;
            }
            if let Err(e) = start(&config) {
                crate::log!(Level::Error, "could not install: {e}");
            }
        },
        || (),
    );
}

#[cfg_attr(miri, allow(dead_code))] // only the constructor calls it
fn secure_execution() -> bool {
    crate::sys::process::secure_execution()
}

/// Whether our code lives in the C library `libcuhook.so` (not in a program or a host library
/// that links cuhook statically and decides for itself).
#[cfg_attr(miri, allow(dead_code))] // only the constructor calls it
fn loaded_as_libcuhook() -> bool {
    crate::hooks::own_object_is_the_c_library()
}

/// Apply a configuration: exclude list, report, trace, then install the CUDA hooks and the
/// registry. What the constructor does; host libraries that embed cuhook may call it from their
/// own constructor with [`Config::from_env`]. Only the first call has an effect.
pub fn start(config: &Config) -> Result<()> {
    if STARTED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // One engine per process: when another copy of cuhook already serves it (a program or a
    // library that embeds the crate and installed first), this one installs nothing, and its
    // C API forwards there. Its report and trace would describe an engine that never ran.
    if let crate::instance::Route::Other(peer) = crate::instance::route() {
        crate::log!(
            Level::Info,
            "the copy of cuhook in {} already serves this process: not installing (CUHOOK_REPORT and CUHOOK_TRACE are ignored)",
            crate::instance::object_of(peer)
        );
        return Ok(());
    }
    crate::hooks::set_exclude_list(config.exclude.iter().cloned());
    crate::hooks::set_group_dlopen(config.group_dlopen);
    crate::cuda::set_managed_scan(config.managed_scan);
    if config.stacks > 0 {
        crate::api::enable_stacks(config.stacks, config.stacks_max);
    }
    if let Some(target) = &config.report {
        report::enable_stats()?;
        *REPORT.lock() = Some(target.clone());
        // glibc runs it at exit (or when this object is unloaded, which `-z nodelete` prevents).
        crate::sys::process::at_exit(write_report_at_exit);
    }
    if let Some(path) = &config.trace {
        if let Err(e) = report::enable_trace(path) {
            crate::log!(Level::Warn, "CUHOOK_TRACE={:?}: {e}; tracing is off", path);
        }
    }
    crate::cuda::install_global()?;
    crate::log!(
        Level::Info,
        "installed: {} slots patched",
        crate::hooks::patched_slots().len()
    );
    Ok(())
}

extern "C" fn write_report_at_exit() {
    crate::sys::boundary::guarded(
        || {
            let target = REPORT.lock().clone();
            let Some(target) = target else { return };
            // Rendering allocates as it goes: in a host out of memory, one fixed line instead
            // of an abort that would change the host's exit status.
            if !crate::sys::memory::available(crate::sys::memory::REPORT_MARGIN) {
                crate::sys::write::stderr(b"cuhook: no exit report: memory is short at exit\n");
                return;
            }
            let text = report::render();
            match target {
                ReportTarget::Stderr => crate::sys::write::stderr(text.as_bytes()),
                ReportTarget::File(path) => {
                    let path = report::expand_path(&path);
                    if let Err(e) = report::write_file(&path, text.as_bytes()) {
                        crate::log!(Level::Error, "{}: {e}", path.to_string_lossy());
                    }
                }
            }
        },
        || (),
    );
}
