#!/usr/bin/env python3
"""quiet.py - check 16: real frameworks with cudefer at its defaults.

usage: quiet.py torch|jax|cupy

Each framework does a little real work with its caching turned off, so
that every tensor is its own allocation and release:

  torch  PYTORCH_NO_CUDA_MEMORY_CACHING=1: 6 training steps of a small MLP,
         and a pinned tensor copied to the device
  jax    XLA_PYTHON_CLIENT_ALLOCATOR=platform (no pool, no preallocation),
         deterministic XLA: 6 jitted training steps of a small MLP
  cupy   cupy.cuda.set_allocator(None), set_pinned_memory_allocator(None):
         arrays made and dropped, a matrix product, pinned round trips

scripts/gpu-check.sh runs it without cudefer and with it, CUDEFER_LOG and
CUDEFER_STATS unset: cudefer must print nothing (no stderr line starting
with "cudefer:") and the values must be those of the run without it.

prints:
  RESULT quiet framework=<name> ok=1 values=<v1,v2,...> cudefer=<0|1>
or, where the framework or a GPU is missing (over the test driver):
  RESULT quiet framework=<name> skipped=1 reason=<no_module|no_gpu> cudefer=<0|1>
(values: repr of each float, comma-separated.)
"""
import ctypes
import os
import sys

STEPS = 6


def cudefer_loaded():
    try:
        ctypes.CDLL(None).cudefer_version
        return 1
    except AttributeError:
        return 0


def result(framework, **fields):
    words = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"RESULT quiet framework={framework} {words} cudefer={cudefer_loaded()}", flush=True)


def skipped(framework, reason):
    result(framework, skipped=1, reason=reason)
    sys.exit(0)


def values(vs):
    return ",".join(repr(float(v)) for v in vs)


def run_torch():
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch
    except ImportError:
        skipped("torch", "no_module")
    if not torch.cuda.is_available():
        skipped("torch", "no_gpu")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(64, 128, generator=gen).to(dev)
    y = torch.randint(0, 10, (64,), generator=gen).to(dev)
    out = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    pinned = torch.arange(4096, dtype=torch.float32).pin_memory()
    out.append((pinned.to(dev, non_blocking=True) * 2).sum().item())
    del pinned
    torch.cuda.synchronize()
    result("torch", ok=1, values=values(out))


def run_jax():
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_gpu_deterministic_ops=true")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        skipped("jax", "no_module")
    try:
        if not jax.devices("gpu"):
            skipped("jax", "no_gpu")
    except RuntimeError:
        skipped("jax", "no_gpu")

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {"w1": jax.random.normal(k1, (64, 128)) * 0.1,
              "w2": jax.random.normal(k2, (128, 1)) * 0.1}
    x = jax.random.normal(k3, (256, 64))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def loss_fn(p):
        h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    @jax.jit
    def step(p):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, grads), loss

    out = []
    for _ in range(STEPS):
        params, loss = step(params)
        out.append(float(loss))
    result("jax", ok=1, values=values(out))


def run_cupy():
    try:
        import cupy as cp
        import cupyx
        import numpy as np
    except ImportError:
        skipped("cupy", "no_module")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            skipped("cupy", "no_gpu")
    except cp.cuda.runtime.CUDARuntimeError:
        skipped("cupy", "no_gpu")
    cp.cuda.set_allocator(None)
    cp.cuda.set_pinned_memory_allocator(None)
    out = []
    rng = np.random.default_rng(0)
    m = rng.standard_normal((256, 256)).astype(np.float64)
    for i in range(STEPS):
        a = cp.arange(1 << 18, dtype=cp.float64) * (i + 1)
        b = cp.asarray(m) @ cp.asarray(m.T)
        out.append(float((a * a).sum() + b.trace()))
        del a, b
        pinned = cupyx.empty_pinned((1 << 16,), dtype=np.float32)
        pinned[:] = np.arange(1 << 16, dtype=np.float32) + i
        d = cp.asarray(pinned) * 2
        back = cupyx.empty_pinned((1 << 16,), dtype=np.float32)
        d.get(out=back)
        out.append(float(back.sum(dtype=np.float64)))
        del pinned, d, back
    cp.cuda.Device().synchronize()
    result("cupy", ok=1, values=values(out))


def main():
    runs = {"torch": run_torch, "jax": run_jax, "cupy": run_cupy}
    if len(sys.argv) != 2 or sys.argv[1] not in runs:
        sys.exit(__doc__)
    runs[sys.argv[1]]()


if __name__ == "__main__":
    main()
