"""PEP 517 build backend of the ``cuhook`` Python package (``pip install .``).

Standard library only, so ``pip install .`` needs nothing from the network to build: it runs
``cargo build --release`` for ``libcuhook.so`` and the ``cuhook`` command, strips copies of
both (``strip``, when there is one), and writes a wheel holding the Python package
(``python/cuhook``), the two files under ``cuhook/_bin/``, and the ``cuhook`` console command.

With a C compiler and this Python's headers it also builds ``cuhook/_speedups.c`` (the C
``lookup(int)``, stable ABI) and tags the wheel ``cp39-abi3-<platform>``; without, the package
reaches the library through ``ctypes`` alone and the wheel is ``py3-none-<platform>``. The ELF
files need nothing beyond glibc and libgcc_s, so ``auditwheel show`` finds the wheel
manylinux-compatible and ``auditwheel repair`` only retags it. Settings, through the environment or ``--config-settings``:

- ``CUHOOK_PREBUILT=DIR`` (or ``prebuilt=DIR``): take the files from a cargo profile directory
  (``target/release``) instead of running cargo;
- ``CARGO``, ``CARGO_TARGET_DIR``: as for cargo;
- ``CUHOOK_WHEEL_PLAT=TAG`` (or ``plat-name=TAG``): the wheel's platform tag;
- ``CUHOOK_NO_STRIP=1`` (or ``no-strip=1``): ship the files as built (~20 MB each);
- ``CUHOOK_NO_SPEEDUPS=1`` (or ``no-speedups=1``): no C lookup, a ``py3-none`` wheel.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(ROOT, "python", "cuhook")
NAME = "cuhook"
SUMMARY = (
    "See every CUDA allocation and free in a Python process (PyTorch, JAX, CuPy, ...), and "
    "which allocation any pointer belongs to"
)
REQUIRES_PYTHON = ">=3.9"
ENTRY_POINTS = "[console_scripts]\ncuhook = cuhook._cli:main\n"


def _version() -> str:
    """The crate's version (Cargo.toml), which the Python package must state too."""
    with open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8") as f:
        cargo = f.read()
    m = re.search(r'^\[package\][^\[]*?^version\s*=\s*"([^"]+)"', cargo, re.M | re.S)
    if not m:
        raise RuntimeError("cuhook_build: no [package] version in Cargo.toml")
    version = m.group(1)
    with open(os.path.join(PACKAGE_DIR, "__init__.py"), encoding="utf-8") as f:
        stated = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not stated or stated.group(1) != version:
        raise RuntimeError(
            f"cuhook_build: python/cuhook/__init__.py states __version__ "
            f"{stated.group(1) if stated else None!r}, Cargo.toml {version!r}: make them agree"
        )
    return version


def _setting(config: Optional[dict[str, Any]], key: str, env: str) -> Optional[str]:
    if config and config.get(key):
        return str(config[key])
    return os.environ.get(env) or None


def _log(message: str) -> None:
    sys.stderr.write(f"cuhook_build: {message}\n")
    sys.stderr.flush()


def _built_files(config: Optional[dict[str, Any]]) -> tuple[str, str]:
    """Paths of libcuhook.so and the cuhook binary, built now unless prebuilt."""
    prebuilt = _setting(config, "prebuilt", "CUHOOK_PREBUILT")
    if prebuilt:
        profile = os.path.abspath(prebuilt)
    else:
        cargo = os.environ.get("CARGO", "cargo")
        command = [cargo, "build", "--release", "--lib", "--bin", "cuhook"]
        _log(" ".join(command))
        try:
            subprocess.run(command, cwd=ROOT, check=True, stdout=sys.stderr)
        except FileNotFoundError:
            raise RuntimeError(
                "cuhook_build: cargo not found: install Rust (https://rustup.rs), or set "
                "CUHOOK_PREBUILT=DIR to a cargo profile directory holding libcuhook.so and cuhook"
            ) from None
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
        profile = os.path.join(os.path.abspath(target), "release")
    # `cargo test` refreshes only deps/libcuhook.so: take the newer of the two.
    libs = [p for p in (os.path.join(profile, "libcuhook.so"),
                        os.path.join(profile, "deps", "libcuhook.so")) if os.path.isfile(p)]
    cli = os.path.join(profile, "cuhook")
    if not libs or not os.path.isfile(cli):
        raise RuntimeError(f"cuhook_build: {profile} holds no libcuhook.so and cuhook")
    return max(libs, key=os.path.getmtime), cli


def _stripped(src: str, dst: str, how: list[str], config: Optional[dict[str, Any]]) -> None:
    strip = os.environ.get("STRIP", "strip")
    if _setting(config, "no-strip", "CUHOOK_NO_STRIP") or not shutil.which(strip):
        shutil.copyfile(src, dst)
    else:
        subprocess.run([strip, *how, "-o", dst, src], check=True)


def _speedups(scratch: str, config: Optional[dict[str, Any]]) -> Optional[str]:
    """cuhook/_speedups.c built against this Python's headers (the stable ABI), or None when
    it cannot be (not CPython, no headers, no compiler, or ``CUHOOK_NO_SPEEDUPS=1``): the
    package then looks up through ctypes alone."""
    if _setting(config, "no-speedups", "CUHOOK_NO_SPEEDUPS"):
        return None
    if sys.implementation.name != "cpython":
        return None
    include = sysconfig.get_paths()["include"]
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not os.path.isfile(os.path.join(include, "Python.h")) or not shutil.which(cc[0]):
        _log(f"no Python.h in {include} or no C compiler {cc[0]}: lookups go through ctypes "
             "alone (slower)")
        return None
    out = os.path.join(scratch, "_speedups.abi3.so")
    command = [*cc, "-shared", "-fPIC", "-O2", "-Wall", f"-I{include}",
               os.path.join(PACKAGE_DIR, "_speedups.c"), "-o", out]
    try:
        subprocess.run(command, check=True, stdout=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as e:
        _log(f"{' '.join(command)} failed ({e}): lookups go through ctypes alone (slower)")
        return None
    stripped = os.path.join(scratch, "_speedups.stripped.so")
    _stripped(out, stripped, ["--strip-unneeded"], config)
    return stripped


def _platform_tag(config: Optional[dict[str, Any]]) -> str:
    tag = _setting(config, "plat-name", "CUHOOK_WHEEL_PLAT")
    return tag or sysconfig.get_platform().replace("-", "_").replace(".", "_")


def _metadata(version: str) -> str:
    with open(os.path.join(ROOT, "docs", "python.md"), encoding="utf-8") as f:
        description = f.read()
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {version}\n"
        f"Summary: {SUMMARY}\n"
        "License: MIT OR Apache-2.0\n"
        f"Requires-Python: {REQUIRES_PYTHON}\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + description
    )


class _Wheel:
    """A wheel being written: files with their modes, then the RECORD."""

    def __init__(self, path: str) -> None:
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: list[str] = []

    def add(self, name: str, data: bytes, mode: int = 0o644) -> None:
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{name},sha256={digest},{len(data)}")

    def close(self, record_name: str) -> None:
        self.records.append(f"{record_name},,")
        self.add_raw(record_name, ("\n".join(self.records) + "\n").encode())
        self.zip.close()

    def add_raw(self, name: str, data: bytes) -> None:
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)


def _package_files() -> list[str]:
    files = []
    for name in sorted(os.listdir(PACKAGE_DIR)):
        if name.endswith((".py", ".pyi")) or name == "py.typed":
            files.append(name)
    return files


# ---------------------------------------------------------------------------- PEP 517 hooks


def get_requires_for_build_wheel(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    return []


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[dict[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    version = _version()
    lib, cli = _built_files(config_settings)
    dist_info = f"{NAME}-{version}.dist-info"
    os.makedirs(wheel_directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuhook-wheel-") as scratch:
        speedups = _speedups(scratch, config_settings)
        # With the C lookup the wheel is for CPython 3.9+ (the stable ABI); without, for any.
        python_tag = "cp39-abi3" if speedups else "py3-none"
        tag = f"{python_tag}-{_platform_tag(config_settings)}"
        wheel_name = f"{NAME}-{version}-{tag}.whl"
        lib_out = os.path.join(scratch, "libcuhook.so")
        cli_out = os.path.join(scratch, "cuhook")
        _stripped(lib, lib_out, ["--strip-unneeded"], config_settings)
        _stripped(cli, cli_out, [], config_settings)
        wheel = _Wheel(os.path.join(wheel_directory, wheel_name))
        for name in _package_files():
            with open(os.path.join(PACKAGE_DIR, name), "rb") as f:
                wheel.add(f"cuhook/{name}", f.read())
        for path, name in ((lib_out, "libcuhook.so"), (cli_out, "cuhook")):
            with open(path, "rb") as f:
                wheel.add(f"cuhook/_bin/{name}", f.read(), 0o755)
        if speedups:
            with open(speedups, "rb") as f:
                wheel.add("cuhook/_speedups.abi3.so", f.read(), 0o755)
        wheel.add(f"{dist_info}/METADATA", _metadata(version).encode())
        wheel.add(
            f"{dist_info}/WHEEL",
            (
                "Wheel-Version: 1.0\nGenerator: cuhook_build\nRoot-Is-Purelib: false\n"
                f"Tag: {tag}\n"
            ).encode(),
        )
        wheel.add(f"{dist_info}/entry_points.txt", ENTRY_POINTS.encode())
        for license_file in ("LICENSE-MIT", "LICENSE-APACHE", "LICENSE"):
            path = os.path.join(ROOT, license_file)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    wheel.add(f"{dist_info}/{license_file}", f.read())
        wheel.close(f"{dist_info}/RECORD")
    _log(f"wrote {wheel_name}")
    return wheel_name


def build_sdist(sdist_directory: str, config_settings: Optional[dict[str, Any]] = None) -> str:
    """The tracked files of the repository (``git ls-files``), as ``cuhook-VERSION.tar.gz``."""
    version = _version()
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, stdout=subprocess.PIPE
    ).stdout.split(b"\0")
    base = f"{NAME}-{version}"
    name = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(p.decode() for p in listed if p):
            path = os.path.join(ROOT, rel)
            if os.path.isfile(path):
                tar.add(path, arcname=f"{base}/{rel}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata(version).encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
