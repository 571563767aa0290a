/* gpucheck.h - shared helpers of the real-GPU check programs (tests/gpu).
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
 * cudefer-loops (bench/loops.c) uses these helpers too, with a prefix and
 * an exit status of its own for failures (gc_failure).
 */
#ifndef CUDEFER_GPUCHECK_H
#define CUDEFER_GPUCHECK_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT; include this header first */
#endif

#include <cuda.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../bench/kernels.h"

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
};

static inline void gc_kernels_from_module(struct gc_kernels *k, CUmodule m)
{
    k->module = m;
    GC_CHECK(cuModuleGetFunction(&k->spin, m, "cudefer_spin"));
    GC_CHECK(cuModuleGetFunction(&k->wait_flag, m, "cudefer_wait_flag"));
    GC_CHECK(cuModuleGetFunction(&k->touch, m, "cudefer_touch"));
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

#endif
