/* test_fidelity.c - shows that the test driver reproduces the behaviour of
 * the real CUDA driver that cudefer depends on (DESIGN.md sections 1, 2).
 *
 * Each test runs in its own process (Criterion), so each starts with a
 * fresh driver. No shim is loaded here. Timing thresholds are generous
 * (the kernels that matter run for 0.2 - 1 s). */
#include <criterion/criterion.h>

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testdriver.h"

#define MS 1000000ull      /* ns per ms */
#define KERNEL_1S 1000000u /* us */
#define MIB ((size_t)1 << 20)
#define TD_STALL_NOTED_NS MS /* testdrv_lock_stall_end_ns: waits of 1 ms or more */

#define CU_OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* cuInit and a new context, current on the calling thread. */
static CUcontext ctx_setup(void)
{
    CUcontext c;
    CU_OK(cuInit(0));
    CU_OK(cuCtxCreate(&c, NULL, 0, 0));
    return c;
}

static CUstream stream_new(unsigned flags)
{
    CUstream s;
    CU_OK(cuStreamCreate(&s, flags));
    return s;
}

static CUevent event_new(void)
{
    CUevent e;
    CU_OK(cuEventCreate(&e, CU_EVENT_DEFAULT));
    return e;
}

/* A thread that waits for *go, sleeps delay_ms, then launches one short
 * kernel in ctx and records how long the launch call took. */
struct launcher {
    CUcontext ctx;
    atomic_int go;
    unsigned delay_ms;
    bool use_cu_launch; /* cuLaunchKernel instead of testdrv_launch */
    CUfunction fn;
    CUresult rc;
    uint64_t launch_ns;
    uint64_t blocked_ns;
    pthread_t thread;
};

static void *launcher_main(void *arg)
{
    struct launcher *l = arg;
    CUstream s;
    cuCtxSetCurrent(l->ctx);
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    while (!atomic_load(&l->go))
        sleep_ms(1);
    sleep_ms(l->delay_ms);
    uint64_t b0 = testdrv_thread_blocked_ns();
    uint64_t t0 = now_ns();
    if (l->use_cu_launch)
        l->rc = cuLaunchKernel(l->fn, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
    else
        l->rc = testdrv_launch(s, 10, 0, 0, TESTDRV_NONE);
    l->launch_ns = now_ns() - t0;
    l->blocked_ns = testdrv_thread_blocked_ns() - b0;
    return NULL;
}

static void launcher_start(struct launcher *l, CUcontext ctx, unsigned delay_ms)
{
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->delay_ms = delay_ms;
    cr_assert_eq(pthread_create(&l->thread, NULL, launcher_main, l), 0);
}

/* ------------------------------------------------------------------ */
/* 1. Waiting releases block the caller and stall other launches       */

enum release_kind {
    REL_DEVICE, REL_MANAGED, REL_HOST, REL_UNREGISTER, REL_ARRAY, REL_MODULE, REL_LIBRARY,
};

struct resource {
    CUdeviceptr dptr;
    void *host;
    CUarray array;
    CUmodule module;
    CUlibrary library;
};

static void resource_make(enum release_kind k, struct resource *r)
{
    static const char image[] = "not a cubin";
    CUDA_ARRAY_DESCRIPTOR d = { .Width = 256, .Height = 256,
                                .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1 };
    switch (k) {
    case REL_DEVICE: CU_OK(cuMemAlloc(&r->dptr, MIB)); break;
    case REL_MANAGED: CU_OK(cuMemAllocManaged(&r->dptr, MIB, CU_MEM_ATTACH_GLOBAL)); break;
    case REL_HOST: CU_OK(cuMemAllocHost(&r->host, MIB)); break;
    case REL_UNREGISTER:
        r->host = malloc(MIB);
        CU_OK(cuMemHostRegister(r->host, MIB, 0));
        break;
    case REL_ARRAY: CU_OK(cuArrayCreate(&r->array, &d)); break;
    case REL_MODULE: CU_OK(cuModuleLoadData(&r->module, image)); break;
    case REL_LIBRARY: {
        CUkernel k;
        CUfunction f;
        CU_OK(cuLibraryLoadData(&r->library, image, NULL, NULL, 0, NULL, NULL, 0));
        CU_OK(cuLibraryGetKernel(&k, r->library, "k"));
        CU_OK(cuKernelGetFunction(&f, k)); /* loaded into the context */
        break;
    }
    }
}

static CUresult resource_release(enum release_kind k, struct resource *r)
{
    switch (k) {
    case REL_DEVICE:
    case REL_MANAGED: return cuMemFree(r->dptr);
    case REL_HOST: return cuMemFreeHost(r->host);
    case REL_UNREGISTER: return cuMemHostUnregister(r->host);
    case REL_ARRAY: return cuArrayDestroy(r->array);
    case REL_MODULE: return cuModuleUnload(r->module);
    case REL_LIBRARY: return cuLibraryUnload(r->library);
    }
    return CUDA_ERROR_UNKNOWN;
}

/* A release made while a 1 s kernel runs on another non-blocking stream
 * blocks the caller ~1 s; another thread's launch made meanwhile stalls
 * (stalls == true) or goes through at once. */
static void check_waiting_release(enum release_kind k, bool stalls)
{
    CUcontext ctx = ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    struct resource r = { 0 };
    resource_make(k, &r);
    struct launcher l;
    launcher_start(&l, ctx, 100);

    CU_OK(testdrv_launch(a, KERNEL_1S, 0, 0, TESTDRV_NONE));
    uint64_t calls0 = testdrv_thread_wait_calls();
    uint64_t b0 = testdrv_thread_blocked_ns(), t0 = now_ns();
    atomic_store(&l.go, 1);
    CU_OK(resource_release(k, &r));
    uint64_t wall = now_ns() - t0, blocked = testdrv_thread_blocked_ns() - b0;
    pthread_join(l.thread, NULL);

    cr_assert_geq(blocked, 800 * MS, "caller blocked only %llu ms", (unsigned long long)(blocked / MS));
    cr_assert_geq(wall, 800 * MS);
    cr_assert_eq(testdrv_thread_wait_calls(), calls0 + 1);
    cr_assert_eq(l.rc, CUDA_SUCCESS);
    if (stalls) {
        cr_assert_geq(l.launch_ns, 600 * MS, "other launch stalled only %llu ms",
                      (unsigned long long)(l.launch_ns / MS));
        cr_assert_geq(l.blocked_ns, 600 * MS);
    } else {
        cr_assert_eq(l.blocked_ns, 0, "other launch stalled %llu ms",
                     (unsigned long long)(l.launch_ns / MS));
    }
    if (r.host && k == REL_UNREGISTER)
        free(r.host);
}

Test(release, mem_free_device_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_DEVICE, true);
}

Test(release, mem_free_managed_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_MANAGED, true);
}

Test(release, mem_free_host_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_HOST, true);
}

Test(release, host_unregister_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_UNREGISTER, true);
}

Test(release, array_destroy_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_ARRAY, true);
}

Test(release, module_unload_blocks_but_does_not_stall, .timeout = 10)
{
    check_waiting_release(REL_MODULE, false);
}

/* Measured (bench/RESULTS.md): the unload of a library with a kernel
 * loaded stalls other launches too. */
Test(release, loaded_library_unload_blocks_and_stalls, .timeout = 10)
{
    check_waiting_release(REL_LIBRARY, true);
}

/* cuLaunchKernel (not only the hook) stalls behind a waiting release;
 * allocations and stream-ordered frees do not wait. */
Test(release, cu_launch_kernel_stalls_allocations_do_not_wait, .timeout = 10)
{
    static const char image[] = "not a cubin";
    CUcontext ctx = ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr p, q;
    void *h;
    CU_OK(cuModuleLoadData(&mod, image));
    CU_OK(cuModuleGetFunction(&fn, mod, "k"));
    CU_OK(cuMemAlloc(&p, MIB));
    CU_OK(cuMemAlloc(&q, 16));
    CU_OK(cuMemFreeAsync(q, a)); /* pays the one-time set-up */
    CU_OK(testdrv_launch(a, 500000, 0, 0, TESTDRV_NONE));

    uint64_t b0 = testdrv_thread_blocked_ns(), w0 = testdrv_thread_wait_calls();
    CUdeviceptr m;
    CU_OK(cuMemAlloc(&q, MIB));
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(cuMemAllocManaged(&m, MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemFreeAsync(q, a));
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "allocations do not wait");
    cr_assert_eq(testdrv_thread_wait_calls(), w0);

    struct launcher l;
    launcher_start(&l, ctx, 50);
    l.use_cu_launch = true;
    l.fn = fn;
    atomic_store(&l.go, 1);
    CU_OK(cuMemFree(p));
    pthread_join(l.thread, NULL);
    cr_assert_eq(l.rc, CUDA_SUCCESS);
    cr_assert_geq(l.launch_ns, 300 * MS);
    cr_assert_geq(testdrv_calls("cuLaunchKernel"), 1);
}

/* testdrv_thread_kernel_waits counts the waits that found a kernel under
 * way in what they waited for, directly or through another stream's event
 * that the waited stream waits for; not a wait for frees alone. */
Test(release, kernel_waits_count_only_waits_for_kernels, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING), b = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr q;
    CUevent ev;
    CU_OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    uint64_t k0 = testdrv_thread_kernel_waits();
    CU_OK(cuStreamSynchronize(a)); /* nothing to wait for */
    CU_OK(cuMemAlloc(&q, 16));
    CU_OK(cuMemFreeAsync(q, a)); /* the one-time set-up: 10 ms, no kernel */
    CU_OK(cuStreamSynchronize(a));
    cr_assert_eq(testdrv_thread_kernel_waits(), k0, "a wait for a free alone counted");
    CU_OK(testdrv_launch(a, 50000, 0, 0, TESTDRV_NONE));
    CU_OK(cuStreamSynchronize(a));
    cr_assert_eq(testdrv_thread_kernel_waits(), k0 + 1, "a wait for a kernel not counted");
    CU_OK(testdrv_launch(a, 50000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(ev, a));
    CU_OK(cuStreamWaitEvent(b, ev, 0));
    CU_OK(cuMemAlloc(&q, 16));
    CU_OK(cuMemFreeAsync(q, b));
    CU_OK(cuStreamSynchronize(b)); /* a free behind the other stream's kernel */
    cr_assert_eq(testdrv_thread_kernel_waits(), k0 + 2, "a wait through an event not counted");
    CU_OK(cuCtxSynchronize()); /* all done already */
    cr_assert_eq(testdrv_thread_kernel_waits(), k0 + 2);
    CU_OK(cuEventDestroy(ev));
}

/* cuLibraryUnload waits only once one of its kernels was loaded into a
 * context. */
Test(release, library_unload_waits_only_when_loaded, .timeout = 10)
{
    static const char image[] = "not a cubin";
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    CUlibrary lazy, used;
    CUkernel k;
    CUfunction f;
    CU_OK(cuLibraryLoadData(&lazy, image, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryLoadData(&used, image, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryGetKernel(&k, used, "k"));
    CU_OK(cuKernelGetFunction(&f, k));
    CU_OK(testdrv_launch(a, 400000, 0, 0, TESTDRV_NONE));

    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuLibraryUnload(lazy));
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "never loaded: no wait");
    uint64_t t0 = now_ns();
    CU_OK(cuLibraryUnload(used));
    cr_assert_geq(now_ns() - t0, 300 * MS);
    cr_assert_eq(cuLibraryUnload(used), CUDA_ERROR_INVALID_HANDLE);
}

/* ------------------------------------------------------------------ */
/* 2. The hazard: an unfenced cuMemFreeAsync under a running kernel     */

Test(hazard, unfenced_free_async_faults, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING), b = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr buf, warm;
    CU_OK(cuMemAlloc(&warm, 16));
    CU_OK(cuMemFreeAsync(warm, b)); /* pays the one-time set-up */
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(a, 200000, buf, MIB, TESTDRV_WRITE));
    sleep_ms(10);

    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuMemFreeAsync(buf, b));
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "cuMemFreeAsync must return at once");

    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_gt(testdrv_faults(), 0);
    /* The error is sticky. */
    CUdeviceptr p;
    cr_assert_eq(cuMemAlloc(&p, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(cuStreamSynchronize(b), CUDA_ERROR_ILLEGAL_ADDRESS);
}

/* The first cuMemFreeAsync of non-pool memory costs ~10 ms once. */
Test(hazard, first_free_async_pays_set_up_once, .timeout = 10)
{
    ctx_setup();
    CUstream b = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p1, p2;
    CU_OK(cuMemAlloc(&p1, 16));
    CU_OK(cuMemAlloc(&p2, 16));
    uint64_t b0 = testdrv_thread_blocked_ns(), t0 = now_ns();
    CU_OK(cuMemFreeAsync(p1, b));
    cr_assert_geq(now_ns() - t0, 9 * MS);
    uint64_t b1 = testdrv_thread_blocked_ns();
    cr_assert_geq(b1 - b0, 9 * MS);
    CU_OK(cuMemFreeAsync(p2, b));
    cr_assert_eq(testdrv_thread_blocked_ns(), b1, "paid once");
}

/* The memory stops being live when the free's stream reaches it, not
 * when other streams are done. */
Test(hazard, free_async_unmaps_when_its_stream_reaches_it, .timeout = 10)
{
    ctx_setup();
    CUstream b = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(b, 150000, 0, 0, TESTDRV_NONE));
    CU_OK(cuMemFreeAsync(buf, b));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1, "still live while b has not reached it");
    CU_OK(cuStreamSynchronize(b));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(testdrv_faults(), 0);
}

/* ------------------------------------------------------------------ */
/* 3. The context-event fence                                          */

Test(fence, ctx_record_event_fence_avoids_the_fault, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING), b = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new();
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(a, 200000, buf, MIB, TESTDRV_WRITE));

    CUdeviceptr warm;
    CU_OK(cuMemAlloc(&warm, 16));
    CU_OK(cuMemFreeAsync(warm, b)); /* pays the one-time set-up */
    uint64_t b0 = testdrv_thread_blocked_ns(), t0 = now_ns();
    CU_OK(cuCtxRecordEvent(ctx, ev));
    CU_OK(cuStreamWaitEvent(b, ev, 0));
    CU_OK(cuMemFreeAsync(buf, b));
    cr_assert_lt(now_ns() - t0, 50 * MS);
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "the fence never blocks the caller");
    cr_assert_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);

    CU_OK(cuCtxSynchronize());
    cr_assert_eq(testdrv_faults(), 0);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(testdrv_pending_free_bytes(), 0);
}

/* The context event covers the legacy and per-thread default streams
 * too, and adds no dependency between the program's streams. */
Test(fence, ctx_record_event_covers_every_stream_kind, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream priv = stream_new(CU_STREAM_NON_BLOCKING), c = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new(), done = event_new();
    CUdeviceptr b1, b2;
    CU_OK(cuMemAlloc(&b1, MIB));
    CU_OK(cuMemAlloc(&b2, MIB));
    CU_OK(testdrv_launch(CU_STREAM_LEGACY, 200000, b1, MIB, TESTDRV_WRITE));
    CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 200000, b2, MIB, TESTDRV_WRITE));
    CU_OK(cuCtxRecordEvent(ctx, ev));
    CU_OK(cuStreamWaitEvent(priv, ev, 0));
    CU_OK(cuMemFreeAsync(b1, priv));
    CU_OK(cuMemFreeAsync(b2, priv));

    /* A later short kernel on another stream does not wait for the fence
     * nor for the kernels it covers. */
    CU_OK(testdrv_launch(c, 10, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(done, c));
    CU_OK(cuEventSynchronize(done));
    cr_assert_eq(cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    cr_assert_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);

    CU_OK(cuCtxSynchronize());
    cr_assert_eq(testdrv_faults(), 0);
}

/* ------------------------------------------------------------------ */
/* 4. Legacy-stream events                                             */

Test(legacy, legacy_record_serialises_blocking_streams, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_DEFAULT), b = stream_new(CU_STREAM_DEFAULT);
    CUevent leg = event_new(), a_end = event_new(), b_end = event_new();

    /* Without the legacy record, B's short kernel finishes long before
     * A's. */
    float ms = -1;
    CU_OK(testdrv_launch(a, 300000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(a_end, a));
    CU_OK(testdrv_launch(b, 1000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(b_end, b));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuEventElapsedTime(&ms, b_end, a_end));
    cr_assert_geq(ms, 100.0f, "B waited for A without a legacy record");

    /* With it, B's kernel waits for A's. */
    uint64_t t0 = now_ns();
    CU_OK(testdrv_launch(a, 400000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(a_end, a));
    CU_OK(cuEventRecord(leg, CU_STREAM_LEGACY));
    CU_OK(testdrv_launch(b, 1000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(b_end, b));
    CU_OK(cuEventSynchronize(b_end));
    cr_assert_geq(now_ns() - t0, 350 * MS);
    CU_OK(cuEventElapsedTime(&ms, a_end, b_end));
    cr_assert_geq(ms, 0.0f, "B finished %f ms before A", (double)-ms);
}

/* A per-thread default stream is blocking-type: it syncs with legacy. */
Test(legacy, per_thread_stream_syncs_with_legacy, .timeout = 10)
{
    ctx_setup();
    CUevent done = event_new();
    CU_OK(testdrv_launch(CU_STREAM_LEGACY, 300000, 0, 0, TESTDRV_NONE));
    uint64_t t0 = now_ns();
    CU_OK(testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(done, CU_STREAM_PER_THREAD));
    CU_OK(cuEventSynchronize(done));
    cr_assert_geq(now_ns() - t0, 250 * MS);
}

Test(legacy, legacy_record_does_not_fence_non_blocking_streams, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING), b = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent leg = event_new();
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(a, 200000, buf, MIB, TESTDRV_WRITE));
    CU_OK(cuEventRecord(leg, CU_STREAM_LEGACY));
    CU_OK(cuStreamWaitEvent(b, leg, 0));
    CU_OK(cuMemFreeAsync(buf, b));
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_gt(testdrv_faults(), 0);
}

Test(legacy, free_async_on_legacy_stream_faults_non_blocking_writer, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, MIB));
    CU_OK(testdrv_launch(a, 200000, buf, MIB, TESTDRV_WRITE));
    CU_OK(cuMemFreeAsync(buf, CU_STREAM_LEGACY));
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_gt(testdrv_faults(), 0);
}

/* ------------------------------------------------------------------ */
/* 5. cuGetProcAddress_v2                                              */

static void *driver_handle(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    return h;
}

/* Resolves name at version with flags; checks the result and status. */
static void *proc(const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 99;
    CU_OK(cuGetProcAddress_v2(name, &fn, version, flags, &st));
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
    cr_assert_not_null(fn);
    return fn;
}

Test(procaddr, versions_and_per_thread_variants, .timeout = 10)
{
    void *h = driver_handle();
    const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    cr_assert_eq(proc("cuMemFree", 2000, 0), dlsym(h, "cuMemFree"));
    cr_assert_eq(proc("cuMemFree", 3020, 0), dlsym(h, "cuMemFree_v2"));
    cr_assert_eq(proc("cuMemFree", 13000, 0), dlsym(h, "cuMemFree_v2"));
    cr_assert_neq(dlsym(h, "cuMemFree"), dlsym(h, "cuMemFree_v2"));
    cr_assert_eq(proc("cuCtxSynchronize", 12080, 0), dlsym(h, "cuCtxSynchronize"));
    cr_assert_eq(proc("cuCtxSynchronize", 13000, 0), dlsym(h, "cuCtxSynchronize_v2"));
    cr_assert_eq(proc("cuGetProcAddress", 11030, 0), dlsym(h, "cuGetProcAddress"));
    cr_assert_eq(proc("cuGetProcAddress", 12000, 0), dlsym(h, "cuGetProcAddress_v2"));
    cr_assert_eq(proc("cuStreamSynchronize", 12000, 0), dlsym(h, "cuStreamSynchronize"));
    cr_assert_eq(proc("cuStreamSynchronize", 12000, pt), dlsym(h, "cuStreamSynchronize_ptsz"));
    cr_assert_eq(proc("cuStreamSynchronize", 6000, pt), dlsym(h, "cuStreamSynchronize"));
    cr_assert_eq(proc("cuStreamBeginCapture", 10000, pt), dlsym(h, "cuStreamBeginCapture_ptsz"));
    cr_assert_eq(proc("cuStreamBeginCapture", 12000, pt), dlsym(h, "cuStreamBeginCapture_v2_ptsz"));
    cr_assert_eq(proc("cuStreamBeginCapture", 12000, 0), dlsym(h, "cuStreamBeginCapture_v2"));
    cr_assert_eq(proc("cuMemcpyHtoD", 12000, pt), dlsym(h, "cuMemcpyHtoD_v2_ptds"));
    cr_assert_eq(proc("cuMemFree", 12000, pt), dlsym(h, "cuMemFree_v2"), "no per-thread variant");
    cr_assert_eq(proc("cuCtxRecordEvent", 12050, 0), dlsym(h, "cuCtxRecordEvent"));

    /* A NULL status pointer is fine; v1 works too. */
    void *fn = NULL;
    CU_OK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, NULL));
    cr_assert_eq(fn, dlsym(h, "cuMemAlloc_v2"));
    CUresult (*v1)(const char *, void **, int, cuuint64_t) =
        (CUresult (*)(const char *, void **, int, cuuint64_t))dlsym(h, "cuGetProcAddress");
    CU_OK(v1("cuMemAlloc", &fn, 2000, 0));
    cr_assert_eq(fn, dlsym(h, "cuMemAlloc"));
}

Test(procaddr, not_found_and_version_not_sufficient, .timeout = 10)
{
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st;
    cr_assert_eq(cuGetProcAddress_v2("cuNoSuchCall", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    cr_assert_null(fn);
    cr_assert_eq(cuGetProcAddress_v2("cuMemFree_v2", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND,
                 "only base names resolve");
    cr_assert_eq(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    cr_assert_eq(cuGetProcAddress_v2("cuMemFree", &fn, 13000, 4, &st), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuGetProcAddress_v2("cuMemFree", NULL, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);
}

/* Resolved pointers are the real entry points: calls through them are
 * counted under their exact ELF names; the 32-bit cuMemAlloc allocates
 * below 4 GiB and its cuMemFree takes that pointer back. */
Test(procaddr, resolved_pointers_call_the_exact_variant, .timeout = 10)
{
    ctx_setup();
    /* CUdeviceptr_v1 is a 32-bit unsigned int. */
    CUresult (*alloc_v1)(unsigned *, unsigned) = (CUresult (*)(unsigned *, unsigned))
        proc("cuMemAlloc", 2000, 0);
    CUresult (*free_v1)(unsigned) = (CUresult (*)(unsigned))proc("cuMemFree", 2000, 0);
    uint64_t n = testdrv_calls("cuMemFree"), n2 = testdrv_calls("cuMemFree_v2");
    unsigned p = 0;
    CU_OK(alloc_v1(&p, 4096));
    cr_assert_neq(p, 0);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1);
    CU_OK(free_v1(p));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(testdrv_calls("cuMemFree"), n + 1);
    cr_assert_eq(testdrv_calls("cuMemFree_v2"), n2);
}

/* Below 12.5 cuCtxRecordEvent does not exist for cuGetProcAddress and
 * answers CUDA_ERROR_NOT_SUPPORTED, though dlsym still finds it. */
Test(procaddr, old_driver_has_no_ctx_record_event, .timeout = 10)
{
    setenv("TESTDRIVER_VERSION", "12040", 1);
    int v = 0;
    CU_OK(cuDriverGetVersion(&v));
    cr_assert_eq(v, 12040);
    void *fn;
    CUdriverProcAddressQueryResult st;
    cr_assert_eq(cuGetProcAddress_v2("cuCtxRecordEvent", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    cr_assert_eq(proc("cuCtxSynchronize", 13000, 0), dlsym(driver_handle(), "cuCtxSynchronize"),
                 "a 12.4 driver has no cuCtxSynchronize_v2");
    cr_assert_not_null(dlsym(driver_handle(), "cuCtxRecordEvent"));
    CUcontext ctx = ctx_setup();
    CUevent ev = event_new();
    cr_assert_eq(cuCtxRecordEvent(ctx, ev), CUDA_ERROR_NOT_SUPPORTED);
}

/* ------------------------------------------------------------------ */
/* 6. Freed memory comes back only after a covering host sync          */

Test(pending, free_async_memory_needs_a_host_sync, .timeout = 10)
{
    ctx_setup();
    testdrv_set_device_capacity(64 * MIB);
    CUstream b = stream_new(CU_STREAM_NON_BLOCKING), other = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new();
    CUdeviceptr p1, p2, q;
    CU_OK(cuMemAlloc(&p1, 32 * MIB));
    CU_OK(cuMemAlloc(&p2, 32 * MIB));
    cr_assert_eq(cuMemAlloc(&q, MIB), CUDA_ERROR_OUT_OF_MEMORY);

    CU_OK(cuMemFreeAsync(p1, b));
    CU_OK(cuEventRecord(ev, b));
    CUresult rc;
    while ((rc = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY)
        sleep_ms(1);
    cr_assert_eq(rc, CUDA_SUCCESS);
    cr_assert_eq(testdrv_pending_free_bytes(), 32 * MIB);
    cr_assert_eq(cuMemAlloc(&q, 16 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    size_t free_b, total_b;
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 0);

    /* A sync of an unrelated stream does not cover it. */
    CU_OK(cuStreamSynchronize(other));
    cr_assert_eq(cuMemAlloc(&q, 16 * MIB), CUDA_ERROR_OUT_OF_MEMORY);

    CU_OK(cuStreamSynchronize(b));
    cr_assert_eq(testdrv_pending_free_bytes(), 0);
    CU_OK(cuMemAlloc(&q, 16 * MIB));

    /* cuEventSynchronize on an event after the free covers it too. */
    CU_OK(cuMemFreeAsync(p2, b));
    CU_OK(cuEventRecord(ev, b));
    CU_OK(cuEventSynchronize(ev));
    CU_OK(cuMemAlloc(&q, 32 * MIB));
}

Test(pending, host_capacity, .timeout = 10)
{
    ctx_setup();
    testdrv_set_host_capacity(4 * MIB);
    void *h1, *h2;
    char *reg = malloc(2 * MIB);
    CU_OK(cuMemAllocHost(&h1, 3 * MIB));
    cr_assert_eq(cuMemHostAlloc(&h2, 2 * MIB, 0), CUDA_ERROR_OUT_OF_MEMORY);
    cr_assert_eq(cuMemHostRegister(reg, 2 * MIB, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cuMemFreeHost(h1));
    CU_OK(cuMemHostRegister(reg, 2 * MIB, 0));
    CU_OK(cuMemHostAlloc(&h2, 2 * MIB, CU_MEMHOSTALLOC_DEVICEMAP));
    cr_assert_eq(testdrv_live_bytes(TESTDRV_HOST), 2 * MIB);
    cr_assert_eq(testdrv_live_bytes(TESTDRV_REGISTERED), 2 * MIB);
    CU_OK(cuMemHostUnregister(reg));
    free(reg);
}

/* A device allocation that does not fit moves managed pages out, as many
 * bytes as it asks for (run 99 of bench/RESULTS.md); managed memory is not
 * moved out for another managed allocation; each device has its own. */
Test(pending, device_allocations_move_managed_memory_out, .timeout = 10)
{
    setenv("TESTDRIVER_DEVICES", "2", 1);
    CUcontext ctx = ctx_setup();
    testdrv_set_device_capacity(64 * MIB);
    CUdeviceptr m1, m2, d1, d2, q;
    size_t free_b, total_b;
    CU_OK(cuMemAllocManaged(&m1, 32 * MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemAllocManaged(&m2, 16 * MIB, CU_MEM_ATTACH_GLOBAL));
    cr_assert_eq(cuMemAllocManaged(&q, 32 * MIB, CU_MEM_ATTACH_GLOBAL),
                 CUDA_ERROR_OUT_OF_MEMORY, "managed memory is not moved out for managed memory");
    CU_OK(cuMemAlloc(&d1, 24 * MIB)); /* 16 MiB free: 24 of managed move out */
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 16 * MIB, "free %zu MiB", free_b / MIB);
    CU_OK(cuMemAlloc(&d2, 40 * MIB)); /* the other 24 resident move out */
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 0, "free %zu MiB", free_b / MIB);
    cr_assert_eq(cuMemAlloc(&q, MIB), CUDA_ERROR_OUT_OF_MEMORY, "nothing resident is left");
    /* Device 1's memory is its own. */
    CUcontext other;
    CUdevice dev1;
    CU_OK(cuDeviceGet(&dev1, 1));
    CU_OK(cuCtxCreate(&other, NULL, 0, dev1));
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 64 * MIB);
    CU_OK(cuCtxDestroy(other));
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuMemFree(m1));
    CU_OK(cuMemFree(m2));
    CU_OK(cuMemFree(d1));
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 24 * MIB, "only d2's 40 MiB stay taken (free %zu MiB)", free_b / MIB);
    CU_OK(cuMemFree(d2));
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    cr_assert_eq(free_b, 64 * MIB);
}

Test(pending, pool_memory_and_release_threshold, .timeout = 10)
{
    ctx_setup();
    testdrv_set_device_capacity(64 * MIB);
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUmemoryPool pool;
    CU_OK(cuDeviceGetDefaultMemPool(&pool, 0));
    cuuint64_t max = UINT64_MAX, v;
    CU_OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
    CUdeviceptr p, q;
    CU_OK(cuMemAllocAsync(&p, 48 * MIB, s));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1);
    CU_OK(cuMemFreeAsync(p, s));
    CU_OK(cuStreamSynchronize(s));
    /* Kept by the pool: reusable by the pool, not by cuMemAlloc. */
    CU_OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
    cr_assert_eq(v, 48 * MIB);
    cr_assert_eq(cuMemAlloc(&q, 32 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cuMemAllocAsync(&q, 32 * MIB, s));
    CU_OK(cuMemFreeAsync(q, s));
    CU_OK(cuStreamSynchronize(s));
    CU_OK(cuMemPoolTrimTo(pool, 0));
    CU_OK(cuMemAlloc(&q, 32 * MIB));
}

/* ------------------------------------------------------------------ */
/* 7. Capture                                                          */

Test(capture, ctx_record_event_invalidates, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new();
    CUgraph g = (CUgraph)1;
    CUstreamCaptureStatus st;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    cr_assert_eq(cuCtxRecordEvent(ctx, ev), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_OK(cuStreamIsCapturing(s, &st));
    cr_assert_eq(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_null(g);
    cr_assert_eq(testdrv_invalidated_captures(), 1);
}

/* Another thread of the program (ctx current there) that synchronises a
 * stream and frees memory while a capture is live; relaxed: it first
 * switches itself to CU_STREAM_CAPTURE_MODE_RELAXED. */
struct on_thread {
    CUcontext ctx;
    bool relaxed;
    CUstream stream;
    CUdeviceptr ptr;
    CUresult sync_rc, free_rc;
};

static void *capture_neighbour(void *arg)
{
    struct on_thread *t = arg;
    cuCtxSetCurrent(t->ctx);
    if (t->relaxed) {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        cuThreadExchangeStreamCaptureMode(&m);
    }
    t->sync_rc = cuStreamSynchronize(t->stream);
    t->free_rc = cuMemFree(t->ptr);
    return NULL;
}

static void run_neighbour(struct on_thread *t)
{
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, capture_neighbour, t), 0);
    pthread_join(th, NULL);
}

Test(capture, global_mode_thread_sync_invalidates, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    struct on_thread t = { .ctx = ctx, .stream = stream_new(CU_STREAM_NON_BLOCKING) };
    CU_OK(cuMemAlloc(&t.ptr, MIB));
    CUgraph g;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(testdrv_launch(s, 500000, 0, 0, TESTDRV_NONE));
    run_neighbour(&t);
    cr_assert_eq(t.sync_rc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(t.free_rc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1, "the refused free freed nothing");
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_geq(testdrv_invalidated_captures(), 1);
}

Test(capture, relaxed_mode_thread_sync_is_allowed, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    struct on_thread t = { .ctx = ctx, .relaxed = true, .stream = stream_new(CU_STREAM_NON_BLOCKING) };
    CU_OK(cuMemAlloc(&t.ptr, MIB));
    CUgraph g = NULL;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    /* Captured work does not run: this 5 s kernel costs nothing. */
    CU_OK(testdrv_launch(s, 5000000, 0, 0, TESTDRV_NONE));
    run_neighbour(&t);
    cr_assert_eq(t.sync_rc, CUDA_SUCCESS);
    cr_assert_eq(t.free_rc, CUDA_SUCCESS);
    CU_OK(cuStreamEndCapture(s, &g));
    cr_assert_not_null(g);
    cr_assert_eq(testdrv_invalidated_captures(), 0);
    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuStreamSynchronize(s));
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "nothing captured ran");
    CU_OK(cuGraphDestroy(g));
}

/* An operation on the legacy stream while a blocking stream captures. */
Test(capture, legacy_stream_op_invalidates_blocking_capture, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_DEFAULT);
    CUevent ev = event_new();
    CUstreamCaptureStatus st;
    CUgraph g;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    cr_assert_eq(cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(cuEventRecord(ev, CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CU_OK(cuStreamIsCapturing(s, &st));
    cr_assert_eq(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_eq(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

/* ------------------------------------------------------------------ */
/* 8. Context teardown                                                 */

Test(teardown, ctx_destroy_frees_owned_not_pool_or_vmm, .timeout = 10)
{
    static const char image[] = "not a cubin";
    CUcontext ctx = ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new();
    CUdeviceptr dev, man, pooled;
    void *host, *reg = malloc(MIB);
    CUarray arr;
    CUmodule mod;
    CUmemGenericAllocationHandle vmm;
    CUDA_ARRAY_DESCRIPTOR d = { .Width = 64, .Height = 64,
                                .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 4 };
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
    CU_OK(cuMemAlloc(&dev, MIB));
    CU_OK(cuMemAllocManaged(&man, MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemAllocHost(&host, MIB));
    CU_OK(cuMemHostRegister(reg, MIB, 0));
    CU_OK(cuArrayCreate(&arr, &d));
    CU_OK(cuModuleLoadData(&mod, image));
    CU_OK(cuMemAllocAsync(&pooled, 2 * MIB, s));
    CU_OK(cuMemCreate(&vmm, 2 * MIB, &prop, 0));
    CU_OK(testdrv_launch(s, 200000, dev, MIB, TESTDRV_WRITE));
    cr_assert_eq(testdrv_live_bytes(TESTDRV_DEVICE), 3 * MIB);

    uint64_t t0 = now_ns();
    CU_OK(cuCtxDestroy(ctx));
    cr_assert_geq(now_ns() - t0, 150 * MS, "teardown waits for the streams");
    cr_assert_eq(testdrv_faults(), 0);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1, "only the pool allocation survives");
    cr_assert_eq(testdrv_live_bytes(TESTDRV_DEVICE), 2 * MIB);
    cr_assert_eq(testdrv_live(TESTDRV_MANAGED), 0);
    cr_assert_eq(testdrv_live(TESTDRV_HOST), 0);
    cr_assert_eq(testdrv_live(TESTDRV_REGISTERED), 0);
    cr_assert_eq(testdrv_live(TESTDRV_ARRAY), 0);
    cr_assert_eq(testdrv_live(TESTDRV_MODULE), 0);
    cr_assert_eq(testdrv_live(TESTDRV_STREAM), 0);
    cr_assert_eq(testdrv_live(TESTDRV_EVENT), 0);
    cr_assert_eq(testdrv_live(TESTDRV_CONTEXT), 0);
    cr_assert_eq(testdrv_live(TESTDRV_VMM), 1);

    /* Later calls naming the dead context or its objects are counted. */
    CUcontext cur = (CUcontext)1;
    CU_OK(cuCtxGetCurrent(&cur));
    cr_assert_null(cur, "the destroyed context was popped");
    uint64_t dead = testdrv_dead_context_calls();
    cr_assert_eq(cuCtxPushCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuCtxSynchronize_v2(ctx), CUDA_ERROR_CONTEXT_IS_DESTROYED,
                 "measured on an H200 (2026-11-29)");
    CUcontext ctx2;
    CU_OK(cuCtxCreate(&ctx2, NULL, 0, 0));
    cr_assert_eq(cuStreamSynchronize(s), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuEventQuery(ev), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuMemFree(dev), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemFreeHost(host), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(testdrv_dead_context_calls(), dead + 6);

    /* Pool and VMM memory are still the program's to release. */
    CUstream s2 = stream_new(CU_STREAM_NON_BLOCKING);
    CU_OK(cuMemFreeAsync(pooled, s2));
    CU_OK(cuStreamSynchronize(s2));
    CU_OK(cuMemRelease(vmm));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(testdrv_live(TESTDRV_VMM), 0);
    free(reg);
}

Test(teardown, primary_context_last_release_and_reset, .timeout = 10)
{
    CUcontext p1, p2;
    CUdeviceptr dev;
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&p1, 0));
    CU_OK(cuCtxSetCurrent(p1));
    CU_OK(cuMemAlloc(&dev, MIB));
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CU_OK(cuDevicePrimaryCtxRelease(0));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(testdrv_live(TESTDRV_STREAM), 0);
    uint64_t dead = testdrv_dead_context_calls();
    CUdeviceptr q;
    cr_assert_eq(cuMemAlloc(&q, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED, "current but inactive");
    cr_assert_eq(testdrv_dead_context_calls(), dead + 1);

    CU_OK(cuDevicePrimaryCtxRetain(&p2, 0));
    cr_assert_eq(p1, p2, "the primary context keeps its handle");
    cr_assert_eq(cuStreamQuery(s), CUDA_ERROR_INVALID_CONTEXT, "objects of the old activation are dead");
    CU_OK(cuMemAlloc(&q, 16));
    CU_OK(cuDevicePrimaryCtxReset(0));
    int active = 1;
    unsigned flags;
    CU_OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    cr_assert_eq(active, 0);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
}

/* The whole simulation runs under one lock. A call that had to wait for it
 * while its holder was descheduled (on an overloaded machine) is noted, so
 * that tests timing calls can tell it from a wait for the GPU. */

static volatile int lock_held;

static void *hold_lock_30ms(void *arg)
{
    (void)arg;
    cr_assert_eq(testdrv_hold_lock(30 * MS, &lock_held), CUDA_SUCCESS);
    return NULL;
}

Test(lock, a_call_held_back_by_the_drivers_own_lock_is_noted, .timeout = 10)
{
    CU_OK(cuInit(0));
    int n;
    uint64_t before = testdrv_lock_stall_end_ns();
    for (int i = 0; i < 100; i++)
        CU_OK(cuDeviceGetCount(&n));
    cr_assert_eq(testdrv_lock_stall_end_ns(), before, "calls no lock held back are not noted");

    pthread_t t;
    lock_held = 0;
    cr_assert_eq(pthread_create(&t, NULL, hold_lock_30ms, NULL), 0);
    while (!lock_held)
        sched_yield();
    uint64_t t0 = now_ns();
    CU_OK(cuDeviceGetCount(&n));
    uint64_t t1 = now_ns();
    pthread_join(t, NULL);
    cr_assert_geq(t1 - t0, 20 * MS, "the call waited for the lock");
    uint64_t end = testdrv_lock_stall_end_ns();
    cr_assert(end >= t0 + TD_STALL_NOTED_NS && end <= t1,
              "the wait is noted with its end (%llu ns after the call began, which took %llu)",
              (unsigned long long)(end - t0), (unsigned long long)(t1 - t0));
}

/* ------------------------------------------------------------------ */
/* 9. The deadlock case                                                */

static volatile int spin_flag;

/* Stands for the program thread that would set the flag the kernel
 * waits for. */
static void *set_flag_later(void *arg)
{
    (void)arg;
    sleep_ms(300);
    spin_flag = 1;
    return NULL;
}

Test(deadlock, waiting_release_blocks_until_spin_kernel_is_released, .timeout = 10)
{
    ctx_setup();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, MIB));
    spin_flag = 0;
    CU_OK(testdrv_launch_spin(a, &spin_flag));
    sleep_ms(20);
    cr_assert_eq(cuStreamQuery(a), CUDA_ERROR_NOT_READY, "the kernel spins");

    pthread_t timer;
    cr_assert_eq(pthread_create(&timer, NULL, set_flag_later, NULL), 0);
    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuMemFree(buf));
    cr_assert_eq(spin_flag, 1, "cuMemFree returned before the kernel was released");
    cr_assert_geq(testdrv_thread_blocked_ns() - b0, 250 * MS);
    pthread_join(timer, NULL);
    CU_OK(cuStreamSynchronize(a));
}

/* A synchronisation waits for another context's work only where its own
 * work waits for it on the GPU: counted (testdrv_foreign_syncs), so that
 * tests can tell. Two contexts of one device; a kernel in the second spins
 * until a timer sets the flag. */
Test(deadlock, synchronisation_counts_another_contexts_work, .timeout = 10)
{
    CUcontext first = ctx_setup(), second;
    CU_OK(cuCtxCreate(&second, NULL, 0, 0));
    CUstream spin = stream_new(CU_STREAM_NON_BLOCKING);
    spin_flag = 0;
    CU_OK(testdrv_launch_spin(spin, &spin_flag));
    CUevent after_spin = event_new();
    CU_OK(cuEventRecord(after_spin, spin));

    /* The first context's own work only: not counted, and no wait. */
    CU_OK(cuCtxSetCurrent(first));
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    uint64_t f0 = testdrv_foreign_syncs(), t0 = testdrv_thread_foreign_syncs();
    CU_OK(cuCtxSynchronize());
    cr_assert_eq(testdrv_foreign_syncs(), f0);
    cr_assert_eq(spin_flag, 0);

    /* A stream of the first waits for the spinning kernel: counted. */
    CU_OK(cuStreamWaitEvent(s, after_spin, 0));
    pthread_t timer;
    cr_assert_eq(pthread_create(&timer, NULL, set_flag_later, NULL), 0);
    CU_OK(cuCtxSynchronize());
    cr_assert_eq(spin_flag, 1, "the synchronisation returned before the kernel it waits for");
    cr_assert_eq(testdrv_foreign_syncs(), f0 + 1);
    cr_assert_eq(testdrv_thread_foreign_syncs(), t0 + 1);
    pthread_join(timer, NULL);

    /* Once that work has finished, nothing is counted. */
    CU_OK(cuCtxSynchronize());
    cr_assert_eq(testdrv_foreign_syncs(), f0 + 1);
    CU_OK(cuCtxDestroy(second));
}

/* ------------------------------------------------------------------ */
/* 10. Error codes                                                     */

Test(errors, before_init_and_without_context, .timeout = 10)
{
    CUdeviceptr p;
    CUcontext c;
    int v;
    const char *name;
    cr_assert_eq(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
    cr_assert_eq(cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    CU_OK(cuDriverGetVersion(&v));
    cr_assert_eq(v, 13000);
    CU_OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name));
    cr_assert_str_eq(name, "CUDA_ERROR_OUT_OF_MEMORY");
    cr_assert_eq(cuGetErrorName((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuGetExportTable((const void **)&name, NULL), CUDA_ERROR_NOT_SUPPORTED);

    CU_OK(cuInit(0));
    cr_assert_eq(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuStreamCreate(&(CUstream){ 0 }, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuMemFree(0));
    cr_assert_eq(cuMemFree(0x10000), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuCtxGetCurrent(NULL), CUDA_ERROR_INVALID_VALUE);
}

/* Measured on an H200: cuMemFree with no current context frees the
 * memory (it waits for the memory's context, as with one). */
Test(errors, release_without_current_context, .timeout = 10)
{
    CUcontext ctx = ctx_setup(), popped;
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p;
    void *h;
    CU_OK(cuMemAlloc(&p, 4096));
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(testdrv_launch(a, 200000, 0, 0, TESTDRV_NONE));
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, ctx);
    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuMemFree(p));
    cr_assert_geq(testdrv_thread_blocked_ns() - b0, 150 * MS);
    CU_OK(cuMemFreeHost(h));
    cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE) + testdrv_live(TESTDRV_HOST), 0);
}

Test(errors, mem_free_codes, .timeout = 10)
{
    ctx_setup();
    CUdeviceptr p, m;
    void *h;
    int on_stack = 0;
    void *heap = malloc(64);
    cr_assert_eq(cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFree(0));
    cr_assert_eq(cuMemFree(0x1234), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAlloc(&p, 4096));
    cr_assert_eq(cuMemFree(p + 16), CUDA_ERROR_INVALID_VALUE, "not an allocation base");
    CU_OK(cuMemFree(p));
    cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "double free");
    cr_assert_eq(cuMemFree((CUdeviceptr)(uintptr_t)&on_stack), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemFree((CUdeviceptr)(uintptr_t)heap), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAllocHost(&h, 4096));
    cr_assert_eq(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE, "pinned host");
    cr_assert_eq(cuMemFreeHost(heap), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFreeHost(h));
    cr_assert_eq(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    cr_assert_eq(cuMemFreeAsync(m, CU_STREAM_LEGACY), CUDA_ERROR_NOT_SUPPORTED);
    ((char *)(uintptr_t)m)[0] = 1; /* managed memory is host memory */
    CU_OK(cuMemFree(m));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE) + testdrv_live(TESTDRV_MANAGED), 0);
    free(heap);
}

Test(errors, registration_codes, .timeout = 10)
{
    ctx_setup();
    char *buf = malloc(16 * 4096);
    CU_OK(cuMemHostRegister(buf, 8 * 4096, 0));
    cr_assert_eq(cuMemHostRegister(buf + 4096, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    cr_assert_eq(cuMemHostRegister(buf + 7 * 4096, 4 * 4096, 0),
                 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CU_OK(cuMemHostRegister(buf + 8 * 4096, 4096, 0));
    cr_assert_eq(cuMemHostUnregister(buf + 4096), CUDA_ERROR_INVALID_VALUE,
                 "inside a registration (measured on an H200, 2026-11-29)");
    CU_OK(cuMemHostUnregister(buf));
    cr_assert_eq(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CU_OK(cuMemHostUnregister(buf + 8 * 4096));
    cr_assert_eq(cuMemHostRegister(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    free(buf);
}

Test(errors, handle_codes, .timeout = 10)
{
    static const char image[] = "not a cubin";
    ctx_setup();
    CUstream s = stream_new(0);
    CUevent e = event_new();
    CUarray a;
    CUmodule m;
    CUlibrary l;
    CUDA_ARRAY_DESCRIPTOR d = { .Width = 16, .Height = 0,
                                .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1 };
    CU_OK(cuArrayCreate(&a, &d));
    CU_OK(cuModuleLoadData(&m, image));
    CU_OK(cuLibraryLoadData(&l, image, NULL, NULL, 0, NULL, NULL, 0));
    cr_assert_eq(testdrv_live_bytes(TESTDRV_ARRAY), 16 * 4);

    cr_assert_eq(cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuEventDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuArrayDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuModuleUnload(NULL), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuLibraryUnload(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cuStreamDestroy(s));
    CU_OK(cuEventDestroy(e));
    CU_OK(cuArrayDestroy(a));
    CU_OK(cuModuleUnload(m));
    CU_OK(cuLibraryUnload(l));
    cr_assert_eq(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuEventDestroy(e), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuLibraryUnload(l), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuStreamDestroy((CUstream)&d), CUDA_ERROR_INVALID_HANDLE, "never a handle");

    cr_assert_eq(cuStreamCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuEventCreate(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuModuleLoadData(&m, NULL), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuArrayCreate(NULL, &d), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(testdrv_live(TESTDRV_STREAM) + testdrv_live(TESTDRV_EVENT) +
                 testdrv_live(TESTDRV_ARRAY) + testdrv_live(TESTDRV_MODULE) +
                 testdrv_live(TESTDRV_LIBRARY), 0);
}

/* Destroying a stream with queued work returns at once; the work runs. */
Test(errors, stream_destroy_lets_queued_work_finish, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new();
    CU_OK(testdrv_launch(s, 200000, 0, 0, TESTDRV_NONE));
    CU_OK(cuEventRecord(ev, s));
    uint64_t t0 = now_ns(), b0 = testdrv_thread_blocked_ns();
    CU_OK(cuStreamDestroy(s));
    cr_assert_eq(testdrv_thread_blocked_ns(), b0);
    cr_assert_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    CU_OK(cuEventSynchronize(ev));
    cr_assert_geq(now_ns() - t0, 150 * MS);
}

/* ------------------------------------------------------------------ */
/* 11. Green contexts (measured on an H200, driver 580.159.04,          */
/*     2026-12-01, tests/gpu/facts.c green and green-dead)              */

/* cuInit and the primary context of device 0, retained and current. */
static CUcontext primary_setup(void)
{
    CUcontext p;
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&p, 0));
    CU_OK(cuCtxSetCurrent(p));
    return p;
}

/* A green context of device 0 with one group of at least min_sms SMs. */
static CUgreenCtx green_new(unsigned min_sms)
{
    CUdevResource all, group, rest;
    unsigned n = 1;
    CUdevResourceDesc desc;
    CUgreenCtx g;
    CU_OK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    CU_OK(cuDevSmResourceSplitByCount(&group, &n, &all, &rest, 0, min_sms));
    CU_OK(cuDevResourceGenerateDesc(&desc, &group, 1));
    CU_OK(cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    return g;
}

static CUcontext green_ctx(CUgreenCtx g)
{
    CUcontext c = NULL;
    CU_OK(cuCtxFromGreenCtx(&c, g));
    return c;
}

static CUstream green_stream(CUgreenCtx g)
{
    CUstream s;
    CU_OK(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
    return s;
}

static int primary_active(void)
{
    unsigned flags;
    int active = -1;
    CU_OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    return active;
}

Test(green, resources_split_and_descriptors, .timeout = 10)
{
    CU_OK(cuInit(0));
    CUdevResource all, groups[4], rest;
    CU_OK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    cr_assert_eq(all.type, CU_DEV_RESOURCE_TYPE_SM);
    cr_assert_eq(all.sm.smCount, 132);
    cr_assert_eq(all.sm.minSmPartitionSize, 8);
    cr_assert_eq(all.sm.smCoscheduledAlignment, 8);
    unsigned n = 0;
    CU_OK(cuDevSmResourceSplitByCount(NULL, &n, &all, NULL, 0, 33));
    cr_assert_eq(n, 3, "groups of 40 SMs (33 rounded up to 8)");
    n = 2;
    CU_OK(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 33));
    cr_assert_eq(n, 2);
    cr_assert_eq(groups[0].sm.smCount, 40);
    cr_assert_eq(rest.sm.smCount, 52);
    CUdevResourceDesc desc, other;
    CU_OK(cuDevResourceGenerateDesc(&desc, groups, 2));
    cr_assert_eq(cuDevResourceGenerateDesc(&other, (CUdevResource[]){ groups[0], all }, 2),
                 CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "not from one split");
    cr_assert_eq(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_INVALID),
                 CUDA_ERROR_INVALID_RESOURCE_TYPE);
    cr_assert_eq(cuDevSmResourceSplitByCount(groups, &n, &all, NULL, 0, 200),
                 CUDA_ERROR_INVALID_VALUE);

    CUgreenCtx g;
    cr_assert_eq(cuGreenCtxCreate(&g, desc, 0, 0), CUDA_ERROR_INVALID_VALUE,
                 "CU_GREEN_CTX_DEFAULT_STREAM is required");
    CU_OK(cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CUdevResource mine;
    CU_OK(cuGreenCtxGetDevResource(g, &mine, CU_DEV_RESOURCE_TYPE_SM));
    cr_assert_eq(mine.sm.smCount, 80);
    CU_OK(cuCtxGetDevResource(green_ctx(g), &mine, CU_DEV_RESOURCE_TYPE_SM));
    cr_assert_eq(mine.sm.smCount, 80);
    CU_OK(cuGreenCtxDestroy(g));
}

Test(green, handles_and_stream_contexts, .timeout = 10)
{
    CUcontext primary = primary_setup();
    CUgreenCtx g = green_new(33);
    CUcontext gctx = green_ctx(g);
    cr_assert_neq(gctx, primary);
    cr_assert_eq(green_ctx(g), gctx, "the same handle on every call");
    cr_assert_neq((void *)gctx, (void *)g);
    unsigned v = 0;
    CU_OK(cuCtxGetApiVersion(gctx, &v));
    cr_assert_gt(v, 0);
    cr_assert_eq(primary_active(), 1);

    CUstream gs = green_stream(g), ps = stream_new(CU_STREAM_NON_BLOCKING);
    CUcontext of = NULL;
    CUgreenCtx gof = NULL;
    CU_OK(cuStreamGetCtx(gs, &of));
    cr_assert_eq(of, gctx);
    CU_OK(cuStreamGetCtx_v2(gs, &of, &gof));
    cr_assert_eq(of, primary, "cuda.h: _v2 answers the primary and the green context");
    cr_assert_eq(gof, g);
    CU_OK(cuStreamGetGreenCtx(ps, &gof));
    cr_assert_null(gof);
    cr_assert_eq(cuGreenCtxStreamCreate(&gs, g, 0, 0), CUDA_ERROR_INVALID_VALUE,
                 "CU_STREAM_NON_BLOCKING is required");
    cr_assert_eq(cuCtxSetCurrent((CUcontext)g), CUDA_ERROR_INVALID_CONTEXT,
                 "a CUgreenCtx is not a CUcontext");

    /* A stream made with cuStreamCreate while the green context is
     * current is the green context's. */
    CU_OK(cuCtxSetCurrent(gctx));
    CUstream s2 = stream_new(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamGetCtx(s2, &of));
    cr_assert_eq(of, gctx);
    cr_assert_eq(testdrv_live(TESTDRV_CONTEXT), 2, "the primary and the green context");
}

/* Memory made while the green context is current is the primary's and
 * outlives it; a kernel of the primary's module runs on a green stream. */
Test(green, memory_belongs_to_the_primary_context, .timeout = 10)
{
    static const char image[] = "not a cubin";
    CUcontext primary = primary_setup();
    CUmodule mod;
    CUfunction fn;
    CU_OK(cuModuleLoadData(&mod, image));
    CU_OK(cuModuleGetFunction(&fn, mod, "k"));
    CUgreenCtx g = green_new(33);
    CUstream gs = green_stream(g);
    CU_OK(cuCtxSetCurrent(green_ctx(g)));
    CUdeviceptr d;
    void *h;
    CUcontext owner = NULL;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
    cr_assert_eq(owner, primary);
    CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)h));
    cr_assert_eq(owner, primary);
    CU_OK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, gs, NULL, NULL));
    CU_OK(cuStreamSynchronize(gs));

    CU_OK(cuCtxSetCurrent(primary));
    CU_OK(cuStreamDestroy(gs));
    CU_OK(cuGreenCtxDestroy(g));
    cr_assert_eq(testdrv_live(TESTDRV_CONTEXT), 1);
    CU_OK(cuMemsetD8(d, 7, MIB));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d));
    cr_assert_eq(owner, primary);
    CU_OK(cuMemFree(d));
    CU_OK(cuMemFreeHost(h));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE) + testdrv_live(TESTDRV_HOST), 0);
}

/* cuCtxRecordEvent on the primary covers the green streams; on the
 * green context (or cuGreenCtxRecordEvent) only the green context's own
 * work. */
Test(green, record_event_coverage, .timeout = 10)
{
    CUcontext primary = primary_setup();
    CUgreenCtx g = green_new(33);
    CUcontext gctx = green_ctx(g);
    CUstream gs = green_stream(g), ps = stream_new(CU_STREAM_NON_BLOCKING);
    CUevent ev = event_new(), ev2 = event_new();

    CU_OK(testdrv_launch(gs, 400000, 0, 0, TESTDRV_NONE));
    CU_OK(cuCtxRecordEvent(primary, ev));
    uint64_t t0 = now_ns();
    CU_OK(cuEventSynchronize(ev));
    cr_assert_geq(now_ns() - t0, 300 * MS, "the primary's record covers the green kernel");
    CU_OK(cuCtxSynchronize());

    CU_OK(testdrv_launch(ps, 400000, 0, 0, TESTDRV_NONE));
    CU_OK(cuCtxRecordEvent(gctx, ev));
    CU_OK(cuGreenCtxRecordEvent(g, ev2));
    cr_assert_eq(cuEventQuery(ev), CUDA_SUCCESS, "the green record leaves the primary kernel out");
    CU_OK(cuEventQuery(ev2));
    CU_OK(cuCtxSynchronize());

    CU_OK(testdrv_launch(gs, 300000, 0, 0, TESTDRV_NONE));
    CU_OK(cuCtxRecordEvent(gctx, ev));
    CU_OK(cuGreenCtxRecordEvent(g, ev2));
    cr_assert_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    cr_assert_eq(cuEventQuery(ev2), CUDA_ERROR_NOT_READY);
    CU_OK(cuCtxSynchronize());
    CU_OK(cuEventQuery(ev));
}

/* A waiting release waits for the green streams and stalls launches on
 * them; cuGreenCtxDestroy under a running kernel returns at once. */
Test(green, release_waits_for_green_work_destroy_does_not, .timeout = 10)
{
    primary_setup();
    CUgreenCtx g = green_new(33);
    CUstream gs = green_stream(g);
    CU_OK(cuCtxSetCurrent(green_ctx(g)));
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(testdrv_launch(gs, 400000, 0, 0, TESTDRV_NONE));
    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuMemFree(d));
    cr_assert_geq(testdrv_thread_blocked_ns() - b0, 300 * MS, "cuMemFree waited for the green kernel");

    struct launcher l;
    launcher_start(&l, green_ctx(g), 50);
    CU_OK(testdrv_launch(gs, 400000, 0, 0, TESTDRV_NONE));
    CU_OK(cuMemAlloc(&d, MIB));
    atomic_store(&l.go, 1);
    CU_OK(cuMemFree(d));
    pthread_join(l.thread, NULL);
    CU_OK(l.rc);
    cr_assert_geq(l.blocked_ns, 200 * MS, "a launch in the green context stalled");

    CU_OK(testdrv_launch(gs, 400000, 0, 0, TESTDRV_NONE));
    CU_OK(cuStreamDestroy(gs));
    b0 = testdrv_thread_blocked_ns();
    uint64_t t0 = now_ns();
    CU_OK(cuGreenCtxDestroy(g));
    cr_assert_lt(now_ns() - t0, 50 * MS);
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "cuGreenCtxDestroy does not wait");
    CUcontext primary;
    CU_OK(cuDevicePrimaryCtxRetain(&primary, 0));
    CU_OK(cuCtxSetCurrent(primary));
    t0 = now_ns();
    CU_OK(cuCtxSynchronize());
    cr_assert_geq(now_ns() - t0, 250 * MS, "the destroyed green context's kernel still runs");
}

struct waiting_free {
    CUcontext ctx;
    void *host;
    atomic_int started;
    uint64_t ns;
};

static void *free_host_waits(void *arg)
{
    struct waiting_free *f = arg;
    cr_assert_eq(cuCtxSetCurrent(f->ctx), CUDA_SUCCESS);
    atomic_store(&f->started, 1);
    uint64_t t0 = now_ns();
    cr_assert_eq(cuMemFreeHost(f->host), CUDA_SUCCESS);
    f->ns = now_ns() - t0;
    return NULL;
}

/* Beside another thread's cuMemFreeHost that waits for a kernel of the
 * primary context, a green context's destruction and a release of the
 * primary context that is not the last return at once (measured on an
 * H200: 0.08 and 0.005 ms beside a 300 ms wait, bench/RESULTS.md run 51). */
Test(green, destroy_and_release_do_not_wait_beside_a_waiting_release, .timeout = 10)
{
    CUcontext p = primary_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    for (int k = 0; k < 2; k++) {
        CUgreenCtx g = NULL;
        CUcontext again;
        if (k == 0)
            g = green_new(8);
        else
            CU_OK(cuDevicePrimaryCtxRetain(&again, 0));
        CU_OK(cuCtxSetCurrent(p));
        struct waiting_free f = {.ctx = p};
        CU_OK(cuMemAllocHost(&f.host, 4096));
        CU_OK(testdrv_launch(s, 300000, 0, 0, TESTDRV_NONE));
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, free_host_waits, &f), 0);
        while (!atomic_load(&f.started))
            sched_yield();
        sleep_ms(20);
        uint64_t b0 = testdrv_thread_blocked_ns(), t0 = now_ns();
        CU_OK(k == 0 ? cuGreenCtxDestroy(g) : cuDevicePrimaryCtxRelease(0));
        uint64_t call = now_ns() - t0;
        pthread_join(t, NULL);
        cr_assert_geq(f.ns, 200 * MS, "cuMemFreeHost waited for the kernel");
        cr_assert_eq(testdrv_thread_blocked_ns(), b0, "%s waited",
                     k == 0 ? "cuGreenCtxDestroy" : "cuDevicePrimaryCtxRelease");
        cr_assert_lt(call, 50 * MS);
    }
}

/* A green context holds a reference on the primary context; the last
 * one to go tears the primary context down. */
Test(green, holds_a_reference_on_the_primary_context, .timeout = 10)
{
    CU_OK(cuInit(0));
    cr_assert_eq(primary_active(), 0);
    CUcontext p;
    CU_OK(cuDevicePrimaryCtxRetain(&p, 0));
    cr_assert_eq(primary_active(), 1);
    CUgreenCtx g = green_new(8);
    CU_OK(cuDevicePrimaryCtxRelease(0));
    cr_assert_eq(primary_active(), 1, "the green context keeps it active");
    CU_OK(cuCtxSetCurrent(green_ctx(g)));
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuCtxSetCurrent(NULL));
    CU_OK(cuGreenCtxDestroy(g));
    cr_assert_eq(primary_active(), 0, "the last green context took the primary with it");
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0, "the primary's memory went with it");
    cr_assert_eq(testdrv_live(TESTDRV_CONTEXT), 0);

    /* A green context made with no retain activates the primary. */
    g = green_new(8);
    cr_assert_eq(primary_active(), 1);
    CU_OK(cuDevicePrimaryCtxRetain(&p, 0));
    CU_OK(cuGreenCtxDestroy(g));
    cr_assert_eq(primary_active(), 1, "the program's retain holds it");
    CU_OK(cuDevicePrimaryCtxRetain(&p, 0));
    CU_OK(cuDevicePrimaryCtxRelease(0));
    cr_assert_eq(primary_active(), 1);
    CU_OK(cuDevicePrimaryCtxReset(0));
    cr_assert_eq(primary_active(), 0);
}

/* Calls naming a destroyed green context, and streams left in it. */
Test(green, calls_naming_a_destroyed_green_context, .timeout = 10)
{
    primary_setup();
    CUgreenCtx g = green_new(33);
    CUcontext gctx = green_ctx(g);
    CUstream gs = green_stream(g);
    CUevent ev = event_new();
    CU_OK(cuGreenCtxDestroy(g));
    cr_assert_eq(testdrv_live(TESTDRV_STREAM), 0);

    uint64_t dead = testdrv_dead_context_calls();
    unsigned v;
    cr_assert_eq(cuCtxRecordEvent(gctx, ev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    cr_assert_eq(cuCtxGetApiVersion(gctx, &v), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuCtxPushCurrent(gctx), CUDA_SUCCESS, "measured: pushing it succeeds");
    cr_assert_eq(testdrv_dead_context_calls(), dead + 3);
    CUdeviceptr d;
    cr_assert_eq(cuMemAlloc(&d, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CUcontext popped;
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, gctx);
    cr_assert_eq(cuStreamSynchronize(gs), CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuda.h");
    cr_assert_eq(cuStreamDestroy(gs), CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuda.h");
    cr_assert_eq(cuGreenCtxDestroy(g), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    cr_assert_eq(cuGreenCtxRecordEvent(g, ev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    cr_assert_eq(testdrv_dead_context_calls(), dead + 8);
}

/* Every new entry point resolves through cuGetProcAddress to the exported
 * function, from the version that introduced it, and is counted. */
Test(green, entry_points_resolve_and_count, .timeout = 10)
{
    static const struct { const char *name; int version; } eps[] = {
        { "cuDeviceGetDevResource", 12040 }, { "cuCtxGetDevResource", 12040 },
        { "cuGreenCtxGetDevResource", 12040 }, { "cuDevSmResourceSplitByCount", 12040 },
        { "cuDevResourceGenerateDesc", 12040 }, { "cuGreenCtxCreate", 12040 },
        { "cuGreenCtxDestroy", 12040 }, { "cuCtxFromGreenCtx", 12040 },
        { "cuGreenCtxStreamCreate", 12050 }, { "cuStreamGetGreenCtx", 12040 },
        { "cuGreenCtxRecordEvent", 12040 }, { "cuGreenCtxWaitEvent", 12040 },
        { "cuPointerGetAttributes", 7000 },
    };
    void *h = driver_handle();
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        cr_assert_eq(proc(eps[i].name, eps[i].version, 0), dlsym(h, eps[i].name), "%s",
                     eps[i].name);
        void *fn;
        CUdriverProcAddressQueryResult st;
        cr_assert_eq(cuGetProcAddress_v2(eps[i].name, &fn, eps[i].version - 10, 0, &st),
                     CUDA_ERROR_NOT_FOUND, "%s", eps[i].name);
        cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    }
    CU_OK(cuInit(0));
    CUresult (*get)(CUdevice, CUdevResource *, CUdevResourceType) =
        (CUresult (*)(CUdevice, CUdevResource *, CUdevResourceType))proc("cuDeviceGetDevResource",
                                                                          13000, 0);
    CUdevResource r;
    uint64_t n = testdrv_calls("cuDeviceGetDevResource");
    CU_OK(get(0, &r, CU_DEV_RESOURCE_TYPE_SM));
    cr_assert_eq(testdrv_calls("cuDeviceGetDevResource"), n + 1);
}

/* Below 12.4 there are no green contexts. */
Test(green, old_driver_has_no_green_contexts, .timeout = 10)
{
    setenv("TESTDRIVER_VERSION", "12030", 1);
    CU_OK(cuInit(0));
    void *fn;
    CUdriverProcAddressQueryResult st;
    cr_assert_eq(cuGetProcAddress_v2("cuGreenCtxCreate", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CUdevResource r;
    cr_assert_eq(cuDeviceGetDevResource(0, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_NOT_SUPPORTED);
}

/* ------------------------------------------------------------------ */
/* 12. Registrations die with their context (measured: facts register) */

enum teardown_way { BY_CTX_DESTROY, BY_LAST_RELEASE, BY_RESET };

/* Registers buf in a context, destroys that context the given way, then
 * checks from another context that the registration is gone. */
static void check_registration_undone(enum teardown_way way)
{
    const size_t bytes = 4 * MIB;
    void *buf = aligned_alloc(4096, bytes);
    CUcontext a, b, p;
    CU_OK(cuInit(0));
    if (way == BY_CTX_DESTROY) {
        CU_OK(cuCtxCreate(&a, NULL, 0, 0));
    } else {
        CU_OK(cuDevicePrimaryCtxRetain(&p, 0));
        CU_OK(cuCtxSetCurrent(p));
    }
    CU_OK(cuMemHostRegister(buf, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
    cr_assert_eq(testdrv_live(TESTDRV_REGISTERED), 1);
    if (way == BY_CTX_DESTROY)
        CU_OK(cuCtxDestroy(a));
    else if (way == BY_LAST_RELEASE)
        CU_OK(cuDevicePrimaryCtxRelease(0));
    else
        CU_OK(cuDevicePrimaryCtxReset(0));
    cr_assert_eq(testdrv_live(TESTDRV_REGISTERED), 0);
    cr_assert_eq(testdrv_live_bytes(TESTDRV_REGISTERED), 0);

    CU_OK(cuCtxCreate(&b, NULL, 0, 0));
    cr_assert_eq(cuMemHostUnregister(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CU_OK(cuMemHostRegister(buf, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
    CU_OK(cuMemHostUnregister(buf));
    CU_OK(cuCtxDestroy(b));
    free(buf);
}

Test(registration, undone_by_ctx_destroy, .timeout = 10)
{
    check_registration_undone(BY_CTX_DESTROY);
}

Test(registration, undone_by_last_primary_release, .timeout = 10)
{
    check_registration_undone(BY_LAST_RELEASE);
}

Test(registration, undone_by_primary_reset, .timeout = 10)
{
    check_registration_undone(BY_RESET);
}

/* Pages registered and then unmapped by the program, the registration not
 * undone: an allocation of host-visible memory that lands there fails
 * (measured: facts unmapped; cuMemAllocHost and cuMemHostAlloc answer
 * ALREADY_MAPPED, cuMemAllocManaged INVALID_VALUE), and succeeds once the
 * registration is undone. Allocations that land elsewhere are kept until
 * one lands there. */
static void check_allocation_over_unmapped_registration(bool managed)
{
    ctx_setup();
    const size_t bytes = 8 * MIB;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    CU_OK(cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
    munmap(p, bytes);
    enum { TRIES = 8 };
    void *elsewhere[TRIES];
    int n = 0;
    CUresult rc = CUDA_SUCCESS;
    for (; n < TRIES; n++) {
        CUdeviceptr m = 0;
        rc = managed ? cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL)
                     : cuMemAllocHost(&elsewhere[n], bytes);
        if (rc != CUDA_SUCCESS)
            break;
        if (managed)
            elsewhere[n] = (void *)(uintptr_t)m;
        cr_assert((char *)elsewhere[n] >= (char *)p + bytes ||
                  (char *)elsewhere[n] + bytes <= (char *)p,
                  "an allocation succeeded over a live registration");
    }
    cr_assert_eq(rc, managed ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_ALREADY_MAPPED,
                 "%d allocations, then %d", n, (int)rc);
    CU_OK(cuMemHostUnregister(p));
    void *h = NULL;
    CUdeviceptr m = 0;
    CU_OK(managed ? cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL) : cuMemAllocHost(&h, bytes));
    CU_OK(managed ? cuMemFree(m) : cuMemFreeHost(h));
    for (int i = 0; i < n; i++)
        CU_OK(managed ? cuMemFree((CUdeviceptr)(uintptr_t)elsewhere[i])
                      : cuMemFreeHost(elsewhere[i]));
}

Test(registration, pinned_allocation_over_unmapped_pages_fails, .timeout = 10)
{
    check_allocation_over_unmapped_registration(false);
}

Test(registration, managed_allocation_over_unmapped_pages_fails, .timeout = 10)
{
    check_allocation_over_unmapped_registration(true);
}

/* ------------------------------------------------------------------ */
/* 13. Answers for freed memory (measured: facts freed)                 */

Test(freed, device_memory, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuMemFreeAsync(d, s));
    CU_OK(cuStreamSynchronize(s));
    cr_assert_eq(cuMemFreeAsync(d, s), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuStreamSynchronize(s));
    cr_assert_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE);

    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuMemFree(d));
    CUcontext owner = NULL;
    cr_assert_eq(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d),
                 CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr base = 0;
    size_t size = 0;
    cr_assert_eq(cuMemGetAddressRange(&base, &size, d + 16), CUDA_ERROR_NOT_FOUND);
    CUpointer_attribute attrs[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE };
    unsigned memtype = 77;
    CUcontext c2 = (CUcontext)1;
    size_t rsize = 77;
    void *vals[] = { &memtype, &c2, &rsize };
    CU_OK(cuPointerGetAttributes(3, attrs, vals, d));
    cr_assert_eq(memtype, 0);
    cr_assert_null(c2);
    cr_assert_eq(rsize, 77, "RANGE_SIZE is left unwritten");
}

Test(freed, live_memory_through_get_attributes, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, MIB));
    CUpointer_attribute attrs[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_HOST_POINTER };
    unsigned memtype = 0;
    CUcontext c2 = NULL;
    size_t rsize = 0;
    void *host = (void *)1;
    void *vals[] = { &memtype, &c2, &rsize, &host };
    uint64_t n = testdrv_calls("cuPointerGetAttributes");
    CU_OK(cuPointerGetAttributes(4, attrs, vals, d + 16));
    cr_assert_eq(testdrv_calls("cuPointerGetAttributes"), n + 1);
    cr_assert_eq(memtype, CU_MEMORYTYPE_DEVICE);
    cr_assert_eq(c2, ctx);
    cr_assert_eq(rsize, MIB);
    cr_assert_null(host, "no host pointer for device memory");
    cr_assert_eq(cuPointerGetAttributes(0, attrs, vals, d), CUDA_ERROR_INVALID_VALUE);
}

Test(freed, pinned_host_memory, .timeout = 10)
{
    ctx_setup();
    void *h;
    CU_OK(cuMemAllocHost(&h, MIB));
    CU_OK(cuMemFreeHost(h));
    unsigned flags = 0, memtype = 77;
    CUdeviceptr dp = 0;
    cr_assert_eq(cuMemHostGetFlags(&flags, h), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemHostGetDevicePointer(&dp, h, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       (CUdeviceptr)(uintptr_t)h),
                 CUDA_ERROR_INVALID_VALUE);
}

/* ------------------------------------------------------------------ */
/* 14. Writing kernels really write host memory                         */

/* The stamp words of page i of buf. */
static uint32_t word_at(const void *buf, size_t page, size_t word)
{
    return ((const volatile uint32_t *)((const char *)buf + page * 4096))[word];
}

/* A 20 ms writing kernel over [p + off, p + off + bytes), waited for. */
static void write_kernel(CUstream s, void *p, size_t off, size_t bytes)
{
    CU_OK(testdrv_launch(s, 20000, (CUdeviceptr)(uintptr_t)p + off, bytes, TESTDRV_WRITE));
    CU_OK(cuStreamSynchronize(s));
}

Test(stamp, writing_kernels_stamp_every_page, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    const size_t pages = 8;
    void *pinned, *reg = aligned_alloc(4096, pages * 4096);
    CUdeviceptr managed;
    CU_OK(cuMemAllocHost(&pinned, pages * 4096));
    CU_OK(cuMemAllocManaged(&managed, pages * 4096, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemHostRegister(reg, pages * 4096, 0));
    void *bufs[] = { pinned, (void *)(uintptr_t)managed, reg };
    for (size_t b = 0; b < 3; b++) {
        memset(bufs[b], 0, pages * 4096);
        CU_OK(testdrv_launch(s, 20000, (CUdeviceptr)(uintptr_t)bufs[b], pages * 4096, TESTDRV_READ));
        CU_OK(cuStreamSynchronize(s));
        cr_assert_eq(word_at(bufs[b], 0, 0), 0, "a reading kernel writes nothing");
        write_kernel(s, bufs[b], 0, pages * 4096);
        for (size_t i = 0; i < pages; i++) {
            cr_assert_eq(word_at(bufs[b], i, 0), TESTDRV_STAMP, "buffer %zu page %zu", b, i);
            cr_assert_eq(word_at(bufs[b], i, 1), 0, "one word per page");
        }
    }
    /* A range that starts inside a page: its first aligned word there. */
    memset(reg, 0, pages * 4096);
    write_kernel(s, reg, 4096 + 6, 4096);
    cr_assert_eq(word_at(reg, 1, 0), 0);
    cr_assert_eq(word_at(reg, 1, 2), TESTDRV_STAMP);
    cr_assert_eq(word_at(reg, 2, 0), TESTDRV_STAMP);
    cr_assert_eq(word_at(reg, 3, 0), 0);
    CU_OK(cuMemHostUnregister(reg));
    free(reg);
    cr_assert_eq(testdrv_faults(), 0);
}

/* The pages of a live registration that the program unmapped: the
 * writes are lost, the process lives on (the real GPU writes pages it
 * pinned). */
Test(stamp, unmapped_registered_pages_do_not_crash, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    const size_t bytes = 16 * 4096;
    void *reg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(reg, MAP_FAILED);
    CU_OK(cuMemHostRegister(reg, bytes, 0));
    CU_OK(testdrv_launch(s, 100000, (CUdeviceptr)(uintptr_t)reg, bytes, TESTDRV_WRITE));
    sleep_ms(20);
    munmap((char *)reg + 4096, 4096);
    CU_OK(cuStreamSynchronize(s));
    cr_assert_eq(word_at(reg, 2, 0), TESTDRV_STAMP, "the pages after the hole are written");
    cr_assert_eq(testdrv_faults(), 0);
    CU_OK(cuMemHostUnregister(reg));
}

/* ------------------------------------------------------------------ */
/* 15. What allocations cost in host time                               */

struct allocator {
    CUcontext ctx;
    uint64_t wall_ns;
    CUresult rc;
    pthread_t thread;
};

static void *allocator_main(void *arg)
{
    struct allocator *a = arg;
    CUdeviceptr d;
    cuCtxSetCurrent(a->ctx);
    uint64_t t0 = now_ns();
    a->rc = cuMemAlloc(&d, MIB);
    a->wall_ns = now_ns() - t0;
    return NULL;
}

Test(alloc_cost, allocations_take_the_set_time_without_waiting, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUdeviceptr d;
    void *h, *reg = aligned_alloc(4096, 4096);
    testdrv_set_alloc_cost(TESTDRV_DEVICE, 100000);
    testdrv_set_alloc_cost(TESTDRV_REGISTERED, 100000);
    uint64_t b0 = testdrv_thread_blocked_ns(), w0 = testdrv_thread_wait_calls(), t0 = now_ns();
    CU_OK(cuMemAlloc(&d, MIB));
    cr_assert_geq(now_ns() - t0, 90 * MS);
    t0 = now_ns();
    CU_OK(cuMemHostRegister(reg, 4096, 0));
    cr_assert_geq(now_ns() - t0, 90 * MS);
    cr_assert_eq(testdrv_thread_blocked_ns(), b0, "not a wait for the GPU");
    cr_assert_eq(testdrv_thread_wait_calls(), w0);
    t0 = now_ns();
    CU_OK(cuMemAllocHost(&h, MIB));
    cr_assert_eq(cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_lt(now_ns() - t0, 50 * MS, "other kinds and failures cost nothing");

    /* The cost is paid outside the driver's lock: two threads overlap. */
    testdrv_set_alloc_cost(TESTDRV_DEVICE, 300000);
    struct allocator a[2] = { { .ctx = ctx }, { .ctx = ctx } };
    t0 = now_ns();
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&a[i].thread, NULL, allocator_main, &a[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(a[i].thread, NULL);
    cr_assert_lt(now_ns() - t0, 550 * MS, "the two allocations overlapped");
    for (int i = 0; i < 2; i++) {
        CU_OK(a[i].rc);
        cr_assert_geq(a[i].wall_ns, 280 * MS);
    }
    testdrv_set_alloc_cost(TESTDRV_DEVICE, 0);
    t0 = now_ns();
    CU_OK(cuMemAlloc(&d, MIB));
    cr_assert_lt(now_ns() - t0, 50 * MS);
    CU_OK(cuMemHostUnregister(reg));
    free(reg);
}

/* ------------------------------------------------------------------ */
/* 16. Launches, graphs and IPC handles that cudefer wraps              */

/* A function of a library loaded into the current context. */
static CUfunction library_function(void)
{
    static const char image[] = "not a cubin";
    CUlibrary lib;
    CUkernel k;
    CUfunction f;
    CU_OK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryGetKernel(&k, lib, "k"));
    CU_OK(cuKernelGetFunction(&f, k));
    return f;
}

/* cuLaunchKernelEx runs on config->hStream and cuLaunchCooperativeKernel on
 * its stream, with the stream handles resolved as for cuLaunchKernel: with a
 * blocking stream capturing, the legacy stream is refused
 * (STREAM_CAPTURE_IMPLICIT) and the _ptsz twins' stream 0 (the per-thread
 * stream) is not. */
Test(launches, ex_and_cooperative_use_their_stream, .timeout = 10)
{
    ctx_setup();
    CUfunction f = library_function();
    CUstream s = stream_new(CU_STREAM_DEFAULT);
    CUlaunchConfig cfg = { .gridDimX = 4, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                           .blockDimY = 1, .blockDimZ = 1, .hStream = s };
    const char *names[] = { "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
                            "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz" };
    uint64_t calls[4];
    for (int i = 0; i < 4; i++)
        calls[i] = testdrv_calls(names[i]);

    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cuLaunchKernelEx(&cfg, f, NULL, NULL));
    CU_OK(cuLaunchCooperativeKernel(f, 4, 1, 1, 32, 1, 1, 0, s, NULL));
    /* The per-thread twins, as a program built with per-thread default
     * streams gets them. */
    const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    CUresult (*ex_ptsz)(const CUlaunchConfig *, CUfunction, void **, void **) =
        (CUresult (*)(const CUlaunchConfig *, CUfunction, void **, void **))
            proc("cuLaunchKernelEx", 13000, pt);
    CUresult (*coop_ptsz)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, CUstream, void **) =
        (CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      unsigned, CUstream, void **))proc("cuLaunchCooperativeKernel", 13000, pt);
    cfg.hStream = NULL;
    CU_OK(ex_ptsz(&cfg, f, NULL, NULL));
    CU_OK(coop_ptsz(f, 4, 1, 1, 32, 1, 1, 0, NULL, NULL));
    CUstreamCaptureStatus st;
    CU_OK(cuStreamIsCapturing(s, &st));
    cr_assert_eq(st, CU_STREAM_CAPTURE_STATUS_ACTIVE, "the per-thread launches are not legacy");
    cr_assert_eq(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(cuLaunchCooperativeKernel(f, 4, 1, 1, 32, 1, 1, 0, NULL, NULL),
                 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CUgraph g;
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(testdrv_calls(names[i]), calls[i] + (i % 2 ? 1 : 2), "%s", names[i]);

    /* Outside a capture they run, on any stream. */
    CU_OK(cuLaunchKernelEx(&cfg, f, NULL, NULL));
    cfg.hStream = s;
    CU_OK(cuLaunchKernelEx(&cfg, f, NULL, NULL));
    CU_OK(cuCtxSynchronize());
}

Test(launches, ex_and_cooperative_bad_input, .timeout = 10)
{
    ctx_setup();
    CUfunction f = library_function();
    CUlaunchConfig cfg = { .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                           .blockDimY = 1, .blockDimZ = 1, .numAttrs = 1 };
    cr_assert_eq(cuLaunchKernelEx(NULL, f, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_ERROR_INVALID_VALUE,
                 "attributes counted but not given");
    cfg.numAttrs = 0;
    cfg.gridDimY = 0;
    cr_assert_eq(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    cfg.gridDimY = 1;
    cr_assert_eq(cuLaunchKernelEx(&cfg, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    CUstream dead = stream_new(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamDestroy(dead));
    cfg.hStream = dead;
    cr_assert_eq(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_ERROR_INVALID_HANDLE,
                 "the config's stream is the one used");
    /* A cooperative grid must be resident at once: 132 SMs x 2 blocks of
     * 1024 threads, or 132 x 32 blocks of 32. */
    CU_OK(cuLaunchCooperativeKernel(f, 264, 1, 1, 1024, 1, 1, 0, NULL, NULL));
    cr_assert_eq(cuLaunchCooperativeKernel(f, 265, 1, 1, 1024, 1, 1, 0, NULL, NULL),
                 CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    CU_OK(cuLaunchCooperativeKernel(f, 132 * 32, 1, 1, 32, 1, 1, 0, NULL, NULL));
    cr_assert_eq(cuLaunchCooperativeKernel(f, 132, 33, 1, 32, 1, 1, 0, NULL, NULL),
                 CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    CU_OK(cuLaunchKernel(f, 132, 33, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CU_OK(cuCtxSynchronize());
}

/* A cuMemFree made on a thread of its own. */
struct freer {
    CUcontext ctx;
    CUdeviceptr d;
    CUresult rc;
};

static void *free_on_thread(void *arg)
{
    struct freer *fr = arg;
    cuCtxSetCurrent(fr->ctx);
    fr->rc = cuMemFree(fr->d);
    return NULL;
}

/* Like cuLaunchKernel, the new launches stall while a waiting release
 * holds the context's launch lock. */
Test(launches, ex_stalls_behind_a_waiting_release, .timeout = 10)
{
    struct freer fr = { .ctx = ctx_setup() };
    CUfunction f = library_function();
    CUstream a = stream_new(CU_STREAM_NON_BLOCKING), b = stream_new(CU_STREAM_NON_BLOCKING);
    CU_OK(cuMemAlloc(&fr.d, MIB));
    CU_OK(testdrv_launch(a, 300000, 0, 0, TESTDRV_NONE));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_on_thread, &fr), 0);
    sleep_ms(50);
    CUlaunchConfig cfg = { .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1,
                           .blockDimY = 1, .blockDimZ = 1, .hStream = b };
    uint64_t b0 = testdrv_thread_blocked_ns();
    CU_OK(cuLaunchKernelEx(&cfg, f, NULL, NULL));
    cr_assert_geq(testdrv_thread_blocked_ns() - b0, 150 * MS);
    pthread_join(t, NULL);
    CU_OK(fr.rc);
}

Test(launches, entry_points_resolve, .timeout = 10)
{
    void *h = driver_handle();
    const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    cr_assert_eq(proc("cuLaunchKernelEx", 11060, 0), dlsym(h, "cuLaunchKernelEx"));
    cr_assert_eq(proc("cuLaunchKernelEx", 13000, pt), dlsym(h, "cuLaunchKernelEx_ptsz"));
    cr_assert_eq(proc("cuLaunchCooperativeKernel", 9000, 0), dlsym(h, "cuLaunchCooperativeKernel"));
    cr_assert_eq(proc("cuLaunchCooperativeKernel", 13000, pt),
                 dlsym(h, "cuLaunchCooperativeKernel_ptsz"));
    cr_assert_eq(proc("cuGraphInstantiateWithFlags", 11040, 0),
                 dlsym(h, "cuGraphInstantiateWithFlags"));
    cr_assert_eq(proc("cuGraphExecDestroy", 10000, 0), dlsym(h, "cuGraphExecDestroy"));
    cr_assert_eq(proc("cuIpcGetMemHandle", 4010, 0), dlsym(h, "cuIpcGetMemHandle"));
    cr_assert_eq(proc("cuIpcOpenMemHandle", 11000, 0), dlsym(h, "cuIpcOpenMemHandle_v2"));
    cr_assert_eq(proc("cuIpcCloseMemHandle", 4010, 0), dlsym(h, "cuIpcCloseMemHandle"));
    void *fn;
    CUdriverProcAddressQueryResult st;
    cr_assert_eq(cuGetProcAddress_v2("cuLaunchKernelEx", &fn, 11050, 0, &st),
                 CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

/* A captured graph instantiates into an executable graph of the current
 * context; instantiation does not wait. */
Test(graphs, instantiate_a_captured_graph, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUgraph g;
    CUgraphExec e, e2;
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(testdrv_launch(s, 100, 0, 0, TESTDRV_NONE));
    CU_OK(cuStreamEndCapture(s, &g));
    CU_OK(testdrv_launch(stream_new(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    uint64_t w0 = testdrv_thread_wait_calls(), t0 = now_ns();
    CU_OK(cuGraphInstantiateWithFlags(&e, g, 0));
    CU_OK(cuGraphInstantiateWithFlags(&e2, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    cr_assert_lt(now_ns() - t0, 100 * MS);
    cr_assert_eq(testdrv_thread_wait_calls(), w0);
    cr_assert_not_null(e);
    cr_assert_neq(e, e2);
    cr_assert_eq(cuGraphInstantiateWithFlags(&e, g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuGraphInstantiateWithFlags(NULL, g, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuGraphInstantiateWithFlags(&e, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuGraphExecDestroy(e2));
    cr_assert_eq(cuGraphExecDestroy(e2), CUDA_ERROR_INVALID_HANDLE);
    CUcontext popped;
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(cuGraphInstantiateWithFlags(&e2, g, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxPushCurrent(ctx));
    CU_OK(cuGraphDestroy(g));
    cr_assert_eq(cuGraphInstantiateWithFlags(&e2, g, 0), CUDA_ERROR_INVALID_HANDLE);
    /* The executable graph belongs to its context. */
    CU_OK(cuCtxDestroy(ctx));
    uint64_t dead = testdrv_dead_context_calls();
    cr_assert_eq(cuGraphExecDestroy(e), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(testdrv_dead_context_calls(), dead + 1);
}

/* cuIpcGetMemHandle takes the base of a live cuMemAlloc allocation of the
 * current context and nothing else; a handle names one allocation. In the
 * exporting process the handle does not open. None of it waits. */
Test(ipc, handles_of_live_cuMemAlloc_bases, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUdeviceptr d, managed, pooled, other, p;
    void *pinned;
    CUipcMemHandle h1, h2, h3;
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuMemAllocManaged(&managed, MIB, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemAllocHost(&pinned, MIB));
    CU_OK(cuMemAllocAsync(&pooled, MIB, NULL));
    CU_OK(testdrv_launch(stream_new(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    uint64_t w0 = testdrv_thread_wait_calls(), t0 = now_ns();
    CU_OK(cuIpcGetMemHandle(&h1, d));
    CU_OK(cuIpcGetMemHandle(&h2, d));
    cr_assert_eq(memcmp(&h1, &h2, sizeof h1), 0, "the same allocation, the same handle");
    cr_assert_eq(cuIpcGetMemHandle(NULL, d), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcGetMemHandle(&h3, d + 256), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcGetMemHandle(&h3, managed), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcGetMemHandle(&h3, (CUdeviceptr)(uintptr_t)pinned), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcGetMemHandle(&h3, pooled), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcGetMemHandle(&h3, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcOpenMemHandle_v2(&p, h1, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_INVALID_CONTEXT, "opened in the process that exported it");
    memset(&h3, 0x5a, sizeof h3);
    cr_assert_eq(cuIpcOpenMemHandle_v2(&p, h3, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_INVALID_VALUE, "not a handle");
    cr_assert_eq(cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE, "not an opened handle");
    cr_assert_lt(now_ns() - t0, 100 * MS);
    cr_assert_eq(testdrv_thread_wait_calls(), w0);

    /* No context; another context's memory; freed memory; a new block. */
    CUcontext popped, second;
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(cuIpcGetMemHandle(&h3, d), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxCreate(&second, NULL, 0, 0));
    CU_OK(cuMemAlloc(&other, MIB));
    CU_OK(cuCtxSetCurrent(ctx));
    cr_assert_eq(cuIpcGetMemHandle(&h3, other), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemFree(d));
    cr_assert_eq(cuIpcGetMemHandle(&h3, d), CUDA_ERROR_INVALID_VALUE, "freed");
    CU_OK(cuMemAlloc(&d, MIB));
    CU_OK(cuIpcGetMemHandle(&h3, d));
    cr_assert_neq(memcmp(&h1, &h3, sizeof h1), 0, "a new allocation, a new handle");
    uint64_t calls = testdrv_calls("cuIpcGetMemHandle");
    cr_assert_geq(calls, 12);
}

/* A child process exports a block; this process opens it (twice: the
 * same address, one more reference), cannot cuMemFree it, and closes it
 * once per open. */
Test(ipc, another_process_opens_and_closes, .timeout = 10)
{
    int to_parent[2], to_child[2];
    cr_assert_eq(pipe(to_parent), 0);
    cr_assert_eq(pipe(to_child), 0);
    pid_t pid = fork(); /* before either process uses the driver */
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        CUcontext c;
        CUdeviceptr d;
        CUipcMemHandle h;
        char done;
        alarm(10); /* whatever becomes of the parent */
        close(to_parent[0]);
        close(to_child[1]);
        if (cuInit(0) || cuCtxCreate(&c, NULL, 0, 0) || cuMemAlloc(&d, 3 * MIB) ||
            cuIpcGetMemHandle(&h, d))
            _exit(1);
        if (write(to_parent[1], &h, sizeof h) != (ssize_t)sizeof h ||
            read(to_child[0], &done, 1) != 1)
            _exit(2);
        _exit(cuMemFree(d) == CUDA_SUCCESS ? 0 : 3);
    }
    close(to_parent[1]);
    close(to_child[0]);
    CUipcMemHandle h;
    cr_assert_eq(read(to_parent[0], &h, sizeof h), (ssize_t)sizeof h);
    CUcontext ctx = ctx_setup();
    CUdeviceptr p, q;
    uint64_t w0 = testdrv_thread_wait_calls();
    CU_OK(cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CU_OK(cuIpcOpenMemHandle_v2(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    cr_assert_eq(p, q, "opened again: the same mapping");
    cr_assert_eq(cuIpcOpenMemHandle_v2(&q, h, 2), CUDA_ERROR_INVALID_VALUE, "unknown flag");
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1);
    CUdeviceptr base;
    size_t size;
    CU_OK(cuMemGetAddressRange(&base, &size, p + 5));
    cr_assert_eq(base, p);
    cr_assert_eq(size, 3 * MIB);
    cr_assert_eq(testdrv_thread_wait_calls(), w0, "IPC calls do not wait");
    cr_assert_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "only cuIpcCloseMemHandle unmaps it");
    w0 = testdrv_thread_wait_calls();
    CUipcMemHandle again;
    cr_assert_eq(cuIpcGetMemHandle(&again, p), CUDA_ERROR_INVALID_VALUE, "not exported here");
    CUcontext popped;
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxPushCurrent(ctx));
    CU_OK(cuIpcCloseMemHandle(p));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 1, "one open left");
    CU_OK(cuIpcCloseMemHandle(p));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(testdrv_thread_wait_calls(), w0, "IPC calls do not wait");
    /* A context's destruction unmaps what it opened. */
    CU_OK(cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CU_OK(cuCtxDestroy(ctx));
    cr_assert_eq(testdrv_live(TESTDRV_DEVICE), 0);

    cr_assert_eq(write(to_child[1], "x", 1), 1);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the exporter failed (%d)", status);
}

/* ------------------------------------------------------------------ */
/* 17. The exit-time teardown                                           */

static int exit_pipe = -1;

/* An exit handler the program registered before its first CUDA call. */
static void report_at_exit(void)
{
    CUresult rc = cuCtxSynchronize();
    if (write(exit_pipe, &rc, sizeof rc) != (ssize_t)sizeof rc)
        _exit(3);
}

/* What a handler registered before cuInit gets at exit, in a child. */
static CUresult at_exit_answer(const char *exit_mode)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        exit_pipe = fds[1];
        if (!freopen("/dev/null", "w", stderr)) /* the driver's line about it */
            _exit(4);
        if (exit_mode)
            setenv("TESTDRIVER_EXIT", exit_mode, 1);
        atexit(report_at_exit);
        CUcontext c;
        if (cuInit(0) || cuCtxCreate(&c, NULL, 0, 0))
            _exit(2);
        exit(0);
    }
    close(fds[1]);
    CUresult rc = CUDA_ERROR_UNKNOWN;
    cr_assert_eq(read(fds[0], &rc, sizeof rc), (ssize_t)sizeof rc, "the handler did not run");
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    return rc;
}

/* By default the driver tears itself down when its library is finalised,
 * after every exit handler; with TESTDRIVER_EXIT=atexit, in an exit
 * handler of cuInit's, before those registered earlier. */
Test(exit, teardown_before_handlers_registered_earlier, .timeout = 10)
{
    cr_assert_eq(at_exit_answer(NULL), CUDA_SUCCESS);
    cr_assert_eq(at_exit_answer("atexit"), CUDA_ERROR_DEINITIALIZED);
}

/* ---- a word written by the GPU after a fence (bench/RESULTS.md, run 62) ---- */

/* cuStreamWriteValue32 behind a context's record: the host sees the word
 * only once the work before the record has ended, never before; bad flags
 * or an unaligned address get CUDA_ERROR_INVALID_VALUE. */
Test(memops, write_value_follows_the_fence, .timeout = 10)
{
    CUcontext ctx = ctx_setup();
    CUstream work = stream_new(CU_STREAM_NON_BLOCKING), priv = stream_new(CU_STREAM_NON_BLOCKING);
    void *host;
    CU_OK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    volatile uint32_t *word = host;
    CUdeviceptr dword;
    CU_OK(cuMemHostGetDevicePointer(&dword, host, 0));
    *word = 0;
    CUevent ev = event_new();
    CU_OK(testdrv_launch(work, 100000, 0, 0, TESTDRV_WRITE));
    CU_OK(cuCtxRecordEvent(ctx, ev));
    CU_OK(cuStreamWaitEvent(priv, ev, 0));
    CU_OK(cuStreamWriteValue32(priv, dword, 7, 0));
    sleep_ms(20);
    cr_expect_eq(*word, 0, "the word was written while the work before the fence ran");
    cr_expect_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    CU_OK(cuStreamSynchronize(priv));
    cr_expect_eq(*word, 7);
    cr_expect_eq(cuEventQuery(ev), CUDA_SUCCESS);
    cr_expect_eq(cuStreamWriteValue32(priv, dword + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuStreamWriteValue32(priv, dword, 1, 8), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuEventDestroy(ev));
    CU_OK(cuMemFreeHost(host));
}

/* A word outside live memory faults the context when the stream reaches
 * it, as a kernel's write there would. */
Test(memops, write_value_to_freed_memory_faults, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    void *host;
    CU_OK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr dword;
    CU_OK(cuMemHostGetDevicePointer(&dword, host, 0));
    CU_OK(cuMemFreeHost(host));
    CU_OK(cuStreamWriteValue32(s, dword, 1, 0));
    cr_expect_eq(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_expect_gt(testdrv_faults(), 0);
}

/* ---- stream-ordered memsets ----------------------------------------------- */

/* cuMemsetD8Async, D16 and D32 fill when the stream reaches them, after
 * the work queued before, never at the call; the value lands in pinned
 * memory that the host reads. An address outside every allocation, or
 * not aligned to the width, gets CUDA_ERROR_INVALID_VALUE at the call. */
Test(memset, async_fills_after_the_work_before_it, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    void *host;
    CU_OK(cuMemAllocHost(&host, 4096));
    memset(host, 0, 4096);
    CUdeviceptr d = (CUdeviceptr)host;
    CU_OK(testdrv_launch(s, 100000, 0, 0, TESTDRV_WRITE));
    CU_OK(cuMemsetD8Async(d, 0xab, 16, s));
    CU_OK(cuMemsetD16Async(d + 16, 0x1234, 8, s));
    CU_OK(cuMemsetD32Async(d + 32, 0xdeadbeefu, 4, s));
    sleep_ms(20);
    const volatile unsigned char *b = host;
    cr_expect_eq(b[0], 0, "the memset ran before the kernel queued ahead of it");
    CU_OK(cuStreamSynchronize(s));
    for (int i = 0; i < 16; i++)
        cr_expect_eq(b[i], 0xab, "byte %d", i);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(((const uint16_t *)host)[8 + i], 0x1234, "half-word %d", i);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(((const uint32_t *)host)[8 + i], 0xdeadbeefu, "word %d", i);
    cr_expect_eq(b[48], 0);
    cr_expect_eq(cuMemsetD16Async(d + 1, 1, 1, s), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemsetD32Async(d + 2, 1, 1, s), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemsetD8Async(d, 1, 8192, s), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemsetD8Async((CUdeviceptr)16, 1, 1, s), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFreeHost(host));
    cr_expect_eq(testdrv_faults(), 0);
}

/* A memset queued behind a stream-ordered free of its block faults the
 * context when the stream reaches it, as a kernel's write there would. */
Test(memset, async_into_memory_freed_before_it_faults, .timeout = 10)
{
    ctx_setup();
    CUstream s = stream_new(CU_STREAM_NON_BLOCKING);
    CUdeviceptr d;
    CU_OK(cuMemAllocAsync(&d, 4096, s));
    CU_OK(cuMemFreeAsync(d, s));
    CU_OK(cuMemsetD8Async(d, 0, 4096, s));
    cr_expect_eq(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_expect_gt(testdrv_faults(), 0);
}

/* ---- copies into and out of arrays ---------------------------------------- */

/* What cuMemcpyHtoA puts into an array, cuMemcpyAtoH reads back (a part
 * never written reads as zeros); a range past the array's end gets
 * CUDA_ERROR_INVALID_VALUE, a destroyed array CUDA_ERROR_INVALID_HANDLE. */
Test(arrays, copies_round_trip, .timeout = 10)
{
    ctx_setup();
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 256, .Height = 1, .Format = CU_AD_FORMAT_UNSIGNED_INT8,
                               .NumChannels = 1};
    CUarray a;
    CU_OK(cuArrayCreate(&a, &d));
    unsigned char in[64], out[256];
    for (int i = 0; i < 64; i++)
        in[i] = (unsigned char)(i + 1);
    CU_OK(cuMemcpyHtoA(a, 128, in, sizeof in));
    memset(out, 0xff, sizeof out);
    CU_OK(cuMemcpyAtoH(out, a, 0, sizeof out));
    for (int i = 0; i < 256; i++)
        cr_expect_eq(out[i], i >= 128 && i < 192 ? i - 127 : 0, "byte %d", i);
    cr_expect_eq(cuMemcpyHtoA(a, 200, in, sizeof in), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemcpyAtoH(out, a, 257, 1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuArrayDestroy(a));
    cr_expect_eq(cuMemcpyAtoH(out, a, 0, 1), CUDA_ERROR_INVALID_HANDLE);
}

/* ---- what a program sets on an allocation (advice.c) ---------------------- */

static int range_int(CUdeviceptr p, size_t bytes, CUmem_range_attribute attr)
{
    int v = 7;
    CU_OK(cuMemRangeGetAttribute(&v, sizeof v, attr, p, bytes));
    return v;
}

static unsigned sync_memops(CUdeviceptr p)
{
    unsigned v = 7;
    CU_OK(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
    return v;
}

/* Measured on the H200 (tests/gpu/inherit.c, run 111): what the queries
 * answer once set, and that a new allocation answers as if nothing had
 * been set, at the address of the freed one too. */
Test(advice, set_then_gone_with_the_allocation, .timeout = 10)
{
    ctx_setup();
    const size_t n = 2u << 20;
    CUmemLocation dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUdeviceptr p, q, d, e;
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
    cr_assert_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 0);
    cr_assert_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION),
                 CU_DEVICE_INVALID);
    CU_OK(cuMemAdvise(p, n, CU_MEM_ADVISE_SET_READ_MOSTLY, dev));
    CU_OK(cuMemAdvise(p, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    CU_OK(cuMemAdvise(p, n, CU_MEM_ADVISE_SET_ACCESSED_BY, dev));
    CU_OK(cuMemPrefetchAsync(p, n, dev, 0, s));
    CU_OK(cuStreamAttachMemAsync(s, p, 0, CU_MEM_ATTACH_HOST));
    CU_OK(cuStreamSynchronize(s));
    const int one = 1;
    CU_OK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 64));
    cr_expect_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 1);
    cr_expect_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION), CU_DEVICE_CPU);
    cr_expect_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY), 0);
    cr_expect_eq(range_int(p, n, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION), 0);
    cr_expect_eq(testdrv_managed_attachment(p), CU_MEM_ATTACH_HOST);
    cr_expect_eq(sync_memops(p), 1);
    CU_OK(cuMemFree(p));
    CU_OK(cuMemAllocManaged(&q, n, CU_MEM_ATTACH_GLOBAL));
    cr_expect_eq(range_int(q, n, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), 0);
    cr_expect_eq(range_int(q, n, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION), CU_DEVICE_INVALID);
    cr_expect_eq(range_int(q, n, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY), CU_DEVICE_INVALID);
    cr_expect_eq(range_int(q, n, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION),
                 CU_DEVICE_INVALID);
    cr_expect_eq(testdrv_managed_attachment(q), CU_MEM_ATTACH_GLOBAL);
    cr_expect_eq(sync_memops(q), 0);

    CU_OK(cuMemAlloc(&d, n));
    CU_OK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d));
    cr_expect_eq(sync_memops(d), 1);
    CU_OK(cuMemFree(d));
    CU_OK(cuMemAlloc(&e, n));
    cr_expect_eq(sync_memops(e), 0);
}

Test(advice, bad_input, .timeout = 10)
{
    ctx_setup();
    CUmemLocation dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUmemLocation nowhere = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 99};
    CUdeviceptr m, d;
    int v;
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemAlloc(&d, 4096));
    /* Device memory is not managed; a range past the allocation. */
    cr_expect_eq(cuMemAdvise(d, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, dev), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemAdvise(m, 8192, CU_MEM_ADVISE_SET_READ_MOSTLY, dev), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemAdvise(m, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, nowhere),
                 CUDA_ERROR_INVALID_DEVICE);
    cr_expect_eq(cuMemPrefetchAsync(d, 4096, dev, 0, s), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemPrefetchAsync(m, 4096, dev, 1, s), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemRangeGetAttribute(&v, 2, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 4096),
                 CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuStreamAttachMemAsync(s, m + 64, 0, CU_MEM_ATTACH_HOST),
                 CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuStreamAttachMemAsync(s, m, 100, CU_MEM_ATTACH_HOST), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuStreamAttachMemAsync(s, m, 0, 7), CUDA_ERROR_INVALID_VALUE);
    const int one = 1;
    cr_expect_eq(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_MAPPED, d),
                 CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuPointerSetAttribute(NULL, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d),
                 CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFree(d));
    cr_expect_eq(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d),
                 CUDA_ERROR_INVALID_VALUE);
}

Test(advice, entry_points_resolve, .timeout = 10)
{
    void *h = driver_handle();
    ctx_setup();
    const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    cr_assert_eq(proc("cuMemAdvise", 8000, 0), dlsym(h, "cuMemAdvise"));
    cr_assert_eq(proc("cuMemAdvise", 13000, 0), dlsym(h, "cuMemAdvise_v2"));
    cr_assert_eq(proc("cuMemPrefetchAsync", 8000, 0), dlsym(h, "cuMemPrefetchAsync"));
    cr_assert_eq(proc("cuMemPrefetchAsync", 13000, pt), dlsym(h, "cuMemPrefetchAsync_v2_ptsz"));
    cr_assert_eq(proc("cuMemPrefetchBatchAsync", 13000, pt),
                 dlsym(h, "cuMemPrefetchBatchAsync_ptsz"));
    cr_assert_eq(proc("cuMemDiscardAndPrefetchBatchAsync", 13000, 0),
                 dlsym(h, "cuMemDiscardAndPrefetchBatchAsync"));
    cr_assert_eq(proc("cuStreamAttachMemAsync", 13000, pt),
                 dlsym(h, "cuStreamAttachMemAsync_ptsz"));
    cr_assert_eq(proc("cuPointerSetAttribute", 6000, 0), dlsym(h, "cuPointerSetAttribute"));
    cr_assert_eq(proc("cuMemRangeGetAttributes", 8000, 0), dlsym(h, "cuMemRangeGetAttributes"));
}

/* A dma-buf of a page-aligned range of one device or pinned allocation. */
Test(advice, dma_buf_of_a_range, .timeout = 10)
{
    ctx_setup();
    CUdeviceptr d, m;
    void *h;
    int fd = -1;
    CU_OK(cuMemAlloc(&d, 8192));
    CU_OK(cuMemAllocHost(&h, 8192));
    CU_OK(cuMemAllocManaged(&m, 8192, CU_MEM_ATTACH_GLOBAL));
    cr_expect_eq(testdrv_dmabuf_exported(d), 0);
    CU_OK(cuMemGetHandleForAddressRange(&fd, d + 4096, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                        0));
    cr_expect_geq(fd, 0);
    close(fd);
    cr_expect_eq(testdrv_dmabuf_exported(d), 1);
    CU_OK(cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)(uintptr_t)h, 8192,
                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
    close(fd);
    cr_expect_eq(testdrv_dmabuf_exported((CUdeviceptr)(uintptr_t)h), 1);
    cr_expect_eq(cuMemGetHandleForAddressRange(&fd, d + 64, 4096,
                                               CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                 CUDA_ERROR_INVALID_VALUE, "not page-aligned");
    cr_expect_eq(cuMemGetHandleForAddressRange(&fd, d, 3 * 4096,
                                               CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                 CUDA_ERROR_INVALID_VALUE, "past the allocation");
    cr_expect_eq(cuMemGetHandleForAddressRange(&fd, m, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                               0),
                 CUDA_ERROR_INVALID_VALUE, "managed memory");
    cr_expect_eq(cuMemGetHandleForAddressRange(NULL, d, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                               0),
                 CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFree(d));
    cr_expect_eq(cuMemGetHandleForAddressRange(&fd, d, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                                               0),
                 CUDA_ERROR_INVALID_VALUE, "freed memory");
}
