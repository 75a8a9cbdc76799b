#!/usr/bin/env bash
# Issue 39 on the real driver: the wheel built on a machine with Rust (`pip wheel --no-deps .
# -w .whl/`) installed here, `import cuhook` with no preload, then PyTorch (native and
# cudaMallocAsync backends), CuPy and JAX (XLA's default and platform allocators) through
# package_check.py; then `python -m cuhook run` and the `cuhook` console command.
# Usage: hook-tests/gpu/package.sh WHEEL [OUTDIR]
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${2:-$(mktemp -d)}"; mkdir -p "$out"
site="$out/site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$1" || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
unset LD_PRELOAD
status=0
cd "$here"
echo "== torch native";  python3 package_check.py torch || status=1
echo "== torch cudaMallocAsync"; PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 package_check.py torch || status=1
echo "== cupy"; python3 package_check.py cupy || status=1
echo "== jax (default allocator)"; XLA_PYTHON_CLIENT_MEM_FRACTION=.3 python3 package_check.py jax || status=1
echo "== jax (platform allocator)"; XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform python3 package_check.py jax || status=1
echo "== python -m cuhook run --stacks 16 (a PyTorch training loop, cudaMallocAsync backend)"
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 -m cuhook run --stacks 16 -- python3 torch_train.py 20 >"$out/run.txt" 2>&1
echo "exit $?"; grep -E "^ *cuda|live|by call site" "$out/run.txt" | head -12
sed -n '/by call site/,/^$/p' "$out/run.txt" | head -30
echo "== cuhook console command"; "$site/bin/cuhook" --help 2>&1 | head -3
echo "### package exit $status"
exit $status
