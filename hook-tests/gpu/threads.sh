#!/usr/bin/env bash
# Issue 36 on the real driver: where the many-thread overhead of the stream-ordered pair comes
# from. bench.cu's pairs (1 and 16 threads, each on its own stream) plain and under three
# builds of libcuhook.so: the normal one, one built with --cfg cuhook_diag="no_context" (no
# context query per allocation) and one with --cfg cuhook_diag="no_registry" (no registry
# write). Processes alternate, ROUNDS rounds (default 3); medians [min-max] and ratios to plain.
# Usage: hook-tests/gpu/threads.sh LIB LIB_NO_CONTEXT LIB_NO_REGISTRY [OUTDIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${4:-}"
no_context="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
no_registry="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
: >"$out/threads.txt"
for round in $(seq "${ROUNDS:-3}"); do
    for threads in 16 1; do
        for api in drv rt; do
            for mode in plain full no_context no_registry; do
                case $mode in
                    plain) env=(NO_CUHOOK=1) ;;
                    full) env=(LD_PRELOAD="$CUHOOK_LIB") ;;
                    no_context) env=(LD_PRELOAD="$no_context") ;;
                    no_registry) env=(LD_PRELOAD="$no_registry") ;;
                esac
                echo "mode=$mode $(env "${env[@]}" "$out/bench" pairs $api "$threads")" >>"$out/threads.txt"
            done
        done
    done
done
python3 - "$out/threads.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"mode=(\w+) pairs api=(\S+) threads=(\d+) .*ns_per_pair=([\d.]+)", line)
    if m:
        rows.setdefault((m[2], int(m[3])), {}).setdefault(m[1], []).append(float(m[4]))
print("ns per pair per thread: median [min-max] xratio to plain")
for (api, threads), r in sorted(rows.items()):
    p = statistics.median(r["plain"])
    cells = [f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] x{statistics.median(v) / p:.2f}"
             for k, v in r.items()]
    print(f"  {api:32} t={threads:2}  " + "  ".join(cells))
PY
