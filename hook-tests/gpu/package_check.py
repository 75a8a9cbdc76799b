"""The installed Python package on the real driver (issue 39): ``import cuhook`` (no preload),
``cuhook.install()``, then a framework allocates. Every live tensor/array must be found by
``cuhook.lookup(obj)`` as CUDA memory covering its bytes, on its device, be in ``cuhook.live()``,
and be gone once the framework has given the memory back. Also: the trace and subscribe paths
see the same allocations, and bad input raises TypeError.

Usage: python3 package_check.py torch|cupy|jax   (PYTORCH_CUDA_ALLOC_CONF / XLA_* from outside)
Prints one summary line per check and ``package_check FRAMEWORK: N failures``; exits 1 on any.
"""
import json
import os
import random
import sys
import tempfile
import threading

import cuhook

framework = sys.argv[1]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


assert not cuhook.preloaded(), "run without LD_PRELOAD: the bundled library is the one checked"
cuhook.install()
cuhook.install()  # a second call: no error, one installation
check(cuhook.installed(), "installed from the wheel's bundled library " + cuhook.library_path())

events = []
lock = threading.Lock()


def on_event(ev):
    with lock:
        events.append(ev)


sub = cuhook.subscribe(on_event)
trace_path = os.path.join(tempfile.mkdtemp(), "t.jsonl")
random.seed(7)
sizes = [random.choice([1, 100, 4096, 65536, 1 << 20, 5 << 20, 1 << 24]) * random.randint(1, 3) for _ in range(120)]

if framework == "torch":
    import torch

    print("allocator backend:", torch.cuda.get_allocator_backend())
    with cuhook.trace(trace_path):
        objs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
        torch.cuda.synchronize()
    spans = [(t.data_ptr(), t.numel()) for t in objs]
    exact_possible = torch.cuda.get_allocator_backend() == "cudaMallocAsync"

    def release():
        global objs
        objs = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()

elif framework == "cupy":
    import cupy

    with cuhook.trace(trace_path):
        objs = [cupy.empty(n, dtype=cupy.uint8) for n in sizes]
        cupy.cuda.Device().synchronize()
    spans = [(a.__cuda_array_interface__["data"][0], a.nbytes) for a in objs]
    exact_possible = False

    def release():
        global objs
        objs = None
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.cuda.Device().synchronize()

elif framework == "jax":
    import jax
    import jax.numpy as jnp

    print("jax", jax.__version__, "devices", jax.devices(), "allocator", os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"))
    with cuhook.trace(trace_path):
        objs = [jnp.zeros(n, dtype=jnp.uint8) for n in sizes]
        for a in objs:
            a.block_until_ready()
    spans = [(a.unsafe_buffer_pointer(), a.nbytes) for a in objs]
    exact_possible = False
    # XLA's default BFC allocator keeps what it took from the driver until exit.
    gives_back = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform"

    def release():
        global objs
        for a in objs:
            a.delete()
        objs = None

else:
    sys.exit("usage: package_check.py torch|cupy|jax")

# Every live object: found, CUDA memory, covering its bytes, device 0.
not_found, not_covering, exact = 0, 0, 0
apis = set()
for obj, (ptr, n) in zip(objs, spans):
    a = cuhook.lookup(obj)
    if a is None or a.mem_type != cuhook.MemType.CUDA:
        not_found += 1
        continue
    apis.add(a.api)
    if not (a.start <= ptr and ptr + n <= a.end and a.device == 0):
        not_covering += 1
    if a.start == ptr and a.size == n:
        exact += 1
    if cuhook.lookup(ptr) != a:
        not_covering += 1
del obj  # the loop variable would keep the last object alive
check(not_found == 0 and not_covering == 0,
      f"{len(objs)} live objects: not found {not_found}, not covering {not_covering}, exact range {exact}, apis {sorted(apis)}")
if exact_possible:
    check(exact == len(objs), f"one allocation per tensor (cudaMallocAsync backend): {exact} of {len(objs)} exact")
starts = {a.start for a in cuhook.live()}
check(all(cuhook.lookup(ptr).start in starts for ptr, _ in spans), "every object's allocation is in cuhook.live()")
s = cuhook.stats()
check(s.live >= 1 and s.live_bytes >= max(sizes), f"stats: live {s.live}, live bytes {s.live_bytes}, untracked {s.untracked}")

# The trace block saw allocations; subscribe delivered them.
with open(trace_path) as f:
    lines = [json.loads(line) for line in f if line.strip()]
allocs_traced = sum(1 for r in lines if r.get("kind") == "alloc" or r.get("event") == "alloc")
check(allocs_traced >= 1, f"trace block: {len(lines)} lines, {allocs_traced} allocations")
sub.flush(5.0)
with lock:
    seen = {e.address for e in events if e.kind & cuhook.EventKind.ALLOC}
check(all(cuhook.lookup(ptr).start in seen for ptr, _ in spans), f"subscribe: {len(events)} events, every object's allocation among them (dropped {sub.dropped})")

# Given back: nothing found any more.
release()
still = sum(1 for ptr, _ in spans if cuhook.lookup(ptr) is not None)
if framework != "jax" or gives_back:
    check(still == 0, f"after the framework gave the memory back: {still} of {len(spans)} still found")
else:
    print(f"n/a  after delete: {still} of {len(spans)} still found (XLA's BFC pool keeps its memory)")

# Bad input.
for bad in (None, "x", 1.5):
    try:
        cuhook.lookup(bad)
        check(False, f"lookup({bad!r}) raised nothing")
    except TypeError:
        pass
sub.close()
text = cuhook.report()
check("cuda" in text.lower(), f"report: {len(text)} characters")
print(f"package_check {framework}: {len(failures)} failures", flush=True)
sys.exit(1 if failures else 0)
