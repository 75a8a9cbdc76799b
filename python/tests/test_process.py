"""Whole processes: the wheel's command (`cuhook`, `python -m cuhook`), one engine under
`cuhook run` and LD_PRELOAD, and what `import cuhook` does to a process by itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cuhook
from conftest import fixtures_dir

BIN = os.path.dirname(sys.executable)
CONSOLE = os.path.join(BIN, "cuhook")

# A program that allocates on the fake runtime, then asks the package about it.
PROGRAM = r"""
import ctypes, os, sys
import cuhook
F = os.environ["FAKE_CUDA"]
print("preloaded", cuhook.preloaded(), "installed", cuhook.installed())
print("library", cuhook.library_path())
ctypes.CDLL(F + "/libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL(F + "/libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), 5 << 20) == 0
a = cuhook.lookup(p.value)
print("lookup", a.size if a else None, a.api if a else None)
print("uninstall", cuhook.uninstall(), "still", cuhook.installed())
"""


def run(args, **env):
    e = dict(os.environ, FAKE_CUDA=fixtures_dir(), **env)
    e.pop("CUHOOK_LIB", None)
    return subprocess.run(args, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)


def lines(out):
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_wheel_carries_the_command_and_the_library():
    for path in (cuhook._native.BUNDLED_LIB, cuhook._native.BUNDLED_CLI):
        assert os.access(path, os.X_OK), path
    assert os.path.isfile(os.path.join(os.path.dirname(cuhook.__file__), "py.typed"))


def test_import_alone_installs_nothing():
    r = run([sys.executable, "-c", "import os, cuhook; print(cuhook.installed(), "
             "cuhook.preloaded(), 'CUHOOK_DISABLE' in os.environ)"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "False"]


def test_a_preloaded_library_is_the_one_engine(tmp_path):
    lib = cuhook._native.BUNDLED_LIB
    report = tmp_path / "r.txt"
    r = run([sys.executable, "-c", PROGRAM], LD_PRELOAD=lib, CUHOOK_REPORT=str(report))
    assert r.returncode == 0, r.stderr
    out = lines(r.stdout)
    # The constructor of the preloaded copy installed; the package talks to that copy.
    assert out["preloaded"] == "True installed True"
    assert os.path.samefile(out["library"], lib)
    assert out["lookup"] == "5242880 cudaMalloc"
    # uninstall() only undoes the package's own installation: the preload's hooks stay.
    assert out["uninstall"] == "False still True"
    # The preloaded copy's exit report saw the allocation the package looked up: one registry.
    text = report.read_text()
    assert "cudaMalloc" in text and "5.0 MiB" in text


@pytest.mark.parametrize("command", ["console", "module"])
def test_cuhook_run_preloads_the_bundled_library_and_import_cuhook_uses_it(command, tmp_path):
    report = tmp_path / "r.txt"
    trace = tmp_path / "t.jsonl"
    head = [CONSOLE] if command == "console" else [sys.executable, "-m", "cuhook"]
    r = run(head + ["run", "--report", str(report), "--trace", str(trace), "--",
                    sys.executable, "-c", PROGRAM])
    assert r.returncode == 0, r.stderr
    out = lines(r.stdout)
    assert out["preloaded"] == "True installed True"
    assert os.path.samefile(out["library"], cuhook._native.BUNDLED_LIB)
    assert out["lookup"] == "5242880 cudaMalloc"
    assert "cudaMalloc" in report.read_text()
    assert '"api":"cudaMalloc"' in trace.read_text()


def test_the_command_has_the_rust_cli_subcommands():
    console = run([CONSOLE, "symbols"])
    module = run([sys.executable, "-m", "cuhook", "symbols"])
    binary = run([cuhook._native.BUNDLED_CLI, "symbols"])
    assert console.returncode == module.returncode == binary.returncode == 0
    assert console.stdout == module.stdout == binary.stdout
    assert "cuMemAllocAsync" in console.stdout
    bad = run([CONSOLE, "no-such-subcommand"])
    assert bad.returncode != 0 and bad.returncode == run(
        [cuhook._native.BUNDLED_CLI, "no-such-subcommand"]).returncode



def test_a_copy_loaded_by_a_host_library_is_found_too():
    # Loaded locally (RTLD_LOCAL, as the dependency of an extension module would be): not in
    # the global scope, found by its soname. Its constructor installed the hooks.
    program = (
        "import ctypes\n"
        f"ctypes.CDLL({cuhook._native.BUNDLED_LIB!r}, mode=ctypes.RTLD_LOCAL)\n"
        "import cuhook\n"
        "print(cuhook.preloaded(), cuhook.installed(), cuhook.library_path())\n"
    )
    r = run([sys.executable, "-c", program])
    assert r.returncode == 0, r.stderr
    preloaded, installed, path = r.stdout.split()
    assert (preloaded, installed) == ("True", "True")
    assert os.path.samefile(path, cuhook._native.BUNDLED_LIB)
