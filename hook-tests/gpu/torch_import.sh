#!/usr/bin/env bash
# Issue 36's loader path on a real host: `import torch` (which opens dozens of libraries, most
# bringing new dependencies with them) in plain processes and with libcuhook.so preloaded,
# alternated, ROUNDS rounds (default 7): seconds inside `import torch` (the interpreter's own
# start left out), medians [min-max], and the preloaded engine's loader counters.
# Usage: hook-tests/gpu/torch_import.sh LIB [OUTDIR]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$1" "${2:-}"
probe='
import ctypes, os, sys, time
t = time.perf_counter()
import torch
took = time.perf_counter() - t
line = ""
if os.environ.get("LD_PRELOAD"):
    lib = ctypes.CDLL(os.environ["LD_PRELOAD"])
    buf = ctypes.create_string_buffer(1 << 16)
    lib.cuhook_diagnostics(buf, len(buf))
    line = next((l for l in buf.value.decode().splitlines() if l.startswith("counters")), "")
print(f"import_s={took:.4f} {line}")
'
: >"$out/import.txt"
for round in $(seq "${ROUNDS:-7}"); do
    echo "mode=plain $(python3 -c "$probe")" >>"$out/import.txt"
    echo "mode=hooked $(LD_PRELOAD="$CUHOOK_LIB" python3 -c "$probe")" >>"$out/import.txt"
done
tail -1 "$out/import.txt"
python3 - "$out/import.txt" <<'PY'
import re, statistics, sys
r = {}
for line in open(sys.argv[1]):
    m = re.match(r"mode=(\w+) import_s=([\d.]+)", line)
    if m:
        r.setdefault(m[1], []).append(float(m[2]) * 1000)
p, h = statistics.median(r["plain"]), statistics.median(r["hooked"])
print(f"import torch (ms): plain {p:.1f} [{min(r['plain']):.1f}-{max(r['plain']):.1f}]  "
      f"hooked {h:.1f} [{min(r['hooked']):.1f}-{max(r['hooked']):.1f}]  +{h - p:.1f} ms x{h / p:.3f}")
PY
