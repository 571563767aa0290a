/* lifecycle_child.c - a plain program for tests/test_lifecycle.c: what a
 * CUDA program does before it exits or execs, run as a process of its own
 * (not a Criterion worker), with the shim preloaded over the test driver.
 *
 * usage: lifecycle_child MODE
 *   exit    queues a release of every kind (a device free behind a kernel
 *           that runs for 5 s more), then returns from main: the process
 *           must exit at once and cleanly, and nothing may reach the driver
 *           after its exit-time teardown (the test driver says so on stderr)
 *   flush   queues a release of every kind, calls cudefer_flush and checks
 *           that every object is gone: the shim works in this process
 *   exec    queues a release of every kind (behind a 5 s kernel), then
 *           execs /bin/true
 * Exit status 0 when all went as it should; otherwise a message on stderr
 * and status 1 (2: bad usage, 3: a set-up call failed).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "own.h"
#include "testdriver.h"

#define BYTES (64u << 10)

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "lifecycle_child: %s failed with %d\n", what, (int)rc);
        exit(3);
    }
}

static const char ptx[] = "// the test driver accepts any image\n";

/* One release of each kind the shim defers; the device free waits behind
 * a kernel that writes the memory for usec more. */
static void queue_one_of_each(unsigned usec)
{
    CUstream s;
    CUdeviceptr d, m;
    void *h, *ha, *r = aligned_alloc(4096, BYTES);
    CUarray a;
    CUmodule mod;
    CUlibrary lib;
    CUkernel k;
    CUfunction f;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuMemAlloc(&d, BYTES), "cuMemAlloc");
    check(cuMemAllocManaged(&m, BYTES, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
    check(cuMemAllocHost(&h, BYTES), "cuMemAllocHost");
    check(cuMemHostAlloc(&ha, BYTES, CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc");
    check(r ? cuMemHostRegister(r, BYTES, 0) : CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostRegister");
    check(cuArrayCreate(&a, &desc), "cuArrayCreate");
    check(cuModuleLoadData(&mod, ptx), "cuModuleLoadData");
    check(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0), "cuLibraryLoadData");
    check(cuLibraryGetKernel(&k, lib, "k"), "cuLibraryGetKernel");
    check(cuKernelGetFunction(&f, k), "cuKernelGetFunction");
    /* The registration first: its release waits for the work submitted
     * before it (the pages are the program's when it returns), and the
     * driver's own unregister is what stays deferred. */
    check(cuMemHostUnregister(r), "cuMemHostUnregister");
    check(testdrv_launch(s, usec, d, BYTES, TESTDRV_WRITE), "testdrv_launch");
    check(cuMemFree(d), "cuMemFree (device)");
    check(cuMemFree(m), "cuMemFree (managed)");
    check(cuMemFreeHost(h), "cuMemFreeHost");
    check(cuMemFreeHost(ha), "cuMemFreeHost (cuMemHostAlloc)");
    check(cuArrayDestroy(a), "cuArrayDestroy");
    check(cuModuleUnload(mod), "cuModuleUnload");
    check(cuLibraryUnload(lib), "cuLibraryUnload");
    /* Deferred, so still there for the driver. */
    if (program_live(TESTDRV_HOST) != 2 || program_live(TESTDRV_ARRAY) != 1) {
        fprintf(stderr, "lifecycle_child: the releases were not deferred (is the shim "
                        "preloaded?)\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

    if (strcmp(argv[1], "exit") == 0) {
        queue_one_of_each(5000000);
        return 0;
    }
    if (strcmp(argv[1], "exec") == 0) {
        queue_one_of_each(5000000);
        execl("/bin/true", "true", (char *)NULL);
        perror("lifecycle_child: exec /bin/true");
        return 1;
    }
    if (strcmp(argv[1], "flush") == 0) {
        queue_one_of_each(1000);
        int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
        if (!flush) {
            fprintf(stderr, "lifecycle_child: cudefer_flush not found\n");
            return 1;
        }
        flush();
        int failed = 0;
        for (enum testdrv_kind kind = TESTDRV_DEVICE; kind <= TESTDRV_LIBRARY; kind++) {
            if (program_live(kind) != 0) {
                fprintf(stderr, "lifecycle_child: kind %d: %zu left after cudefer_flush\n",
                        (int)kind, program_live(kind));
                failed = 1;
            }
        }
        if (testdrv_faults() != 0) {
            fprintf(stderr, "lifecycle_child: a kernel touched freed memory\n");
            failed = 1;
        }
        return failed;
    }
    return 2;
}
