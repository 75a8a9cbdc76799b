"""PyTorch under cuhook (libcuhook.so preloaded): every live tensor's memory must be in the
registry as CUDA memory covering it, and gone after the tensor is freed."""
import random
import sys

import torch

import cuhook_ctypes as ch

lib = ch.load()
assert torch.cuda.is_available()
backend = torch.cuda.get_allocator_backend()
print("allocator backend:", backend)
random.seed(1)
sizes = [random.choice([1, 7, 512, 4096, 65536, 1 << 20, 3 << 20, 1 << 24]) * random.randint(1, 4) for _ in range(200)]
tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
torch.cuda.synchronize()
bad = []
for t in tensors:
    info = ch.lookup(lib, t.data_ptr(), t.numel())
    if info is None or info.mem_type != ch.MEM_TYPE_CUDA or info.address > t.data_ptr() or info.address + info.size < t.data_ptr() + t.numel():
        bad.append((hex(t.data_ptr()), t.numel(), None if info is None else (hex(info.address), info.size, info.mem_type)))
apis = set()
for t in tensors:
    info = ch.lookup(lib, t.data_ptr(), t.numel())
    if info is not None:
        apis.add(info.api.decode())
print("live tensors: %d, not registered as CUDA memory covering them: %d, apis: %s" % (len(tensors), len(bad), sorted(apis)))
ptrs = [(t.data_ptr(), t.numel()) for t in tensors]
del tensors, t
torch.cuda.synchronize()
still = [hex(p) for p, n in ptrs if ch.lookup(lib, p, n) is not None]
if backend == "cudaMallocAsync":
    # Every tensor was its own cudaMallocAsync allocation, freed with cudaFreeAsync.
    print("after delete: %d of %d still registered" % (len(still), len(ptrs)))
    ok = not bad and not still
else:
    # The caching allocator keeps its segments: they stay registered after the tensors go.
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    gone = [hex(p) for p, n in ptrs if ch.lookup(lib, p, n) is not None]
    print("after empty_cache: %d of %d still registered" % (len(gone), len(ptrs)))
    ok = not bad and not gone
print("check torch_%s %s" % (backend, "ok" if ok else "FAIL"))
if bad[:5]:
    print("first problems:", bad[:5])
sys.exit(0 if ok else 1)
