#!/usr/bin/env bash
# Measurements on the GPU machine (docs/performance.md): lookup vs cuPointerGetAttributes,
# hooked vs plain cudaMallocAsync/cudaFreeAsync pairs, install time in PyTorch.
# Usage: hook-tests/gpu/measure.sh LIBCUHOOK_SO [OUTDIR]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CUHOOK_LIB="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
nvcc -O2 -arch=native -I "$root/include" -I "$root/fixtures/engine" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
CUHOOK_DISABLE=1 "$out/bench" lookup
for round in 1 2 3 4 5; do
    NO_CUHOOK=1 "$out/bench" pairs
    CUHOOK_DISABLE=1 "$out/bench" pairs
done
cd "$here" && CUHOOK_DISABLE=1 python3 torch_install_time.py
