#!/usr/bin/env bash
# Issue 36's PyTorch target: torch_threads.py (THREADS Python threads, each on its own stream,
# allocating and freeing tensors with the cudaMallocAsync backend) in plain processes and with
# each given libcuhook.so preloaded, alternated, ROUNDS rounds (default 5); allocations per
# second, medians [min-max], and each library's ratio to plain.
# Usage: hook-tests/gpu/torch_threads.sh OUTDIR LIB [LIB...]   (THREADS="1 8", DURATION=3)
set -u
out="$1"; shift; mkdir -p "$out"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
libs=()
for lib in "$@"; do libs+=("$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"); done
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
: >"$out/torch_threads.txt"
# The summary is printed however the script ends (a `timeout` around it leaves the rounds that
# finished summarised).
trap summary EXIT
summary() {
for i in "${!libs[@]}"; do echo "lib$i = ${libs[$i]}"; done
python3 - "$out/torch_threads.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"mode=(\w+) torch_threads threads=(\d+) .*allocs_per_s=(\d+)", line)
    if m:
        rows.setdefault(int(m[2]), {}).setdefault(m[1], []).append(float(m[3]))
print("allocations/s: median [min-max] xratio to plain")
for threads, r in sorted(rows.items()):
    if "plain" not in r:
        continue
    p = statistics.median(r["plain"])
    cells = [f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] x{statistics.median(v) / p:.3f}"
             for k, v in sorted(r.items())]
    print(f"  threads={threads:2}  " + "  ".join(cells))
PY
}
for round in $(seq "${ROUNDS:-5}"); do
    for threads in ${THREADS:-8 1}; do
        echo "mode=plain $(python3 "$here/torch_threads.py" "$threads" "${DURATION:-3}")" >>"$out/torch_threads.txt"
        for i in "${!libs[@]}"; do
            echo "mode=lib$i $(LD_PRELOAD="${libs[$i]}" python3 "$here/torch_threads.py" "$threads" "${DURATION:-3}")" >>"$out/torch_threads.txt"
        done
    done
done
