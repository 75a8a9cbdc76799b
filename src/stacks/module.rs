//! Frames → (module, load bias, offset, build-id): what a stack table records so that frames
//! can be symbolized later, in this process or another (the CLI, after the program exited).
//!
//! Report time only: this allocates, walks the loader's list and pins objects while their
//! build-ids are read. A frame's `offset` is its address minus the module's load bias — the
//! address in the module's own ELF view, which is what its symbol tables and DWARF use.
//!
//! Unsafe only to give back the loader references that pin objects (`dl::close`).
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::elf::{self, LoadedObject};
use crate::sys::dl;

/// One loaded object, as frames refer to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Its file: the loader's path, or the executable's (`/proc/self/exe`) for the main
    /// program; the loader's name for objects without a file (`linux-vdso.so.1`).
    pub path: String,
    /// Load bias: added to the module's ELF addresses to give run-time addresses.
    pub bias: usize,
    /// GNU build-id (from its `PT_NOTE` in memory), when it has one.
    pub build_id: Option<Vec<u8>>,
}

impl Module {
    /// The build-id as lowercase hex ("" when there is none).
    pub fn build_id_hex(&self) -> String {
        self.build_id
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The file name alone (for `module+0xoffset`).
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// A frame address resolved to its module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleFrame {
    /// The run-time address.
    pub address: usize,
    /// The module holding it.
    pub module: Arc<Module>,
    /// `address - module.bias`.
    pub offset: usize,
}

/// The loaded objects at one moment, to resolve many frames against.
#[derive(Debug)]
pub struct Modules {
    objects: Vec<(Arc<LoadedObject>, Arc<Module>)>,
}

impl Modules {
    /// The objects loaded now, with their build-ids (each pinned while it is read).
    pub fn loaded() -> Modules {
        let snapshot = elf::snapshot();
        let objects = snapshot
            .objects
            .into_iter()
            .map(|obj| {
                let module = Arc::new(describe(&obj));
                (obj, module)
            })
            .collect();
        Modules { objects }
    }

    /// The module holding `address` (inside one of its `PT_LOAD` segments); `None` for
    /// addresses no loaded object covers (JIT code, an object unloaded since).
    pub fn resolve(&self, address: usize) -> Option<ModuleFrame> {
        let (_, module) = self.objects.iter().find(|(o, _)| o.contains(address))?;
        Some(ModuleFrame {
            address,
            module: Arc::clone(module),
            offset: address.wrapping_sub(module.bias),
        })
    }

    /// Every module, in the loader's order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Module>> {
        self.objects.iter().map(|(_, m)| m)
    }
}

/// Path, bias and build-id of one object.
fn describe(obj: &LoadedObject) -> Module {
    let path = if obj.position == 0 && obj.name.is_empty() {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        obj.name.clone()
    };
    // The main program, the vDSO and the loader are never unloaded; any other object is
    // pinned (a reference of our own) while its notes are read.
    let pin = if obj.position == 0 || obj.name.is_empty() {
        None
    } else {
        std::ffi::CString::new(obj.name.as_bytes())
            .ok()
            .and_then(|name| dl::open_loaded(Some(&name)))
    };
    let (vdso, interpreter) = dl::vdso_and_interpreter();
    let never_unloaded = obj.position == 0 || obj.base == vdso || obj.base == interpreter;
    let build_id = if never_unloaded || pin.is_some() {
        elf::build_id(obj)
    } else {
        None
    };
    if let Some(handle) = pin {
        // SAFETY: our own reference from `open_loaded`, given back once.
        unsafe { dl::close(handle) };
    }
    Module {
        path,
        bias: obj.base,
        build_id,
    }
}
