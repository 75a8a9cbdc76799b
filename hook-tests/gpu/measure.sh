#!/usr/bin/env bash
# Measurements on the GPU machine (docs/performance.md): lookup vs cuPointerGetAttributes,
# hooked vs plain cudaMallocAsync/cudaFreeAsync pairs, install time in PyTorch.
# Usage: hook-tests/gpu/measure.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "$0")/common.sh"
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
CUHOOK_DISABLE=1 "$out/bench" lookup
for round in 1 2 3 4 5; do
    NO_CUHOOK=1 "$out/bench" pairs
    CUHOOK_DISABLE=1 "$out/bench" pairs
done
cd "$here" && CUHOOK_DISABLE=1 python3 torch_install_time.py
