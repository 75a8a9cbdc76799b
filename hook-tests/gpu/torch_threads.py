"""Issue 36's PyTorch workload: THREADS Python threads, each on its own CUDA stream, allocate and
free tensors for SECONDS; prints the allocations per second of all threads together.

Meant for the `cudaMallocAsync` backend (every `torch.empty` is then a `cudaMallocAsync` and
every release a `cudaFreeAsync`): run it plain and with libcuhook.so preloaded in alternated
processes (`torch_threads.sh`).

Usage: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 torch_threads.py THREADS [SECONDS]
"""

import sys
import threading
import time

import torch

THREADS = int(sys.argv[1])
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
# Bytes of the tensors each round holds at once: small and mid-sized, as a training step's
# temporaries are.
SIZES = [256, 4096, 65536, 1 << 20, 512, 16384, 262144, 2048]


def worker(start: threading.Barrier, counts: list, i: int) -> None:
    stream = torch.cuda.Stream()
    n = 0
    with torch.cuda.stream(stream):
        for _ in range(20):  # warm the pool
            held = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in SIZES]
            del held
        start.wait()
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            held = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in SIZES]
            del held
            n += len(SIZES)
    stream.synchronize()
    counts[i] = n


def main() -> None:
    torch.cuda.init()
    torch.empty(1, device="cuda")
    counts = [0] * THREADS
    start = threading.Barrier(THREADS + 1)
    threads = [threading.Thread(target=worker, args=(start, counts, i)) for i in range(THREADS)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    backend = torch.cuda.get_allocator_backend()
    print(f"torch_threads threads={THREADS} backend={backend} allocs={sum(counts)} "
          f"seconds={took:.3f} allocs_per_s={sum(counts) / took:.0f}")


if __name__ == "__main__":
    main()
