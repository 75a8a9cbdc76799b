//! Which objects are never patched: cuhook's own object, the vDSO, the dynamic loader, and the
//! user's exclude list.

use std::sync::Mutex;

use crate::elf::LoadedObject;

use super::loader::auxv;

/// Why an object is not patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The object that contains cuhook: its calls to originals must never reach its own hooks.
    SelfObject,
    /// The kernel's vDSO (no relocations to patch).
    Vdso,
    /// The dynamic loader itself.
    Loader,
    /// Its name contains an entry of the exclude list.
    Excluded,
}

static EXCLUDE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Replace the exclude list: objects whose path contains any of these substrings are not
/// patched by installs and rescans that start afterwards.
pub fn set_exclude_list<I: IntoIterator<Item = S>, S: Into<String>>(patterns: I) {
    let list: Vec<String> = patterns
        .into_iter()
        .map(Into::into)
        .filter(|s: &String| !s.is_empty())
        .collect();
    *EXCLUDE.lock().unwrap_or_else(|e| e.into_inner()) = list;
}

/// The current exclude list.
pub fn exclude_list() -> Vec<String> {
    EXCLUDE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Any address inside cuhook's own code.
fn self_address() -> usize {
    self_address as *const () as usize
}

/// Whether `obj` must be left alone, and why.
pub fn skip_reason(obj: &LoadedObject, exclude: &[String]) -> Option<SkipReason> {
    if obj.contains(self_address()) {
        return Some(SkipReason::SelfObject);
    }
    let vdso = auxv(libc::AT_SYSINFO_EHDR);
    if (vdso != 0 && obj.contains(vdso))
        || obj.name.starts_with("linux-vdso")
        || obj.name.starts_with("linux-gate")
    {
        return Some(SkipReason::Vdso);
    }
    let file = obj.name.rsplit('/').next().unwrap_or("");
    let interp = auxv(libc::AT_BASE);
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
