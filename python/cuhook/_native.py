"""The C library behind the package: which copy of ``libcuhook.so`` to use, and its functions.

One engine per process: when a ``libcuhook.so`` is already loaded (``LD_PRELOAD``,
``cuhook run``, a host library that links it), that copy is used; otherwise ``$CUHOOK_LIB``
when set, else the one bundled in the wheel. The bundled copy is loaded with
``CUHOOK_DISABLE=1`` for the moment of the load, so that its constructor does not install the
hooks by itself: in Python nothing is hooked before :func:`cuhook.install`.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Optional

SONAME = "libcuhook.so.0"
BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")
BUNDLED_LIB = os.path.join(BIN_DIR, "libcuhook.so")
BUNDLED_CLI = os.path.join(BIN_DIR, "cuhook")

c_int, c_size_t, c_uint64, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p
c_ssize_t = ctypes.c_ssize_t


class MemEvent(ctypes.Structure):
    """``cuhook_mem_event_t``."""

    _fields_ = [
        ("address", c_void_p),
        ("size", c_size_t),
        ("mem_type", c_int),
        ("device", c_int),
        ("flags", ctypes.c_uint),
        ("api", c_void_p),
        ("stream", c_void_p),
        ("pool", c_void_p),
        ("context", c_void_p),
    ]


class MemInfo(ctypes.Structure):
    """``cuhook_mem_info_t``: the event's fields, then ``seq``."""

    _fields_ = [("ev", MemEvent), ("seq", c_uint64)]


class QueuedEvent(ctypes.Structure):
    """``cuhook_queued_event_t``."""

    _fields_ = [("ev", MemEvent), ("event", c_int), ("tid", c_int), ("time_ns", c_uint64)]


class CStats(ctypes.Structure):
    """``cuhook_stats_t``."""

    _fields_ = [
        ("live", c_size_t),
        ("live_bytes", c_size_t),
        ("missed_frees", c_uint64),
        ("unknown_frees", c_uint64),
        ("failed_frees", c_uint64),
        ("untracked", c_uint64),
    ]


class CUsage(ctypes.Structure):
    """``cuhook_usage_t``."""

    _fields_ = [("mem_type", c_int), ("device", c_int), ("live", c_uint64), ("peak", c_uint64)]


class CQueueStats(ctypes.Structure):
    """``cuhook_queue_stats_t``."""

    _fields_ = [("queued", c_uint64), ("dropped", c_uint64), ("popped", c_uint64)]


assert ctypes.sizeof(MemInfo) == 72 and ctypes.sizeof(QueuedEvent) == 80
assert ctypes.sizeof(CStats) == 48 and ctypes.sizeof(CUsage) == 24

# name: (restype, argtypes)
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "cuhook_strerror": (c_void_p, [c_int]),
    "cuhook_lookup": (c_int, [c_void_p, c_size_t, c_void_p]),
    "cuhook_classify": (c_int, [c_void_p, c_void_p]),
    "cuhook_installation_open": (c_int, [ctypes.POINTER(c_uint64)]),
    "cuhook_installation_close": (c_int, [c_uint64]),
    "cuhook_installed": (c_int, []),
    "cuhook_live": (c_ssize_t, [c_void_p, c_size_t]),
    "cuhook_usage": (c_ssize_t, [c_void_p, c_size_t]),
    "cuhook_report": (c_ssize_t, [c_void_p, c_size_t]),
    "cuhook_stats": (c_int, [ctypes.POINTER(CStats)]),
    "cuhook_trace_open": (c_int, [ctypes.c_char_p, ctypes.POINTER(c_void_p)]),
    "cuhook_trace_close": (c_int, [c_void_p]),
    "cuhook_queue_open": (c_int, [c_int, c_size_t, ctypes.POINTER(c_void_p)]),
    "cuhook_queue_pop": (c_ssize_t, [c_void_p, c_void_p, c_size_t, c_int]),
    "cuhook_queue_interrupt": (c_int, [c_void_p]),
    "cuhook_queue_stats": (c_int, [c_void_p, ctypes.POINTER(CQueueStats)]),
    "cuhook_queue_close": (c_int, [c_void_p]),
}


class CuhookError(RuntimeError):
    """A call into ``libcuhook.so`` failed; ``status`` is the C API's negative status."""

    def __init__(self, what: str, status: int) -> None:
        self.status = status
        super().__init__(f"{what}: {strerror(status)} (status {status})")


class _Dlinfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", c_void_p),
    ]


def _already_loaded() -> Optional[ctypes.CDLL]:
    """A libcuhook.so the process holds already, without loading anything."""
    try:
        return ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        pass
    everything = ctypes.CDLL(None)
    try:
        everything.cuhook_install  # a copy in the global scope under another name
    except AttributeError:
        return None
    return everything


def _load_disabled(path: str) -> ctypes.CDLL:
    """Load ``path`` with its constructor told to do nothing (CUHOOK_DISABLE=1)."""
    old = os.environ.get("CUHOOK_DISABLE")
    os.environ["CUHOOK_DISABLE"] = "1"
    try:
        return ctypes.CDLL(path)
    finally:
        if old is None:
            del os.environ["CUHOOK_DISABLE"]
        else:
            os.environ["CUHOOK_DISABLE"] = old


def _load() -> tuple[ctypes.CDLL, bool]:
    lib = _already_loaded()
    if lib is not None:
        return lib, True
    path = os.environ.get("CUHOOK_LIB") or BUNDLED_LIB
    if not os.path.isfile(path):
        raise ImportError(
            f"cuhook: no libcuhook.so is loaded in this process and {path} does not exist "
            "(install the package with pip, or set CUHOOK_LIB=/path/to/libcuhook.so)"
        )
    return _load_disabled(path), False


LIB, PRELOADED = _load()


def _missing(name: str) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise CuhookError(
            f"{name} is not in the libcuhook.so loaded in this process ({library_path()}): "
            "an older release",
            -8,
        )

    return call


def function(name: str) -> Any:
    """The C function ``name`` with its types set (a stub that raises when it is missing)."""
    restype, argtypes = SIGNATURES[name]
    try:
        f = getattr(LIB, name)
    except AttributeError:
        return _missing(name)
    f.restype = restype
    f.argtypes = argtypes
    return f


def strerror(status: int) -> str:
    """The C API's message for a status."""
    p = _strerror(status)
    return ctypes.string_at(p).decode() if p else f"status {status}"


_strerror = function("cuhook_strerror")


def library_path() -> str:
    """The file of the libcuhook.so this package talks to (a preloaded one, or the bundled)."""
    info = _Dlinfo()
    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [c_void_p, ctypes.POINTER(_Dlinfo)]
    address = ctypes.cast(LIB.cuhook_install, c_void_p).value
    if not libdl.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return ""
    name: bytes = info.dli_fname
    return os.path.realpath(name.decode(errors="replace"))


API_NAMES: dict[int, str] = {}


def api_name(address: Optional[int]) -> str:
    """The API name at ``address`` (a static string of the serving library), cached."""
    if not address:
        return ""
    name = API_NAMES.get(address)
    if name is None:
        name = ctypes.string_at(address).decode(errors="replace")
        API_NAMES[address] = name
    return name


def nonblocking(name: str) -> Any:
    """``function(name)`` called without releasing the GIL: only for functions that never
    block and never call back into Python."""
    restype, argtypes = SIGNATURES[name]
    try:
        address = ctypes.cast(getattr(LIB, name), c_void_p).value
    except AttributeError:
        return _missing(name)
    return ctypes.PYFUNCTYPE(restype, *argtypes)(address or 0)


def address_of(name: str) -> int:
    """The address of the C function ``name`` (0 when the library lacks it)."""
    try:
        return ctypes.cast(getattr(LIB, name), c_void_p).value or 0
    except AttributeError:
        return 0
