#!/usr/bin/env bash
# The whole real-GPU suite: the nvcc workload in three link modes, late install and
# classification (and device ordinals on every visible GPU), PyTorch and CuPy, module globals,
# late frees, IPC between two processes and CUDA graphs (issue13.sh), then the
# measurements. Usage: hook-tests/gpu/all.sh LIBCUHOOK_SO [OUTDIR]
# Build libcuhook.so on a machine with Rust (`cargo build --release`) and copy it here first.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
lib="$1"
out="${2:-$(mktemp -d)}"
status=0
echo "### workload (run.sh)";          bash "$here/run.sh" "$lib" "$out/workload" || status=1
echo "### late install (late.sh)";     bash "$here/late.sh" "$lib" "$out/late" || status=1
echo "### PyTorch and CuPy (python.sh)"; bash "$here/python.sh" "$lib" "$out/python" || status=1
echo "### globals, late frees, IPC, graphs (issue13.sh)"; bash "$here/issue13.sh" "$lib" "$out/issue13" || status=1
echo "### measurements (measure.sh)";  bash "$here/measure.sh" "$lib" "$out/measure" || status=1
echo "### suite exit $status"
exit $status
