"""A small PyTorch training loop for timing (issue 37's <= 1.10x with stacks on): an MLP and a
convolution on random data, the allocator backend from PYTORCH_CUDA_ALLOC_CONF. Prints the loop's
seconds (after a warm-up) and the allocations cuhook saw when it is loaded.
Usage: python3 torch_train.py [STEPS]"""
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(), torch.nn.Linear(64 * 16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()


def step(batch):
    x = torch.randn(batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


for i in range(20):
    step(32 + 8 * (i % 5))
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(steps):
    step(32 + 8 * (i % 5))  # varying shapes: the allocator keeps allocating
torch.cuda.synchronize()
loop = time.perf_counter() - t0
print(f"train backend={torch.cuda.get_allocator_backend()} steps={steps} loop_s={loop:.4f}", flush=True)
