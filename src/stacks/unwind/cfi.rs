//! The CFI row for one address, from its object's `.eh_frame_hdr` and `.eh_frame`, read in
//! place with `gimli` and reduced to the few rules the walk follows.
//!
//! Nothing here allocates: `gimli`'s unwind context is given array storage ([`Storage`]) and
//! lives on the capturing thread's stack (its size is checked by a test). Nothing takes a lock:
//! `_dl_find_object` is lock-free, the rest reads memory. Every slice handed to `gimli` covers
//! bytes of the mapping that holds the tables only (`tables_mapping`): the header's exact
//! length, and `.eh_frame` from its start to the end of the one FDE the binary search table
//! points to (its CIE precedes it).
#![allow(unsafe_code)]

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EhFrameOffset, NativeEndian, Register,
    RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection, UnwindTableRow,
};

use super::arch;
use crate::sys::dl;

type Slice = gimli::EndianSlice<'static, NativeEndian>;

/// Fixed-size storage for `gimli`'s unwind context: [`arch::RULES`] register rules per row,
/// and `DW_CFA_remember_state` nested 4 deep (as gimli's own default).
pub(super) struct Storage;

impl UnwindContextStorage<usize> for Storage {
    type Rules = [(Register, RegisterRule<usize>); arch::RULES];
    type Stack = [UnwindTableRow<usize, Self>; 4];
}

/// The unwind context of one capture, reused for each frame.
pub(super) struct Context(UnwindContext<usize, Storage>);

impl Context {
    pub(super) fn new() -> Context {
        Context(UnwindContext::new_in())
    }
}

/// Bytes of stack one [`Context`] takes.
#[cfg(test)]
pub(crate) fn context_size() -> usize {
    std::mem::size_of::<Context>()
}

/// How one register of the caller is recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rule {
    /// Unchanged (also: no rule given).
    Same,
    /// Not recoverable: for the return address, the end of the stack.
    Undefined,
    /// Saved at CFA + n.
    Offset(i64),
    /// Is CFA + n.
    ValOffset(i64),
    /// In that register.
    Register(u16),
}

/// The rules of one CFI row the walk follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rules {
    pub cfa_register: u16,
    pub cfa_offset: i64,
    pub ra: Rule,
    pub fp: Rule,
}

/// What the unwind tables say about an address.
pub(super) enum Lookup {
    Found(Rules),
    /// No object, no `.eh_frame_hdr`, or no FDE covers it: the caller may try frame pointers.
    NoInfo,
    /// Covered, but by rules this walk does not follow (an expression, a signal frame, a table
    /// it cannot read): the end of the capture.
    Unsupported,
}

/// The CFI row covering `pc`, from its object's tables (the walk asks the cache first:
/// `super::rules_for`).
pub(super) fn find(pc: usize, ctx: &mut Context) -> Lookup {
    let Some(object) = dl::found_object_if_resolved(pc) else {
        return Lookup::NoInfo;
    };
    if object.eh_frame_hdr == 0 {
        return Lookup::NoInfo;
    }
    let Some(tables) = tables_mapping(object) else {
        return Lookup::Unsupported;
    };
    match row(pc, tables, ctx) {
        Ok(rules) => rules,
        Err(gimli::Error::NoUnwindInfoForAddress) => Lookup::NoInfo,
        Err(_) => Lookup::Unsupported,
    }
}

/// The mapping the unwind tables are read in: the one holding `pc` (what `_dl_find_object`
/// answered for it), or else the one holding the tables' header. glibc's answer is the mapping
/// *containing* the address, which is the whole object when its segments are mapped without
/// gaps, but one segment when a program's segments have unmapped gaps between them (linked
/// with a page size larger than the system's, or by a linker that page-aligns each segment):
/// the code then lies in one mapping and its tables in another.
fn tables_mapping(object: dl::FoundObject) -> Option<dl::FoundObject> {
    let hdr = object.eh_frame_hdr;
    if (object.map_start..object.map_end).contains(&hdr) {
        return Some(object);
    }
    // Another mapping of the same object: it names the same tables.
    let tables = dl::found_object_if_resolved(hdr)?;
    (tables.eh_frame_hdr == hdr).then_some(tables)
}

/// `len` bytes at `addr` of the object `[start, end)`, or `None` when they are not inside it.
fn bytes(addr: usize, len: usize, object: &dl::FoundObject) -> Option<&'static [u8]> {
    let end = addr.checked_add(len)?;
    if addr < object.map_start || end > object.map_end {
        return None;
    }
    // SAFETY: inside the mapped range of a loaded object, in the segment `_dl_find_object`
    // points to (the header and the unwind tables are part of a read-only `PT_LOAD`); the
    // object stays loaded while code of it is on this thread's stack. 'static is a lie kept
    // inside this module: the slices do not outlive one `find`.
    Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
}

/// The `.eh_frame_hdr` layout every linker writes: version 1, `.eh_frame` pointer
/// `pcrel|sdata4`, FDE count `udata4`, table `datarel|sdata4`.
const HDR_ENCODINGS: [u8; 4] = [1, 0x1b, 0x03, 0x3b];

fn row(pc: usize, object: dl::FoundObject, ctx: &mut Context) -> gimli::Result<Lookup> {
    let hdr_addr = object.eh_frame_hdr;
    let Some(head) = bytes(hdr_addr, 12, &object) else {
        return Ok(Lookup::Unsupported);
    };
    if head[..4] != HDR_ENCODINGS {
        return Ok(Lookup::Unsupported);
    }
    let count = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]) as usize;
    let Some(hdr) = count
        .checked_mul(8)
        .and_then(|t| bytes(hdr_addr, 12 + t, &object))
    else {
        return Ok(Lookup::Unsupported);
    };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_addr as u64);
    let parsed = EhFrameHdr::new(hdr, NativeEndian).parse(&bases, 8)?;
    let eh_frame_addr = parsed.eh_frame_ptr().direct()? as usize;
    let bases = bases.set_eh_frame(eh_frame_addr as u64);
    let Some(table) = parsed.table() else {
        return Ok(Lookup::NoInfo);
    };
    let fde_addr = table.lookup(pc as u64, &bases)?.direct()? as usize;
    // The FDE's length word says where it ends; `.eh_frame` is read up to there.
    let Some(fde_end) = fde_addr
        .checked_sub(eh_frame_addr)
        .and_then(|_| entry_end(fde_addr, &object))
    else {
        return Ok(Lookup::Unsupported);
    };
    let Some(section) = bytes(eh_frame_addr, fde_end - eh_frame_addr, &object) else {
        return Ok(Lookup::Unsupported);
    };
    let mut eh_frame = EhFrame::<Slice>::new(section, NativeEndian);
    eh_frame.set_address_size(8);
    let fde = eh_frame.fde_from_offset(
        &bases,
        EhFrameOffset(fde_addr - eh_frame_addr),
        EhFrame::cie_from_offset,
    )?;
    if !fde.contains(pc as u64) {
        return Ok(Lookup::NoInfo);
    }
    if fde.is_signal_trampoline() {
        return Ok(Lookup::Unsupported);
    }
    let row = fde.unwind_info_for_address(&eh_frame, &bases, &mut ctx.0, pc as u64)?;
    Ok(reduce(row))
}

/// The end of the CIE or FDE at `addr` (its 32- or 64-bit length, read in place).
fn entry_end(addr: usize, object: &dl::FoundObject) -> Option<usize> {
    let word = bytes(addr, 4, object)?;
    let len = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
    let (header, len) = if len == u32::MAX {
        let long = bytes(addr + 4, 8, object)?;
        (12, u64::from_ne_bytes(long.try_into().ok()?) as usize)
    } else {
        (4, len as usize)
    };
    let end = addr.checked_add(header)?.checked_add(len)?;
    (end <= object.map_end).then_some(end)
}

/// The row's CFA, return address and frame pointer rules, or `Unsupported`.
fn reduce(row: &UnwindTableRow<usize, Storage>) -> Lookup {
    let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
        return Lookup::Unsupported;
    };
    let rule = |r: u16| -> Option<Rule> {
        Some(match row.register(Register(r)) {
            None | Some(RegisterRule::SameValue) => Rule::Same,
            Some(RegisterRule::Undefined) => Rule::Undefined,
            Some(RegisterRule::Offset(o)) => Rule::Offset(o),
            Some(RegisterRule::ValOffset(o)) => Rule::ValOffset(o),
            Some(RegisterRule::Register(Register(x))) => Rule::Register(x),
            Some(_) => return None,
        })
    };
    let Some(ra) = rule(arch::RA) else {
        return Lookup::Unsupported;
    };
    // A frame pointer kept by an expression is not followed: unknown from here up.
    let fp = rule(arch::FP).unwrap_or(Rule::Undefined);
    Lookup::Found(Rules {
        cfa_register: register.0,
        cfa_offset: offset,
        ra,
        fp,
    })
}
