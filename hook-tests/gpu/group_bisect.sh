#!/usr/bin/env bash
# The loader's group path (CUHOOK_GROUP_DLOPEN) against PyTorch, which it crashed on the H200
# (docs/gpu-results.md, nineteenth session; the cause, the dlsym interposer, fixed in the
# twenty-second; kept as a check of both paths): torch_check.py (both allocator backends) and a
# training loop (torch_train.py, cuBLAS loaded lazily), preloaded, with the path off and on.
# Each run prints its exit status; a crash leaves a core file in OUTDIR, and with gdb present
# its backtrace is printed (which hook, original or loader step faulted); without gdb (the
# GPU machine) segv_shim.c, preloaded first, prints the faulting frame. Then the patched slots
# after `import torch` with the path off and on (slots_dump.py), for a diff.
# Usage: hook-tests/gpu/group_bisect.sh LIBCUHOOK_SO [OUTDIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${2:-}"
cd "$here"
ulimit -c unlimited 2>/dev/null
source "$here/segv.sh"
shim=$(segv_shim "$out")
for on in 0 1; do
    for run in native async train; do
        case $run in
            native) conf=""; args=(torch_check.py) ;;
            async) conf=backend:cudaMallocAsync; args=(torch_check.py) ;;
            train) conf=backend:cudaMallocAsync; args=(torch_train.py 20) ;;
        esac
        dir="$out/group$on-$run"
        mkdir -p "$dir"
        (cd "$dir" && env ${conf:+PYTORCH_CUDA_ALLOC_CONF=$conf} CUHOOK_GROUP_DLOPEN=$on LD_PRELOAD="${shim:+$shim }$CUHOOK_LIB" \
            timeout 120 python3 "$here/${args[0]}" "${args[@]:1}" >"$dir/out.txt" 2>&1)
        echo "CUHOOK_GROUP_DLOPEN=$on $run: exit $?"
        segv_frame "$dir/out.txt"
        core=$(ls "$dir"/core* 2>/dev/null | head -1)
        if [ -n "$core" ] && command -v gdb >/dev/null; then
            gdb -batch -ex "bt 25" "$(command -v python3)" "$core" 2>/dev/null | grep -E "^#" | head -25
        fi
    done
    CUHOOK_GROUP_DLOPEN=$on LD_PRELOAD="$CUHOOK_LIB" timeout 120 python3 slots_dump.py \
        >"$out/slots_group$on.txt" 2>&1
done
echo "slots differing between the path off and on:"
diff <(sort "$out/slots_group0.txt") <(sort "$out/slots_group1.txt") | head -40
