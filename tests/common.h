/* common.h - helpers shared by the suites that run the shim over the test
 * driver (LD_PRELOAD=libcudefer.so, LD_LIBRARY_PATH=<test driver>). */
#ifndef CUDEFER_TESTS_COMMON_H
#define CUDEFER_TESTS_COMMON_H

#include <criterion/criterion.h>
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "testdriver.h"

#define CU_OK(call)                                                           \
    do {                                                                      \
        CUresult rc_ = (call);                                                \
        cr_assert_eq(rc_, CUDA_SUCCESS, "%s returned %d", #call, (int)rc_);   \
    } while (0)

/* Initialises the driver and makes a fresh context current. Its
 * synchronisation (a flush point) waits for cudefer's one-time set-up,
 * which the waiter thread otherwise makes at some moment: the driver's
 * counts a test reads afterwards are then the program's own. */
static inline CUcontext test_context(void)
{
    CUcontext ctx;
    CUdevice dev;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuCtxSynchronize());
    return ctx;
}

static inline CUstream test_stream(unsigned flags)
{
    CUstream s;
    CU_OK(cuStreamCreate(&s, flags));
    return s;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define MS (1000000ull)

#endif
