"""PyTorch under cuhook (libcuhook.so preloaded, `cudaMallocAsync` backend): tensors allocated
by Python threads, each on its own stream, are registered on their device, with a context and
their stream. CUDA 13's runtime serves such threads with no context current; before, their
allocations were registered on device -1 with no context.

Usage: CUHOOK_LIB=... LD_PRELOAD=$CUHOOK_LIB PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \\
       python3 torch_device.py"""
import sys
import threading

import torch

import cuhook_ctypes as ch

lib = ch.load()
assert torch.cuda.get_allocator_backend() == "cudaMallocAsync", "run with the cudaMallocAsync backend"
torch.empty(1, device="cuda")
found = []


def worker(i: int) -> None:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tensors = [torch.empty(4096 << k, dtype=torch.uint8, device="cuda") for k in range(4)]
        for t in tensors:
            info = ch.lookup(lib, t.data_ptr(), t.numel())
            found.append((i, t.device.index, stream.cuda_stream,
                          None if info is None else (info.device, info.context or 0, info.stream or 0)))
        stream.synchronize()


threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
bad = [f for f in found if f[3] is None or f[3][0] != f[1] or f[3][1] == 0 or f[3][2] != f[2]]
print("tensors of 4 threads: %d, without their device, a context or their stream: %d" % (len(found), len(bad)))
if bad:
    print("first problems (thread, device, stream, registered device/context/stream):", bad[:4])
print("check torch_device %s" % ("FAIL" if bad else "ok"))
sys.exit(1 if bad else 0)
