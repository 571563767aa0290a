"""doors_torch.py - check 1(d): a few PyTorch training steps on the GPU.

With PYTORCH_NO_CUDA_MEMORY_CACHING=1 every tensor is its own
cudaMalloc/cudaFree, so the shim handles thousands of releases. The losses
(printed in full precision) must be the same with and without the shim.
"""
import os

# Before torch is imported: no caching allocator, deterministic cuBLAS.
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")

    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(128, 256, generator=gen).to(dev)
    y = torch.randint(0, 10, (128,), generator=gen).to(dev)

    for step in range(10):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.17g}")

    # Pinned host memory too (cudaHostAlloc / cudaFreeHost).
    pinned = torch.arange(4096, dtype=torch.float32).pin_memory()
    total = (pinned.to(dev, non_blocking=True) * 2).sum().item()
    del pinned
    torch.cuda.synchronize()
    params = sum(p.double().sum().item() for p in model.parameters())
    print(f"pinned sum {total:.17g}")
    print(f"parameter sum {params:.17g}")
    print("done")


if __name__ == "__main__":
    main()
