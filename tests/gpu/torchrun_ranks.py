#!/usr/bin/env python3
"""torchrun_ranks.py - one rank of a torchrun job whose ranks share ONE GPU,
each allocating and freeing device memory hundreds of times and all-reducing
CPU tensors over gloo. scripts/gpu-ranks.sh runs it, without and with
cudefer:

    torchrun --standalone --nproc-per-node=2 tests/gpu/torchrun_ranks.py [--iters N]

Each rank joins a gloo process group (torchrun's environment: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and uses cuda:0. Each of ITERS rounds
makes CUDA tensors of several sizes and a matrix product of two of them
(kernels that are still running when the tensors go), then drops them all:
with PYTORCH_NO_CUDA_MEMORY_CACHING=1, forced here, each tensor is a
cudaMalloc of its own and its release a cudaFree, which is what cudefer
changes. Every 10th round all-reduces (sum) a CPU tensor and checks every
element against the exact sum. Each rank prints one line:

    RESULT torchrun_ranks rank=<r> world=<n> pid=<pid> iters=<n> frees=<n>
           allreduces=<n> bad=<n> ok=<0|1> seconds=<s> cudefer=<0|1> torch=<version>

frees: the CUDA tensors the rank dropped (the cudaFree calls it made at
least; PyTorch may make more of its own). Without CUDA:

    RESULT torchrun_ranks rank=<r> skipped=1 reason=<why>

Exit status: 0 when every sum was right, 1 otherwise, 2 on a set-up error
(no CUDA).
"""
import argparse
import ctypes
import datetime
import os
import sys
import time

# Every tensor its own cudaMalloc/cudaFree; set before torch is imported.
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

SIZES = [1 << 10, 1 << 16, 1 << 20, (1 << 22) + 3]  # float32 elements
MATRIX = 512


def cudefer_loaded():
    try:
        ctypes.CDLL(None).cudefer_version
        return 1
    except AttributeError:
        return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("RESULT torchrun_ranks rank=%d skipped=1 reason=no-cuda" % rank, flush=True)
        return 2
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))

    # sum over ranks r of (r + 1) * k
    ranks_sum = world * (world + 1) // 2
    frees = allreduces = bad = 0
    start = time.time()
    for it in range(args.iters):
        tensors = [torch.full((n,), float(it), device=device) for n in SIZES]
        a = torch.full((MATRIX, MATRIX), 1.0 / MATRIX, device=device)
        b = torch.full((MATRIX, MATRIX), float(rank + 1), device=device)
        c = a @ b  # each element: rank + 1
        c.add_(tensors[0][:1])  # + it, on the GPU, before anything is freed
        tensors += [a, b, c]
        frees += len(tensors)
        del a, b, c, tensors  # freed while the product may still run
        if it % 10 == 0:
            k = it + 1
            x = torch.full((4097,), float((rank + 1) * k), dtype=torch.float64)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            allreduces += 1
            bad += int((x != float(ranks_sum * k)).sum().item())
    # One last product, checked on the host.
    a = torch.full((MATRIX, MATRIX), 1.0 / MATRIX, device=device)
    b = torch.full((MATRIX, MATRIX), float(rank + 1), device=device)
    got = (a @ b).cpu()
    bad += int((got - float(rank + 1)).abs().gt(1e-3).sum().item())
    del a, b
    frees += 3
    torch.cuda.synchronize()
    seconds = time.time() - start
    dist.barrier()
    dist.destroy_process_group()

    ok = int(bad == 0)
    print("RESULT torchrun_ranks rank=%d world=%d pid=%d iters=%d frees=%d allreduces=%d "
          "bad=%d ok=%d seconds=%.2f cudefer=%d torch=%s"
          % (rank, world, os.getpid(), args.iters, frees, allreduces, bad, ok, seconds,
             cudefer_loaded(), torch.__version__), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
