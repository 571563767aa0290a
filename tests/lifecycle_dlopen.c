/* lifecycle_dlopen.c - for tests/test_lifecycle.c: a program that loads the
 * driver at run time, as the CUDA runtime does (dlopen of libcuda.so.1,
 * entry points by dlsym), queues releases with a kernel still running, and
 * returns from main.
 *
 * The exit must be as quick and clean as with a program linked with the
 * driver: no wait for the kernel, and no call into the driver once it has
 * torn itself down (the test driver reports such a call on stderr). (The
 * shim looks the driver's functions up with dlsym, so the dynamic loader
 * finalises the shim before the driver in both cases.)
 *
 * usage: lifecycle_dlopen      (no arguments; with the shim preloaded)
 * Exit status 0; 1 with a message on stderr when something failed.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "own.h"
#include "testdriver.h"

#define BYTES (64u << 10)

/* cuda.h maps plain names onto versioned ones (cuMemAlloc is
 * cuMemAlloc_v2): the string is the ELF name a pointer of that type has. */
#define NAME_OF(fn) NAME_OF_(fn)
#define NAME_OF_(fn) #fn
#define LOOKUP(var, fn)                                                       \
    __typeof__(&fn) var = (__typeof__(&fn))lookup(driver, NAME_OF(fn))

static void *lookup(void *driver, const char *name)
{
    void *p = dlsym(driver, name);
    if (!p) {
        fprintf(stderr, "lifecycle_dlopen: %s not found\n", name);
        exit(1);
    }
    return p;
}

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        fprintf(stderr, "lifecycle_dlopen: %s failed with %d\n", what, (int)rc);
        exit(1);
    }
}

int main(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        fprintf(stderr, "lifecycle_dlopen: %s\n", dlerror());
        return 1;
    }
    LOOKUP(init, cuInit);
    LOOKUP(device_get, cuDeviceGet);
    LOOKUP(retain, cuDevicePrimaryCtxRetain);
    LOOKUP(set_current, cuCtxSetCurrent);
    LOOKUP(stream_create, cuStreamCreate);
    LOOKUP(mem_alloc, cuMemAlloc);
    LOOKUP(mem_free, cuMemFree);
    LOOKUP(host_alloc, cuMemAllocHost);
    LOOKUP(host_free, cuMemFreeHost);
    LOOKUP(array_create, cuArrayCreate);
    LOOKUP(array_destroy, cuArrayDestroy);
    LOOKUP(launch, testdrv_launch);
    LOOKUP(live, testdrv_live);
    LOOKUP(live_sized, testdrv_live_sized);

    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUdeviceptr d;
    void *h;
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    check(init(0), "cuInit");
    check(device_get(&dev, 0), "cuDeviceGet");
    check(retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(set_current(ctx), "cuCtxSetCurrent");
    check(stream_create(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(mem_alloc(&d, BYTES), "cuMemAlloc");
    check(host_alloc(&h, BYTES), "cuMemAllocHost");
    check(array_create(&a, &desc), "cuArrayCreate");
    check(launch(s, 5000000, d, BYTES, TESTDRV_WRITE), "testdrv_launch");
    check(mem_free(d), "cuMemFree");
    check(host_free(h), "cuMemFreeHost");
    check(array_destroy(a), "cuArrayDestroy");
    /* cudefer's own pinned word is not the program's (own.h). */
    if (live(TESTDRV_HOST) - live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES) != 1 ||
        live(TESTDRV_ARRAY) != 1) {
        fprintf(stderr, "lifecycle_dlopen: the releases were not deferred (is the shim "
                        "preloaded?)\n");
        return 1;
    }
    return 0; /* with all three queued and the kernel running */
}
