#!/usr/bin/env python3
"""nccl_allreduce.py - NCCL all-reduces across two GPUs, one process each.

Spawns one process per GPU (torch.multiprocessing), joins an NCCL process
group over TCP on 127.0.0.1, and runs ITERS rounds. Each round allocates
fresh tensors of several sizes (with PYTORCH_NO_CUDA_MEMORY_CACHING=1 every
tensor is its own cudaMalloc and cudaFree, which is what cudefer changes),
all-reduces them (sum; synchronous and async), and checks every element of
the result against the exact sum. Run it with and without
LD_PRELOAD=libcudefer.so (scripts/gpu-multi.sh does both).

Rank 0 prints one line:

    RESULT nccl_allreduce world=<n> iters=<n> elements=<total checked>
           ok=<0|1> bad=<count> seconds=<s> cudefer=<0|1> torch=<version>

or, without two GPUs (or torch with NCCL):

    RESULT nccl_allreduce world=<n> skipped=1 reason=<why>

Exit status: 0 when every sum was right, 1 otherwise, 2 on a set-up error.

usage: nccl_allreduce.py [--iters N] [--world N] [--port P]
"""
import argparse
import ctypes
import datetime
import os
import queue
import sys
import time

# NVLink SHARP / multicast stay off (they need a fabric manager set-up that
# the lent machines do not have), and the caching allocator too. Set before
# torch (and NCCL) are imported, in the parent and so in every child.
FORCED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
}
os.environ.update(FORCED_ENV)

SIZES = [1, 1000, 1 << 16, 1 << 20, (1 << 22) + 3]  # elements per tensor


def cudefer_loaded():
    try:
        ctypes.CDLL(None).cudefer_version
        return 1
    except AttributeError:
        return 0


def worker(rank, world, iters, port, results):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    device = torch.device("cuda", rank)
    # sum over ranks r of (r + 1) * k
    ranks_sum = world * (world + 1) // 2
    bad = 0
    checked = 0
    start = time.time()
    for it in range(iters):
        k = it + 1
        tensors = []
        for n in SIZES:
            # Exact in float64 and in int64 alike.
            t = torch.full((n,), float((rank + 1) * k), dtype=torch.float64, device=device)
            tensors.append(t)
        ints = torch.full((4097,), (rank + 1) * k, dtype=torch.int64, device=device)
        works = []
        for i, t in enumerate(tensors):
            if i % 2:
                works.append(dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True))
            else:
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
        dist.all_reduce(ints, op=dist.ReduceOp.SUM)
        for w in works:
            w.wait()
        want = float(ranks_sum * k)
        for t in tensors:
            bad += int((t != want).sum().item())
            checked += t.numel()
        bad += int((ints != ranks_sum * k).sum().item())
        checked += ints.numel()
        # Every tensor goes back (cudaFree each) before the next round.
        del tensors, ints, works
    torch.cuda.synchronize()
    seconds = time.time() - start
    # Every rank's verdict, summed on every rank.
    verdict = torch.tensor([bad, checked], dtype=torch.int64, device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.SUM)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put((int(verdict[0].item()), int(verdict[1].item()), seconds,
                     torch.__version__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=29531)
    args = parser.parse_args()

    def skipped(reason):
        print(f"RESULT nccl_allreduce world={args.world} skipped=1 reason={reason}",
              flush=True)
        return 0

    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError:
        return skipped("no_torch")
    if not torch.cuda.is_available():
        return skipped("no_cuda")
    if torch.cuda.device_count() < args.world:
        return skipped(f"{torch.cuda.device_count()}_gpus")
    if not dist.is_nccl_available():
        return skipped("no_nccl")

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, args.iters, args.port, results))
             for r in range(args.world)]
    for p in procs:
        p.start()
    # Rank 0's verdict, read before the joins (a child that put something in
    # a queue exits only once it is read).
    verdict = None
    deadline = time.time() + 240
    while verdict is None and time.time() < deadline:
        try:
            verdict = results.get(timeout=1)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=max(1.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    if any(c != 0 for c in codes) or verdict is None:
        print(f"RESULT nccl_allreduce world={args.world} iters={args.iters} ok=0 "
              f"exitcodes={','.join(str(c) for c in codes)} cudefer={cudefer_loaded()}",
              flush=True)
        return 1
    bad, checked, seconds, version = verdict
    ok = int(bad == 0)
    print(f"RESULT nccl_allreduce world={args.world} iters={args.iters} elements={checked} "
          f"ok={ok} bad={bad} seconds={seconds:.3f} cudefer={cudefer_loaded()} "
          f"torch={version}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
