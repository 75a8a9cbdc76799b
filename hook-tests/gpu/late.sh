#!/usr/bin/env bash
# Late install + classification (and device ordinals on every visible GPU).
# Usage: hook-tests/gpu/late.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "$0")/common.sh"
nvcc -O2 -arch=native "${inc[@]}" -o "$out/late" "$here/late.cu" -lcuda -ldl -lpthread || exit 1
CUHOOK_DISABLE=1 "$out/late"
