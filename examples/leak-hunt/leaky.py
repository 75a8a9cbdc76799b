"""A training loop with a GPU memory leak, for `cuhook run` to find (see README.md here).

Each step allocates activations and gradients and frees them, and allocates a small buffer for
its metrics, which it keeps in a history list: the bug. (In PyTorch the same bug is keeping
`loss` tensors in a list instead of `loss.item()`.) With --fixed, the metrics buffer is freed.

It calls the CUDA runtime through ctypes, so it needs nothing but Python and libcudart: the
first of libcudart.so.13, .12 and libcudart.so that loads, or the one `$CUDART` names
(`scripts/run-example.sh leak-hunt` runs it on cuhook's fake runtime).
"""
import argparse
import ctypes
import os


def load_cudart():
    names = [os.environ["CUDART"]] if os.environ.get("CUDART") else [
        "libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise SystemExit("leaky.py: cannot load the CUDA runtime (" + "; ".join(errors)
                     + "): set CUDART=/path/to/libcudart.so.N")


cudart = load_cudart()
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]

MiB = 1 << 20


def alloc(size):
    ptr = ctypes.c_void_p()
    status = cudart.cudaMalloc(ctypes.byref(ptr), size)
    if status != 0:
        raise MemoryError(f"cudaMalloc({size}) failed with status {status}")
    return ptr.value


def free(ptr):
    cudart.cudaFree(ptr)


def train(steps, fixed):
    history = []
    for _ in range(steps):
        activations = alloc(64 * MiB)
        gradients = alloc(32 * MiB)
        metrics = alloc(MiB // 4)
        free(gradients)
        free(activations)
        if fixed:
            free(metrics)
        else:
            history.append(metrics)  # the leak: every step's metrics buffer stays allocated
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--fixed", action="store_true", help="free the metrics buffer")
    args = parser.parse_args()
    kept = train(args.steps, args.fixed)
    print(f"trained {args.steps} steps; {len(kept)} metrics buffers still held")
