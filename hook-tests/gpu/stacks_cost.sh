#!/usr/bin/env bash
# Issue 37's cost target on the real driver: stacks on (CUHOOK_STACKS=16) against plain and
# against hooked without stacks, alternated processes, 5 rounds: the stream-ordered pair
# benchmark (bench.cu, runtime and driver API, 1 thread) and a PyTorch training loop with the
# cudaMallocAsync backend (torch_train.py: the loop's seconds and the process's wall time).
# Usage: hook-tests/gpu/stacks_cost.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
: >"$out/cost.txt"
wall() { local t0 t1 r; t0=$(date +%s%N); r=$("$@" 2>/dev/null | tail -1); t1=$(date +%s%N); echo "$r wall_ms=$(( (t1 - t0) / 1000000 ))"; }
for round in 1 2 3 4 5; do
    for mode in plain hooked stacks16; do
        case $mode in
            plain) env=(NO_CUHOOK=1) ;;
            hooked) env=(LD_PRELOAD="$CUHOOK_LIB") ;;
            stacks16) env=(LD_PRELOAD="$CUHOOK_LIB" CUHOOK_STACKS=16) ;;
        esac
        for api in rt drv; do
            echo "mode=$mode $(env "${env[@]}" "$out/bench" pairs $api 1)" >>"$out/cost.txt"
        done
        echo "mode=$mode $(cd "$here" && wall env "${env[@]}" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 torch_train.py 300)" >>"$out/cost.txt"
    done
done
python3 - "$out/cost.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    mode = re.match(r"mode=(\w+)", line)[1]
    for key, pat in (("pairs rt ns", r"api=cudaMalloc\S* threads=1 .*ns_per_pair=([\d.]+)"),
                     ("pairs drv ns", r"api=cuMem\S* threads=1 .*ns_per_pair=([\d.]+)"),
                     ("torch loop s", r"loop_s=([\d.]+)"), ("torch wall ms", r"train .*wall_ms=(\d+)")):
        m = re.search(pat, line)
        if m:
            rows.setdefault(key, {}).setdefault(mode, []).append(float(m[1]))
print("median over 5 alternated rounds [min-max]; ratio to plain")
for key, r in rows.items():
    p = statistics.median(r["plain"])
    cells = []
    for mode in ("plain", "hooked", "stacks16"):
        v = r.get(mode, [0])
        cells.append(f"{mode} {statistics.median(v):.4g} [{min(v):.4g}-{max(v):.4g}] x{statistics.median(v) / p:.3f}")
    print(f"  {key:14} " + "  ".join(cells))
PY
