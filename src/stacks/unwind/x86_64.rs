//! x86-64: `rip`, `rsp`, `rbp` at entry; DWARF registers 6 (`rbp`), 7 (`rsp`), 16 (the
//! return address column, always saved at CFA − 8 by the call).

/// DWARF number of the stack pointer (`rsp`).
pub(super) const SP: u16 = 7;
/// DWARF number of the frame pointer (`rbp`).
pub(super) const FP: u16 = 6;
/// The return address column.
pub(super) const RA: u16 = 16;
/// No link register: the return address is always on the stack.
pub(super) const HAS_LINK_REGISTER: bool = false;
/// Register rules one CFI row may hold (the callee-saved set and the return address, with
/// room to spare): a row with more ends the capture.
pub(super) const RULES: usize = 20;

/// This point's registers: the address of the instruction after the `lea`, and the current
/// stack and frame pointers. Inlined into the caller, whose frame the CFI at that address
/// describes.
#[inline(always)]
pub(super) fn here() -> super::Registers {
    let (pc, sp, fp): (usize, usize, usize);
    // SAFETY: reads three registers into outputs; touches no memory and no flags.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags)
        );
    }
    super::Registers { pc, sp, fp, lr: 0 }
}

/// The return address column has no "same value" on x86-64 (it is not a register).
#[inline(always)]
pub(super) fn return_address_same_value(_regs: &super::Registers) -> Option<usize> {
    Some(0)
}

/// Return addresses carry no signature on x86-64.
#[inline(always)]
pub(super) fn strip(ra: usize) -> usize {
    ra
}
