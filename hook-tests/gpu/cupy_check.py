"""CuPy with MemoryAsyncPool under cuhook: every live array registered, gone once freed."""
import sys

import cupy

import cuhook_ctypes as ch

lib = ch.load()
cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
arrays = [cupy.empty(n, dtype=cupy.uint8) for n in [16, 4096, 1 << 20, 3 << 20, 1 << 24] * 20]
cupy.cuda.Device().synchronize()
bad = []
apis = set()
for a in arrays:
    info = ch.lookup(lib, a.data.ptr, a.nbytes)
    if info is None or info.mem_type != ch.MEM_TYPE_CUDA:
        bad.append(hex(a.data.ptr))
    else:
        apis.add(info.api.decode())
ptrs = [(a.data.ptr, a.nbytes) for a in arrays]
del arrays, a
cupy.cuda.Device().synchronize()
still = [hex(p) for p, n in ptrs if ch.lookup(lib, p, n) is not None]
print("cupy live arrays: %d, unregistered: %d, apis: %s, still registered after free: %d" % (len(ptrs), len(bad), sorted(apis), len(still)))
ok = not bad and not still
print("check cupy_async_pool %s" % ("ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
