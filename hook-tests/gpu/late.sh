#!/usr/bin/env bash
# Late install + classification (and device ordinals on every visible GPU).
# Usage: hook-tests/gpu/late.sh LIBCUHOOK_SO [OUTDIR]
set -u
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CUHOOK_LIB="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
nvcc -O2 -arch=native -I "$root/include" -I "$root/fixtures/engine" -o "$out/late" "$here/late.cu" -lcuda -ldl -lpthread || exit 1
CUHOOK_DISABLE=1 "$out/late"
