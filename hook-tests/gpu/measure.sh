#!/usr/bin/env bash
# Measurements on the GPU machine (docs/performance.md): C API lookups vs cuPointerGetAttributes
# (1 and 16 threads), hooked vs plain 4 KiB stream-ordered pairs (runtime and driver API, 1 thread
# and 16 threads each on its own stream), install time in PyTorch.
# Plain (NO_CUHOOK=1) and hooked (LD_PRELOAD=libcuhook.so, default configuration) processes
# alternate, 7 rounds; each process reports the best of 20 blocks per thread; the summary gives
# medians over rounds, the spread, and hooked/plain.
# Usage: hook-tests/gpu/measure.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
LD_PRELOAD="$CUHOOK_LIB" "$out/bench" lookup | tee "$out/lookup.txt"
# One process, one pinned thread, hooks toggled between blocks (the least noisy comparison).
for i in 1 2 3; do taskset -c 3 "$out/bench" toggle 41; done | tee "$out/toggle.txt"
: >"$out/pairs.txt"
for round in 1 2 3 4 5 6 7; do
    for api in rt drv; do
        for threads in 1 16; do
            NO_CUHOOK=1 "$out/bench" pairs $api $threads >>"$out/pairs.txt"
            LD_PRELOAD="$CUHOOK_LIB" "$out/bench" pairs $api $threads >>"$out/pairs.txt"
        done
    done
done
python3 - "$out/pairs.txt" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"pairs api=(\S+) threads=(\d+) mode=(\w+) ns_per_pair=([\d.]+)", line)
    if m:
        runs.setdefault((m[1], int(m[2])), {}).setdefault(m[3], []).append(float(m[4]))
print("pairs (ns per pair, per thread; median over rounds [min-max])")
for (api, threads), r in sorted(runs.items()):
    p, h = r.get("plain", [0]), r.get("hooked", [0])
    mp, mh = statistics.median(p), statistics.median(h)
    print(f"  {api:32} threads={threads:2}  plain {mp:7.1f} [{min(p):.1f}-{max(p):.1f}]"
          f"  hooked {mh:7.1f} [{min(h):.1f}-{max(h):.1f}]  +{mh - mp:.1f} ns  x{mh / mp:.3f}")
PY
cd "$here" && CUHOOK_DISABLE=1 python3 torch_install_time.py
