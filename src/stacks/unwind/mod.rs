//! Native stack capture for the hook path: return addresses, from the unwind tables.
//!
//! Each step finds the object holding the program counter with glibc's `_dl_find_object`
//! (lock-free, allocation-free, async-signal-safe), its `.eh_frame_hdr` binary search table,
//! the FDE covering the address, and evaluates its CFI (`gimli`, with a fixed-size unwind
//! context on the stack: [`cfi`]) to the canonical frame address and the caller's return
//! address and frame pointer. Where no unwind information covers the address (JIT code, an
//! object without `PT_GNU_EH_FRAME`, glibc before 2.35, or [`super::prepare`] not called yet),
//! the step follows the frame pointer instead, which is right for code built with frame
//! pointers and stops quickly (by the checks below) for code without.
//!
//! Found rows are kept in a process-wide lock-free cache by address (`cache`): a warm capture
//! of 16 frames costs ≈ 145 ns, ≈ 2,800 instructions (`benches/stacks.rs`), against ≈ 4 µs
//! when every FDE is looked up and evaluated.
//!
//! Bounded and fault-free: at most `out.len()` (≤ [`MAX_FRAMES`]) frames; every stack word is
//! read only inside the thread's stack mapping (`bounds`), aligned; the stack pointer must
//! grow strictly from frame to frame; a step whose rules are not plain (a DWARF expression, as
//! in a signal frame) ends the capture. The unwind tables themselves are read from loaded
//! objects, where `_dl_find_object` says they are.
//!
//! Architectures: x86-64 and aarch64 share this code; [`arch`] holds the registers read at
//! entry, their DWARF numbers and (aarch64) pointer-authentication stripping.
#![allow(unsafe_code)]

mod cache;
mod cfi;

#[cfg_attr(target_arch = "x86_64", path = "x86_64.rs")]
#[cfg_attr(target_arch = "aarch64", path = "aarch64.rs")]
mod arch;

use super::bounds;
pub use cache::clear as forget_unwind_rules;
use cfi::{Lookup, Rule};

/// The most frames one capture records.
pub const MAX_FRAMES: usize = 64;

/// The registers an unwind starts from: the program counter, stack pointer, frame pointer
/// (`rbp`, `x29`) and, on aarch64, the link register (`x30`; unused on x86-64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    /// Program counter: an exact instruction address in the first frame.
    pub pc: usize,
    /// Stack pointer.
    pub sp: usize,
    /// Frame pointer.
    pub fp: usize,
    /// Link register (aarch64).
    pub lr: usize,
}

/// Record the calling thread's return addresses into `out`; returns how many were written.
/// With `skip` 0, `out[0]` is `capture`'s own return address (the call site in the function
/// that called it), `out[1]` that function's return address, and so on; `skip` drops that
/// many frames from the top first. Records at most `out.len()` (and [`MAX_FRAMES`]) frames; never allocates,
/// locks or faults (see the module doc).
#[inline(never)]
pub fn capture(skip: usize, out: &mut [usize]) -> usize {
    let regs = arch::here();
    // `regs` describes this function's own frame: its first step yields the return address
    // into our caller, which is frame 0 of the caller's view plus one (ours).
    walk(regs, true, skip, out)
}

/// Unwind from `regs` (a context captured elsewhere, e.g. a signal handler's, or made up by a
/// test): `out[0]` is the first return address found above `regs`' frame, after `skip`.
/// Garbage registers end the walk at the first check that fails; nothing is read outside the
/// stack mapping holding `regs.sp`.
#[inline(never)]
pub fn capture_from(regs: &Registers, skip: usize, out: &mut [usize]) -> usize {
    walk(*regs, true, skip, out)
}

/// The walk: `exact` says whether `regs.pc` is an instruction address (the first frame) rather
/// than a return address (whose call instruction precedes it).
fn walk(mut regs: Registers, mut exact: bool, mut skip: usize, out: &mut [usize]) -> usize {
    let limit = out.len().min(MAX_FRAMES);
    if limit == 0 {
        return 0;
    }
    let Some(stack) = bounds::stack_of(regs.sp) else {
        return 0;
    };
    let mut ctx = cfi::Context::new();
    let mut n = 0;
    // Every step consumes a frame or ends the walk; `skip` frames are bounded by the same
    // sanity checks (the stack pointer grows strictly inside a finite mapping) and by a cap.
    let mut steps = 0;
    while n < limit && steps < MAX_FRAMES + skip.min(MAX_FRAMES) {
        steps += 1;
        let Some(next) = step(&regs, exact, stack, &mut ctx) else {
            break;
        };
        regs = next;
        exact = false;
        if skip > 0 {
            skip -= 1;
            continue;
        }
        out[n] = regs.pc;
        n += 1;
    }
    n
}

/// One frame up: the caller's registers, or `None` at the end of the stack (or where the
/// rules cannot be followed safely).
fn step(
    regs: &Registers,
    exact: bool,
    stack: (usize, usize),
    ctx: &mut cfi::Context,
) -> Option<Registers> {
    // A return address follows its call: look the call itself up.
    let lookup = if exact {
        regs.pc
    } else {
        regs.pc.checked_sub(1)?
    };
    let next = match rules_for(lookup, ctx) {
        Lookup::Found(rules) => {
            #[cfg(test)]
            STEPS.with(|s| s.set((s.get().0 + 1, s.get().1)));
            apply(regs, &rules, stack)?
        }
        Lookup::NoInfo => {
            #[cfg(test)]
            STEPS.with(|s| s.set((s.get().0, s.get().1 + 1)));
            frame_pointer_step(regs, stack)?
        }
        Lookup::Unsupported => return None,
    };
    // Progress: the stack pointer grows strictly and stays in the mapping; a return address
    // in the first page is the end of a stack (or garbage).
    let pc = arch::strip(next.pc);
    if next.sp <= regs.sp || next.sp > stack.1 || pc < 4096 {
        return None;
    }
    Some(Registers { pc, ..next })
}

/// The CFI row covering `pc`: from the cache, else from the tables (then cached).
fn rules_for(pc: usize, ctx: &mut cfi::Context) -> Lookup {
    if let Some(rules) = cache::get(pc) {
        return Lookup::Found(rules);
    }
    let found = cfi::find(pc, ctx);
    if let Lookup::Found(rules) = &found {
        cache::put(pc, rules);
    }
    found
}

/// Follow CFI rules: the CFA, then the return address and frame pointer saved relative to it.
fn apply(regs: &Registers, rules: &cfi::Rules, stack: (usize, usize)) -> Option<Registers> {
    let base = value_of(regs, rules.cfa_register)?;
    let cfa = base.checked_add_signed(rules.cfa_offset as isize)?;
    let recover = |rule: Rule, current: usize| -> Option<usize> {
        match rule {
            Rule::Same => Some(current),
            Rule::Undefined => None,
            Rule::Offset(o) => read(cfa.checked_add_signed(o as isize)?, stack),
            Rule::ValOffset(o) => cfa.checked_add_signed(o as isize),
            Rule::Register(r) => value_of(regs, r),
        }
    };
    // An undefined return address is the outermost frame.
    let ra = recover(rules.ra, arch::return_address_same_value(regs)?)?;
    // The frame pointer is only needed while some caller's CFA is based on it: an unknown one
    // becomes 0, which no later check accepts.
    let fp = recover(rules.fp, regs.fp).unwrap_or(0);
    let lr = if arch::HAS_LINK_REGISTER { ra } else { 0 };
    Some(Registers {
        pc: ra,
        sp: cfa,
        fp,
        lr,
    })
}

/// The value of a DWARF register this unwinder tracks.
fn value_of(regs: &Registers, r: u16) -> Option<usize> {
    match r {
        arch::SP => Some(regs.sp),
        arch::FP => Some(regs.fp),
        r if arch::HAS_LINK_REGISTER && r == arch::RA => Some(regs.lr),
        _ => None,
    }
}

/// The frame-record walk: `[fp]` is the caller's frame pointer, `[fp + word]` the return
/// address. Only where the frame pointer points into the stack above the stack pointer.
fn frame_pointer_step(regs: &Registers, stack: (usize, usize)) -> Option<Registers> {
    const W: usize = std::mem::size_of::<usize>();
    let fp = regs.fp;
    if fp < regs.sp {
        return None;
    }
    let caller_fp = read(fp, stack)?;
    let ra = read(fp.checked_add(W)?, stack)?;
    // Frame records are chained upwards; 0 ends the chain (then the caller is the last).
    if caller_fp != 0 && caller_fp <= fp {
        return None;
    }
    Some(Registers {
        pc: ra,
        sp: fp + 2 * W,
        fp: caller_fp,
        lr: ra,
    })
}

/// One aligned word of the stack mapping `[lo, hi)`; `None` outside it.
#[inline]
fn read(addr: usize, (lo, hi): (usize, usize)) -> Option<usize> {
    const W: usize = std::mem::size_of::<usize>();
    if addr < lo || addr > hi.checked_sub(W)? || !addr.is_multiple_of(W) {
        return None;
    }
    // SAFETY: an aligned word inside the readable mapping that holds this thread's stack
    // (`bounds`), which stays mapped while the thread runs on it. Volatile: the compiler must
    // not assume anything about memory it does not own.
    Some(unsafe { std::ptr::read_volatile(addr as *const usize) })
}

#[cfg(test)]
pub(super) use cfi::context_size;

#[cfg(test)]
thread_local! {
    /// This thread's steps taken from the unwind tables and by frame pointer.
    pub(super) static STEPS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}
