#!/bin/sh
# Instructions cuhook adds per cuMemAllocAsync + cuMemFreeAsync pair, counted with callgrind:
# a tiny driver (benches/callgrind/mini_libcuda.c) and a loop of pairs (pairs.c), run plain and
# with target/release/libcuhook.so preloaded (default configuration: registry attached), at
# each number of other live ranges. Each figure is the slope between two loop lengths, so
# start-up, install and the live ranges' own inserts cancel.
#
#   benches/callgrind.sh [LIVE...]        (default: 1000 1000000); then the instructions of one
# cuhook_lookup (lookups.c) at each LIVE.
# Environment: LOOPS_A, LOOPS_B (default 20000, 40000), CC (default cc), LIB (the library to
# preload, default target/release/libcuhook.so), BASELINE (another libcuhook.so, e.g. built from
# an older commit: adds its column, counted in the same run).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/callgrind"
mkdir -p "$out"
cc=${CC:-cc}
a=${LOOPS_A:-20000}
b=${LOOPS_B:-40000}
[ $# -gt 0 ] || set -- 1000 1000000
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
[ -f "$root/target/release/libcuhook.so" ] || (cd "$root" && cargo build --release --lib)
"$cc" -O2 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$root/benches/callgrind/mini_libcuda.c"
"$cc" -O2 -o "$out/pairs" "$root/benches/callgrind/pairs.c" -L"$out" -l:libcuda.so.1 -Wl,-rpath,"$out"
"$cc" -O2 -o "$out/lookups" "$root/benches/callgrind/lookups.c" -L"$out" -l:libcuda.so.1 -Wl,-rpath,"$out" -ldl

# Total instructions of one run (all threads).
count() { # preload live loops [program]
    f="$out/cg.$$.out"
    prog="$out/${4:-pairs}"
    if [ -n "$1" ]; then
        LD_PRELOAD="$1" valgrind --tool=callgrind --callgrind-out-file="$f" "$prog" "$2" "$3" >/dev/null 2>"$out/cg.log"
    else
        valgrind --tool=callgrind --callgrind-out-file="$f" "$prog" "$2" "$3" >/dev/null 2>"$out/cg.log"
    fi
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$f"
    rm -f "$f"
}
slope() { # preload live
    x=$(count "$1" "$2" "$a")
    y=$(count "$1" "$2" "$b")
    echo $(( (y - x) / (b - a) ))
}
lib=${LIB:-$root/target/release/libcuhook.so}
# The constructor installs only from a file named libcuhook*.so (src/init/mod.rs): preload other
# names through a copy, or they would count as plain.
as_libcuhook() { # path
    case "$(basename "$1")" in
    libcuhook*.so*) echo "$1" ;;
    *) d="$out/as_libcuhook.$(echo "$1" | cksum | cut -d' ' -f1)"; mkdir -p "$d"; cp "$1" "$d/libcuhook.so"; echo "$d/libcuhook.so" ;;
    esac
}
lib=$(as_libcuhook "$lib")
[ -z "${BASELINE:-}" ] || BASELINE=$(as_libcuhook "$BASELINE")
echo "instructions per cuMemAllocAsync+cuMemFreeAsync pair (slope between $a and $b pairs)"
if [ -n "${BASELINE:-}" ]; then
    printf '%-10s %10s %10s %10s %12s %14s\n' "live" "plain" "preloaded" "added" "baseline" "baseline added"
else
    printf '%-10s %10s %10s %10s\n' "live" "plain" "preloaded" "added"
fi
for live in "$@"; do
    p=$(slope "" "$live")
    h=$(slope "$lib" "$live")
    if [ -n "${BASELINE:-}" ]; then
        o=$(slope "$BASELINE" "$live")
        printf '%-10s %10s %10s %10s %12s %14s\n' "$live" "$p" "$h" $((h - p)) "$o" $((o - p))
    else
        printf '%-10s %10s %10s %10s\n' "$live" "$p" "$h" $((h - p))
    fi
done

# The C API lookup: rounds of 256 cuhook_lookup calls, each a pointer inside one of the LIVE
# ranges (slope between 100 and 200 rounds, per call; the loop's own instructions included).
lookups() { # preload live
    x=$(count "$1" "$2" 100 lookups)
    y=$(count "$1" "$2" 200 lookups)
    echo $(( (y - x) / 25600 ))
}
echo "instructions per cuhook_lookup (C API) of a pointer in a live range"
for live in "$@"; do
    if [ -n "${BASELINE:-}" ]; then
        printf '%-10s %10s %12s\n' "$live" "$(lookups "$lib" "$live")" "$(lookups "$BASELINE" "$live")"
    else
        printf '%-10s %10s\n' "$live" "$(lookups "$lib" "$live")"
    fi
done
