"""Which tensors hold GPU memory in a PyTorch training loop, step by step.

After each step every live CUDA allocation cuhook knows is listed with the tensors inside it
(parameters, gradients, optimizer state, anything else still referenced), and how much of it
they use: the rest is the caching allocator's free space, or memory held by no tensor at all.

    pip install .                       # cuhook's Python package, from the repository root
    python examples/python/tensor_memory.py
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python examples/python/tensor_memory.py

With PyTorch's default allocator an allocation is a cached block that holds many tensors; with
the cudaMallocAsync backend each tensor has its own. Needs PyTorch with a CUDA device.
"""

from __future__ import annotations

import gc
from collections import defaultdict

import cuhook
import torch

cuhook.install()  # before the first CUDA call, so that every allocation is seen


def tensor_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """Names of the tensors the training loop keeps, by storage address."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters():
        names[p.untyped_storage().data_ptr()] = name
        if p.grad is not None:
            names[p.grad.untyped_storage().data_ptr()] = f"{name}.grad"
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_cuda:
                names[value.untyped_storage().data_ptr()] = f"adam.{key}[{tuple(p.shape)}]"
    return names


def show(step: int, names: dict[int, str]) -> None:
    """Every live allocation, with the storages (tensors) it holds."""
    storages: dict[int, int] = {}  # storage address -> bytes, each storage once (views share)
    for obj in gc.get_objects():
        if torch.is_tensor(obj) and obj.is_cuda:
            s = obj.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    held = defaultdict(list)
    for address, nbytes in storages.items():
        a = cuhook.lookup(address)
        held[a].append((address, nbytes))
    print(f"step {step}: {cuhook.stats().live_bytes / 2**20:.1f} MiB in "
          f"{len(cuhook.live())} allocations")
    for a in cuhook.live():
        inside = held.pop(a, [])
        used = sum(n for _, n in inside)
        print(f"  {a.start:#x} {a.size / 2**20:8.2f} MiB {a.api:<16} {used / 2**20:8.2f} MiB in "
              f"{len(inside)} tensors")
        for address, nbytes in sorted(inside):
            label = names.get(address, "activation or temporary")
            print(f"      +{address - a.start:<10x} {nbytes / 2**20:8.3f} MiB  {label}")
    if held.get(None):
        print(f"  {len(held[None])} tensors in memory allocated before cuhook.install()")


def main() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for step in range(3):
        x = torch.randn(256, 1024, device="cuda")
        y = torch.randint(0, 10, (256,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=(step != 1))  # step 1 keeps the gradients
        show(step, tensor_names(model, optimizer))


if __name__ == "__main__":
    main()
