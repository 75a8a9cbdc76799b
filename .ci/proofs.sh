#!/usr/bin/env bash
# Concurrency proofs (docs/architecture.md, "Concurrency proofs"): the loom models of the
# registry's lock-free lookup and of the event grace periods, then the pure-Rust unit tests of
# registry and events under Miri (CUHOOK_MIRI_TESTS picks the test filters; by default both:
# registry ≈ 2 minutes, events ≈ 1 on 2 cores). A part whose tool is missing prints
# "SKIPPED: ..." and does not fail the run; a part that runs and fails does.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
status=0

# ---- loom: every test named loom_*, on the real code built with --cfg loom (own target dir:
# the flag rebuilds every dependency).
echo "== loom (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2})"
start=$SECONDS
if RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$target/loom" \
    LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" \
    cargo test --release --lib loom_; then
    echo "loom: passed in $((SECONDS - start)) s"
else
    echo "loom: FAILED"
    status=1
fi

# ---- miri: registry and events unit tests. Those Miri cannot run (fork, tgkill, timed stress,
# the random models) are #[cfg_attr(miri, ignore)]; the rest of the crate calls C. Under Miri the
# registry's page table is smaller (a 4,096-slot top, 1,024-slot tables).
echo "== miri"
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED: miri: no nightly toolchain (rustup toolchain install nightly --component miri)"
elif ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "SKIPPED: miri: nightly has no miri component (rustup +nightly component add miri)"
else
    start=$SECONDS
    # The tests leak callback contexts on purpose.
    if CARGO_TARGET_DIR="$target" MIRIFLAGS="${MIRIFLAGS:--Zmiri-ignore-leaks}" \
        cargo +nightly miri test --lib -- ${CUHOOK_MIRI_TESTS:-registry:: events::}; then
        echo "miri: passed in $((SECONDS - start)) s"
    else
        echo "miri: FAILED"
        status=1
    fi
fi
exit $status
