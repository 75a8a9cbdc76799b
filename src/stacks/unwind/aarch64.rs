//! aarch64: `pc`, `sp`, `x29`, `x30` at entry; DWARF registers 29 (`x29`, frame pointer),
//! 30 (`x30`, link register and return address column), 31 (`sp`). Return addresses signed
//! with pointer authentication (`-mbranch-protection=pac-ret`) are stripped with `xpaclri`,
//! a hint that is a no-op on cores without it.
//!
//! The stacks tests pass cross-built under qemu-user (`cargo test --release --target
//! aarch64-unknown-linux-gnu --lib stacks`); not yet run or measured on aarch64 hardware.

/// DWARF number of the stack pointer.
pub(super) const SP: u16 = 31;
/// DWARF number of the frame pointer (`x29`).
pub(super) const FP: u16 = 29;
/// The return address column (`x30`).
pub(super) const RA: u16 = 30;
/// The return address of a leaf frame is still in `x30`.
pub(super) const HAS_LINK_REGISTER: bool = true;
/// Register rules one CFI row may hold: `x19`–`x30`, `d8`–`d15`, the return-address signing
/// state, with room to spare.
pub(super) const RULES: usize = 28;

/// This point's registers: `pc` (this instruction), `sp`, `x29`, `x30`.
#[inline(always)]
pub(super) fn here() -> super::Registers {
    let (pc, sp, fp, lr): (usize, usize, usize, usize);
    // SAFETY: reads four registers into outputs; touches no memory and no flags.
    unsafe {
        std::arch::asm!(
            "adr {pc}, .",
            "mov {sp}, sp",
            "mov {fp}, x29",
            "mov {lr}, x30",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            lr = out(reg) lr,
            options(nomem, nostack, preserves_flags)
        );
    }
    super::Registers { pc, sp, fp, lr }
}

/// "Same value" for the return address column: the link register as it is.
#[inline(always)]
pub(super) fn return_address_same_value(regs: &super::Registers) -> Option<usize> {
    Some(regs.lr)
}

/// The return address without its pointer-authentication code (`xpaclri`, `hint #7`).
#[inline(always)]
pub(super) fn strip(ra: usize) -> usize {
    let mut v = ra;
    // SAFETY: `xpaclri` only rewrites x30, which is declared clobbered; no memory is touched.
    unsafe {
        std::arch::asm!(
            "mov x30, {v}",
            "hint #7",
            "mov {v}, x30",
            v = inout(reg) v,
            out("x30") _,
            options(nomem, nostack, preserves_flags)
        );
    }
    v
}
