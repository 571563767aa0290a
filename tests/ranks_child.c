/* ranks_child.c - one of the processes that tests/test_install.py starts
 * at once, through scripts/cudefer and through the installed cudefer
 * command: a driver-API program over the test driver that makes a known
 * number of releases, each while a simulated kernel still runs.
 *
 * usage: ranks_child N
 *   N rounds of: cuMemAlloc (64 KiB to 192 KiB) and cuMemAllocHost (16 KiB),
 *   a 2 ms kernel writing the device block on a non-blocking stream, then
 *   cuMemFree of the device block and cuMemFreeHost of the host block while
 *   the kernel runs; cuCtxSynchronize at the end. So N device and N host
 *   releases, and no other.
 * Prints "ranks_child pid=P device=N host=N". Exit status 0; 1 when cudefer
 * is not loaded or a kernel touched freed memory; 2: bad usage; 3: a CUDA
 * call failed.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "testdriver.h"

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "ranks_child: %s failed with %d\n", what, (int)rc);
        exit(3);
    }
}

int main(int argc, char **argv)
{
    int rounds = argc == 2 ? atoi(argv[1]) : -1;
    if (rounds < 0) {
        fprintf(stderr, "usage: ranks_child N\n");
        return 2;
    }
    if (!dlsym(RTLD_DEFAULT, "cudefer_version")) {
        fprintf(stderr, "ranks_child: cudefer is not loaded\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (int i = 0; i < rounds; i++) {
        size_t bytes = (size_t)(1 + i % 3) << 16;
        CUdeviceptr d;
        void *h;
        check(cuMemAlloc(&d, bytes), "cuMemAlloc");
        check(cuMemAllocHost(&h, 16 << 10), "cuMemAllocHost");
        check(testdrv_launch(s, 2000, d, bytes, TESTDRV_WRITE), "testdrv_launch");
        check(cuMemFree(d), "cuMemFree");
        check(cuMemFreeHost(h), "cuMemFreeHost");
    }
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    if (testdrv_faults() != 0) {
        fprintf(stderr, "ranks_child: a kernel touched freed memory\n");
        return 1;
    }
    printf("ranks_child pid=%d device=%d host=%d\n", (int)getpid(), rounds, rounds);
    return 0;
}
