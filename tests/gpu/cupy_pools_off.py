"""A pytest plugin for scripts/gpu-suite.sh: CuPy's memory pools off.

With the pools on, CuPy keeps freed device and pinned memory for itself,
and the driver (and cudefer) see few releases. With them off, every array
is a cudaMalloc and a cudaFree, and every pinned staging buffer a
cudaHostAlloc and a cudaFreeHost, while the tests check the values the
GPU computed into that memory. The same plugin runs in both runs of the
suite (without and with cudefer), so their outcomes stay comparable:

    PYTHONPATH=$PWD/tests/gpu OUT=... scripts/gpu-suite.sh ../cupy/tests \\
        -p cupy_pools_off cupy_tests/core_tests/test_ndarray_copy_and_view.py
"""

import sys


def pytest_configure(config):
    import cupy

    cupy.cuda.set_allocator(None)
    cupy.cuda.set_pinned_memory_allocator(None)
    print("cupy_pools_off: CuPy's device and pinned memory pools are off", file=sys.stderr)
