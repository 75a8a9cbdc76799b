"""ctypes view of libcuhook.so's C API (include/cuhook.h), for the Python GPU checks."""
import ctypes
import os


class MemEvent(ctypes.Structure):
    """cuhook_mem_event_t"""
    _fields_ = [
        ("address", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("mem_type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("flags", ctypes.c_uint),
        ("api", ctypes.c_char_p),
        ("stream", ctypes.c_void_p),
        ("pool", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
    ]


class MemInfo(MemEvent):
    """cuhook_mem_info_t: the event's fields, then seq."""
    _fields_ = [("seq", ctypes.c_uint64)]


MEM_TYPE_CUDA = 1


def load():
    lib = ctypes.CDLL(os.environ["CUHOOK_LIB"])
    lib.cuhook_lookup.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(MemInfo)]
    lib.cuhook_install.restype = ctypes.c_int
    lib.cuhook_patched_slots.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.cuhook_patched_slots.restype = ctypes.c_ssize_t
    return lib


def lookup(lib, ptr, length):
    info = MemInfo()
    rc = lib.cuhook_lookup(ctypes.c_void_p(ptr), length, ctypes.byref(info))
    return info if rc == 0 else None
