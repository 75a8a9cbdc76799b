//! Model-based test: random operation sequences against a naive `BTreeMap` reference.
//!
//! Rerun one failing sequence with `REGISTRY_SEED=<seed> cargo test --release registry_model`.

use std::collections::BTreeMap;

use super::{alloc, Rng};
use crate::registry::{Allocation, InsertOutcome, Registry, Removed};

const MAX: usize = usize::MAX;

/// The obviously-correct registry: start -> allocation, every operation a linear scan.
#[derive(Default)]
struct Model {
    map: BTreeMap<usize, Allocation>,
    seq: u64,
    missed: u64,
}

impl Model {
    /// Removes `[lo, hi]`, re-adding the parts outside it; returns (whole, partial, bytes, pieces).
    fn clear(&mut self, lo: usize, hi: usize) -> (usize, usize, usize, Vec<Allocation>) {
        let hit: Vec<Allocation> = self
            .map
            .values()
            .filter(|a| a.start <= hi && a.last() >= lo)
            .copied()
            .collect();
        let (mut whole, mut partial, mut bytes, mut pieces) = (0, 0, 0, Vec::new());
        for a in hit {
            self.map.remove(&a.start);
            if a.start < lo {
                self.map.insert(
                    a.start,
                    Allocation {
                        size: lo - a.start,
                        ..a
                    },
                );
            }
            if a.last() > hi {
                self.map.insert(
                    hi + 1,
                    Allocation {
                        start: hi + 1,
                        size: a.last() - hi,
                        ..a
                    },
                );
            }
            if a.start >= lo && a.last() <= hi {
                whole += 1;
            } else {
                partial += 1;
            }
            let (from, to) = (a.start.max(lo), a.last().min(hi));
            bytes += to - from + 1;
            pieces.push(Allocation {
                start: from,
                size: to - from + 1,
                ..a
            });
        }
        (whole, partial, bytes, pieces)
    }

    fn insert(&mut self, mut a: Allocation) -> InsertOutcome {
        if a.size == 0 {
            return InsertOutcome::default();
        }
        let last = a.start.checked_add(a.size - 1).unwrap_or(MAX);
        a.size = last - a.start + 1;
        self.seq += 1;
        a.seq = self.seq;
        let (whole, partial, _, _) = self.clear(a.start, last);
        self.missed += (whole + partial) as u64;
        self.map.insert(a.start, a);
        InsertOutcome {
            seq: Some(a.seq),
            overwritten: whole + partial,
            size: a.size,
        }
    }

    fn remove(&mut self, start: usize, len: usize) -> (Removed, Vec<Allocation>) {
        if len == 0 {
            return (Removed::default(), Vec::new());
        }
        let last = start.checked_add(len - 1).unwrap_or(MAX);
        let (whole, partial, bytes, pieces) = self.clear(start, last);
        (
            Removed {
                whole,
                partial,
                bytes,
            },
            pieces,
        )
    }

    fn lookup_span(&self, ptr: usize, len: usize) -> Option<Allocation> {
        let last = ptr.checked_add(len.saturating_sub(1))?;
        // The only candidate is the range with the largest start <= ptr (ranges never overlap,
        // which `Registry::check` asserts).
        let (_, a) = self.map.range(..=ptr).next_back()?;
        (last <= a.last()).then_some(*a)
    }

    fn live_bytes(&self) -> usize {
        let total: u128 = self.map.values().map(|a| a.size as u128).sum();
        total.min(MAX as u128) as usize
    }
}

/// Prints the seed when a sequence fails, whatever assertion fired.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "registry model test failed with seed {} (rerun: REGISTRY_SEED={})",
                self.0, self.0
            );
        }
    }
}

/// Where a sequence puts its ranges: a window of `span` bytes at `base`, so the operations
/// overlap each other often.
struct Space {
    base: usize,
    span: usize,
    max_size: usize,
    grow: bool,
}

impl Space {
    fn addr(&self, rng: &mut Rng) -> usize {
        self.base.wrapping_add(rng.below(self.span as u64) as usize)
    }

    fn size(&self, rng: &mut Rng) -> usize {
        // Huge sizes wipe out whole trees; a growing sequence needs them to be rare.
        let roll = if self.grow {
            rng.below(10_000)
        } else {
            rng.below(100)
        };
        match roll {
            0 => 0,
            1 => MAX,
            2 => MAX / 2 + rng.below(1000) as usize,
            3..=10 => 1,
            _ => 1 + rng.below(self.max_size as u64) as usize,
        }
    }
}

/// A pointer worth probing: random, or on/around the boundary of a live range.
fn probe(rng: &mut Rng, model: &Model, space: &Space) -> usize {
    if model.map.is_empty() || rng.chance(40) {
        return match rng.below(10) {
            0 => 0,
            1 => MAX,
            _ => space.addr(rng),
        };
    }
    let nth = rng.below(model.map.len() as u64) as usize;
    let a = model.map.values().nth(nth).expect("nth < len");
    match rng.below(5) {
        0 => a.start,
        1 => a.last(),
        2 => a.start.wrapping_sub(1),
        3 => a.last().wrapping_add(1),
        _ => a.start + (rng.below(a.size as u64)) as usize,
    }
}

/// Runs one sequence; returns the most page tables it used at once and the longest chain of
/// buckets a shared granule needed.
fn run(seed: u64, ops: usize) -> (usize, usize) {
    let (tables, chain, _) = run_with(seed, ops, false);
    (tables, chain)
}

/// After an operation made without new memory: every range the registry still holds is one the
/// model holds, exactly (nothing stale), and each the model holds beyond those was counted
/// untracked. The model then forgets those, and the sequence goes on exact.
fn reconcile(reg: &Registry, model: &mut Model, untracked_before: u64, what: &str) {
    let held: BTreeMap<usize, Allocation> =
        reg.snapshot().into_iter().map(|a| (a.start, a)).collect();
    for a in held.values() {
        assert_eq!(
            model.map.get(&a.start),
            Some(a),
            "{what}: a range the model does not hold"
        );
    }
    let before = model.map.len();
    model.map.retain(|start, _| held.contains_key(start));
    assert_eq!(
        (before - model.map.len()) as u64,
        reg.untracked() - untracked_before,
        "{what}: ranges lost without being counted untracked"
    );
}

/// Runs one sequence; with `starve`, about a third of the operations run as if the host's memory
/// were exhausted (the writer gets no new memory), and are held to [`reconcile`]'s rules. Returns
/// the shape as [`run`] does, and how many ranges went untracked.
fn run_with(seed: u64, ops: usize, starve: bool) -> (usize, usize, u64) {
    let _guard = SeedGuard(seed);
    let mut rng = Rng::new(seed);
    // Long sequences grow a big sparse tree, then shrink it (splits first, merges later).
    let long = ops > 1000;
    let space = match if long { 2 } else { rng.below(4) } {
        // Dense at address 0.
        0 => Space {
            base: 0,
            span: 1 << 10,
            max_size: 64,
            grow: long,
        },
        // Dense against the top of the address space (starts wrap past it into the bottom).
        1 => Space {
            base: MAX - (1 << 10) + 1,
            span: 1 << 11,
            max_size: 64,
            grow: long,
        },
        // Sparse: many small ranges, deep trees.
        2 => Space {
            base: 1 << 40,
            span: 1 << 24,
            max_size: 256,
            grow: long,
        },
        _ => Space {
            base: 1 << 30,
            span: 1 << 14,
            max_size: 1 << 10,
            grow: long,
        },
    };
    let reg = Registry::new();
    let mut model = Model::default();
    let mut shape = (0, 0);
    for op in 0..ops {
        let ctx = |what: &str| format!("seed {seed} op {op}: {what}");
        let kind = match (long, op < ops * 6 / 10) {
            (false, _) => rng.below(100),
            (true, true) if rng.chance(75) => 0,
            (true, false) if rng.chance(85) => 45 + rng.below(35),
            (true, _) if rng.chance(1) => 80,
            (true, _) => rng.below(80),
        };
        let starved = starve && rng.chance(35);
        let untracked = reg.untracked();
        super::super::slab::STARVED.set(starved);
        match kind {
            0..=44 => {
                let a = alloc(space.addr(&mut rng), space.size(&mut rng), rng.next());
                let (got, want) = (reg.insert(a), model.insert(a));
                if starved && got.seq.is_none() {
                    assert_eq!(
                        got.overwritten,
                        want.overwritten,
                        "{}",
                        ctx("insert, starved")
                    );
                } else {
                    assert_eq!(got, want, "{}", ctx("insert"));
                }
            }
            45..=59 => {
                let (start, len) = (probe(&mut rng, &model, &space), space.size(&mut rng));
                let mut pieces = Vec::new();
                let got = reg.remove_with(start, len, |a| pieces.push(a));
                let (want, want_pieces) = model.remove(start, len);
                assert_eq!(got, want, "{}", ctx("remove"));
                assert_eq!(pieces, want_pieces, "{}", ctx("remove pieces"));
            }
            60..=79 => {
                let start = probe(&mut rng, &model, &space);
                let want = model.map.remove(&start);
                assert_eq!(
                    reg.remove_allocation(start),
                    want,
                    "{}",
                    ctx("remove_allocation")
                );
            }
            80..=81 => {
                let m = rng.below(5) as i32 - 1;
                let mut got = Vec::new();
                let n = reg.purge(|a| a.device == m, |a| got.push(a));
                let want: Vec<Allocation> = model
                    .map
                    .values()
                    .filter(|a| a.device == m)
                    .copied()
                    .collect();
                model.map.retain(|_, a| a.device != m);
                assert_eq!((n, got), (want.len(), want), "{}", ctx("purge"));
            }
            _ => {}
        }
        super::super::slab::STARVED.set(false);
        if starved {
            reconcile(&reg, &mut model, untracked, &ctx("starved"));
        }
        for _ in 0..4 {
            let p = probe(&mut rng, &model, &space);
            assert_eq!(reg.lookup(p), model.lookup_span(p, 0), "{}", ctx("lookup"));
            let len = match rng.below(4) {
                0 => 0,
                1 => MAX,
                _ => rng.below(space.max_size as u64 * 2) as usize,
            };
            assert_eq!(
                reg.lookup_span(p, len),
                model.lookup_span(p, len),
                "{}",
                ctx("lookup_span")
            );
        }
        assert_eq!(reg.len(), model.map.len(), "{}", ctx("len"));
        assert_eq!(reg.is_empty(), model.map.is_empty(), "{}", ctx("is_empty"));
        assert_eq!(reg.missed_frees(), model.missed, "{}", ctx("missed"));
        assert_eq!(
            reg.live_bytes(),
            model.live_bytes(),
            "{}",
            ctx("live bytes")
        );
        if op % 64 == 63 {
            reg.check();
            let (tables, chain) = reg.shape();
            shape = (shape.0.max(tables), shape.1.max(chain));
        }
    }
    reg.check();
    let want: Vec<Allocation> = model.map.values().copied().collect();
    assert_eq!(reg.snapshot(), want, "seed {seed}: final snapshot");
    (shape.0, shape.1, reg.untracked())
}

fn seed_from_env() -> Option<u64> {
    std::env::var("REGISTRY_SEED").ok()?.parse().ok()
}

#[test]
#[cfg_attr(
    miri,
    ignore = "too slow interpreted: 4 sequences of 30 operations take 3 minutes"
)]
fn registry_model_short_sequences() {
    if let Some(seed) = seed_from_env() {
        run(seed, 3000);
        return;
    }
    let mut longest = 0;
    for seed in 0..3000 {
        longest = longest.max(run(seed, 200).1);
    }
    // Dense sequences must have shared granules among more ranges than one bucket holds.
    assert!(longest >= 2, "longest bucket chain: {longest}");
}

#[test]
#[cfg_attr(miri, ignore = "64,000 operations: too slow interpreted")]
fn registry_model_long_sequences() {
    if seed_from_env().is_some() {
        return;
    }
    let (mut tables, mut chain) = (0, 0);
    for seed in 1_000_000..1_000_004 {
        let (t, c) = run(seed, 16_000);
        tables = tables.max(t);
        chain = chain.max(c);
    }
    // The sequences must have spread over many leaf tables and shared granules, or they prove
    // little.
    assert!(
        tables >= 8 && chain >= 1,
        "only {tables} tables, chains of {chain}"
    );
}

/// The registry under exhausted memory: inserts go untracked, trims drop whole ranges, frees of
/// ranges in shared granules are made in place; nothing stale is ever found, nothing lost goes
/// uncounted, and once memory returns the sequence is exact again.
#[test]
#[cfg_attr(miri, ignore = "thousands of operations: too slow interpreted")]
fn registry_model_without_memory() {
    use super::super::slab::IN_PLACE;
    let seeds = match seed_from_env() {
        Some(seed) => seed..seed + 1,
        None => 2_000_000..2_000_600,
    };
    let (mut untracked, mut in_place) = (0, 0);
    for seed in seeds {
        IN_PLACE.set(0);
        untracked += run_with(seed, 300, true).2;
        in_place += IN_PLACE.get();
    }
    // Both degraded paths must have run, or the sequences prove little.
    assert!(
        untracked > 0 && in_place > 0,
        "untracked: {untracked}, removals in place: {in_place}"
    );
}
