#!/usr/bin/env bash
# Issue 36 on the real driver: the stream-ordered pairs of bench.cu (1 and 16 threads, each on
# its own stream) in plain processes and under each given libcuhook.so, alternated process by
# process, ROUNDS rounds (default 5); medians [min-max] and ratios to plain. Give it builds to
# compare: the library before and after a change, or measurement builds made with
# --cfg cuhook_diag="no_context" (no context query per allocation) or "no_registry" (no
# registry write). Each column is named after its file.
# Usage: hook-tests/gpu/threads.sh LIB [LIB...]   (OUT_DIR=dir for the raw lines)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${OUT_DIR:-}"
libs=()
for lib in "$@"; do libs+=("$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"); done
nvcc -O2 -arch=native "${inc[@]}" -o "$out/bench" "$here/bench.cu" -lcuda -ldl -lpthread || exit 1
: >"$out/threads.txt"
# The summary is printed however the script ends: a `timeout` around it (a device call's
# limit) still leaves the rounds that finished summarised.
trap summary EXIT
summary() {
python3 - "$out/threads.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"mode=(\S+) pairs api=(\S+) threads=(\d+) .*ns_per_pair=([\d.]+)", line)
    if m:
        rows.setdefault((m[2], int(m[3])), {}).setdefault(m[1], []).append(float(m[4]))
print("ns per pair per thread: median [min-max] xratio to plain")
for (api, threads), r in sorted(rows.items()):
    if "plain" not in r:
        continue
    p = statistics.median(r["plain"])
    cells = [f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] x{statistics.median(v) / p:.2f}"
             for k, v in r.items()]
    print(f"  {api:32} t={threads:2}  " + "  ".join(cells))
PY
}
for round in $(seq "${ROUNDS:-5}"); do
    for threads in 16 1; do
        for api in drv rt; do
            echo "mode=plain $(NO_CUHOOK=1 "$out/bench" pairs $api "$threads")" >>"$out/threads.txt"
            for lib in "${libs[@]}"; do
                echo "mode=$(basename "$lib" .so) $(LD_PRELOAD="$lib" "$out/bench" pairs $api "$threads")" >>"$out/threads.txt"
            done
        done
    done
done
