"""cupy_pinned.py - CuPy without its memory pools: pinned round trips and
small device allocations in a loop.

With cupy.cuda.set_allocator(None) and cupy.cuda.set_pinned_memory_allocator(None)
every device array is a cudaMalloc / cudaFree and every pinned buffer a
cudaHostAlloc / cudaFreeHost, released as soon as Python drops it. Two
loops, on a non-blocking stream:

  pinned  per iteration: a pinned buffer filled from a host (numpy) array,
          copied to a new device array, 2*x + i computed on the device (two
          kernels, one temporary), copied back into a second pinned buffer,
          stream synchronised, checked against numpy, hashed; everything
          dropped (2 cudaFreeHost, 3 cudaFree).
  device  per iteration: cupy.full (allocation + fill), x * 3 (allocation),
          added into an accumulator allocated once; both dropped (2
          cudaFree); no synchronisation inside the loop, one at the end.

Each loop runs --runs times after a warm-up; the figure is the median us
per iteration (min-max). The results (SHA-256 of every pinned output, and
of the accumulator) must be the same with and without cudefer.

--caching keeps CuPy's default memory pool and pinned memory pool instead
(the reference an ordinary CuPy program gets).

Prints per loop:
  RESULT cupy loop=<pinned|device> caching=<0|1> cudefer=<0|1>
         us_per_iter=<median> min=<> max=<> runs=<> iters=<> words=<>
         peak_mem_mib=<> ok=<0|1> sha256=<hex>
"""
import argparse
import ctypes
import hashlib
import statistics
import sys
import time

import numpy as np
import cupy as cp
import cupyx


def cudefer_loaded():
    try:
        ctypes.CDLL(None).cudefer_version
        return True
    except AttributeError:
        return False


def used_bytes():
    free, total = cp.cuda.runtime.memGetInfo()
    return total - free


class Peak:
    def __init__(self):
        cp.cuda.runtime.deviceSynchronize()
        self.base = used_bytes()
        self.peak = self.base

    def sample(self):
        self.peak = max(self.peak, used_bytes())

    def mib(self):
        return (self.peak - self.base) / 2**20


def pinned_loop(iters, words, stream, src, peak, sha, check):
    f2 = np.float32(2)
    bad = 0
    for i in range(iters):
        hp = cupyx.empty_pinned(words, dtype=np.float32)
        hp[...] = src
        with stream:
            d = cp.empty(words, dtype=cp.float32)
            d.set(hp, stream=stream)
            d2 = d * f2 + np.float32(i)
            out = cupyx.empty_pinned(words, dtype=np.float32)
            d2.get(stream=stream, out=out)
        stream.synchronize()
        if check:
            if not np.array_equal(out, src * f2 + np.float32(i)):
                bad += 1
            sha.update(out.tobytes())
        del hp, d, d2, out
        if i % 50 == 0:
            peak.sample()
    return bad


def device_loop(iters, words, stream, acc, peak):
    f3 = np.float32(3)
    with stream:
        for i in range(iters):
            x = cp.full(words, i % 100, dtype=cp.float32)
            y = x * f3
            acc += y
            del x, y
            if i % 200 == 0:
                peak.sample()
    stream.synchronize()


def report(loop, caching, times, iters, words, peak, ok, digest):
    us = [t * 1e6 / iters for t in times]
    print(
        f"RESULT cupy loop={loop} caching={int(caching)} cudefer={int(cudefer_loaded())} "
        f"us_per_iter={statistics.median(us):.2f} min={min(us):.2f} max={max(us):.2f} "
        f"runs={len(us)} iters={iters} words={words} peak_mem_mib={peak.mib():.1f} "
        f"ok={int(ok)} sha256={digest}",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--caching", action="store_true",
                    help="keep CuPy's memory pools (the reference)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pinned-iters", type=int, default=300)
    ap.add_argument("--device-iters", type=int, default=3000)
    ap.add_argument("--words", type=int, default=1024, help="float32 words per transfer")
    args = ap.parse_args()

    if not args.caching:
        cp.cuda.set_allocator(None)
        cp.cuda.set_pinned_memory_allocator(None)
    stream = cp.cuda.Stream(non_blocking=True)
    src = (np.arange(args.words, dtype=np.float32) % 1000).astype(np.float32)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    print(f"cupy_pinned: cupy {cp.__version__}, {name}, "
          f"runtime {cp.cuda.runtime.runtimeGetVersion()}, "
          f"driver {cp.cuda.runtime.driverGetVersion()}, "
          f"caching={int(args.caching)} cudefer={int(cudefer_loaded())}", flush=True)

    # Warm-up: kernel compilation, first calls of each kind.
    warm = Peak()
    pinned_loop(10, args.words, stream, src, warm, hashlib.sha256(), True)
    acc = cp.zeros(args.words, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    device_loop(50, args.words, stream, acc, warm)
    cp.cuda.runtime.deviceSynchronize()
    del acc

    failed = False

    # Pinned round trips.
    peak = Peak()
    times, digest, bad = [], None, 0
    for run in range(args.runs):
        sha = hashlib.sha256()
        t0 = time.perf_counter()
        bad += pinned_loop(args.pinned_iters, args.words, stream, src, peak, sha, True)
        cp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t0)
        d = sha.hexdigest()
        if digest is not None and d != digest:
            bad += 1
        digest = d
    report("pinned", args.caching, times, args.pinned_iters, args.words, peak, bad == 0, digest)
    failed |= bad != 0

    # Small device allocations.
    peak = Peak()
    times, digest, ok = [], None, True
    expected = np.float32(3 * sum(i % 100 for i in range(args.device_iters)))
    for run in range(args.runs):
        acc = cp.zeros(args.words, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        device_loop(args.device_iters, args.words, stream, acc, peak)
        cp.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t0)
        host = cp.asnumpy(acc)
        ok &= bool(np.all(host == expected))
        d = hashlib.sha256(host.tobytes()).hexdigest()
        ok &= digest is None or d == digest
        digest = d
        del acc
    report("device", args.caching, times, args.device_iters, args.words, peak, ok, digest)
    failed |= not ok

    print("cupy_pinned: " + ("RESULTS WRONG" if failed else "all results correct"), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
