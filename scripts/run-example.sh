#!/bin/sh
# Run one of cuhook's examples with nothing but this command, on the fake CUDA driver and
# runtime (fixtures/cuda/, compiled here with $CC or cc): no GPU, no CUDA toolkit needed.
#
# Usage: scripts/run-example.sh NAME [ARGS...]
#   regcache-c   examples/regcache/regcache.c, built against the installed C library
#                (scripts/install-c.sh into target/examples-run/prefix) with pkg-config
#   regcache     examples/regcache.rs   (cargo build --release --example regcache)
#   cudarc       examples/cudarc.rs     (cargo build --release --example cudarc)
#   leak-hunt    examples/leak-hunt/leaky.py under `cuhook run`, then `cuhook view` of its trace
#                (ARGS go to leaky.py: --steps N, --fixed)
# Everything it makes goes to target/examples-run/ ($CUHOOK_EXAMPLE_OUT if set). It builds what it needs with
# `cargo build --release` first; CUHOOK_PREBUILT=DIR uses a cargo profile directory that is
# already built instead (DIR/cuhook, DIR/deps/libcuhook.so, DIR/examples/; the tests do this).
# On a machine with CUDA, each example's own documentation gives the command without fakes.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
name=${1:-}
[ $# -gt 0 ] && shift
case $name in
    regcache-c | regcache | cudarc | leak-hunt) ;;
    -h | --help)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        exit 0
        ;;
    *)
        echo "run-example.sh: name an example: regcache-c, regcache, cudarc or leak-hunt (try --help)" >&2
        exit 2
        ;;
esac

out=${CUHOOK_EXAMPLE_OUT:-$root/target/examples-run}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "${CUHOOK_PREBUILT:-}" ]; then
    profile=$CUHOOK_PREBUILT
else
    profile=$root/target/release
    case $name in
        regcache | cudarc) (cd "$root" && cargo build --release --example "$name") ;;
        *) (cd "$root" && cargo build --release) ;;
    esac
fi
cuhook=$profile/cuhook
# The library of the last build: cargo test refreshes only deps/libcuhook.so.
lib=$profile/libcuhook.so
if [ -f "$profile/deps/libcuhook.so" ] && { [ ! -f "$lib" ] || [ "$profile/deps/libcuhook.so" -nt "$lib" ]; }; then
    lib=$profile/deps/libcuhook.so
fi

# The fake driver and runtime, as the demo builds them.
fake=$out/fake-cuda
mkdir -p "$fake"
cc=${CC:-cc}
"$cc" -O1 -std=c11 -fvisibility=hidden -fPIC -shared -Wl,-soname,libcuda.so.1 \
    -o "$fake/libcuda.so.1" "$root/fixtures/cuda/fake_libcuda.c" -lpthread
"$cc" -O1 -std=c11 -fvisibility=hidden -fPIC -shared -Wl,-soname,libcudart.so.13 \
    -o "$fake/libcudart.so.13" "$root/fixtures/cuda/fake_cudart.c" -Wl,-rpath,'$ORIGIN' -ldl -lpthread
echo "run-example.sh: the fake CUDA driver and runtime are in $fake" >&2

case $name in
    regcache-c)
        prefix=$out/prefix
        sh "$root/scripts/install-c.sh" --prefix "$prefix" --lib "$lib" --no-cli >/dev/null
        # What the example's own comment gives for real CUDA, with the fake driver's <cuda.h>
        # (fixtures/examples) and libcuda.so.1 in place of the toolkit's.
        "$cc" -O1 -Wall -Wextra -o "$out/regcache" "$root/examples/regcache/regcache.c" \
            $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs cuhook) \
            -I "$root/fixtures/examples" -I "$root/fixtures/cuda" \
            -L "$fake" -l:libcuda.so.1 -lpthread -Wl,-rpath,"$prefix/lib:$fake"
        exec "$out/regcache" "$@"
        ;;
    regcache | cudarc)
        LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$profile/examples/$name" "$@"
        ;;
    leak-hunt)
        cd "$out"
        LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            "$cuhook" run --lib "$lib" --report leak.txt --trace leak.jsonl -- \
            python3 "$root/examples/leak-hunt/leaky.py" "$@"
        "$cuhook" view -o leak.html leak.jsonl
        echo "run-example.sh: the report is $out/leak.txt, the page $out/leak.html"
        ;;
esac
