"""The Python API on the fake CUDA driver: lookups of every kind of pointer holder, live(),
stats(), report(), the install/uninstall pair and its context manager, bad input."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

import cuhook
from cuhook import Flags, MemType

MiB = 1 << 20


# ------------------------------------------------------------------------ lookups


def test_a_runtime_allocation_is_found_with_its_exact_range_and_gone_after_free(installed):
    p = installed.malloc(3 * MiB)
    a = cuhook.lookup(p)
    assert a == cuhook.Allocation(p, 3 * MiB, MemType.CUDA, 0, "cudaMalloc", 0, a.seq)
    assert a.seq > 0 and a.end == p + 3 * MiB and p + 5 in a and a.end not in a
    assert cuhook.lookup(p + 3 * MiB - 1) == a          # the last byte
    after = cuhook.lookup(p + 3 * MiB)                   # one past: not this allocation
    assert after is None or after.start == p + 3 * MiB
    installed.free(p)
    assert cuhook.lookup(p) is None
    assert cuhook.lookup(p + MiB) is None


def test_stream_ordered_and_managed_memory_carry_their_kind(installed):
    s = installed.stream()
    p = installed.malloc_async(MiB, s)
    m = installed.malloc_managed(2 * MiB)
    a = cuhook.lookup(p)
    assert (a.start, a.size, a.api) == (p, MiB, "cudaMallocAsync")
    assert a.flags & Flags.STREAM_ORDERED and a.mem_type == MemType.CUDA
    b = cuhook.lookup(m)
    assert (b.start, b.size, b.mem_type, b.api) == (m, 2 * MiB, MemType.CUDA_MANAGED,
                                                    "cudaMallocManaged")
    installed.free_async(p, s)
    installed.free(m)
    assert cuhook.lookup(p) is None and cuhook.lookup(m) is None


def test_a_reused_address_gets_a_new_seq(installed):
    p = installed.malloc(MiB)
    first = cuhook.lookup(p).seq
    installed.free(p)
    q = installed.malloc(MiB)
    assert cuhook.lookup(q).seq > first
    installed.free(q)


class Tensor:
    """What PyTorch offers: data_ptr()."""

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class CudaArray:
    """What CuPy and Numba offer: __cuda_array_interface__."""

    def __init__(self, address: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (16,), "typestr": "<f4", "data": (address, False), "version": 3,
        }


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR, _DLTENSOR_VERSIONED = b"dltensor", b"dltensor_versioned"


class DLPackArray:
    """What JAX offers: __dlpack__ / __dlpack_device__ (a real PyCapsule of a DLPack struct,
    legacy or versioned, with a byte offset)."""

    def __init__(self, address: int, byte_offset: int, versioned: bool) -> None:
        self.managed = (DLManagedTensorVersioned if versioned else DLManagedTensor)()
        if versioned:
            self.managed.major = 1
        t = self.managed.dl_tensor
        t.data, t.byte_offset, t.ndim = address, byte_offset, 1
        t.device.device_type, t.device.device_id = 2, 0   # kDLCUDA, device 0
        self.name = _DLTENSOR_VERSIONED if versioned else _DLTENSOR

    def __dlpack__(self, stream=None, max_version=None):
        return _capsule_new(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("holder", ["int", "c_void_p", "torch", "cuda_array_interface",
                                    "dlpack", "dlpack_versioned"])
def test_every_kind_of_pointer_holder_is_looked_up(installed, holder):
    p = installed.malloc(MiB)
    inside = p + 4096
    x = {
        "int": lambda: inside,
        "c_void_p": lambda: ctypes.c_void_p(inside),
        "torch": lambda: Tensor(inside),
        "cuda_array_interface": lambda: CudaArray(inside),
        "dlpack": lambda: DLPackArray(p, 4096, versioned=False),
        "dlpack_versioned": lambda: DLPackArray(p, 4096, versioned=True),
    }[holder]()
    a = cuhook.lookup(x)
    assert a is not None and (a.start, a.size, a.api) == (p, MiB, "cudaMalloc")
    installed.free(p)
    assert cuhook.lookup(x) is None


def test_host_memory_and_null_are_not_found(installed):
    buf = ctypes.create_string_buffer(4096)
    assert cuhook.lookup(ctypes.addressof(buf)) is None
    assert cuhook.lookup(0) is None
    assert cuhook.lookup(ctypes.c_void_p()) is None
    assert cuhook.lookup(Tensor(0)) is None


@pytest.mark.parametrize("bad", [None, "x", b"\x00", 1.5, object(), True, [1], {"data": 1}])
def test_what_is_not_an_address_is_a_type_error(bad):
    with pytest.raises(TypeError):
        cuhook.lookup(bad)


@pytest.mark.parametrize("bad", [-1, 1 << 64, -(1 << 70)])
def test_an_int_outside_the_address_space_is_a_value_error(bad):
    with pytest.raises(ValueError):
        cuhook.lookup(bad)


def test_a_capsule_that_is_not_dlpack_is_a_type_error():
    class Odd:
        def __dlpack__(self):
            return _capsule_new(ctypes.addressof(ctypes.c_int(0)), b"not_dlpack", None)

    with pytest.raises(TypeError):
        cuhook.lookup(Odd())


# ------------------------------------------------------------------------ the registry whole


def test_live_lists_exactly_the_allocations_held(installed):
    before = {a.start for a in cuhook.live()}
    ps = [installed.malloc((i + 1) * MiB) for i in range(3)]
    now = cuhook.live()
    assert [a.start for a in now] == sorted(a.start for a in now)      # address order
    mine = {a.start: a for a in now if a.start not in before}
    assert {p: (mine[p].size, mine[p].api) for p in mine} == {
        p: ((i + 1) * MiB, "cudaMalloc") for i, p in enumerate(ps)}
    installed.free(ps[1])
    assert {a.start for a in cuhook.live()} - before == {ps[0], ps[2]}
    installed.free(ps[0])
    installed.free(ps[2])
    assert {a.start for a in cuhook.live()} == before


def test_live_grows_its_buffer_past_64_allocations(installed):
    ps = [installed.malloc(4096) for _ in range(100)]
    starts = {a.start for a in cuhook.live()}
    assert set(ps) <= starts
    for p in ps:
        installed.free(p)
    assert not set(ps) & {a.start for a in cuhook.live()}


def test_stats_count_live_bytes_and_peaks(installed):
    s0 = cuhook.stats()
    p = installed.malloc(5 * MiB)
    s1 = cuhook.stats()
    assert (s1.live - s0.live, s1.live_bytes - s0.live_bytes) == (1, 5 * MiB)
    cuda0 = [u for u in s1.usage if (u.mem_type, u.device) == (MemType.CUDA, 0)]
    assert len(cuda0) == 1 and cuda0[0].peak >= cuda0[0].live >= 5 * MiB
    installed.free(p)
    s2 = cuhook.stats()
    assert (s2.live, s2.live_bytes) == (s0.live, s0.live_bytes)
    assert s2.missed_frees == s0.missed_frees


def test_report_is_the_exit_report_with_the_calls_made(installed):
    p = installed.malloc(7 * MiB)
    text = cuhook.report()
    assert text.startswith(f"==== cuhook report (pid {os.getpid()}) ====")
    calls = [line.split() for line in text.splitlines() if line.strip().startswith("cudaMalloc ")]
    assert calls and int(calls[0][1]) >= 1
    assert "Live allocations at exit" in text and "Hooked:" in text
    assert f"{p:#x}" in text                     # listed among the live allocations
    installed.free(p)
    assert f"{p:#x}" not in cuhook.report()


# ------------------------------------------------------------------------ installing


def test_install_twice_is_one_installation_and_the_context_manager_restores(cuda):
    cuhook.install()
    again = cuhook.install()                     # no error, nothing more
    assert again.made is False and cuhook.installed()
    assert cuhook.uninstall() is True            # one uninstall undoes it: it was one
    assert not cuhook.installed()
    assert cuhook.uninstall() is False           # nothing of ours left
    p = cuda.malloc(MiB)                         # not seen: no hooks
    assert cuhook.lookup(p) is None
    with cuhook.install() as inst:
        assert inst.made and cuhook.installed()
        q = cuda.malloc(MiB)
        assert cuhook.lookup(q).size == MiB
        with cuhook.install() as inner:          # already installed: leaves it so
            assert not inner.made
        assert cuhook.installed()
        cuda.free(q)
    assert not cuhook.installed()
    cuda.free(p)
    cuhook.install()
    assert cuhook.installed()


def test_uninstall_empties_the_registry(cuda):
    cuhook.install()
    p = cuda.malloc(MiB)
    assert cuhook.lookup(p) is not None
    cuhook.uninstall()
    assert cuhook.lookup(p) is None and cuhook.live() == []
    cuhook.install()
    cuda.free(p)


def test_the_package_uses_the_bundled_library_when_none_is_preloaded():
    assert not cuhook.preloaded()
    assert os.path.samefile(cuhook.library_path(), os.environ.get("CUHOOK_LIB")
                            or cuhook._native.BUNDLED_LIB)
    assert "CUHOOK_DISABLE" not in os.environ    # set only for the moment of the load


# ------------------------------------------------------------------------ the C lookup


def test_the_c_lookup_and_the_ctypes_lookup_agree(installed):
    if cuhook._speedups is None:
        if os.environ.get("CUHOOK_REQUIRE_SPEEDUPS"):
            pytest.fail("the wheel was built without cuhook/_speedups.c (no compiler or headers)")
        pytest.skip("built without the C lookup")
    assert cuhook.lookup is cuhook._speedups.lookup
    p = installed.malloc(MiB)
    cases = [p, p + 100, p + MiB - 1, p + MiB, 0, 4096, (1 << 64) - 1, Tensor(p + 8),
             ctypes.c_void_p(p), CudaArray(p), DLPackArray(p, 64, versioned=True)]
    for x in cases:
        assert cuhook.lookup(x) == cuhook._lookup_ctypes(x), x
    assert cuhook.lookup(p).api == "cudaMalloc" and cuhook.lookup(p).mem_type is MemType.CUDA
    for bad, error in [(-1, ValueError), (1 << 64, ValueError), (None, TypeError),
                       ("x", TypeError), (2.0, TypeError), (False, TypeError)]:
        for f in (cuhook.lookup, cuhook._lookup_ctypes):
            with pytest.raises(error):
                f(bad)
    installed.free(p)
    assert cuhook.lookup(p) is None and cuhook._lookup_ctypes(p) is None


@pytest.mark.parametrize("path", ["lookup", "_lookup_ctypes"])
def test_lookups_from_many_threads_see_their_own_allocations(installed, path):
    look = getattr(cuhook, path)
    wrong = []

    def work():
        for _ in range(50):
            size = 4096 * (1 + threading.get_native_id() % 7)
            p = installed.malloc(size)
            for _ in range(20):
                a = look(p + size // 2)
                if a is None or (a.start, a.size) != (p, size):
                    wrong.append((p, size, a))
            installed.free(p)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
