"""How long cuhook.lookup takes from Python, against no-op calls of the same binding styles
(docs/performance.md, "Python lookups"). Run with the installed package, on the fake driver:

    python python/benches/lookup.py          # after `cargo test --release` and `pip install .`

Each figure is the best of 7 runs of 1,000,000 calls, in ns per call.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import timeit

import cuhook

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_cuda() -> ctypes.CDLL:
    found = os.environ.get("CUHOOK_FIXTURES") or os.path.dirname(max(glob.glob(os.path.join(
        ROOT, "target", "*", "build", "cuhook-fixtures-*", "out", "fixtures", "libcudart.so.13")),
        key=os.path.getmtime))
    ctypes.CDLL(os.path.join(found, "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    rt = ctypes.CDLL(os.path.join(found, "libcudart.so.13"))
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    return rt


def main() -> None:
    cuhook.install()
    rt = fake_cuda()
    buffers = []
    for _ in range(64):                      # a registry with a few allocations in it
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
        buffers.append(p.value)
    hit, miss = buffers[17] + 4096, 0x1000
    memcpy = ctypes.cast(ctypes.CDLL(None).memcpy, ctypes.c_void_p).value
    nop = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_size_t)(memcpy)
    scope = {"cuhook": cuhook, "hit": hit, "miss": miss, "nop": nop,
             "c_void_p": ctypes.c_void_p(hit)}
    rows = [
        ("C extension: no-op builtin call, id(int)", "id(hit)"),
        ("cuhook.lookup(int), not found", "cuhook.lookup(miss)"),
        ("cuhook.lookup(int), found", "cuhook.lookup(hit)"),
        ("ctypes: no-op call memcpy(p, p, 0), GIL kept", "nop(hit, hit, 0)"),
        ("ctypes lookup (no C extension), not found", "cuhook._lookup_ctypes(miss)"),
        ("ctypes lookup (no C extension), found", "cuhook._lookup_ctypes(hit)"),
        ("cuhook.lookup(ctypes.c_void_p), found", "cuhook.lookup(c_void_p)"),
    ]
    print(f"python {sys.version.split()[0]}, C lookup: {cuhook._speedups is not None}")
    for name, stmt in rows:
        best = min(timeit.repeat(stmt, globals=scope, number=1_000_000, repeat=7))
        print(f"  {name:48s} {best * 1e3:7.1f} ns")


if __name__ == "__main__":
    main()
