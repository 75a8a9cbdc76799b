"""Streams made and destroyed again and again (CuPy, MemoryAsyncPool: every allocation a
cudaMallocAsync on the current stream): each allocation is registered with its own stream, the
stream's context and the device, whether or not the driver hands a destroyed stream's handle
out again. The hooks cache a stream's context per thread and forget it at every stream
destruction (cudaStreamDestroy, and the driver's cuStreamDestroy the runtime reaches through
cuGetProcAddress). Run with libcuhook.so preloaded and CUHOOK_LIB naming it."""
import sys

import cupy

import cuhook_ctypes as ch

ROUNDS = 200

lib = ch.load()
cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
device = cupy.cuda.Device().id
seen, reused, bad = set(), 0, []
for i in range(ROUNDS):
    s = cupy.cuda.Stream(non_blocking=True)
    handle = s.ptr
    reused += handle in seen
    seen.add(handle)
    with s:
        a = cupy.empty(4096 + i, dtype=cupy.uint8)
        info = ch.lookup(lib, a.data.ptr, a.nbytes)
        if (info is None or info.device != device or info.stream != handle or not info.context):
            bad.append((i, hex(handle), None if info is None else (info.device, info.stream, info.context)))
        del a
    s.synchronize()
    del s
print("streams: %d made and destroyed, %d handles handed out again; allocations wrong: %d %s"
      % (ROUNDS, reused, len(bad), bad[:3]))
print("check stream_churn %s" % ("ok" if not bad else "FAIL"))
sys.exit(0 if not bad else 1)
