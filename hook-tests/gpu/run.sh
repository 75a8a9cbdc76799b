#!/usr/bin/env bash
# The real-GPU hook suite: build the workload with nvcc in several link modes, run each with
# cuhook, judge every call. Usage: hook-tests/gpu/run.sh LIBCUHOOK_SO [OUTDIR]
# Needs: nvcc, a GPU, python3. Prints one line per (symbol, build): the api cuhook reported.
set -u
source "$(dirname "$0")/common.sh"
builds=(
    "static::"
    "shared:--runtime-api:-cudart shared"
    "ptds::--default-stream per-thread"
)
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
nvcc --version | tail -1
for b in "${builds[@]}"; do
    name="${b%%:*}"; rest="${b#*:}"; flag="${rest%%:*}"; nvflags="${rest#*:}"
    # shellcheck disable=SC2086
    if ! nvcc -O2 -arch=native $nvflags "${inc[@]}" -o "$out/workload_$name" "$here/workload.cu" -lcuda -ldl 2>"$out/build_$name.log"; then
        echo "BUILD FAILED $name"; cat "$out/build_$name.log"; status=1; continue
    fi
    "$out/workload_$name" >"$out/run_$name.txt" 2>&1
    echo "== $name (exit $?)"
    python3 "$here/check.py" "$name" "$out/run_$name.txt" $flag || status=1
done
exit $status
