"""transformer.py - a larger PyTorch training loop than mlp.py, timed per step.

A small transformer encoder from torch.nn, random weights and random data,
nothing downloaded: torch.nn.TransformerEncoder of 6 layers (d_model 512,
8 heads, feed-forward 2048, ReLU, no dropout, batch_first), a linear head to
16 classes at every position, cross-entropy against fixed random labels,
AdamW; batch 64 sequences of 128 positions of random float32 inputs, trained
for --steps steps from a fixed seed. About 19 million parameters; a step is
about 1 TFLOP of float32 work (TF32 off).

Attention runs on PyTorch's math backend (flash, memory-efficient and cuDNN
attention off) and deterministic algorithms are requested, so that runs with
different allocators, or with cudefer, compute the same bits. Each step ends
with a synchronisation of the current stream, its wall time taken from the
start of the step to the end of that synchronisation. The losses stay on the
GPU (one preallocated tensor) and are hashed bitwise (SHA-256 of their
float32 bytes) at the end.

Device memory in use is sampled after every step as in mlp.py (peak_mem_mib
from NVML, what the GPU holds; visible_peak_mib from mem_get_info, what the
program is told), above the level measured before the model was built.

Run it three ways (scripts/bench-gpu.sh does):
  (a) python3 transformer.py                                   caching allocator
  (b) PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 transformer.py  every tensor a
                                                               cudaMalloc/cudaFree
  (c) as (b) with LD_PRELOAD=libcudefer.so

Prints one line:
  RESULT transformer caching=<0|1> cudefer=<0|1> us_per_step=<median> min=<>
         max=<> p10=<> p90=<> steps=<> warmup=<> total_s=<> peak_mem_mib=<> mem_source=<>
         visible_peak_mib=<> params=<> final_loss=<> loss_sha256=<hex>
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


def math_attention_only():
    """Attention on the math backend: deterministic, the same on every run."""
    b = torch.backends.cuda
    for name, on in (("enable_flash_sdp", False), ("enable_mem_efficient_sdp", False),
                     ("enable_cudnn_sdp", False), ("enable_math_sdp", True)):
        fn = getattr(b, name, None)
        if fn is not None:
            fn(on)


class Model(torch.nn.Module):
    def __init__(self, d_model, heads, layers, ff, classes):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=ff, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--ff", type=int, default=2048)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4, help="distinct input batches, cycled")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("transformer.py: --steps must be larger than --warmup")

    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") in ("", "0")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    math_attention_only()
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.zeros(1, device=dev)  # the context
    torch.cuda.synchronize()
    mem = DeviceMemory(str(torch.cuda.get_device_properties(dev).uuid), torch.cuda.mem_get_info)

    model = Model(args.d_model, args.heads, args.layers, args.ff, args.classes).to(dev)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    gen = torch.Generator(device="cpu").manual_seed(1)
    xs = torch.randn(args.batches, args.batch, args.seq, args.d_model, generator=gen).to(dev)
    ys = torch.randint(0, args.classes, (args.batches, args.batch * args.seq),
                       generator=gen).to(dev)
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
        out = model(x)
        loss = loss_fn(out.reshape(-1, args.classes), y)
        loss.backward()
        opt.step()
        losses[step].copy_(loss.detach())
        del out, loss
        stream.synchronize()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e6)
        mem.sample()
    torch.cuda.synchronize()
    total_s = time.perf_counter() - t_all

    host = losses.cpu()
    digest = hashlib.sha256(host.numpy().tobytes()).hexdigest()
    print(
        f"RESULT transformer caching={int(caching)} cudefer={int(cudefer_loaded())} "
        f"{step_fields(times, args.steps, args.warmup, total_s)} "
        f"{mem.fields()} params={params} "
        f"{loss_fields(host[-1].item(), digest)}",
        flush=True,
    )
    print(f"transformer: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"{params} parameters, first losses {[f'{v:.6g}' for v in host[:3].tolist()]}",
          flush=True)


if __name__ == "__main__":
    main()
