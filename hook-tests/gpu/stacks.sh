#!/usr/bin/env bash
# Issue 37 on the real driver: leaks.cu under `compute-sanitizer --leak-check full` and under
# `cuhook run --stacks 16`, the sites each names (file:line of the leaking calls) and both wall
# times against the plain program, alternated, 3 rounds.
# Usage: hook-tests/gpu/stacks.sh LIBCUHOOK_SO CUHOOK_BIN [OUTDIR]
set -u
bin="$2"
# common.sh reads the library and the output folder as its own arguments 1 and 2.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${3:-}"
nvcc -O1 -g -Xcompiler -fomit-frame-pointer -cudart shared -o "$out/leaks" "$here/leaks.cu" || exit 1
for mark in small async big; do
    echo "expect $mark at leaks.cu:$(grep -n "MARK($mark)" "$here/leaks.cu" | cut -d: -f1)"
done
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
for round in 1 2 3; do
    echo "round $round plain_ms $(ms "$out/leaks") sanitizer_ms $(ms compute-sanitizer --leak-check full "$out/leaks") cuhook_ms $(ms "$bin" run --lib "$CUHOOK_LIB" --stacks 16 -- "$out/leaks")"
done
compute-sanitizer --leak-check full "$out/leaks" > "$out/sanitizer.txt" 2>&1
"$bin" run --lib "$CUHOOK_LIB" --stacks 16 -- "$out/leaks" > "$out/cuhook.txt" 2>&1
echo "--- compute-sanitizer: leaked buffers $(grep -c 'Leaked' "$out/sanitizer.txt")"
grep -E 'Leaked|leaks.cu' "$out/sanitizer.txt" | head -40
echo "--- cuhook"
sed -n '/by call site/,/^$/p' "$out/cuhook.txt"
