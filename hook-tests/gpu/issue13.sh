#!/usr/bin/env bash
# Issue 13 on the real GPU: module/library globals (globals.cu), late-install frees sized before
# the real free (late_free.cu), imported memory across two processes (ipc.cu), and CUDA graphs
# checked against the driver (graph.cu) and under PyTorch's cudaMallocAsync backend (graph_check.py).
# Usage: hook-tests/gpu/issue13.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "$0")/common.sh"
status=0
# Each build: its name, the source, extra nvcc options. The globals check also runs with
# zstd-compressed cubins (the reader decodes them) and with the shared runtime.
for build in globals globals_zstd:globals:--compress-mode=size "globals_shared:globals:-cudart shared" \
        late_free ipc graph graph_nodes; do
    IFS=: read -r prog src opts <<< "$build"
    echo "### $prog"
    # shellcheck disable=SC2086 # the options are words
    if ! nvcc -O2 -arch=native $opts "${inc[@]}" -o "$out/$prog" "$here/${src:-$prog}.cu" -lcuda -ldl -lpthread; then
        echo "check build_$prog FAIL"; status=1; continue
    fi
    # The programs install cuhook themselves (CUHOOK_DISABLE keeps the constructor out of it).
    CUHOOK_DISABLE=1 "$out/$prog" || status=1
done
echo "### graph_check.py (PyTorch, cudaMallocAsync backend)"
(cd "$here" && PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync CUHOOK_REPORT="$out/report_graph.txt" \
    LD_PRELOAD="$CUHOOK_LIB" python3 graph_check.py) || status=1
echo "### issue13 exit $status"
exit $status
