"""cupy_pinned.py - CuPy without its memory pools: pinned round trips and
small device allocations, the way a CuPy program makes them.

With cupy.cuda.set_allocator(None) and cupy.cuda.set_pinned_memory_allocator(None)
every device array is a cudaMalloc / cudaFree and every pinned buffer a
cudaHostAlloc / cudaFreeHost, released as soon as Python drops it
(cupy.cuda.memory.Memory.__dealloc__ calls cudaFree at once). Three loops,
on a non-blocking stream:

  pinned       per iteration: a 4 MiB pinned buffer filled from a host
               (numpy) array, copied to a new device array, 2*x + i computed
               on the device (two kernels, one temporary), copied back into
               a second pinned buffer, stream synchronised, checked against
               numpy, hashed; everything dropped (2 cudaFreeHost, 3
               cudaFree). The check and the hash cover 4,096 words spread
               over the buffer every iteration and the whole buffer in the
               first and last iteration of each run, so that numpy's work
               does not hide the allocator's.
  device_busy  per round: 100 small device allocations (cupy.full of 1,024
               float32 words, added into an accumulator allocated once, then
               dropped: one cudaMalloc and one cudaFree each) while another
               stream of the program computes (a 3072 x 3072 float32
               matrix product, relaunched as soon as the previous one has
               finished, checked once per allocation with an event query):
               a program that overlaps its own work on two streams.
  device_idle  the same 100 allocations with nothing else running: the
               earlier version of this benchmark.

Why the earlier version gained nothing (1.05x): its loop dropped each small
array right after launching 1,024-word kernels, which finish in a few
microseconds, while CuPy's Python dispatch of the next operation takes 15-20
microseconds. By the time cudaFree ran, the GPU had nothing left in flight,
so the driver's free did not wait (its idle-GPU cost is 1-2 microseconds);
CuPy's own pool made that loop only 1.2x faster. Nothing synchronised inside
the loop; there was simply no work to wait for. The driver's cudaFree waits
for all work in the context, on every stream, so it costs a CuPy program
when the GPU is busy: device_busy measures that case, and device_idle stays
as the reference.

Each loop runs --runs times after a warm-up; the figure is the median (min-
max): us per iteration (pinned) or per round of 100 allocations (device_*).
The results (SHA-256 of the checked pinned words, and of the accumulator)
must be the same with and without cudefer.

--caching keeps CuPy's default memory pool and pinned memory pool instead
(the reference an ordinary CuPy program gets).

Prints per loop:
  RESULT cupy loop=<pinned|device_busy|device_idle> caching=<0|1> cudefer=<0|1>
         us_per_iter=<median> min=<> max=<> runs=<> iters=<> words=<>
         peak_mem_mib=<> ok=<0|1> sha256=<hex> [bg_n=<> bg_launched=<>]
"""
import argparse
import hashlib
import statistics
import sys
import time

import numpy as np
import cupy as cp
import cupyx

from common import cudefer_loaded


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


class Busy:
    """Another stream of the program, kept busy with matrix products."""

    def __init__(self, n):
        self.n = n
        self.launched = 0
        self.stream = None
        if n <= 0:
            return
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            self.a = cp.full((n, n), 0.001, dtype=cp.float32)
            self.b = cp.full((n, n), 0.002, dtype=cp.float32)
            self.c = cp.empty((n, n), dtype=cp.float32)
        self.event = self.stream.record()
        self.stream.synchronize()

    def keep_busy(self):
        """Relaunches the product if the previous one has finished."""
        if self.stream is None or not self.event.done:
            return
        with self.stream:
            cp.dot(self.a, self.b, out=self.c)
        self.stream.record(self.event)
        self.launched += 1

    def drain(self):
        if self.stream is not None:
            self.stream.synchronize()


def pinned_loop(iters, words, stream, src, sample, peak, sha, check):
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
            got = out[sample]
            if not np.array_equal(got, src[sample] * f2 + np.float32(i)):
                bad += 1
            if (i == 0 or i == iters - 1) and not np.array_equal(out, src * f2 + np.float32(i)):
                bad += 1
            sha.update(got.tobytes())
        del hp, d, d2, out
        if i % 8 == 0:
            peak.sample()
    return bad


def device_round(allocs, words, stream, acc, busy, base):
    """allocs small allocations; returns the sum of the values added."""
    added = 0
    with stream:
        for j in range(allocs):
            busy.keep_busy()
            v = (base + j) % 100
            x = cp.full(words, v, dtype=cp.float32)
            acc += x
            del x
            added += v
    return added


def report(loop, caching, us, iters, words, peak, ok, digest, extra=""):
    print(
        f"RESULT cupy loop={loop} caching={int(caching)} cudefer={int(cudefer_loaded())} "
        f"us_per_iter={statistics.median(us):.2f} min={min(us):.2f} max={max(us):.2f} "
        f"runs={len(us)} iters={iters} words={words} peak_mem_mib={peak.mib():.1f} "
        f"ok={int(ok)} sha256={digest}{extra}",
        flush=True,
    )


def run_pinned(args, stream):
    src = (np.arange(args.pinned_words, dtype=np.float32) % 1000).astype(np.float32)
    sample = np.linspace(0, args.pinned_words - 1, 4096).astype(np.int64)
    warm = Peak()
    pinned_loop(3, args.pinned_words, stream, src, sample, warm, hashlib.sha256(), True)
    peak = Peak()
    us, digest, bad = [], None, 0
    for _ in range(args.runs):
        sha = hashlib.sha256()
        t0 = time.perf_counter()
        bad += pinned_loop(args.pinned_iters, args.pinned_words, stream, src, sample, peak,
                           sha, True)
        cp.cuda.runtime.deviceSynchronize()
        us.append((time.perf_counter() - t0) * 1e6 / args.pinned_iters)
        d = sha.hexdigest()
        if digest is not None and d != digest:
            bad += 1
        digest = d
    report("pinned", args.caching, us, args.pinned_iters, args.pinned_words, peak, bad == 0,
           digest)
    return bad == 0


def run_device(args, stream, loop, busy):
    allocs, rounds = args.allocs, args.rounds
    words = args.words
    # Warm-up: kernel compilation, first calls.
    acc = cp.zeros(words, dtype=cp.float32)
    device_round(10, words, stream, acc, busy, 0)
    cp.cuda.runtime.deviceSynchronize()
    del acc
    busy.launched = 0

    peak = Peak()
    us, digest, ok = [], None, True
    for _ in range(args.runs):
        acc = cp.zeros(words, dtype=cp.float32)
        cp.cuda.runtime.deviceSynchronize()
        added = 0
        t0 = time.perf_counter()
        for r in range(rounds):
            added += device_round(allocs, words, stream, acc, busy, r * allocs)
            peak.sample()
        stream.synchronize()
        us.append((time.perf_counter() - t0) * 1e6 / rounds)
        busy.drain()
        host = cp.asnumpy(acc)
        ok &= bool(np.all(host == np.float32(added)))
        d = hashlib.sha256(host.tobytes()).hexdigest()
        ok &= digest is None or d == digest
        digest = d
        del acc
    extra = f" bg_n={busy.n} bg_launched={busy.launched} allocs_per_round={allocs}"
    report(loop, args.caching, us, rounds, words, peak, ok, digest, extra)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--caching", action="store_true",
                    help="keep CuPy's memory pools (the reference)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pinned-iters", type=int, default=30)
    ap.add_argument("--pinned-words", type=int, default=1 << 20,
                    help="float32 words per pinned buffer (default 4 MiB)")
    ap.add_argument("--allocs", type=int, default=100, help="small allocations per round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run")
    ap.add_argument("--words", type=int, default=1024, help="float32 words per small array")
    ap.add_argument("--bg-n", type=int, default=3072,
                    help="matrix size of the other stream's products (0: none)")
    ap.add_argument("--loops", default="pinned,device_busy,device_idle")
    args = ap.parse_args()

    if not args.caching:
        cp.cuda.set_allocator(None)
        cp.cuda.set_pinned_memory_allocator(None)
    stream = cp.cuda.Stream(non_blocking=True)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    print(f"cupy_pinned: cupy {cp.__version__}, {name}, "
          f"runtime {cp.cuda.runtime.runtimeGetVersion()}, "
          f"driver {cp.cuda.runtime.driverGetVersion()}, "
          f"caching={int(args.caching)} cudefer={int(cudefer_loaded())}", flush=True)

    loops = [x for x in args.loops.split(",") if x]
    ok = True
    for loop in loops:
        if loop == "pinned":
            ok &= run_pinned(args, stream)
        elif loop == "device_busy":
            busy = Busy(args.bg_n)
            ok &= run_device(args, stream, loop, busy)
            busy.drain()
            del busy
        elif loop == "device_idle":
            ok &= run_device(args, stream, loop, Busy(0))
        else:
            sys.exit(f"cupy_pinned.py: no loop {loop}")
        cp.cuda.runtime.deviceSynchronize()

    print("cupy_pinned: " + ("all results correct" if ok else "RESULTS WRONG"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
