"""CUDA graphs under cuhook (issue 13, item 4), with PyTorch's cudaMallocAsync backend
(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, libcuhook.so preloaded): a model step captured
with torch.cuda.graph must compute the right result on every replay; the allocations and frees
PyTorch makes while capturing are dispatched flagged GRAPH; and once the graph and its outputs
are gone, every range the capture registered that is still in the registry is memory the driver
still has, of the registered size (no stale range)."""
import ctypes
import sys

import torch

import cuhook_ctypes as ch

FLAG_GRAPH = 1 << 9
EVENT_ALLOC, EVENT_FREE = 1, 2


CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ch.MemEvent), ctypes.c_void_p)
graph_allocs, graph_frees = {}, set()


def on_event(kind, ev, _arg):
    e = ev.contents
    if e.flags & FLAG_GRAPH:
        if kind == EVENT_ALLOC:
            graph_allocs[e.address] = e.size
        else:
            graph_frees.add(e.address)


lib = ch.load()
lib.cuhook_set_event_handler.argtypes = [ctypes.c_int, ctypes.c_int, CALLBACK, ctypes.c_void_p]
callback = CALLBACK(on_event)
assert lib.cuhook_set_event_handler(EVENT_ALLOC | EVENT_FREE, 0, callback, None) == 0
backend = torch.cuda.get_allocator_backend()
print("allocator backend:", backend)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
static_in = torch.randn(256, 1024, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.no_grad():
    for _ in range(3):  # warm-up outside the capture
        model(static_in)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_out = model(static_in) * 2
torch.cuda.synchronize()
out_ptr = static_out.data_ptr()
captured = dict(graph_allocs)
print("during capture: %d GRAPH allocs, %d GRAPH frees" % (len(captured), len(graph_frees)))

ok_replays = True
with torch.no_grad():
    for i in range(5):
        x = torch.randn(256, 1024, device="cuda")
        static_in.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        want = model(x) * 2
        if not torch.allclose(static_out, want, rtol=1e-3, atol=1e-3):
            ok_replays = False
            print("replay %d differs: max abs err %g" % (i, (static_out - want).abs().max().item()))
out_registered = ch.lookup(lib, out_ptr, static_out.numel() * static_out.element_size())
print("graph output registered while the graph lives:", out_registered is not None)

del static_out, graph
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.synchronize()
cuda = ctypes.CDLL("libcuda.so.1")


def driver_size(address):
    """The size of the allocation the driver has at `address`, or None when it has none."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(address))
    return size.value if rc == 0 else None


# Stale: the registry still answers GRAPH memory where the driver has no allocation. A captured
# allocation that the graph never frees is real memory once the graph has run, and stays so after
# the graph is destroyed until someone frees it (PyTorch keeps some of its graph pool's blocks:
# its warning above); those must stay registered, with the driver's size.
stale, kept = [], []
for a, size in captured.items():
    info = ch.lookup(lib, a, 1)
    if info is None or not info.flags & FLAG_GRAPH:
        continue
    (kept if driver_size(a) == info.size else stale).append(hex(a))
print("after the graph is destroyed: of %d captured ranges, %d still allocated and registered %s, %d registered but not allocated %s"
      % (len(captured), len(kept), kept[:5], len(stale), stale[:5]))
checks = {
    "graph_replays_correct": ok_replays,
    "graph_events_flagged": backend != "cudaMallocAsync" or len(captured) > 0,
    "graph_output_registered": out_registered is not None,
    "graph_no_stale_ranges": not stale,
}
for name, good in checks.items():
    print("check %s %s" % (name, "ok" if good else "FAIL"))
# The callback is a ctypes thunk that the interpreter frees at shutdown, while PyTorch still
# frees memory (and cuhook would still call it): unsubscribe first.
lib.cuhook_unset_event_handler.argtypes = [ctypes.c_int, CALLBACK, ctypes.c_void_p]
assert lib.cuhook_unset_event_handler(EVENT_ALLOC | EVENT_FREE, callback, None) == 0
sys.exit(0 if all(checks.values()) else 1)
