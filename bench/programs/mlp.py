"""mlp.py - a small PyTorch training loop, timed per step.

A 3-layer MLP (1024 -> 1024 -> 1024 -> 10, ReLU, 1024 wide), batch 256, MSE
loss against fixed random targets, SGD with momentum, trained for --steps
steps on the GPU from a fixed seed. Each step ends with a synchronisation of
the current stream (what a training loop that reads its loss every step
does), and its wall time is taken from the start of the step to the end of
that synchronisation. The losses stay on the GPU (one preallocated tensor)
and are hashed bitwise (SHA-256 of their float32 bytes) at the end, so runs
with different allocators or with cudefer must print the same hash.

Device memory in use is sampled after every step, outside the timing, and
reported above the level measured before the model was built: peak_mem_mib
as NVML reports it for the GPU (common.DeviceMemory; mem_source=nvml), what
the GPU really holds, cudefer's cache included; visible_peak_mib as
torch.cuda.mem_get_info (total - free) reports it, which under cudefer
counts the memory cudefer holds for reuse as free. Without NVML both are
the latter (mem_source=mem_get_info).

Run it three ways (scripts/bench-gpu.sh does):
  (a) python3 mlp.py                                   PyTorch's caching allocator
  (b) PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 mlp.py  every tensor a cudaMalloc/cudaFree
  (c) as (b) with LD_PRELOAD=libcudefer.so

Prints one line:
  RESULT mlp caching=<0|1> cudefer=<0|1> us_per_step=<median> min=<> max=<>
         p10=<> p90=<> steps=<> warmup=<> total_s=<> peak_mem_mib=<> mem_source=<>
         visible_peak_mib=<> final_loss=<> loss_sha256=<hex>
"""
import argparse
import hashlib
import os
import sys
import time

# Before torch is imported: deterministic cuBLAS workspaces.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from common import DeviceMemory, cudefer_loaded, loss_fields, step_fields  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=8, help="distinct input batches, cycled")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("mlp.py: --steps must be larger than --warmup")

    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") in ("", "0")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.zeros(1, device=dev)  # the context
    torch.cuda.synchronize()
    mem = DeviceMemory(str(torch.cuda.get_device_properties(dev).uuid), torch.cuda.mem_get_info)

    w = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    gen = torch.Generator(device="cpu").manual_seed(1)
    xs = torch.randn(args.batches, args.batch, w, generator=gen).to(dev)
    ys = torch.randn(args.batches, args.batch, 10, generator=gen).to(dev)
    losses = torch.zeros(args.steps, dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream()
    torch.cuda.synchronize()

    times = []
    t_all = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = xs[step % args.batches]
        y = ys[step % args.batches]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses[step].copy_(loss.detach())
        stream.synchronize()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e6)
        mem.sample()
    torch.cuda.synchronize()
    total_s = time.perf_counter() - t_all

    host = losses.cpu()
    digest = hashlib.sha256(host.numpy().tobytes()).hexdigest()
    print(
        f"RESULT mlp caching={int(caching)} cudefer={int(cudefer_loaded())} "
        f"{step_fields(times, args.steps, args.warmup, total_s)} "
        f"{mem.fields()} {loss_fields(host[-1].item(), digest)}",
        flush=True,
    )
    print(f"mlp: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"first losses {[f'{v:.6g}' for v in host[:3].tolist()]}", flush=True)


if __name__ == "__main__":
    main()
