/* release_cases.h - the releases whose stall two programs measure: the
 * check tests/gpu/stall.c and the stall section of cudefer-loops (loops.c).
 *
 * Each release (cuMemFree, cuMemFreeHost, cuMemHostUnregister,
 * cuArrayDestroy, cuModuleUnload, cuLibraryUnload) is made while a long
 * kernel runs on spin_stream; another thread, the launcher, launches a tiny
 * kernel on launch_stream launcher.delay_ms into the release. This header
 * holds what the two programs share: the streams, the launching thread, the
 * objects released (how each is prepared and released) and the table of
 * cases, with each program's names for them. Each program launches the long
 * kernel, times the release and prints its lines itself.
 *
 * Everything is static: the header is for those two programs, one
 * translation unit each, and each uses all of it.
 */
#ifndef CUDEFER_RELEASE_CASES_H
#define CUDEFER_RELEASE_CASES_H

#include "gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define RELEASE_OBJECT_BYTES (1 * GC_MIB)
#define RELEASE_LAUNCH_DELAY_MS 5.0

/* ---- the streams and the launching thread -------------------------------- */

static CUstream spin_stream;   /* the long kernel */
static CUstream launch_stream; /* the other thread's tiny kernels */
static CUstream setup_stream;  /* first launches of loaded kernels */

static struct {
    pthread_t thread;
    CUcontext ctx;    /* made current in the thread */
    CUfunction touch; /* cudefer_touch, launched with nothing to write */
    _Atomic int go;   /* round to launch in */
    _Atomic int done; /* last round launched */
    _Atomic bool quit;
    double delay_ms;
    double launch_ms;
    CUresult rc;
} launcher;

/* The launching thread: once a round, delay_ms after the round starts, one
 * launch of the tiny kernel on launch_stream, timed. */
static void *launcher_main(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(launcher.ctx));
    int round = 0;
    for (;;) {
        while (atomic_load(&launcher.go) == round && !atomic_load(&launcher.quit))
            gc_sleep_ms(0.02);
        if (atomic_load(&launcher.quit))
            return NULL;
        round = atomic_load(&launcher.go);
        gc_sleep_ms(launcher.delay_ms);
        double t0 = gc_now_ms();
        launcher.rc = gc_touch_with(launcher.touch, launch_stream, 0, 0);
        launcher.launch_ms = gc_now_ms() - t0;
        atomic_store(&launcher.done, round);
    }
}

/* Starts a round of the launching thread; returns it for launcher_wait. */
static int launcher_start_round(void)
{
    int round = atomic_load(&launcher.go) + 1;
    atomic_store(&launcher.go, round);
    return round;
}

/* Waits until the launching thread has launched in the round. */
static void launcher_wait(int round)
{
    while (atomic_load(&launcher.done) != round)
        gc_sleep_ms(0.1);
}

/* Creates the three streams (non-blocking) and starts the launching thread
 * in ctx, with the tiny kernel touch; it launches at once (delay_ms 0, for
 * the warm-up) until the program sets launcher.delay_ms. */
static void release_start(CUcontext ctx, CUfunction touch)
{
    GC_CHECK(cuStreamCreate(&spin_stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&launch_stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&setup_stream, CU_STREAM_NON_BLOCKING));
    launcher.ctx = ctx;
    launcher.touch = touch;
    launcher.delay_ms = 0;
    if (pthread_create(&launcher.thread, NULL, launcher_main, NULL) != 0)
        gc_die("pthread_create failed");
}

/* Ends the launching thread and destroys the streams. */
static void release_stop(void)
{
    atomic_store(&launcher.quit, true);
    pthread_join(launcher.thread, NULL);
    GC_CHECK(cuStreamDestroy(spin_stream));
    GC_CHECK(cuStreamDestroy(launch_stream));
    GC_CHECK(cuStreamDestroy(setup_stream));
}

/* ---- the objects released ------------------------------------------------ */

struct object {
    CUdeviceptr dptr;
    void *host;
    CUarray array;
    CUmodule module;
    CUlibrary library;
};

/* Device memory. */
static void prep_device(struct object *o)
{
    GC_CHECK(cuMemAlloc(&o->dptr, RELEASE_OBJECT_BYTES));
}

/* Managed memory. */
static void prep_managed(struct object *o)
{
    GC_CHECK(cuMemAllocManaged(&o->dptr, RELEASE_OBJECT_BYTES, CU_MEM_ATTACH_GLOBAL));
}

/* Pinned host memory from cuMemAllocHost. */
static void prep_alloc_host(struct object *o)
{
    GC_CHECK(cuMemAllocHost(&o->host, RELEASE_OBJECT_BYTES));
}

/* Pinned host memory from cuMemHostAlloc, mapped for the device. */
static void prep_host_alloc(struct object *o)
{
    GC_CHECK(cuMemHostAlloc(&o->host, RELEASE_OBJECT_BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
}

/* Page-aligned host memory, registered. */
static void prep_registered(struct object *o)
{
    o->host = gc_xpages(RELEASE_OBJECT_BYTES);
    GC_CHECK(cuMemHostRegister(o->host, RELEASE_OBJECT_BYTES, 0));
}

/* A 256 x 256 float array. */
static void prep_array(struct object *o)
{
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = 256, .Height = 256, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuArrayCreate(&o->array, &d));
}

/* A second module, one of whose kernels has run. */
static void prep_module(struct object *o)
{
    CUfunction f;
    GC_CHECK(cuModuleLoadData(&o->module, cudefer_kernels_ptx));
    GC_CHECK(cuModuleGetFunction(&f, o->module, "cudefer_touch"));
    GC_CHECK(gc_touch_with(f, setup_stream, 0, 0));
    GC_CHECK(cuStreamSynchronize(setup_stream));
}

/* A library one of whose kernels is loaded into the context and has run:
 * only then does the real cuLibraryUnload wait for the GPU. */
static void prep_library(struct object *o)
{
    CUkernel k;
    CUfunction f;
    GC_CHECK(cuLibraryLoadData(&o->library, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&k, o->library, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&f, k));
    GC_CHECK(gc_touch_with(f, setup_stream, 0, 0));
    GC_CHECK(cuStreamSynchronize(setup_stream));
}

/* The releases, one call each; their code is the measurement's. */
static CUresult rel_mem_free(struct object *o) { return cuMemFree(o->dptr); }
static CUresult rel_free_host(struct object *o) { return cuMemFreeHost(o->host); }
static CUresult rel_unregister(struct object *o) { return cuMemHostUnregister(o->host); }
static CUresult rel_array(struct object *o) { return cuArrayDestroy(o->array); }
static CUresult rel_module(struct object *o) { return cuModuleUnload(o->module); }
static CUresult rel_library(struct object *o) { return cuLibraryUnload(o->library); }

/* Frees the registered memory once it is unregistered and idle. */
static void after_registered(struct object *o)
{
    free(o->host);
}

/* ---- the cases ----------------------------------------------------------- */

struct release_case {
    const char *name;  /* tests/gpu/stall.c: "RESULT stall release=<name>" */
    const char *id;    /* cudefer-loops: "R stall case=<id>" */
    const char *label; /* cudefer-loops: the row of its stall table */
    void (*prepare)(struct object *o);
    CUresult (*release)(struct object *o);
    void (*after)(struct object *o); /* once the context is synchronised */
    /* The release waits, with cudefer too, for the work submitted before it
     * (cudefer's cuMemHostUnregister: the program may unmap the pages as
     * soon as it returns, so the GPU must be done with them); only the
     * other thread's launch must not wait. */
    bool waits_for_prior;
};

static const struct release_case release_cases[] = {
    {"cuMemFree(cuMemAlloc)", "device", "cuMemFree (cuMemAlloc memory)", prep_device,
     rel_mem_free, NULL, false},
    {"cuMemFree(cuMemAllocManaged)", "managed", "cuMemFree (cuMemAllocManaged memory)",
     prep_managed, rel_mem_free, NULL, false},
    {"cuMemFreeHost(cuMemAllocHost)", "allochost", "cuMemFreeHost (cuMemAllocHost memory)",
     prep_alloc_host, rel_free_host, NULL, false},
    {"cuMemFreeHost(cuMemHostAlloc)", "hostalloc",
     "cuMemFreeHost (cuMemHostAlloc DEVICEMAP memory)", prep_host_alloc, rel_free_host, NULL,
     false},
    {"cuMemHostUnregister", "unregister", "cuMemHostUnregister", prep_registered,
     rel_unregister, after_registered, true},
    {"cuArrayDestroy", "array", "cuArrayDestroy", prep_array, rel_array, NULL, false},
    {"cuModuleUnload(second_module)", "module",
     "cuModuleUnload (a second module, a kernel of it run)", prep_module, rel_module, NULL,
     false},
    {"cuLibraryUnload(kernel_loaded)", "library",
     "cuLibraryUnload (a kernel of it loaded and run)", prep_library, rel_library, NULL, false},
};
#define N_RELEASE_CASES (sizeof release_cases / sizeof release_cases[0])

#endif
