#!/bin/sh
# Cache lines one cuMemAllocAsync + cuMemFreeAsync pair touches, plain and with
# target/release/libcuhook.so preloaded (valgrind's lackey traces every access between two
# marker stores; benches/callgrind/footprint.c and footprint.py). Deterministic like the
# instruction count of callgrind.sh, except for the stack: its alignment follows the size of the
# environment, so the data lines on it may differ by one between two shells. A hook that runs
# after the driver has evicted it from the first-level caches pays roughly one miss per line
# listed here, which instructions alone do not show.
#
#   benches/footprint.sh [LIVE]        (default 1000 other live ranges)
# Environment: CC (default cc), LIB (the library to preload).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/target/callgrind"
mkdir -p "$out"
cc=${CC:-cc}
live=${1:-1000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
[ -f "$root/target/release/libcuhook.so" ] || (cd "$root" && cargo build --release --lib)
"$cc" -O2 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$root/benches/callgrind/mini_libcuda.c"
"$cc" -O2 -no-pie -o "$out/footprint" "$root/benches/callgrind/footprint.c" -L"$out" -l:libcuda.so.1 -Wl,-rpath,"$out"
lib=$(readlink -f "${LIB:-$root/target/release/libcuhook.so}")
case "$(basename "$lib")" in libcuhook*.so*) ;; *) echo "LIB must be named libcuhook*.so (the constructor installs only from such a file)" >&2; exit 1 ;; esac
begin=$(nm "$out/footprint" | awk '/ footprint_begin$/ {print $1}')
end=$(nm "$out/footprint" | awk '/ footprint_end$/ {print $1}')
trap 'rm -f "$out/lackey.log"' EXIT
for preload in "" "$lib"; do
    echo "== ${preload:-plain}"
    LD_PRELOAD="$preload" valgrind --tool=lackey --trace-mem=yes --log-file="$out/lackey.log" \
        "$out/footprint" "$live" "$out/footprint.maps" >/dev/null
    python3 "$root/benches/callgrind/footprint.py" "$out/lackey.log" "$out/footprint.maps" "$begin" "$end" ${preload:+"$preload"}
done
