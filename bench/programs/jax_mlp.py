"""jax_mlp.py - a few jitted JAX training steps of an MLP, timed per step.

A 3-layer MLP (1024 -> 1024 -> 1024 -> 10, ReLU), batch 256, mean squared
error against fixed random targets, SGD with momentum written out with
jax.tree_util (no optax), one jax.jit'ed step function; --steps steps on the
GPU from fixed data (numpy's generator, seed 1) and fixed initial weights
(jax.random, key 0). The step's arguments are not donated, so every step
allocates new parameter, momentum and temporary buffers and the previous
ones are released when Python drops them: with
XLA_PYTHON_CLIENT_ALLOCATOR=platform each of those is a cuMemAlloc /
cuMemFree of the driver. Each step ends with the loss's block_until_ready;
its wall time is taken from the call to the end of that wait. The losses
(kept as device scalars) are hashed bitwise at the end (SHA-256 of their
float32 bytes), so runs with different allocators or with cudefer can be
compared.

Run it three ways (scripts/bench-gpu.sh does):
  (a) python3 jax_mlp.py                                       JAX's default
                                                               allocator (BFC,
                                                               memory preallocated)
  (b) XLA_PYTHON_CLIENT_ALLOCATOR=platform python3 jax_mlp.py  allocate and free
                                                               on demand
  (c) as (b) with LD_PRELOAD=libcudefer.so

Prints one line:
  RESULT jax allocator=<default|platform|...> caching=<0|1> cudefer=<0|1>
         us_per_step=<median> min=<> max=<> p10=<> p90=<> steps=<> warmup=<>
         total_s=<> peak_mem_mib=<-|MiB> final_loss=<> loss_sha256=<hex>
("caching" is 1 for the default allocator, 0 for the platform allocator;
peak_mem_mib is JAX's peak_bytes_in_use where the allocator reports it.)
"""
import argparse
import hashlib
import os
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

from common import cudefer_loaded, loss_fields, step_fields  # noqa: E402


def tree_map(fn, *trees):
    tree = getattr(jax, "tree", None)
    if tree is not None and hasattr(tree, "map"):
        return tree.map(fn, *trees)
    return jax.tree_util.tree_map(fn, *trees)


def init_params(sizes):
    key = jax.random.key(0) if hasattr(jax.random, "key") else jax.random.PRNGKey(0)
    params = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (m, n), dtype=jnp.float32) * np.float32(1.0 / np.sqrt(m))
        b = jnp.zeros((n,), dtype=jnp.float32)
        params.append((w, b))
    return params


def forward(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss_fn(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


@jax.jit
def train_step(params, mom, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    mom = tree_map(lambda m, g: 0.9 * m + g, mom, grads)
    params = tree_map(lambda p, m: p - 1e-3 * m, params, mom)
    return params, mom, loss


def peak_mib(dev):
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - not every allocator reports
        return "-"
    v = stats.get("peak_bytes_in_use")
    return f"{v / 2**20:.1f}" if v is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=8, help="distinct input batches, cycled")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("jax_mlp.py: --steps must be larger than --warmup")

    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "") or "default"
    devs = jax.devices()
    dev = devs[0]
    if dev.platform != "gpu":
        sys.exit(f"jax_mlp.py: JAX runs on {dev.platform}, not on a GPU "
                 "(is the CUDA plugin installed?)")

    w = args.width
    params = jax.device_put(init_params([w, w, w, 10]), dev)
    mom = tree_map(jnp.zeros_like, params)
    rng = np.random.default_rng(1)
    xs = [jax.device_put(rng.standard_normal((args.batch, w), dtype=np.float32), dev)
          for _ in range(args.batches)]
    ys = [jax.device_put(rng.standard_normal((args.batch, 10), dtype=np.float32), dev)
          for _ in range(args.batches)]
    for a in xs + ys:
        a.block_until_ready()

    losses, times = [], []
    t_all = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        params, mom, loss = train_step(params, mom, xs[step % args.batches],
                                       ys[step % args.batches])
        loss.block_until_ready()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e6)
        losses.append(loss)
    jax.block_until_ready(params)
    total_s = time.perf_counter() - t_all

    host = np.array([np.float32(v) for v in losses], dtype=np.float32)
    digest = hashlib.sha256(host.tobytes()).hexdigest()
    print(
        f"RESULT jax allocator={allocator} caching={int(allocator == 'default')} "
        f"cudefer={int(cudefer_loaded())} "
        f"{step_fields(times, args.steps, args.warmup, total_s)} "
        f"peak_mem_mib={peak_mib(dev)} {loss_fields(float(host[-1]), digest)}",
        flush=True,
    )
    print(f"jax_mlp: jax {jax.__version__}, {dev.device_kind}, allocator {allocator}, "
          f"first losses {[f'{v:.6g}' for v in host[:3].tolist()]}", flush=True)


if __name__ == "__main__":
    main()
