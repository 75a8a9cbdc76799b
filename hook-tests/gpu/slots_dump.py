"""Debugging aid: after `import torch` under a preloaded libcuhook.so, print every patched slot
(object, symbol, what it held, what it holds now: each as module!symbol through dladdr) and the
engine's counters, sorted, so that two libraries' patches can be compared line by line; then
make the first CUDA allocation (with faulthandler on, so a crash shows where Python was).
Without a GPU (any machine with PyTorch from PyPI, whose CUDA libraries come with it) it stops
after the dump. LAZY: comma-separated globs under site-packages of libraries to `dlopen` after
the import (PyTorch loads cuDNN's parts, cuSOLVER and others lazily: groups of new objects).
Usage: CUHOOK_LIB=... LD_PRELOAD=$CUHOOK_LIB [LAZY=...] python3 slots_dump.py"""
import ctypes
import faulthandler
import glob
import os
import sys

faulthandler.enable()


class SlotInfo(ctypes.Structure):
    _fields_ = [("set", ctypes.c_char * 64), ("object", ctypes.c_char * 256),
                ("symbol", ctypes.c_char * 128), ("address", ctypes.c_size_t), ("kind", ctypes.c_int),
                ("old_value", ctypes.c_size_t), ("new_value", ctypes.c_size_t), ("protection", ctypes.c_char * 4)]


class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]


libdl = ctypes.CDLL(None)
libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]


def name(addr):
    info = DlInfo()
    if not libdl.dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
        return hex(addr)
    module = os.path.basename((info.fname or b"?").decode())
    sym = (info.sname or b"").decode()
    off = addr - (info.saddr or info.fbase or 0)
    return f"{module}!{sym}+{off:#x}"


import torch  # noqa: E402

site = os.path.dirname(os.path.dirname(torch.__file__))
for pattern in filter(None, os.environ.get("LAZY", "").split(",")):
    for path in sorted(glob.glob(os.path.join(site, pattern))):
        try:
            ctypes.CDLL(path)
            print("lazy loaded", os.path.basename(path), file=sys.stderr)
        except OSError as e:
            print("lazy failed", os.path.basename(path), e, file=sys.stderr)

lib = ctypes.CDLL(os.environ["CUHOOK_LIB"])
lib.cuhook_patched_slots.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.cuhook_patched_slots.restype = ctypes.c_ssize_t
slots = (SlotInfo * 8192)()
n = lib.cuhook_patched_slots(slots, 8192)
lines = []
for s in slots[:min(n, 8192)]:
    lines.append(f"{os.path.basename(s.object.decode())} {s.symbol.decode()} kind={s.kind} "
                 f"old={name(s.old_value)} new={name(s.new_value)} now={name(ctypes.c_size_t.from_address(s.address).value)}")
for line in sorted(lines):
    print("slot", line)
buf = ctypes.create_string_buffer(1 << 20)
lib.cuhook_diagnostics(buf, len(buf))
for line in buf.value.decode().splitlines():
    print("diag", line)
sys.stdout.flush()
if not torch.cuda.is_available():
    print("no GPU: slots only", file=sys.stderr)
    sys.exit(0)
x = torch.empty(1 << 20, device="cuda")
torch.cuda.synchronize()
print("first allocation ok", hex(x.data_ptr()), flush=True)
