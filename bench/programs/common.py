"""common.py - what the real-program benchmarks of this folder share.

Imported by mlp.py, transformer.py, jax_mlp.py and cupy_pinned.py, which
scripts/bench-gpu.sh runs in place (their folder is then on sys.path).
Imports no framework.
"""
import ctypes
import statistics


def cudefer_loaded():
    """Whether libcudefer is in the process (its public API is visible)."""
    try:
        ctypes.CDLL(None).cudefer_version
        return True
    except AttributeError:
        return False


def step_fields(times_us, steps, warmup, total_s):
    """The RESULT line's timing fields: median, extremes and deciles of the
    steps after the warm-up, in microseconds, then the counts and total_s."""
    timed = sorted(times_us[warmup:])
    q = statistics.quantiles(timed, n=10)
    return (f"us_per_step={statistics.median(timed):.1f} min={timed[0]:.1f} "
            f"max={timed[-1]:.1f} p10={q[0]:.1f} p90={q[-1]:.1f} steps={steps} "
            f"warmup={warmup} total_s={total_s:.3f}")


def loss_fields(final_loss, digest):
    """The RESULT line's last fields: the final loss and the losses' hash."""
    return f"final_loss={final_loss:.9g} loss_sha256={digest}"
