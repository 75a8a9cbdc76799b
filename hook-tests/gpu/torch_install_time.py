"""Install time in a PyTorch process: cuhook_install() after torch and CUDA are loaded
(run with CUHOOK_DISABLE=1 so the constructor does not install first)."""
import time

import torch

import cuhook_ctypes as ch

torch.zeros(1, device="cuda")
lib = ch.load()
t0 = time.perf_counter()
rc = lib.cuhook_install()
ms = (time.perf_counter() - t0) * 1000
slots = lib.cuhook_patched_slots(None, 0)
with open("/proc/self/maps") as f:
    objects = len({l.split()[-1] for l in f if l.rstrip().endswith(".so") or ".so." in l})
print("install_time rc=%d ms=%.1f slots=%d shared_objects_mapped=%d" % (rc, ms, slots, objects))
