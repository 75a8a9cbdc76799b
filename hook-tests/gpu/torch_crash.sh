#!/usr/bin/env bash
# Which of several libcuhook.so builds crash PyTorch, and where: torch_check.py (native
# allocator, then the cudaMallocAsync backend) preloaded with each library after segv_shim.c,
# which prints the faulting instruction and the return addresses above it as object+offset
# (there is no gdb on the GPU machine). Resolve offsets in libcuhook.so with `addr2line -fie`
# on the unstripped library of the same build. Extra environment for every run: ENV="A=1 B=2".
# Usage: hook-tests/gpu/torch_crash.sh OUTDIR LIB [LIB...]   (RUN_TIMEOUT=s per run, default 90)
set -u
out="$1"; shift; mkdir -p "$out"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/segv.sh"
shim=$(segv_shim "$out") || exit 1
status=0
for lib in "$@"; do
    lib="$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
    for conf in native cudaMallocAsync; do
        log="$out/$(basename "$lib" .so)-$conf.txt"
        vars=(${ENV:-} CUHOOK_LIB="$lib" LD_PRELOAD="$shim $lib")
        [ "$conf" = native ] || vars+=(PYTORCH_CUDA_ALLOC_CONF=backend:$conf)
        (cd "$here" && env "${vars[@]}" timeout "${RUN_TIMEOUT:-90}" python3 torch_check.py) >"$log" 2>&1
        rc=$?
        echo "$(basename "$lib") $conf: exit $rc, $(grep -m1 '^check' "$log" || echo 'no check line')"
        [ $rc -eq 0 ] || status=1
        segv_frame "$log"
    done
done
exit $status
