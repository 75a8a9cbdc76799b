#!/bin/sh
# Instructions of the registry's own edits, counted with callgrind (deterministic, so it can be
# re-checked on any machine; `cargo bench --bench writers -- sizes` times the same edits): one
# insert + exact-start removal on one thread with 1,000 other ranges live, per range size, and
# per allocation of `torch_threads.py`'s sizes packed at 512-byte steps (as PyTorch's
# `cudaMallocAsync` pool packs them) and at 4 KiB steps. Each figure is a slope between two
# round counts, so start-up and the live ranges' inserts cancel.
#
#   benches/callgrind_edits.sh
# Environment: WRITERS_BIN (the writers bench binary to count; default: built here), BASELINE
# (another writers bench binary, e.g. built from an older commit: adds its column, counted in the
# same run).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
if [ -z "${WRITERS_BIN:-}" ]; then
    (cd "$root" && cargo bench --no-run --bench writers >/dev/null 2>&1)
    WRITERS_BIN=$(ls -t "$root"/target/release/deps/writers-* | grep -v '\.d$' | head -1)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

count() { # bin size rounds step
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$1" replay "$2" "$3" "$4" >/dev/null 2>"$out/log"
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/cg"
}
slope() { # bin size step
    per=1
    [ "$2" = 0 ] && per=8
    a=$(count "$1" "$2" 1000 "$3")
    b=$(count "$1" "$2" 2000 "$3")
    echo $(((b - a) / 1000 / per))
}
printf '%-34s %10s' "instructions per insert+removal" "this"
[ -n "${BASELINE:-}" ] && printf ' %10s' "baseline"
echo
for case in "4096 0" "16384 0" "65536 0" "262144 0" "1048576 0" "16384 512" "0 512" "0 4096"; do
    set -- $case
    if [ "$1" = 0 ]; then
        what="torch sizes at $2-byte steps, each"
    else
        what="$1 B at a block's start + $2"
    fi
    printf '%-34s %10s' "$what" "$(slope "$WRITERS_BIN" "$1" "$2")"
    [ -n "${BASELINE:-}" ] && printf ' %10s' "$(slope "$BASELINE" "$1" "$2")"
    echo
done
