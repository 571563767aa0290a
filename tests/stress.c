/* stress.c - 16 threads release concurrently through the shim, over the test
 * driver; meant for the ThreadSanitizer build (Criterion's own process
 * machinery does not run under it). Each thread allocates, touches with a
 * kernel and releases device and pinned memory, and creates and destroys
 * streams; at the end every allocation must be gone and no kernel may have
 * touched freed memory. Prints "N passed, N failed". */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "testdriver.h"

#define THREADS 16
#define ROUNDS 200

static CUcontext ctx;
static int passed, failed;

static void check(int ok, const char *what)
{
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "FAIL: %s\n", what);
    }
}

static void *worker(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(ctx);
    CUstream s;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return (void *)1;
    for (int i = 0; i < ROUNDS; i++) {
        CUdeviceptr d;
        void *h;
        if (cuMemAlloc(&d, 4096 + (size_t)i) != CUDA_SUCCESS)
            return (void *)1;
        testdrv_launch(s, 5, d, 4096, TESTDRV_WRITE);
        if (cuMemFree(d) != CUDA_SUCCESS)
            return (void *)1;
        if (cuMemAllocHost(&h, 4096) != CUDA_SUCCESS || cuMemFreeHost(h) != CUDA_SUCCESS)
            return (void *)1;
        if (i % 50 == 49) {
            cuStreamDestroy(s);
            if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
                return (void *)1;
            cuCtxSynchronize();
        }
    }
    cuStreamDestroy(s);
    return NULL;
}

int main(void)
{
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "no context\n");
        return 2;
    }
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        check(ret == NULL, "a thread saw a failed call");
    }
    check(cuCtxSynchronize() == CUDA_SUCCESS, "cuCtxSynchronize");
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    check(flush != NULL, "the shim is preloaded");
    if (flush)
        flush();
    check(testdrv_live(TESTDRV_DEVICE) == 0, "device memory left");
    check(testdrv_live(TESTDRV_HOST) == 0, "pinned memory left");
    check(testdrv_faults() == 0, "a kernel touched freed memory");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
