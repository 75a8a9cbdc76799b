#!/usr/bin/env bash
# Where a hooked call's time goes on the real driver: runs bench.cu's stream-ordered pairs (16 and
# 1 threads, driver and runtime API) and torch_threads.py (8 and 1 threads, `cudaMallocAsync`
# backend) under each given timing build of libcuhook.so, REPS times (default 2). A timing build
# prints at exit, per API, the calls and the mean ns before the real call, in it and after it,
# and the registry's exclusive edits (lines starting `cuhook-diag`). Build them on a machine with
# Rust (docs/performance.md, "Where a hooked call's time goes"):
#   RUSTFLAGS='--cfg cuhook_diag="timing"' cargo build --release --lib --target-dir target/diag_timing
#   RUSTFLAGS='--cfg cuhook_diag="timing" --cfg cuhook_diag="no_registry" --cfg cuhook_diag="no_context"' \
#       cargo build --release --lib --target-dir target/diag_pass   # the driver's own time, no hook work
# Usage: hook-tests/gpu/timing.sh LIB [LIB...]   (OUT_DIR=dir keeps the bench binary)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${OUT_DIR:-}"
libs=()
for lib in "$@"; do libs+=("$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"); done
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
for rep in $(seq "${REPS:-2}"); do
    for lib in "${libs[@]}"; do
        for api in drv rt; do
            for threads in 16 1; do
                echo "== $(basename "$lib") pairs $api $threads"
                LD_PRELOAD="$lib" "$out/bench" pairs $api "$threads" 2>&1 | grep -E '^pairs|^cuhook-diag'
            done
        done
        if python3 -c 'import torch' 2>/dev/null; then
            for threads in 8 1; do
                echo "== $(basename "$lib") torch_threads $threads"
                PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD="$lib" \
                    python3 "$here/torch_threads.py" "$threads" 3 2>&1 | grep -E '^torch_threads|^cuhook-diag'
            done
        fi
    done
done
