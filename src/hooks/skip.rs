//! Which objects are never patched: the C library `libcuhook.so`, the vDSO, the dynamic loader,
//! and the user's exclude list.
//!
//! The object that contains cuhook's code is skipped only when it *is* the C library (its soname
//! starts with `libcuhook.so`): nothing in it calls CUDA or loads libraries for a user. When the
//! crate is linked into a program or into a library of the user's, that object is the host's
//! own code, and it is patched like any other; cuhook's own loader calls then go through the
//! functions `sys::real` captured before the first patch, and its driver calls through pointers
//! it looked up with them, so none of them reaches a hook.

use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use crate::elf::DynamicTables;

use crate::elf::LoadedObject;

use super::loader::vdso_and_interpreter;

/// Why an object is not patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The C library `libcuhook.so` itself (an object holding only cuhook's code).
    SelfObject,
    /// The kernel's vDSO (no relocations to patch).
    Vdso,
    /// The dynamic loader itself.
    Loader,
    /// Its name contains an entry of the exclude list.
    Excluded,
}

/// One version of the exclude list. Replaced versions stay allocated (a reader may be copying
/// one) and stay *reachable*, chained from the current one: a leak checker (LeakSanitizer in a
/// sanitizer-built host) sees memory still referenced, not a leak.
struct ExcludeList {
    patterns: Vec<String>,
    previous: *const ExcludeList,
}

/// The exclude list, replaced whole. No lock: a `fork` while another thread held one would
/// leave the child's next install or rescan waiting for ever. Set it at start-up, not in a loop
/// (each version is kept).
static EXCLUDE: AtomicPtr<ExcludeList> = AtomicPtr::new(std::ptr::null_mut());

/// Replace the exclude list: objects whose path contains any of these substrings are not
/// patched by installs and rescans that start afterwards. The previous list is kept allocated
/// (readers never wait for this call); it is meant for configuration, a few calls per process.
pub fn set_exclude_list<I: IntoIterator<Item = S>, S: Into<String>>(patterns: I) {
    let patterns: Vec<String> = patterns
        .into_iter()
        .map(Into::into)
        .filter(|s: &String| !s.is_empty())
        .collect();
    let list = Box::into_raw(Box::new(ExcludeList {
        patterns,
        previous: std::ptr::null(),
    }));
    let mut current = EXCLUDE.load(Ordering::Acquire);
    loop {
        // SAFETY: `list` is ours until published below.
        #[allow(unsafe_code)]
        unsafe {
            (*list).previous = current
        };
        // Release: the list is complete before a reader can load its address.
        match EXCLUDE.compare_exchange(current, list, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => current = now,
        }
    }
}

/// The current exclude list.
pub fn exclude_list() -> Vec<String> {
    let list = EXCLUDE.load(Ordering::Acquire);
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: a pointer `set_exclude_list` published from `Box::into_raw`; lists are never freed.
    #[allow(unsafe_code)]
    unsafe {
        (*list).patterns.clone()
    }
}

/// The range of cuhook's own code (`[start, end)` of its executable segments) when that code is
/// the C library `libcuhook.so`; `None` in a program or library that embeds the crate, where
/// the object's code is the host's too.
pub(crate) fn own_code_range() -> Option<(usize, usize)> {
    let snapshot = crate::elf::snapshot();
    let own = snapshot
        .objects
        .iter()
        .find(|o| o.contains(self_address()))?;
    if !self_is_the_c_library(own) {
        return None;
    }
    own.segments()
        .filter(|&(_, _, flags)| flags & goblin::elf::program_header::PF_X != 0)
        .fold(None, |range, (start, end, _)| match range {
            None => Some((start, end)),
            Some((lo, hi)) => Some((start.min(lo), end.max(hi))),
        })
}

/// Any address inside cuhook's own code.
fn self_address() -> usize {
    self_address as *const () as usize
}

/// Whether the object containing cuhook's code is the C library: decided once (that object
/// never changes), from its soname.
fn self_is_the_c_library(own: &LoadedObject) -> bool {
    const UNKNOWN: u8 = 0;
    const YES: u8 = 1;
    const NO: u8 = 2;
    static ANSWER: AtomicU8 = AtomicU8::new(UNKNOWN);
    match ANSWER.load(Ordering::Relaxed) {
        YES => return true,
        NO => return false,
        _ => {}
    }
    let yes = soname(own).is_some_and(|n| n.starts_with(b"libcuhook.so"));
    ANSWER.store(if yes { YES } else { NO }, Ordering::Relaxed);
    yes
}

/// Whether the object containing cuhook's code is the C library `libcuhook.so` (by its soname),
/// rather than a program or a library of the user's that embeds the crate.
pub(crate) fn own_object_is_the_c_library() -> bool {
    crate::elf::snapshot()
        .objects
        .iter()
        .find(|o| o.contains(self_address()))
        .is_some_and(|own| self_is_the_c_library(own))
}

/// The object's `DT_SONAME` (read from our own object only: it is mapped while we run).
fn soname(obj: &LoadedObject) -> Option<Vec<u8>> {
    let tables = DynamicTables::read(obj).ok()??;
    let at = tables.strtab.checked_add(tables.soname?)?;
    crate::elf::read_c_str(obj, at, 256)
}

/// Whether `obj` must be left alone, and why.
pub fn skip_reason(obj: &LoadedObject, exclude: &[String]) -> Option<SkipReason> {
    if obj.contains(self_address()) && self_is_the_c_library(obj) {
        return Some(SkipReason::SelfObject);
    }
    let (vdso, interp) = vdso_and_interpreter();
    if (vdso != 0 && obj.contains(vdso))
        || obj.name.starts_with("linux-vdso")
        || obj.name.starts_with("linux-gate")
    {
        return Some(SkipReason::Vdso);
    }
    // The file name (`memrchr`: `rsplit` decodes the path char by char, ≈ 250 instructions).
    let file = match memchr::memrchr(b'/', obj.name.as_bytes()) {
        Some(i) => &obj.name[i + 1..],
        None => &obj.name[..],
    };
    if (interp != 0 && obj.contains(interp))
        || file.starts_with("ld-linux")
        || file.starts_with("ld64.so")
    {
        return Some(SkipReason::Loader);
    }
    if exclude.iter().any(|p| obj.name.contains(p.as_str())) {
        return Some(SkipReason::Excluded);
    }
    None
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Children forked while another thread replaces the exclude list read it at once. With the
    /// list behind a mutex, a child forked while the lock was held waited for ever (the alarm
    /// kills it): here the other thread replaces the list in a tight loop.
    #[test]
    fn a_child_forked_while_the_list_changes_reads_it() {
        static STOP: AtomicBool = AtomicBool::new(false);
        set_exclude_list(["no-such-object-0"]);
        let setter = std::thread::spawn(|| {
            let mut n = 0u64;
            while !STOP.load(Ordering::Relaxed) {
                set_exclude_list([format!("no-such-object-{}", n % 2)]);
                n += 1;
            }
        });
        let failed = (0..100)
            .filter(|_| {
                !cuhook_fixtures::forked(5, || {
                    exclude_list()
                        .first()
                        .is_some_and(|p| p.starts_with("no-such-object-"))
                })
            })
            .count();
        STOP.store(true, Ordering::Relaxed);
        setter.join().unwrap();
        set_exclude_list(Vec::<String>::new());
        assert_eq!(failed, 0, "children that could not read the list");
    }
}
