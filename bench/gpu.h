/* gpu.h - shared helpers of the programs that run on a real GPU: the checks
 * of tests/gpu and cudefer-loops (loops.c).
 *
 * Every program prints its findings as one line each:
 *
 *     RESULT <name> key=value key=value ...
 *
 * (values never contain spaces); scripts/gpu-check.sh collects them and
 * tests/gpu/report.py turns them into tables. Anything else a program
 * prints is for the log only.
 *
 * GC_CHECK(call) ends the program (exit status 2) when a set-up call fails:
 * such a run has no RESULT line, which the report shows as a failure.
 * Calls whose return code is the finding are not wrapped; their codes are
 * printed by name (gc_rc).
 *
 * cudefer-loops (loops.c) uses these helpers too, with a prefix and an exit
 * status of its own for failures (gc_failure). The programs of tests/gpu are
 * built with -I bench (scripts/gpu-check.sh).
 */
#ifndef CUDEFER_BENCH_GPU_H
#define CUDEFER_BENCH_GPU_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT; include this header first */
#endif

#include <cuda.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

#define GC_KIB (1024ull)
#define GC_MIB (1024ull * 1024ull)
#define GC_GIB (1024ull * 1024ull * 1024ull)

/* ---- return codes -------------------------------------------------------- */

/* The driver's name of a CUresult ("CUDA_SUCCESS"), or "CUresult_<n>" for a
 * code the driver has no name for. The string is static per thread. */
static inline const char *gc_rc(CUresult rc)
{
    static _Thread_local char unknown[32];
    const char *name = NULL;
    if (cuGetErrorName(rc, &name) == CUDA_SUCCESS && name)
        return name;
    snprintf(unknown, sizeof unknown, "CUresult_%d", (int)rc);
    return unknown;
}

/* How a failure ends the program: gc_fail and gc_die write the prefix and
 * their message to stderr and exit with the status. The checks keep "" and
 * 2; a program may set other ones before its first call of either. */
static struct {
    char prefix[256];
    int status;
} gc_failure = {"", 2};

/* Ends the program for a CUDA call that failed. */
static inline void gc_fail(const char *what, CUresult rc, const char *file, int line)
{
    fflush(stdout);
    fprintf(stderr, "%s%s:%d: %s failed: %s (%d)\n", gc_failure.prefix, file, line, what,
            gc_rc(rc), (int)rc);
    exit(gc_failure.status);
}

#define GC_CHECK(call)                                                      \
    do {                                                                    \
        CUresult gc_rc_ = (call);                                           \
        if (gc_rc_ != CUDA_SUCCESS)                                         \
            gc_fail(#call, gc_rc_, __FILE__, __LINE__);                     \
    } while (0)

/* For failures that are not CUDA calls (bad arguments, malloc). */
static inline void gc_die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs(gc_failure.prefix, stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(gc_failure.status);
}

static inline void *gc_xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p)
        gc_die("out of host memory (%zu bytes)", bytes);
    return p;
}

/* Page-aligned host memory of a whole number of pages, for cuMemHostRegister. */
static inline void *gc_xpages(size_t bytes)
{
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, rounded);
    if (!p)
        gc_die("out of host memory (%zu bytes)", rounded);
    memset(p, 0, rounded);
    return p;
}

/* ---- time ---------------------------------------------------------------- */

static inline double gc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline void gc_sleep_ms(double ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1e3);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1e3) * 1e6);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Sleeps until gc_now_ms() reaches t_ms (at once if it has). */
static inline void gc_sleep_until(double t_ms)
{
    double left = t_ms - gc_now_ms();
    if (left > 0)
        gc_sleep_ms(left);
}

/* ---- context ------------------------------------------------------------- */

/* Initialises the driver and makes device 0's primary context current on
 * this thread (as the CUDA runtime does). */
static inline CUcontext gc_init(void)
{
    CUdevice dev;
    CUcontext ctx;
    GC_CHECK(cuInit(0));
    GC_CHECK(cuDeviceGet(&dev, 0));
    GC_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    GC_CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

/* Drops this program's reference to the primary context (the last one:
 * the context is destroyed, which is the teardown path of the shim). */
static inline void gc_fini(void)
{
    CUdevice dev;
    GC_CHECK(cuDeviceGet(&dev, 0));
    GC_CHECK(cuCtxSetCurrent(NULL));
    GC_CHECK(cuDevicePrimaryCtxRelease(dev));
}

/* ---- kernels (bench/kernels.h) ------------------------------------------ */

struct gc_kernels {
    CUmodule module;
    CUfunction spin;      /* (u64 ns, u64 buf, u64 words) */
    CUfunction wait_flag; /* (u64 flag) */
    CUfunction touch;     /* (u64 buf, u64 words) */
    CUfunction fill;      /* (u64 buf, u64 words), every thread of a grid */
};

static inline void gc_kernels_from_module(struct gc_kernels *k, CUmodule m)
{
    k->module = m;
    GC_CHECK(cuModuleGetFunction(&k->spin, m, "cudefer_spin"));
    GC_CHECK(cuModuleGetFunction(&k->wait_flag, m, "cudefer_wait_flag"));
    GC_CHECK(cuModuleGetFunction(&k->touch, m, "cudefer_touch"));
    GC_CHECK(cuModuleGetFunction(&k->fill, m, "cudefer_fill"));
}

static inline void gc_load_kernels(struct gc_kernels *k)
{
    CUmodule m;
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    gc_kernels_from_module(k, m);
}

/* One thread, one block: every kernel of kernels.h is written for that. */
static inline CUresult gc_launch(CUfunction f, CUstream s, void **args)
{
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

static inline CUresult gc_spin(const struct gc_kernels *k, CUstream s, double ms,
                               CUdeviceptr buf, unsigned long long words)
{
    unsigned long long ns = (unsigned long long)(ms * 1e6);
    void *args[] = {&ns, &buf, &words};
    return gc_launch(k->spin, s, args);
}

static inline CUresult gc_touch_with(CUfunction touch, CUstream s, CUdeviceptr buf,
                                     unsigned long long words)
{
    void *args[] = {&buf, &words};
    return gc_launch(touch, s, args);
}

static inline CUresult gc_touch(const struct gc_kernels *k, CUstream s, CUdeviceptr buf,
                                unsigned long long words)
{
    return gc_touch_with(k->touch, s, buf, words);
}

static inline CUresult gc_wait_flag(const struct gc_kernels *k, CUstream s, CUdeviceptr flag)
{
    void *args[] = {&flag};
    return gc_launch(k->wait_flag, s, args);
}

/* cudefer_fill over [buf, buf + bytes): every word written once, by 264
 * blocks of 256 threads. */
static inline CUresult gc_fill(const struct gc_kernels *k, CUstream s, CUdeviceptr buf,
                               size_t bytes)
{
    unsigned long long words = bytes / 4;
    void *args[] = {&buf, &words};
    return cuLaunchKernel(k->fill, 264, 1, 1, 256, 1, 1, 0, s, args, NULL);
}

/* ---- a flag the host sets, with a watchdog ------------------------------ */

/* A u32 in pinned host memory mapped for the device (cuMemHostAlloc
 * DEVICEMAP), for cudefer_wait_flag; a watchdog thread sets it after a
 * time, so that a kernel waiting for it never waits for ever. */
struct gc_flag {
    volatile uint32_t *host;
    CUdeviceptr dev;
    pthread_t watchdog;
    double after_ms;
    _Atomic bool running, done, fired;
};

static inline void gc_flag_set(struct gc_flag *f)
{
    __atomic_store_n(f->host, 1u, __ATOMIC_SEQ_CST);
}

/* Allocates the flag (in the current context) and clears it. */
static inline void gc_flag_init(struct gc_flag *f)
{
    void *host;
    GC_CHECK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    GC_CHECK(cuMemHostGetDevicePointer(&f->dev, host, 0));
    f->host = host;
    *f->host = 0;
}

static inline void *gc_flag_watchdog_main(void *arg)
{
    struct gc_flag *f = arg;
    double start = gc_now_ms();
    while (!atomic_load(&f->done)) {
        if (gc_now_ms() - start >= f->after_ms) {
            atomic_store(&f->fired, true);
            gc_flag_set(f);
            return NULL;
        }
        gc_sleep_ms(1.0);
    }
    return NULL;
}

/* Clears the flag and starts the watchdog: it sets the flag after_ms from
 * now unless gc_flag_disarm comes first. */
static inline void gc_flag_arm(struct gc_flag *f, double after_ms)
{
    *f->host = 0;
    f->after_ms = after_ms;
    atomic_store(&f->done, false);
    atomic_store(&f->fired, false);
    if (pthread_create(&f->watchdog, NULL, gc_flag_watchdog_main, f) != 0)
        gc_die("pthread_create failed");
    atomic_store(&f->running, true);
}

/* Stops the watchdog; true when it had set the flag. */
static inline bool gc_flag_disarm(struct gc_flag *f)
{
    if (atomic_load(&f->running)) {
        atomic_store(&f->done, true);
        pthread_join(f->watchdog, NULL);
        atomic_store(&f->running, false);
    }
    return atomic_load(&f->fired);
}

static inline void gc_flag_free(struct gc_flag *f)
{
    gc_flag_disarm(f);
    GC_CHECK(cuMemFreeHost((void *)f->host));
}

/* ---- checksums ----------------------------------------------------------- */

/* FNV-1a over 32-bit words: equal output, equal checksum. */
static inline unsigned long long gc_checksum(const uint32_t *w, size_t n)
{
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- cudefer ------------------------------------------------------------- */

/* cudefer_flush() when the shim is loaded; 0 otherwise. */
static inline int gc_cudefer_flush(void)
{
    int (*flush)(void) = NULL;
    *(void **)&flush = dlsym(RTLD_DEFAULT, "cudefer_flush");
    return flush ? flush() : 0;
}

static inline int gc_cudefer_loaded(void)
{
    return dlsym(RTLD_DEFAULT, "cudefer_version") != NULL;
}

/* Over the project's test driver (smoke runs of the scripts without a GPU,
 * recognised by its testdrv_launch hook) kernels are simulated: PTX does not
 * run, so timings and what kernels write mean nothing. */
static inline int gc_test_driver(void)
{
    return dlsym(RTLD_DEFAULT, "testdrv_launch") != NULL;
}

/* ---- device memory ------------------------------------------------------- */

/* Device memory in use (total - free), in MiB. */
static inline double gc_used_mib(void)
{
    size_t free_bytes, total;
    GC_CHECK(cuMemGetInfo(&free_bytes, &total));
    return (double)(total - free_bytes) / (double)GC_MIB;
}

#endif
