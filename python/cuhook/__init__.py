"""cuhook for Python: see every CUDA allocation and free in this process, and ask which
allocation any pointer (an int, a PyTorch tensor, a CuPy/Numba array, a DLPack producer such as
a JAX array) belongs to.

>>> import cuhook
>>> cuhook.install()                     # patch every loaded library, start the registry
>>> a = cuhook.lookup(tensor)            # Allocation(start, size, mem_type, device, api, ...)
>>> with cuhook.trace("t.jsonl"):        # the JSON-lines trace of that block
...     step()
>>> sub = cuhook.subscribe(print)        # events, delivered by a thread of ours

The package drives ``libcuhook.so`` through its C API (``include/cuhook.h``). One engine per
process: when a ``libcuhook.so`` is already loaded (``cuhook run``, ``LD_PRELOAD``), that copy
is used, so a program run under ``cuhook run`` and its own ``import cuhook`` share one set of
hooks and one registry. See docs/python.md.
"""

from __future__ import annotations

import atexit
import ctypes
import enum
import importlib
import logging
import os
import struct
import threading
from types import TracebackType
from typing import Any, Callable, NamedTuple, Optional, Union

from . import _native
from ._native import CuhookError, library_path

__all__ = [
    "ALL",
    "Allocation",
    "CuhookError",
    "Event",
    "EventKind",
    "Flags",
    "Installation",
    "MemType",
    "Stats",
    "Subscription",
    "Trace",
    "Usage",
    "install",
    "installed",
    "library_path",
    "live",
    "lookup",
    "preloaded",
    "report",
    "stats",
    "subscribe",
    "trace",
    "uninstall",
]

__version__ = "0.1.0"

log = logging.getLogger("cuhook")


class MemType(enum.IntEnum):
    """What kind of memory an allocation is (``CUHOOK_MEM_TYPE_*``)."""

    HOST = 0
    """Pinned or registered host memory."""
    CUDA = 1
    """Device memory."""
    CUDA_MANAGED = 2
    """Managed (unified) memory."""
    UNKNOWN = 3


class Flags(enum.IntFlag):
    """How an allocation was made (``CUHOOK_FLAG_*``)."""

    STREAM_ORDERED = 1 << 0
    POOL = 1 << 1
    VMM = 1 << 2
    PINNED_HOST = 1 << 3
    REGISTERED = 1 << 4
    EXISTING = 1 << 5
    PURGED = 1 << 6
    GLOBAL = 1 << 7
    IMPORTED = 1 << 8
    GRAPH = 1 << 9


class EventKind(enum.IntFlag):
    """Event kinds, combinable for :func:`subscribe`'s ``events``."""

    ALLOC = 1
    FREE = 2


ALL = EventKind.ALLOC | EventKind.FREE
_MEM_TYPES = (MemType.HOST, MemType.CUDA, MemType.CUDA_MANAGED, MemType.UNKNOWN)


def _mem_type(value: int) -> MemType:
    return _MEM_TYPES[value] if 0 <= value < 4 else MemType.UNKNOWN


class Allocation(NamedTuple):
    """One registered allocation: ``[start, start + size)``."""

    start: int
    """First byte."""
    size: int
    """Bytes, as the allocating call asked for."""
    mem_type: MemType
    device: int
    """Device ordinal; -1 when unknown."""
    api: str
    """The API the program called, e.g. ``"cudaMallocAsync"``."""
    flags: int
    """:class:`Flags` bits."""
    seq: int
    """Grows with every registration: an address handed out again gets a new ``seq``."""

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.start + self.size

    def __contains__(self, address: object) -> bool:
        return isinstance(address, int) and self.start <= address < self.start + self.size


class Event(NamedTuple):
    """One allocation or free, as :func:`subscribe` delivers it."""

    kind: EventKind
    address: int
    size: int
    """Alloc: as requested. Free: the registry's record (0 when unknown)."""
    mem_type: MemType
    device: int
    api: str
    flags: int
    stream: int
    pool: int
    tid: int
    """The thread that allocated or freed."""
    time_ns: int
    """Wall-clock time, ns since the Unix epoch."""


class Usage(NamedTuple):
    """Live and peak bytes of one memory type on one device (-1: host or unknown)."""

    mem_type: MemType
    device: int
    live: int
    peak: int


class Stats(NamedTuple):
    """The registry's counters, and live/peak bytes per memory type and device."""

    live: int
    """Allocations registered now."""
    live_bytes: int
    missed_frees: int
    """Registrations over a live range (a free cuhook did not see)."""
    unknown_frees: int
    """Frees of pointers allocated before the hooks were installed."""
    failed_frees: int
    untracked: int
    """Allocations not registered because the memory to record them could not be had."""
    usage: tuple[Usage, ...]
    """Counted from the first :func:`install` (or the preloaded library's report)."""


def _check(what: str, status: int) -> int:
    if status < 0:
        raise CuhookError(what, status)
    return status


# ---------------------------------------------------------------------------- installing

_c_open = _native.function("cuhook_installation_open")
_c_close = _native.function("cuhook_installation_close")
_c_installed = _native.function("cuhook_installed")
_install_lock = threading.Lock()
_installation: Optional[int] = None  # the id of the package's installation
c_uint64 = ctypes.c_uint64


class Installation:
    """What :func:`install` returns. As a context manager it puts back the state it found:
    leaving the ``with`` block uninstalls only when this :func:`install` was the one that
    installed."""

    def __init__(self, made: bool) -> None:
        self.made = made
        """Whether this call installed (False: the package's installation was there)."""

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self.made:
            uninstall()

    def __repr__(self) -> str:
        return f"<cuhook.Installation made={self.made}>"


def install() -> Installation:
    """Install the CUDA hooks and the registry (every loaded library is patched, and every
    library loaded later), and start the report's counters. Idempotent: a second call does
    nothing more. Usable as ``with cuhook.install(): ...``.

    The package's installation is counted with any other (``cuhook run``'s, a library's):
    :func:`uninstall` removes only the package's, so hooks someone else installed stay.
    """
    global _installation
    with _install_lock:
        if _installation is not None:
            return Installation(False)
        ident = c_uint64()
        _check("install", _c_open(ctypes.byref(ident)))
        _installation = ident.value
        return Installation(True)


def uninstall() -> bool:
    """Undo :func:`install`. Returns False when the package had not installed. When no other
    installation holds the hooks, every patched slot is put back and the registry emptied."""
    global _installation
    with _install_lock:
        if _installation is None:
            return False
        ident, _installation = _installation, None
        _check("uninstall", _c_close(ident))
        return True


def installed() -> bool:
    """Whether the CUDA hooks are installed in this process (by this package or anyone)."""
    return bool(_c_installed())


def preloaded() -> bool:
    """Whether the library was already loaded when the package was imported (``cuhook run``,
    ``LD_PRELOAD``): then its installation, report and trace are the process's own."""
    return _native.PRELOADED


# ---------------------------------------------------------------------------- lookups

# The ctypes path (the C extension's lookup is used when the wheel has it). cuhook_lookup is
# lock-free and never blocks (tens of ns): called without releasing the GIL (a PYFUNCTYPE),
# which saves the release and the re-acquisition; it writes into a buffer of the calling
# thread's own.
_c_lookup = _native.nonblocking("cuhook_lookup")
_tls = threading.local()
# cuhook_mem_info_t as read back: address, size, mem_type, device, flags, api, seq.
_unpack_info = struct.Struct("QQiiI4xQ24xQ").unpack_from
assert struct.calcsize("QQiiI4xQ24xQ") == ctypes.sizeof(_native.MemInfo)
_new_tuple = tuple.__new__


def _info_buffer() -> tuple[bytearray, int]:
    """This thread's buffer for cuhook_lookup, and its address."""
    buf = bytearray(ctypes.sizeof(_native.MemInfo))
    pair = (buf, ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)))
    _tls.info = pair
    return pair


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_address(obj: Any) -> int:
    """The first byte of a DLPack producer's data (``data + byte_offset``). The capsule is
    read, not consumed: its destructor gives the tensor back."""
    capsule = obj.__dlpack__()
    name = _capsule_name(capsule)
    if name == b"dltensor":
        managed: Any = _DLManagedTensor.from_address(_capsule_pointer(capsule, name))
    elif name == b"dltensor_versioned":
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, name))
    else:
        raise TypeError(f"__dlpack__ returned a capsule named {name!r}, not a DLPack tensor")
    tensor = managed.dl_tensor
    return int(tensor.data or 0) + int(tensor.byte_offset)


def _address_of(x: Any) -> int:
    """The address an object points at (see :func:`lookup`)."""
    if isinstance(x, bool):
        raise TypeError("cuhook.lookup: a bool is not an address")
    if isinstance(x, int):
        return int(x)
    if isinstance(x, ctypes.c_void_p):
        return x.value or 0
    data_ptr = getattr(x, "data_ptr", None)
    if callable(data_ptr):  # PyTorch
        return int(data_ptr())
    cai = getattr(x, "__cuda_array_interface__", None)
    if isinstance(cai, dict):  # CuPy, Numba
        return int(cai["data"][0] or 0)
    if callable(getattr(x, "__dlpack__", None)):  # JAX and every DLPack producer
        return _dlpack_address(x)
    raise TypeError(
        f"cuhook.lookup: cannot tell where a {type(x).__name__} points (give an int address, "
        "or an object with data_ptr(), __cuda_array_interface__ or __dlpack__)"
    )


_api_names = _native.API_NAMES


def _lookup_ctypes(x: Any) -> Optional[Allocation]:
    """The allocation that contains ``x``, from the registry alone (no driver call), or None.

    ``x`` is an int address, a ``ctypes.c_void_p``, an object with ``data_ptr()`` (a PyTorch
    tensor), with ``__cuda_array_interface__`` (CuPy, Numba), or a DLPack producer
    (``__dlpack__``: JAX). Anything else raises ``TypeError``; an int outside 0..2**64-1
    raises ``ValueError``. A freed address gives None. (PyTorch's caching allocator carves
    tensors out of larger blocks: the allocation found is the block that holds the tensor.)
    """
    if type(x) is not int:
        x = _address_of(x)
    if not 0 <= x < 18446744073709551616:
        raise ValueError(f"cuhook.lookup: {x} is not an address")
    try:
        buf, where = _tls.info
    except AttributeError:
        buf, where = _info_buffer()
    if _c_lookup(x, 0, where):
        return None
    start, size, mem_type, device, flags, api, seq = _unpack_info(buf)
    name = _api_names.get(api)
    if name is None:
        name = _native.api_name(api)
    return _new_tuple(
        Allocation, (start, size, _MEM_TYPES[mem_type & 3], device, name, flags, seq)
    )


def _speedups_module() -> Any:
    """cuhook/_speedups.c, the C lookup, when the wheel has it (None: ctypes alone)."""
    try:
        return importlib.import_module("._speedups", __name__)
    except ImportError:  # built without a C compiler, or not CPython
        return None


_speedups = _speedups_module()
_lookup_address = _native.address_of("cuhook_lookup")
lookup: Callable[[Any], Optional[Allocation]]
if _speedups is not None and _lookup_address:
    # The same contract; an exact int is looked up in C, anything else by _lookup_ctypes.
    _speedups.setup(_lookup_address, Allocation, _MEM_TYPES, _lookup_ctypes)
    lookup = _speedups.lookup
else:
    lookup = _lookup_ctypes


def _allocation(info: _native.MemInfo) -> Allocation:
    ev = info.ev
    return Allocation(
        ev.address or 0, ev.size, _mem_type(ev.mem_type), ev.device,
        _native.api_name(ev.api), ev.flags, info.seq,
    )


_c_live = _native.function("cuhook_live")


def live() -> list[Allocation]:
    """Every allocation the registry holds now, in address order."""
    room = 64
    while True:
        buf = (_native.MemInfo * room)()
        n = _check("live", _c_live(buf, room))
        if n <= room:
            return [_allocation(buf[i]) for i in range(n)]
        room = n + n // 4 + 16


_c_stats = _native.function("cuhook_stats")
_NOT_INSTALLED = -4
_c_usage = _native.function("cuhook_usage")


def stats() -> Stats:
    """The registry's counters now, with live and peak bytes per memory type and device."""
    s = _native.CStats()
    _check("stats", _c_stats(ctypes.byref(s)))
    room = 16
    while True:
        rows = (_native.CUsage * room)()
        n = _c_usage(rows, room)
        if n == _NOT_INSTALLED:  # another copy of cuhook serves the process: no peaks here
            n = 0
        _check("stats", n)
        if n <= room:
            break
        room = n
    usage = tuple(Usage(_mem_type(r.mem_type), r.device, r.live, r.peak) for r in rows[:n])
    return Stats(
        s.live, s.live_bytes, s.missed_frees, s.unknown_frees, s.failed_frees, s.untracked, usage
    )


_c_report = _native.function("cuhook_report")


def report() -> str:
    """The exit report as it would be written now (``cuhook run``'s report): calls and bytes
    per API, live and peak bytes, the allocations still live, what was hooked, warnings."""
    room = 1 << 14
    while True:
        buf = ctypes.create_string_buffer(room)
        n = _check("report", _c_report(buf, room))
        if n < room:
            return buf.raw[:n].decode(errors="replace")
        room = n + 4096


# ---------------------------------------------------------------------------- traces

_c_trace_open = _native.function("cuhook_trace_open")
_c_trace_close = _native.function("cuhook_trace_close")


class Trace:
    """An open trace (see :func:`trace`); a context manager, or call :meth:`close`."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = os.fspath(path)
        handle = ctypes.c_void_p()
        _check(f"trace {self.path}", _c_trace_open(os.fsencode(self.path), ctypes.byref(handle)))
        self._handle: Optional[int] = handle.value

    def close(self) -> None:
        """Stop writing; when this returns no line is written any more. Idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _check("trace close", _c_trace_close(handle))

    def __enter__(self) -> Trace:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def trace(path: Union[str, "os.PathLike[str]"]) -> Trace:
    """Write one JSON line per event to ``path`` (appended; ``%p`` becomes the process id,
    ``%r`` the MPI rank) until the ``with`` block ends or :meth:`Trace.close`. The lines are
    those of ``CUHOOK_TRACE`` (``cuhook view`` draws them). Does not install the hooks."""
    return Trace(path)


# ---------------------------------------------------------------------------- events

_c_queue_open = _native.function("cuhook_queue_open")
_c_queue_pop = _native.function("cuhook_queue_pop")
_c_queue_interrupt = _native.function("cuhook_queue_interrupt")
_c_queue_stats = _native.function("cuhook_queue_stats")
_c_queue_close = _native.function("cuhook_queue_close")
_BATCH = 256
_subscriptions: set[Subscription] = set()
_subscriptions_lock = threading.Lock()


class Subscription:
    """A callback receiving events (see :func:`subscribe`). A context manager; or call
    :meth:`close`."""

    def __init__(self, callback: Callable[[Event], Any], events: int, capacity: int) -> None:
        if not callable(callback):
            raise TypeError("cuhook.subscribe: the callback is not callable")
        if not isinstance(events, int) or events & ~int(ALL) or not events & int(ALL):
            raise ValueError("cuhook.subscribe: events must be EventKind.ALLOC and/or EventKind.FREE")
        if not isinstance(capacity, int) or not 1 <= capacity <= 1 << 24:
            raise ValueError("cuhook.subscribe: capacity must be 1 to 2**24")
        self.callback = callback
        self.delivered = 0
        """Events handed to the callback so far."""
        self.errors = 0
        """Calls of the callback that raised."""
        self.first_error: Optional[BaseException] = None
        """The first exception the callback raised (logged once, on the "cuhook" logger)."""
        self._done = threading.Condition()
        self._closing = False
        install()
        handle = ctypes.c_void_p()
        _check("subscribe", _c_queue_open(int(events), capacity, ctypes.byref(handle)))
        self._queue: Optional[int] = handle.value
        self._thread = threading.Thread(target=self._run, name="cuhook-events", daemon=True)
        with _subscriptions_lock:
            _subscriptions.add(self)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Events lost because the queue was full (the callback did not keep up)."""
        return int(self._counts().dropped)

    def _counts(self) -> _native.CQueueStats:
        s = _native.CQueueStats()
        if self._queue is not None:
            _check("subscription", _c_queue_stats(self._queue, ctypes.byref(s)))
        return s

    def _run(self) -> None:
        buf = (_native.QueuedEvent * _BATCH)()
        queue = self._queue
        while not self._closing:
            n = _c_queue_pop(queue, buf, _BATCH, -1)
            if n < 0:
                log.error("cuhook: reading events failed: %s", _native.strerror(n))
                break
            for i in range(n):
                if self._closing:
                    break
                q = buf[i]
                ev = q.ev
                event = Event(
                    EventKind(q.event), ev.address or 0, ev.size, _mem_type(ev.mem_type),
                    ev.device, _native.api_name(ev.api), ev.flags, ev.stream or 0,
                    ev.pool or 0, q.tid, q.time_ns,
                )
                try:
                    self.callback(event)
                except Exception as e:  # reported once; delivery goes on
                    self.errors += 1
                    if self.first_error is None:
                        self.first_error = e
                        log.error(
                            "cuhook: the subscriber %r raised (reported once; events are still "
                            "delivered to it)", self.callback, exc_info=e,
                        )
            with self._done:
                self.delivered += n
                self._done.notify_all()
        if threading.current_thread() is self._thread and self._closing_from_callback:
            self._free()

    _closing_from_callback = False

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every event queued before this call has been delivered (or dropped).
        Returns False when ``timeout`` seconds passed first."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("cuhook: flush() from inside the subscriber would wait for itself")
        target = self._counts().queued
        with self._done:
            return self._done.wait_for(
                lambda: self.delivered >= target or self._queue is None, timeout
            )

    def close(self) -> None:
        """Stop delivering: after this returns the callback is not called again (from inside
        the callback: after it returns). Idempotent."""
        if self._queue is None or self._closing:
            return
        self._closing = True
        if threading.current_thread() is self._thread:
            self._closing_from_callback = True  # the thread frees the queue on its way out
            return
        _c_queue_interrupt(self._queue)
        self._thread.join()
        self._free()

    def _restart_in_child(self) -> None:
        """In a forked child: the delivery thread is the parent's and does not exist here; the
        queue does (the hooks of the child fill it). A thread of the child's own takes over."""
        self._done = threading.Condition()
        if self._queue is None or self._closing:
            return
        self._thread = threading.Thread(target=self._run, name="cuhook-events", daemon=True)
        self._thread.start()

    def _free(self) -> None:
        queue, self._queue = self._queue, None
        with _subscriptions_lock:
            _subscriptions.discard(self)
        if queue is not None:
            _check("unsubscribe", _c_queue_close(queue))
        with self._done:
            self._done.notify_all()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._queue is None else "open"
        return f"<cuhook.Subscription {self.callback!r} {state} delivered={self.delivered}>"


def subscribe(
    callback: Callable[[Event], Any], events: int = ALL, capacity: int = 1 << 16
) -> Subscription:
    """Call ``callback(event)`` for every allocation and free (``events``: ``EventKind.ALLOC``
    and/or ``EventKind.FREE``), installing the hooks if needed.

    No Python runs inside a hook: the hook copies each event into a bounded queue of
    ``capacity`` events, and a thread of the subscription calls ``callback`` in order. When the
    callback does not keep up and the queue is full, events are dropped and counted
    (:attr:`Subscription.dropped`); the allocating thread never waits. An exception the
    callback raises is logged once (logger ``"cuhook"``), counted, and delivery goes on.
    """
    return Subscription(callback, events, capacity)


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock when it forked.
    global _subscriptions_lock
    _subscriptions_lock = threading.Lock()
    for s in list(_subscriptions):
        s._restart_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_subscriptions() -> None:
    with _subscriptions_lock:
        open_ones = list(_subscriptions)
    for s in open_ones:
        try:
            s.close()
        except Exception:
            pass
