#!/usr/bin/env bash
# cuhook_install() in a process that has PyTorch's biggest library loaded (libtorch_cpu.so:
# 338,434 .rela.dyn entries, 100,000 of them naming symbols), with no GPU and no CUDA: the wheel
# from PyPI, its two CUDA dependencies replaced by stub libraries that define the imported names.
# Counts install instructions with callgrind and times the install in alternating processes.
#
# Usage: benches/torch/run.sh LIBCUHOOK_SO [BASELINE_LIBCUHOOK_SO] [WORKDIR]
# Downloads ≈ 540 MB once (pip download torch --no-deps) into WORKDIR (default /tmp/cuhook-torch).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
lib="$(realpath "$1")"
base="${2:+$(realpath "$2")}"
work="${3:-/tmp/cuhook-torch}"
mkdir -p "$work" && cd "$work"
ls torch-*.whl >/dev/null 2>&1 || pip download torch --no-deps -d . >/dev/null
whl=$(ls torch-*.whl | head -1)
[ -f torch/lib/libtorch_cpu.so ] || python3 -c "
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith('torch/lib/') and n.endswith(('.so', '.so.1', '.so.5')):
        z.extract(n, '.')" "$whl"
mkdir -p stubs
for dep in $(readelf -d torch/lib/libtorch_cpu.so | sed -n 's/.*Shared library: \[\(lib\(cudart\|cupti\)[^]]*\)\]/\1/p'); do
    [ -f "stubs/$dep" ] && continue
    nm -D --undefined-only torch/lib/libtorch_cpu.so | awk -v d="@$dep" 'index($2, d) { sub(d, "", $2); print "int " $2 "(void) { return 0; }" }' > "stubs/$dep.c"
    echo "$dep { global: *; };" > "stubs/$dep.map"
    gcc -shared -fPIC -o "stubs/$dep" "stubs/$dep.c" -Wl,--version-script="stubs/$dep.map" -Wl,-soname,"$dep"
done
gcc -O2 -o install_probe "$here/install_probe.c" -ldl
run() { CUHOOK_DISABLE=1 LD_LIBRARY_PATH="$work/stubs:$work/torch/lib" "$@"; }
for l in $base $lib; do
    echo "== $l"
    run valgrind --tool=callgrind --toggle-collect=cuhook_install --callgrind-out-file=/dev/null \
        ./install_probe "$l" "$work/torch/lib/libtorch_cpu.so" 2>&1 | grep -E "Collected" || true
done
for i in 1 2 3 4 5 6 7 8 9; do
    for l in $base $lib; do
        echo "$l $(run ./install_probe "$l" "$work/torch/lib/libtorch_cpu.so")"
    done
done
