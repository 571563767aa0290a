/* common.h - helpers shared by the suites that run the shim over the test
 * driver (LD_PRELOAD=libcudefer.so, LD_LIBRARY_PATH=<test driver>). */
#ifndef CUDEFER_TESTS_COMMON_H
#define CUDEFER_TESTS_COMMON_H

#include <criterion/criterion.h>
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "own.h"
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

/* A kernel that waits for the host: it runs until spin_release sets its
 * flag, or a watchdog does after 2 s, so that a wrong wait ends (and is
 * seen). */
struct spin {
    volatile int flag;
    pthread_t watchdog;
};

static inline void *spin_watchdog(void *arg)
{
    struct spin *sp = arg;
    for (int i = 0; i < 2000 && !sp->flag; i++)
        usleep(1000);
    sp->flag = 1;
    return NULL;
}

/* Queues on s a kernel that runs until spin_release (or 2 s). */
static inline void spin_start(struct spin *sp, CUstream s)
{
    sp->flag = 0;
    CU_OK(testdrv_launch_spin(s, &sp->flag));
    cr_assert_eq(pthread_create(&sp->watchdog, NULL, spin_watchdog, sp), 0);
}

static inline void spin_release(struct spin *sp)
{
    sp->flag = 1;
    pthread_join(sp->watchdog, NULL);
}

#endif
