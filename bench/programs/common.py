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


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class DeviceMemory:
    """Device memory in use on one GPU: its level when made, and the peak
    above that level over the samples taken after it (sample()), printed
    by fields() as the RESULT line's peak_mem_mib, mem_source and
    visible_peak_mib.

    peak_mem_mib is NVML's figure for the whole GPU (libnvidia-ml, which
    comes with the driver and which cudefer does not wrap): what the GPU
    really holds, the blocks cudefer keeps for reuse included; other
    processes on the same GPU count in it. visible_peak_mib is the
    framework's mem_get_info (total - free), which under cudefer counts the
    device memory cudefer holds for the program as free, as the driver
    alone would once its own release had returned (README, cuMemGetInfo):
    what the program is told, not what the GPU holds. Where NVML cannot be
    had, both are the latter, and mem_source says so.
    """

    def __init__(self, uuid, mem_get_info):
        self._info = mem_get_info
        self._nvml = None
        self._dev = ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2")
            name = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            if lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(self._dev)) != 0:
                raise OSError("nvmlDeviceGetHandleByUUID " + name)
            self._nvml = lib
            self._base = self._used()
        except (OSError, AttributeError):
            self._nvml = None
            self._base = self._visible()
        self.source = "nvml" if self._nvml else "mem_get_info"
        self._vbase = self._visible()
        self._peak, self._vpeak = self._base, self._vbase

    def _visible(self):
        free, total = self._info()
        return total - free

    def _used(self):
        if self._nvml is None:
            return self._visible()
        m = _NvmlMemory()
        if self._nvml.nvmlDeviceGetMemoryInfo(self._dev, ctypes.byref(m)) != 0:
            raise OSError("nvmlDeviceGetMemoryInfo")
        return m.used

    def sample(self):
        self._peak = max(self._peak, self._used())
        self._vpeak = max(self._vpeak, self._visible())

    def fields(self):
        return (f"peak_mem_mib={(self._peak - self._base) / 2**20:.1f} "
                f"mem_source={self.source} "
                f"visible_peak_mib={(self._vpeak - self._vbase) / 2**20:.1f}")
