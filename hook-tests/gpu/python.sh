#!/usr/bin/env bash
# PyTorch and CuPy with libcuhook.so preloaded (auto-install from its constructor); CuPy streams
# made and destroyed again and again (stream_check.py).
# Usage: hook-tests/gpu/python.sh LIBCUHOOK_SO [OUTDIR]
set -u
here="$(cd "$(dirname "$1")" && pwd)"
export CUHOOK_LIB="$here/$(basename "$1")"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
cd "$(dirname "$0")"
status=0
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync CUHOOK_REPORT="$out/report_torch_async.txt" LD_PRELOAD="$CUHOOK_LIB" python3 torch_check.py || status=1
CUHOOK_REPORT="$out/report_torch_native.txt" LD_PRELOAD="$CUHOOK_LIB" python3 torch_check.py || status=1
CUHOOK_REPORT="$out/report_cupy.txt" LD_PRELOAD="$CUHOOK_LIB" python3 cupy_check.py || status=1
LD_PRELOAD="$CUHOOK_LIB" python3 stream_check.py || status=1
exit $status
