#!/usr/bin/env bash
# The adopter's paths on a real GPU: install the C library (scripts/install-c.sh), build the C
# registration cache against it (pkg-config when present) and the CUDA driver, run it; hunt the
# Python example's leak with the real CUDA runtime under `cuhook run` as two simulated MPI ranks
# (%r), and draw both traces with `cuhook view`.
# Usage: hook-tests/gpu/adopt.sh LIBCUHOOK_SO [OUTDIR]   (the `cuhook` binary beside the library)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cuhook="$(dirname "$CUHOOK_LIB")/cuhook"
cuda="${CUDA_HOME:-/usr/local/cuda}"
status=0
fail() { echo "FAILED: $*"; status=1; }

sh "$root/scripts/install-c.sh" --prefix "$out/prefix" --lib "$CUHOOK_LIB" || fail install-c
if command -v pkg-config >/dev/null; then
    flags=$(PKG_CONFIG_PATH="$out/prefix/lib/pkgconfig" pkg-config --cflags --libs cuhook)
else
    flags="-I$out/prefix/include -L$out/prefix/lib -lcuhook"
fi
echo "cuhook flags: $flags"
# shellcheck disable=SC2086 # flags is a word list
cc -O1 -Wall -Wextra -o "$out/regcache" "$root/examples/regcache/regcache.c" $flags \
    -I"$cuda/include" -L"$cuda/lib64/stubs" -lcuda -lpthread -Wl,-rpath,"$out/prefix/lib" ||
    fail "build regcache.c"
readelf -d "$out/regcache" | grep -q 'NEEDED.*libcuhook.so.0' || fail "regcache does not need libcuhook.so.0"
"$out/regcache" || fail "regcache.c checks"

cudart=$(ls "$cuda"/lib64/libcudart.so.1[0-9] 2>/dev/null | head -n 1)
for rank in 0 1; do
    (cd "$out" && PMI_RANK=$rank CUDART="$cudart" "$cuhook" run --report "r.%r.txt" \
        --trace "t.%r.jsonl" -- python3 "$root/examples/leak-hunt/leaky.py" --steps $((10 + 10 * rank))) ||
        fail "leak hunt rank $rank"
done
grep -q 'Live allocations at exit: 10 (2.5 MiB)' "$out/r.0.txt" || fail "rank 0 should hold 10 buffers"
grep -q 'Live allocations at exit: 20 (5.0 MiB)' "$out/r.1.txt" || fail "rank 1 should hold 20 buffers"
"$cuhook" view -o "$out/leak.html" "$out"/t.*.jsonl || fail "cuhook view"
exit $status
