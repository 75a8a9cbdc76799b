"""Debugging aid: after `import torch` under a preloaded libcuhook.so, print every patched slot
(object, symbol, what it held, what it holds now: each as module!symbol through dladdr) and the
engine's counters, sorted, so that two libraries' patches can be compared line by line; then
make the first CUDA allocation (with faulthandler on, so a crash shows where Python was).
Usage: CUHOOK_LIB=... LD_PRELOAD=$CUHOOK_LIB python3 slots_dump.py"""
import ctypes
import faulthandler
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
x = torch.empty(1 << 20, device="cuda")
torch.cuda.synchronize()
print("first allocation ok", hex(x.data_ptr()), flush=True)
