"""The fake CUDA driver and runtime (fixtures/cuda, built by cargo into
target/release/build/cuhook-fixtures-*/out/fixtures), loaded through ctypes after
cuhook.install(), as a program loads the real ones."""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Iterator

import pytest

import cuhook

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fixtures_dir() -> str:
    """$CUHOOK_FIXTURES, else the newest fixtures directory of the cargo build."""
    named = os.environ.get("CUHOOK_FIXTURES")
    if named:
        return named
    found = glob.glob(os.path.join(ROOT, "target", "*", "build", "cuhook-fixtures-*", "out",
                                   "fixtures", "libcudart.so.13"))
    if not found:
        pytest.exit("no fake CUDA runtime: run `cargo test --release` (or `cargo build "
                    "--release --tests`) first, or set CUHOOK_FIXTURES", returncode=3)
    return os.path.dirname(max(found, key=os.path.getmtime))


class Cuda:
    """The fake runtime's allocation calls, with the statuses checked."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.driver = ctypes.CDLL(os.path.join(directory, "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
        self.rt = ctypes.CDLL(os.path.join(directory, "libcudart.so.13"))
        vp, pvp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        self.rt.cudaMalloc.argtypes = [pvp, ctypes.c_size_t]
        self.rt.cudaMallocManaged.argtypes = [pvp, ctypes.c_size_t, ctypes.c_uint]
        self.rt.cudaMallocAsync.argtypes = [pvp, ctypes.c_size_t, vp]
        self.rt.cudaFreeAsync.argtypes = [vp, vp]
        self.rt.cudaFree.argtypes = [vp]
        self.rt.cudaStreamCreate.argtypes = [pvp]
        self.rt.cudaStreamSynchronize.argtypes = [vp]

    def _out(self, status: int, p: ctypes.c_void_p, what: str) -> int:
        assert status == 0, f"{what} failed with {status}"
        assert p.value
        return p.value

    def malloc(self, size: int) -> int:
        p = ctypes.c_void_p()
        return self._out(self.rt.cudaMalloc(ctypes.byref(p), size), p, "cudaMalloc")

    def malloc_managed(self, size: int) -> int:
        p = ctypes.c_void_p()
        return self._out(self.rt.cudaMallocManaged(ctypes.byref(p), size, 1), p,
                         "cudaMallocManaged")

    def stream(self) -> int:
        s = ctypes.c_void_p()
        assert self.rt.cudaStreamCreate(ctypes.byref(s)) == 0
        return s.value or 0

    def malloc_async(self, size: int, stream: int) -> int:
        p = ctypes.c_void_p()
        return self._out(self.rt.cudaMallocAsync(ctypes.byref(p), size, stream), p,
                         "cudaMallocAsync")

    def free(self, ptr: int) -> None:
        assert self.rt.cudaFree(ptr) == 0

    def free_async(self, ptr: int, stream: int) -> None:
        assert self.rt.cudaFreeAsync(ptr, stream) == 0


_cuda: Cuda | None = None


@pytest.fixture(scope="session")
def cuda() -> Iterator[Cuda]:
    """The hooks installed, then the fake CUDA libraries loaded."""
    global _cuda
    cuhook.install()
    if _cuda is None:
        _cuda = Cuda(fixtures_dir())
    yield _cuda


@pytest.fixture
def installed(cuda: Cuda) -> Cuda:
    """Each test starts installed (a test may have uninstalled)."""
    cuhook.install()
    return cuda
