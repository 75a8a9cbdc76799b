"""Install time in a PyTorch process: one cuhook_install() after torch and CUDA are loaded,
in fresh processes (the first install is what a host pays: later ones find every object
already indexed).

Usage (GPU machine, from the repository root):
    CUHOOK_LIB=$PWD/.device-carry/libcuhook.so CUHOOK_DISABLE=1 \\
        python3 hook-tests/gpu/torch_install_time.py [ROUNDS]
CUHOOK_DISABLE=1 keeps the library's constructor from installing when ctypes loads it.
Prints one line per round and the median."""
import ctypes
import os
import statistics
import subprocess
import sys
import time


def child():
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cuhook_ctypes as ch

    torch.zeros(1, device="cuda")
    lib = ch.load()
    t0 = time.perf_counter()
    c0 = time.thread_time()
    rc = lib.cuhook_install()
    cpu = (time.thread_time() - c0) * 1000
    ms = (time.perf_counter() - t0) * 1000
    slots = lib.cuhook_patched_slots(None, 0)
    text = ctypes.create_string_buffer(1 << 16)
    lib.cuhook_diagnostics.restype = ctypes.c_ssize_t
    lib.cuhook_diagnostics(text, len(text))
    counters = next(
        (l for l in text.value.decode(errors="replace").splitlines() if l.startswith("counters")),
        "counters ?",
    )
    t1 = time.perf_counter()
    urc = lib.cuhook_uninstall()
    ums = (time.perf_counter() - t1) * 1000
    with open("/proc/self/maps") as f:
        lines = f.readlines()
    objects = len({l.split()[-1] for l in lines if l.rstrip().endswith(".so") or ".so." in l})
    print(
        "install_time rc=%d ms=%.2f cpu_ms=%.2f slots=%d shared_objects_mapped=%d mappings=%d "
        "uninstall rc=%d ms=%.2f %s" % (rc, ms, cpu, slots, objects, len(lines), urc, ums, counters)
    )


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    times = []
    for _ in range(rounds):
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child"],
            capture_output=True,
            text=True,
        )
        line = next((l for l in out.stdout.splitlines() if l.startswith("install_time")), None)
        if out.returncode != 0 or line is None:
            print(out.stdout + out.stderr)
            sys.exit(1)
        print(line)
        times.append(float(line.split(" ms=")[1].split()[0]))
    print("install_time median_ms=%.2f min_ms=%.2f max_ms=%.2f rounds=%d"
          % (statistics.median(times), min(times), max(times), rounds))


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
