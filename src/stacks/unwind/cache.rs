//! A process-wide cache of reduced CFI rows by address: a capture in a hook revisits the same
//! few hundred return addresses over and over, and finding and evaluating an FDE costs about
//! 250 ns a frame where a hit costs a few.
//!
//! Direct-mapped, [`ENTRIES`] entries of two words, no lock: an entry is `(pc ^ packed,
//! packed)`, written with two relaxed stores; a reader accepts it only when the XOR of the two
//! words it loaded gives its own pc, so a torn pair (two writers, or a writer and a reader) is
//! nearly always a miss. A rare accepted torn pair, or an entry left by an object unloaded since
//! (its address reused by another), yields wrong rules for one frame: the walk's checks still
//! bound every read to the stack mapping, so the cost is a wrong frame, never a fault.
//! [`clear`] empties it (for the `dlclose` interposer to call when it is wired in).

use std::sync::atomic::{AtomicU64, Ordering};

use super::arch;
use super::cfi::{Rule, Rules};

/// Entries (a power of two): 64 KiB of zeroed `.bss`.
const ENTRIES: usize = 4096;

struct Entry {
    check: AtomicU64,
    packed: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    check: AtomicU64::new(0),
    packed: AtomicU64::new(0),
};

static CACHE: [Entry; ENTRIES] = [EMPTY; ENTRIES];

fn slot(pc: usize) -> &'static Entry {
    let h = (pc as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - ENTRIES.trailing_zeros());
    &CACHE[h as usize]
}

/// The cached rules for `pc`, if any.
#[inline]
pub(super) fn get(pc: usize) -> Option<Rules> {
    let e = slot(pc);
    let packed = e.packed.load(Ordering::Relaxed);
    let check = e.check.load(Ordering::Relaxed);
    if packed == 0 || check ^ packed != pc as u64 {
        return None;
    }
    unpack(packed)
}

/// Remember `rules` for `pc` (when they fit the packed form).
#[inline]
pub(super) fn put(pc: usize, rules: &Rules) {
    if let Some(packed) = pack(rules) {
        let e = slot(pc);
        e.packed.store(packed, Ordering::Relaxed);
        e.check.store(pc as u64 ^ packed, Ordering::Relaxed);
    }
}

/// Forget every entry (objects were unloaded).
pub fn clear() {
    for e in CACHE.iter() {
        e.packed.store(0, Ordering::Relaxed);
        e.check.store(0, Ordering::Relaxed);
    }
}

// Layout of a packed row (never 0: bit 63 is always set):
// bit 63 valid | bit 62 CFA register is FP (else SP) | bits 30..62 CFA offset (i32)
// | bits 15..30 return address rule | bits 0..15 frame pointer rule.
// A rule: 3 bits of kind, 12 bits of signed value (offset, or register number).
const VALID: u64 = 1 << 63;
const CFA_FP: u64 = 1 << 62;

fn pack(r: &Rules) -> Option<u64> {
    let reg = match r.cfa_register {
        arch::SP => 0,
        arch::FP => CFA_FP,
        _ => return None,
    };
    let off = i32::try_from(r.cfa_offset).ok()? as u32 as u64;
    Some(VALID | reg | off << 30 | pack_rule(r.ra)? << 15 | pack_rule(r.fp)?)
}

fn pack_rule(rule: Rule) -> Option<u64> {
    let (kind, value): (u64, i64) = match rule {
        Rule::Same => (0, 0),
        Rule::Undefined => (1, 0),
        Rule::Offset(o) => (2, o),
        Rule::ValOffset(o) => (3, o),
        Rule::Register(r) => (4, r as i64),
    };
    if !(-2048..2048).contains(&value) {
        return None;
    }
    Some(kind << 12 | (value as u64 & 0xfff))
}

fn unpack(p: u64) -> Option<Rules> {
    let cfa_register = if p & CFA_FP != 0 { arch::FP } else { arch::SP };
    let cfa_offset = ((p >> 30) as u32) as i32 as i64;
    Some(Rules {
        cfa_register,
        cfa_offset,
        ra: unpack_rule((p >> 15) & 0x7fff)?,
        fp: unpack_rule(p & 0x7fff)?,
    })
}

fn unpack_rule(bits: u64) -> Option<Rule> {
    // Sign-extend the 12-bit value.
    let value = ((bits & 0xfff) as i64) << 52 >> 52;
    Some(match bits >> 12 {
        0 => Rule::Same,
        1 => Rule::Undefined,
        2 => Rule::Offset(value),
        3 => Rule::ValOffset(value),
        4 => Rule::Register(value as u16),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_the_packed_form() {
        for rules in [
            Rules {
                cfa_register: arch::SP,
                cfa_offset: 8,
                ra: Rule::Offset(-8),
                fp: Rule::Same,
            },
            Rules {
                cfa_register: arch::FP,
                cfa_offset: -16,
                ra: Rule::Register(arch::RA),
                fp: Rule::Offset(-2048),
            },
            Rules {
                cfa_register: arch::SP,
                cfa_offset: i32::MAX as i64,
                ra: Rule::Undefined,
                fp: Rule::ValOffset(2047),
            },
        ] {
            let p = pack(&rules).unwrap();
            assert_eq!(unpack(p), Some(rules));
        }
        let too_far = Rules {
            cfa_register: arch::SP,
            cfa_offset: 8,
            ra: Rule::Offset(4096),
            fp: Rule::Same,
        };
        assert_eq!(pack(&too_far), None);
        put(0x1234_5678, &too_far);
        assert_eq!(get(0x1234_5678), None);
    }
}
