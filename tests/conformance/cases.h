/* cases.h - the conformance cases: bad input given to releases and
 * allocations, the code the real driver answers, and how the context
 * behaves afterwards. One table, compiled into two harnesses:
 *
 *   tests/gpu/conform.c       on a GPU, one case per process, without and
 *                             with cudefer; prints RESULT lines that
 *                             tests/gpu/report.py compares
 *   tests/test_conformance.c  Criterion over the test driver, with the shim
 *                             (suite "conformance") and without it
 *                             ("conformance-driver"); every case is a test
 *                             of its own, asserting the codes of this table
 *
 * A case (struct conform_case) is its name, f(arg); the function that
 * performs it and records each code it sees; the codes the real driver gave
 * (the call's, and for the capture cases cuStreamEndCapture's); cudefer's
 * code where it differs by design; and the behaviour afterwards: in
 * whatever context the case left current, a 1 MiB cuMemAlloc, a kernel
 * writing it and cuCtxSynchronize (conform_follow_up).
 *
 * Every code is MEASURED: tests/gpu/conform.c on an NVIDIA H200, driver
 * 580.159.04, CUDA 13.0, without and with cudefer (2026-11-29; raw logs not
 * kept, summarised in bench/RESULTS.md). Where the driver crashed (SIGSEGV)
 * the table says CONFORM_CRASH and gives cudefer's measured answer.
 *
 * The cases reach their harness only through struct conform_harness: how a
 * failed set-up call ends the case, how a short kernel is launched (a PTX
 * kernel on a GPU, the test driver's simulated one under Criterion) and who
 * hears each code as soon as it is seen. Objects a case leaves behind are in
 * struct conform_run, for a harness's own checks afterwards. Everything is
 * static: one translation unit per harness.
 */
#ifndef CUDEFER_CONFORMANCE_CASES_H
#define CUDEFER_CONFORMANCE_CASES_H

#include <cuda.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../bench/kernels.h"

#define CONFORM_BYTES (1u << 20)
#define CONFORM_MAX_CODES 2

/* Table entries that are not CUresults. */
enum {
    CONFORM_CRASH = -1,     /* the driver crashed (SIGSEGV): no code */
    CONFORM_AS_DRIVER = -2, /* cudefer's answer: the driver's */
};

/* What a harness lends the cases. */
struct conform_harness {
    /* Ends the case: a set-up call failed. Must not return. */
    void (*fail)(const char *what, CUresult rc);
    /* Queues a short kernel on s that writes buf[0 .. words) (nothing when
     * words is 0), in the current context. */
    CUresult (*launch)(CUstream s, CUdeviceptr buf, unsigned long long words);
    /* Hears each code as the case sees it (may be NULL). */
    void (*seen)(const char *suffix, CUresult rc);
};

/* One run of a case. */
struct conform_run {
    const struct conform_harness *h;
    CUcontext primary; /* current when the case starts (the primary context) */
    int n;             /* codes seen */
    struct {
        const char *suffix; /* "" for the call, ".end_capture" for its capture's end */
        CUresult rc;
    } codes[CONFORM_MAX_CODES];
    /* What the case leaves for a harness's own checks afterwards. */
    CUdeviceptr dptr; /* its device or managed block (or the other thread's) */
    void *host;       /* its host block: pinned or registered */
    CUcontext other;  /* the second context it created, if any */
};

/* A code of the table: the driver's, and cudefer's. */
struct conform_answer {
    int driver;  /* a CUresult, or CONFORM_CRASH */
    int cudefer; /* a CUresult where it differs by design, CONFORM_AS_DRIVER
                    otherwise, CONFORM_CRASH where cudefer crashes too */
};

/* The behaviour afterwards (conform_follow_up), as measured. */
enum conform_after {
    CONFORM_AFTER_OK = 0,    /* allocation, launch and cuCtxSynchronize succeed */
    CONFORM_AFTER_DESTROYED, /* the current context is destroyed: each answers
                                CUDA_ERROR_CONTEXT_IS_DESTROYED */
};

/* A row of the table: the name and the function, then designated fields
 * (.after is CONFORM_AFTER_OK unless given). */
struct conform_case {
    const char *name;
    void (*run)(struct conform_run *r);
    enum conform_after after;
    struct conform_answer call;        /* the code of the call */
    struct conform_answer end_capture; /* cuStreamEndCapture's, when .captures */
    bool captures;
    /* Where the real driver crashes with and without cudefer: the test
     * driver's answer (a stand-in that both Criterion runs expect). */
    int stand_in;
};

/* ---- what a case uses ---------------------------------------------------- */

/* Records a code the case saw. */
static void conform_saw(struct conform_run *r, const char *suffix, CUresult rc)
{
    if (r->n < CONFORM_MAX_CODES) {
        r->codes[r->n].suffix = suffix;
        r->codes[r->n].rc = rc;
        r->n++;
    }
    if (r->h->seen)
        r->h->seen(suffix, rc);
}

/* Ends the case: the set-up step `what` failed with rc. */
static void fail_case(struct conform_run *r, const char *what, CUresult rc)
{
    r->h->fail(what, rc);
    abort(); /* fail must not return */
}

/* A set-up call that must succeed. */
static void need(struct conform_run *r, CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS)
        fail_case(r, what, rc);
}

static void *host_memory(struct conform_run *r, size_t bytes)
{
    void *p = malloc(bytes);
    if (!p)
        fail_case(r, "malloc", CUDA_ERROR_OUT_OF_MEMORY);
    return p;
}

/* Page-aligned host memory, zeroed. */
static void *pages(struct conform_run *r)
{
    void *h = aligned_alloc(4096, CONFORM_BYTES);
    if (!h)
        fail_case(r, "aligned_alloc", CUDA_ERROR_OUT_OF_MEMORY);
    memset(h, 0, CONFORM_BYTES);
    return h;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

static CUdeviceptr device_alloc(struct conform_run *r)
{
    CUdeviceptr p;
    need(r, cuMemAlloc(&p, CONFORM_BYTES), "cuMemAlloc");
    return p;
}

static CUdeviceptr managed_alloc(struct conform_run *r)
{
    CUdeviceptr p;
    need(r, cuMemAllocManaged(&p, CONFORM_BYTES, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
    return p;
}

static void *host_alloc(struct conform_run *r)
{
    void *h;
    need(r, cuMemAllocHost(&h, CONFORM_BYTES), "cuMemAllocHost");
    return h;
}

static void *registered(struct conform_run *r)
{
    void *h = pages(r);
    need(r, cuMemHostRegister(h, CONFORM_BYTES, 0), "cuMemHostRegister");
    return h;
}

/* A second context of device 0, current (pushed) on return. */
static CUcontext other_context(struct conform_run *r)
{
    CUdevice dev;
    CUcontext ctx;
    need(r, cuDeviceGet(&dev, 0), "cuDeviceGet");
    need(r, cuCtxCreate(&ctx, NULL, 0, dev), "cuCtxCreate");
    return ctx;
}

/* Pops the current context, which must be the one `other_context` made. */
static void pop_other(struct conform_run *r, CUcontext made)
{
    CUcontext popped;
    need(r, cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
    if (popped != made)
        fail_case(r, "cuCtxPopCurrent popped another context", CUDA_ERROR_UNKNOWN);
}

struct destroyer {
    CUcontext ctx;
    CUresult rc;
};

static void *destroy_main(void *arg)
{
    struct destroyer *d = arg;
    d->rc = cuCtxDestroy(d->ctx);
    return NULL;
}

/* cuCtxDestroy from another thread: the context stays current, destroyed,
 * on this one (cuda.h: "attempting to access ctx from those threads will
 * result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED"). */
static void destroy_from_another_thread(struct conform_run *r, CUcontext ctx)
{
    struct destroyer d = {ctx, CUDA_ERROR_UNKNOWN};
    pthread_t t;
    if (pthread_create(&t, NULL, destroy_main, &d) != 0)
        fail_case(r, "pthread_create", CUDA_ERROR_UNKNOWN);
    pthread_join(t, NULL);
    need(r, d.rc, "cuCtxDestroy from another thread");
}

/* A released cuMemAllocHost block of CONFORM_BYTES whose fence has passed:
 * what cudefer could hand out again without a driver call. (Not
 * cuCtxSynchronize, which would release cudefer's queue.) */
static void released_host_block(struct conform_run *r)
{
    void *h = host_alloc(r);
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    need(r, cuStreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize");
    sleep_ms(50); /* the fence passes on cudefer's own stream */
}

static CUarray array_create(struct conform_run *r)
{
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    need(r, cuArrayCreate(&a, &d), "cuArrayCreate");
    return a;
}

static CUmipmappedArray mipmapped_create(struct conform_run *r)
{
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    need(r, cuMipmappedArrayCreate(&m, &d, 2), "cuMipmappedArrayCreate");
    return m;
}

static CUmodule module_load(struct conform_run *r)
{
    CUmodule m;
    need(r, cuModuleLoadData(&m, cudefer_kernels_ptx), "cuModuleLoadData");
    return m;
}

static CUlibrary library_load(struct conform_run *r)
{
    CUlibrary l;
    need(r, cuLibraryLoadData(&l, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0),
         "cuLibraryLoadData");
    return l;
}

/* ---- the behaviour afterwards -------------------------------------------- */

struct conform_after_codes {
    CUresult alloc, launch, sync;
    CUresult free; /* of the follow-up's block, when the allocation succeeded */
};

/* In whatever context is current: allocate, launch a kernel that writes the
 * new memory (or touches nothing if the allocation failed), synchronise the
 * context, free the block. */
static struct conform_after_codes conform_follow_up(const struct conform_harness *h)
{
    struct conform_after_codes a = {.free = CUDA_SUCCESS};
    CUdeviceptr p = 0;
    a.alloc = cuMemAlloc(&p, CONFORM_BYTES);
    bool have = a.alloc == CUDA_SUCCESS;
    a.launch = h->launch(NULL, have ? p : 0, have ? 16 : 0);
    a.sync = cuCtxSynchronize();
    if (have)
        a.free = cuMemFree(p);
    return a;
}

/* ---- capture ------------------------------------------------------------- */

/* A global-mode capture of a new stream on this thread, with one kernel in
 * it. The kernel runs once before, outside the capture (on a GPU that loads
 * it into the context). */
static CUstream capture_begin(struct conform_run *r)
{
    CUstream s;
    need(r, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    need(r, r->h->launch(s, 0, 0), "a launch before the capture");
    need(r, cuStreamSynchronize(s), "cuStreamSynchronize");
    need(r, cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    need(r, r->h->launch(s, 0, 0), "a launch in the capture");
    return s;
}

static void capture_end(struct conform_run *r, CUstream s)
{
    CUgraph g = NULL;
    CUresult end = cuStreamEndCapture(s, &g);
    conform_saw(r, ".end_capture", end);
    if (end == CUDA_SUCCESS && g)
        need(r, cuGraphDestroy(g), "cuGraphDestroy");
}

enum other_call { OTHER_FREE, OTHER_FREE_HOST, OTHER_ALLOC };

struct other_thread {
    CUcontext ctx;
    enum other_call call;
    bool relaxed;
    CUdeviceptr dptr;
    void *host;
    CUresult setup; /* its cuCtxSetCurrent and cuThreadExchangeStreamCaptureMode */
    CUresult rc;
};

static void *other_thread_main(void *arg)
{
    struct other_thread *o = arg;
    o->setup = cuCtxSetCurrent(o->ctx);
    if (o->setup == CUDA_SUCCESS && o->relaxed) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        o->setup = cuThreadExchangeStreamCaptureMode(&mode);
    }
    if (o->setup != CUDA_SUCCESS)
        return NULL;
    switch (o->call) {
    case OTHER_FREE: o->rc = cuMemFree(o->dptr); break;
    case OTHER_FREE_HOST: o->rc = cuMemFreeHost(o->host); break;
    case OTHER_ALLOC: o->rc = cuMemAlloc(&o->dptr, CONFORM_BYTES); break;
    }
    return NULL;
}

/* This thread captures in the global mode while another thread, in the
 * global or the relaxed mode, makes the call. The other thread's block
 * (freed, or allocated when the allocation succeeded) is left in r. */
static void during_capture_on_another_thread(struct conform_run *r, enum other_call call,
                                             bool relaxed)
{
    struct other_thread o = {.ctx = r->primary, .call = call, .relaxed = relaxed};
    if (call == OTHER_FREE)
        o.dptr = device_alloc(r);
    if (call == OTHER_FREE_HOST)
        o.host = host_alloc(r);
    CUstream s = capture_begin(r);
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread_main, &o) != 0)
        fail_case(r, "pthread_create", CUDA_ERROR_UNKNOWN);
    pthread_join(t, NULL);
    need(r, o.setup, "the other thread's set-up");
    conform_saw(r, "", o.rc);
    capture_end(r, s);
    r->dptr = o.dptr;
    r->host = o.host;
}

/* The release with no current context (the object names its context), the
 * context pushed back afterwards. */
static void release_with_no_context(struct conform_run *r, CUresult (*release)(void *),
                                    void *handle)
{
    CUcontext popped;
    need(r, cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
    conform_saw(r, "", release(handle));
    need(r, cuCtxPushCurrent(popped), "cuCtxPushCurrent");
}

static CUresult free_any(void *p) { return cuMemFree((CUdeviceptr)(uintptr_t)p); }
static CUresult free_host_any(void *h) { return cuMemFreeHost(h); }
static CUresult unregister_any(void *h) { return cuMemHostUnregister(h); }
static CUresult array_destroy_any(void *a) { return cuArrayDestroy(a); }
static CUresult mipmapped_destroy_any(void *m) { return cuMipmappedArrayDestroy(m); }
static CUresult module_unload_any(void *m) { return cuModuleUnload(m); }
static CUresult library_unload_any(void *l) { return cuLibraryUnload(l); }

/* ---- cuMemFree ----------------------------------------------------------- */

/* SUCCESS. */
static void free_null(struct conform_run *r)
{
    conform_saw(r, "", cuMemFree(0));
}

/* INVALID_VALUE. */
static void free_never_allocated(struct conform_run *r)
{
    conform_saw(r, "", cuMemFree((CUdeviceptr)0xdead0000ull));
}

/* INVALID_VALUE. */
static void free_interior(struct conform_run *r)
{
    r->dptr = device_alloc(r);
    conform_saw(r, "", cuMemFree(r->dptr + 256));
}

/* INVALID_VALUE. */
static void free_double(struct conform_run *r)
{
    CUdeviceptr p = device_alloc(r);
    need(r, cuMemFree(p), "cuMemFree");
    conform_saw(r, "", cuMemFree(p));
}

/* INVALID_VALUE. */
static void free_managed_double(struct conform_run *r)
{
    CUdeviceptr p = managed_alloc(r);
    need(r, cuMemFree(p), "cuMemFree");
    conform_saw(r, "", cuMemFree(p));
}

/* INVALID_VALUE. */
static void free_malloc_ptr(struct conform_run *r)
{
    void *h = host_memory(r, CONFORM_BYTES);
    conform_saw(r, "", cuMemFree((CUdeviceptr)(uintptr_t)h));
    free(h);
}

/* INVALID_VALUE. */
static void free_alloc_host_ptr(struct conform_run *r)
{
    r->host = host_alloc(r);
    conform_saw(r, "", cuMemFree((CUdeviceptr)(uintptr_t)r->host));
}

/* SUCCESS: the memory is freed; the pointer names its context. */
static void free_no_context(struct conform_run *r)
{
    r->dptr = device_alloc(r);
    release_with_no_context(r, free_any, (void *)(uintptr_t)r->dptr);
}

/* INVALID_VALUE, as for a malloc pointer. */
static void free_stack_ptr(struct conform_run *r)
{
    char on_stack[64];
    conform_saw(r, "", cuMemFree((CUdeviceptr)(uintptr_t)on_stack));
}

/* INVALID_VALUE: registered memory is released by cuMemHostUnregister only. */
static void free_registered_ptr(struct conform_run *r)
{
    r->host = registered(r);
    conform_saw(r, "", cuMemFree((CUdeviceptr)(uintptr_t)r->host));
}

/* INVALID_VALUE, as for device memory. */
static void free_managed_interior(struct conform_run *r)
{
    r->dptr = managed_alloc(r);
    conform_saw(r, "", cuMemFree(r->dptr + 4096));
}

/* SUCCESS. cuMemFree needs no current context, so the memory of another
 * context is freed too: the pointer names it. */
static void free_other_context_ptr(struct conform_run *r)
{
    r->other = other_context(r);
    r->dptr = device_alloc(r);
    pop_other(r, r->other);
    conform_saw(r, "", cuMemFree(r->dptr));
}

/* STREAM_CAPTURE_UNSUPPORTED during this thread's own global-mode capture (a
 * "potentially unsafe API call", cuStreamBeginCapture documentation), then
 * STREAM_CAPTURE_INVALIDATED from cuStreamEndCapture. cudefer only queues the
 * release: SUCCESS, SUCCESS (measured too, by design); the capture stays
 * valid and the release happens once it has ended. */
static void free_in_capture(struct conform_run *r)
{
    r->dptr = device_alloc(r);
    CUstream s = capture_begin(r);
    conform_saw(r, "", cuMemFree(r->dptr));
    capture_end(r, s);
}

/* STREAM_CAPTURE_UNSUPPORTED, then STREAM_CAPTURE_INVALIDATED (and the
 * capture check: every free failed and every capture was invalidated).
 * With cudefer SUCCESS twice, by design (measured too). */
static void free_global_capture_other_thread(struct conform_run *r)
{
    during_capture_on_another_thread(r, OTHER_FREE, false);
}

/* SUCCESS, SUCCESS: a cuMemFree from a thread in the relaxed mode does not
 * invalidate the capture. */
static void free_relaxed_thread(struct conform_run *r)
{
    during_capture_on_another_thread(r, OTHER_FREE, true);
}

/* INVALID_VALUE. cuCtxDestroy freed the memory; its pointer is one the
 * driver does not know any more. */
static void free_after_ctx_destroy(struct conform_run *r)
{
    CUcontext b = other_context(r);
    CUdeviceptr p = device_alloc(r);
    need(r, cuCtxDestroy(b), "cuCtxDestroy"); /* popped: the primary is current again */
    conform_saw(r, "", cuMemFree(p));
}

/* CONTEXT_IS_DESTROYED, with and without cudefer (a context destroyed while
 * current to another thread stays current there, and "attempting to access
 * ctx from those threads will result in the error
 * CUDA_ERROR_CONTEXT_IS_DESTROYED"), although the memory is another live
 * context's. Everything afterwards fails the same way. cudefer asks whether
 * an unknown current context lives and leaves the release to the driver
 * when it does not. */
static void free_destroyed_context_current(struct conform_run *r)
{
    CUdeviceptr p = device_alloc(r);
    destroy_from_another_thread(r, other_context(r));
    conform_saw(r, "", cuMemFree(p));
}

/* ---- cuMemFreeHost ------------------------------------------------------- */

/* INVALID_VALUE. */
static void free_host_malloc_ptr(struct conform_run *r)
{
    void *h = host_memory(r, CONFORM_BYTES);
    conform_saw(r, "", cuMemFreeHost(h));
    free(h);
}

/* INVALID_VALUE. */
static void free_host_device_ptr(struct conform_run *r)
{
    r->dptr = device_alloc(r);
    conform_saw(r, "", cuMemFreeHost((void *)(uintptr_t)r->dptr));
}

/* INVALID_VALUE. */
static void free_host_double(struct conform_run *r)
{
    void *h = host_alloc(r);
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    conform_saw(r, "", cuMemFreeHost(h));
}

/* SUCCESS, free(NULL) semantics (as measured on an RTX 4090, driver
 * 590.48.01, by lupinemachines/lupine#850; cudaFreeHost(NULL) forwards it to
 * the driver). */
static void free_host_null(struct conform_run *r)
{
    conform_saw(r, "", cuMemFreeHost(NULL));
}

/* INVALID_VALUE, as cuMemFree of an interior pointer. */
static void free_host_interior(struct conform_run *r)
{
    r->host = host_alloc(r);
    conform_saw(r, "", cuMemFreeHost((char *)r->host + 256));
}

/* INVALID_VALUE: managed memory is released by cuMemFree. */
static void free_host_managed_ptr(struct conform_run *r)
{
    r->dptr = managed_alloc(r);
    conform_saw(r, "", cuMemFreeHost((void *)(uintptr_t)r->dptr));
}

/* INVALID_VALUE. */
static void free_host_registered_ptr(struct conform_run *r)
{
    r->host = registered(r);
    conform_saw(r, "", cuMemFreeHost(r->host));
}

/* INVALID_VALUE, as for cuMemAllocHost memory. */
static void free_host_hostalloc_double(struct conform_run *r)
{
    void *h;
    need(r, cuMemHostAlloc(&h, CONFORM_BYTES, CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc");
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    conform_saw(r, "", cuMemFreeHost(h));
}

/* SUCCESS, as cuMemFree of another context's memory. */
static void free_host_other_context_ptr(struct conform_run *r)
{
    r->other = other_context(r);
    r->host = host_alloc(r);
    pop_other(r, r->other);
    conform_saw(r, "", cuMemFreeHost(r->host));
}

/* STREAM_CAPTURE_UNSUPPORTED, then STREAM_CAPTURE_INVALIDATED, as cuMemFree.
 * cudefer only queues: SUCCESS twice, by design (measured too). */
static void free_host_in_capture(struct conform_run *r)
{
    r->host = host_alloc(r);
    CUstream s = capture_begin(r);
    conform_saw(r, "", cuMemFreeHost(r->host));
    capture_end(r, s);
}

/* SUCCESS, SUCCESS: the relaxed mode permits unsafe calls. */
static void free_host_relaxed_thread(struct conform_run *r)
{
    during_capture_on_another_thread(r, OTHER_FREE_HOST, true);
}

/* SUCCESS, as cuMemFree. */
static void free_host_no_context(struct conform_run *r)
{
    r->host = host_alloc(r);
    release_with_no_context(r, free_host_any, r->host);
}

/* INVALID_VALUE, as cuMemFree. */
static void free_host_after_ctx_destroy(struct conform_run *r)
{
    CUcontext b = other_context(r);
    void *h = host_alloc(r);
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuMemFreeHost(h));
}

/* INVALID_VALUE, as for any pointer the driver does not know. */
static void free_host_interior_after_free_host(struct conform_run *r)
{
    char *h = host_alloc(r);
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    conform_saw(r, "", cuMemFreeHost(h + 256));
}

/* ---- cuMemHostUnregister ------------------------------------------------- */

/* HOST_MEMORY_NOT_REGISTERED. */
static void unregister_never_registered(struct conform_run *r)
{
    void *h = pages(r);
    conform_saw(r, "", cuMemHostUnregister(h));
    free(h);
}

/* HOST_MEMORY_NOT_REGISTERED. */
static void unregister_double(struct conform_run *r)
{
    void *h = registered(r);
    need(r, cuMemHostUnregister(h), "cuMemHostUnregister");
    conform_saw(r, "", cuMemHostUnregister(h));
}

/* INVALID_VALUE (as measured on an RTX 4090, driver 590.48.01, by
 * lupinemachines/lupine#858). */
static void unregister_null(struct conform_run *r)
{
    conform_saw(r, "", cuMemHostUnregister(NULL));
}

/* INVALID_VALUE, not HOST_MEMORY_NOT_REGISTERED: the driver knows the
 * address (pinned by cuMemAllocHost), it is just not a registration.
 * HOST_MEMORY_NOT_REGISTERED is for addresses it does not know (never
 * registered, or unregistered already). */
static void unregister_alloc_host_ptr(struct conform_run *r)
{
    r->host = host_alloc(r);
    conform_saw(r, "", cuMemHostUnregister(r->host));
}

/* INVALID_VALUE (the documentation: "the memory range whose base address is
 * specified by p"; an address inside a registration is a known one, not a
 * base). */
static void unregister_interior(struct conform_run *r)
{
    r->host = registered(r);
    conform_saw(r, "", cuMemHostUnregister((char *)r->host + 4096));
}

/* INVALID_VALUE (device memory: an address the driver knows, not a
 * registration). */
static void unregister_device_ptr(struct conform_run *r)
{
    r->dptr = device_alloc(r);
    conform_saw(r, "", cuMemHostUnregister((void *)(uintptr_t)r->dptr));
}

/* SUCCESS, as cuMemFree (the memory names its context). */
static void unregister_no_context(struct conform_run *r)
{
    r->host = registered(r);
    release_with_no_context(r, unregister_any, r->host);
}

/* HOST_MEMORY_NOT_REGISTERED: the driver has forgotten the range. With
 * cudefer the unregister may still be queued, the driver then knows the
 * address; cudefer gives the code of an unknown one. */
static void unregister_interior_after_unregister(struct conform_run *r)
{
    char *h = registered(r);
    need(r, cuMemHostUnregister(h), "cuMemHostUnregister");
    conform_saw(r, "", cuMemHostUnregister(h + 4096));
}

/* HOST_MEMORY_NOT_REGISTERED: the context's destruction undid the
 * registration. */
static void unregister_after_ctx_destroy(struct conform_run *r)
{
    char *h = pages(r);
    CUcontext b = other_context(r);
    need(r, cuMemHostRegister(h, CONFORM_BYTES, 0), "cuMemHostRegister");
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuMemHostUnregister(h));
}

/* INVALID_VALUE: the context's destruction undid the registration, and a
 * registration made since in another context, one page lower, covers the
 * address without starting there (an interior pointer, as above). */
static void unregister_after_ctx_destroy_inside_a_new_registration(struct conform_run *r)
{
    char *h = pages(r);
    CUcontext b = other_context(r);
    need(r, cuMemHostRegister(h + 4096, CONFORM_BYTES - 4096, 0), "cuMemHostRegister");
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    need(r, cuMemHostRegister(h, CONFORM_BYTES, 0), "cuMemHostRegister");
    conform_saw(r, "", cuMemHostUnregister(h + 4096));
    need(r, cuMemHostUnregister(h), "cuMemHostUnregister");
}

/* HOST_MEMORY_NOT_REGISTERED: freed pinned memory is unknown to the driver,
 * whatever cudefer holds. */
static void unregister_after_free_host(struct conform_run *r)
{
    void *h = host_alloc(r);
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    conform_saw(r, "", cuMemHostUnregister(h));
}

/* HOST_MEMORY_NOT_REGISTERED, as above. */
static void unregister_interior_after_free_host(struct conform_run *r)
{
    char *h = host_alloc(r);
    need(r, cuMemFreeHost(h), "cuMemFreeHost");
    conform_saw(r, "", cuMemHostUnregister(h + 4096));
}

/* ---- arrays, modules, libraries ------------------------------------------ */

/* The driver crashes (SIGSEGV); cudefer answers INVALID_HANDLE. */
static void array_destroy_double(struct conform_run *r)
{
    CUarray a = array_create(r);
    need(r, cuArrayDestroy(a), "cuArrayDestroy");
    conform_saw(r, "", cuArrayDestroy(a));
}

/* INVALID_HANDLE. */
static void array_destroy_null(struct conform_run *r)
{
    conform_saw(r, "", cuArrayDestroy(NULL));
}

/* CONTEXT_IS_DESTROYED (a module answers INVALID_HANDLE there). cudefer
 * gives the same code itself: the context's teardown kept the array's
 * record, torn, and the dead handle does not reach the driver. */
static void array_destroy_after_ctx_destroy(struct conform_run *r)
{
    CUcontext b = other_context(r);
    CUarray a = array_create(r);
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuArrayDestroy(a));
}

/* The driver crashes (SIGSEGV); cudefer answers CONTEXT_IS_DESTROYED, as for
 * an array its context's destruction freed: the first destroy was still
 * queued when the context went, and the record stays torn. */
static void array_destroy_double_after_ctx_destroy(struct conform_run *r)
{
    CUcontext b = other_context(r);
    CUarray a = array_create(r);
    need(r, cuArrayDestroy(a), "cuArrayDestroy");
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuArrayDestroy(a));
}

/* The driver crashes (SIGSEGV), as on a second cuArrayDestroy; cudefer
 * answers INVALID_HANDLE. */
static void mipmapped_destroy_double(struct conform_run *r)
{
    CUmipmappedArray m = mipmapped_create(r);
    need(r, cuMipmappedArrayDestroy(m), "cuMipmappedArrayDestroy");
    conform_saw(r, "", cuMipmappedArrayDestroy(m));
}

/* INVALID_HANDLE. */
static void module_unload_double(struct conform_run *r)
{
    CUmodule m = module_load(r);
    need(r, cuModuleUnload(m), "cuModuleUnload");
    conform_saw(r, "", cuModuleUnload(m));
}

/* INVALID_HANDLE. */
static void module_unload_null(struct conform_run *r)
{
    conform_saw(r, "", cuModuleUnload(NULL));
}

/* INVALID_HANDLE, as for a second unload, and the follow-up succeeds
 * (documented as undefined: "the context or its resources [must not be]
 * accessed or passed in subsequent API calls"). cudefer answers itself: the
 * context's teardown left the module's record torn, and the dead handle
 * never reaches the driver. */
static void module_unload_after_ctx_destroy(struct conform_run *r)
{
    CUcontext b = other_context(r);
    CUmodule m = module_load(r);
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuModuleUnload(m));
}

/* The driver crashes (SIGSEGV); cudefer answers INVALID_HANDLE. A kernel of
 * the library was loaded into the context first. */
static void library_unload_double(struct conform_run *r)
{
    CUlibrary l = library_load(r);
    CUkernel k;
    CUfunction f;
    need(r, cuLibraryGetKernel(&k, l, "cudefer_touch"), "cuLibraryGetKernel");
    need(r, cuKernelGetFunction(&f, k), "cuKernelGetFunction");
    need(r, cuLibraryUnload(l), "cuLibraryUnload");
    conform_saw(r, "", cuLibraryUnload(l));
}

/* INVALID_HANDLE. */
static void library_unload_null(struct conform_run *r)
{
    conform_saw(r, "", cuLibraryUnload(NULL));
}

/* SUCCESS, as cuMemFree. */
static void array_destroy_no_context(struct conform_run *r)
{
    release_with_no_context(r, array_destroy_any, array_create(r));
}

/* SUCCESS. */
static void mipmapped_destroy_no_context(struct conform_run *r)
{
    release_with_no_context(r, mipmapped_destroy_any, mipmapped_create(r));
}

/* SUCCESS. */
static void module_unload_no_context(struct conform_run *r)
{
    release_with_no_context(r, module_unload_any, module_load(r));
}

/* SUCCESS (a library names no context). */
static void library_unload_no_context(struct conform_run *r)
{
    release_with_no_context(r, library_unload_any, library_load(r));
}

/* The driver crashes (SIGSEGV), as on any second cuLibraryUnload; cudefer
 * answers INVALID_HANDLE, also when the current context is destroyed (the
 * library names no context) and the first unload is still queued. */
static void library_unload_double_destroyed_context_current(struct conform_run *r)
{
    CUlibrary l = library_load(r);
    need(r, cuLibraryUnload(l), "cuLibraryUnload");
    destroy_from_another_thread(r, other_context(r));
    conform_saw(r, "", cuLibraryUnload(l));
}

/* ---- destroyed contexts -------------------------------------------------- */

/* CONTEXT_IS_DESTROYED (as cuMemFree(destroyed_context_current)). */
static void ctx_sync_destroyed_current(struct conform_run *r)
{
    destroy_from_another_thread(r, other_context(r));
    conform_saw(r, "", cuCtxSynchronize());
}

/* CONTEXT_IS_DESTROYED (not INVALID_CONTEXT, the documented code of a bad
 * context: the driver still tells a destroyed context's handle). */
static void ctx_sync_v2_destroyed(struct conform_run *r)
{
    CUcontext b = other_context(r);
    need(r, cuCtxDestroy(b), "cuCtxDestroy");
    conform_saw(r, "", cuCtxSynchronize_v2(b));
}

/* ---- allocations: NULL arguments ----------------------------------------- */

/* All INVALID_VALUE, the documented code of a bad argument. */

static void alloc_null_ptr(struct conform_run *r)
{
    conform_saw(r, "", cuMemAlloc(NULL, CONFORM_BYTES));
}

/* Documented: "If bytesize is 0, cuMemAlloc() returns
 * CUDA_ERROR_INVALID_VALUE". */
static void alloc_zero_bytes(struct conform_run *r)
{
    CUdeviceptr p;
    conform_saw(r, "", cuMemAlloc(&p, 0));
}

static void alloc_host_null_ptr(struct conform_run *r)
{
    conform_saw(r, "", cuMemAllocHost(NULL, CONFORM_BYTES));
}

static void alloc_managed_null_ptr(struct conform_run *r)
{
    conform_saw(r, "", cuMemAllocManaged(NULL, CONFORM_BYTES, CU_MEM_ATTACH_GLOBAL));
}

static void register_null_ptr(struct conform_run *r)
{
    conform_saw(r, "", cuMemHostRegister(NULL, CONFORM_BYTES, 0));
}

static void array_create_null_desc(struct conform_run *r)
{
    CUarray a;
    conform_saw(r, "", cuArrayCreate(&a, NULL));
}

static void stream_create_null_ptr(struct conform_run *r)
{
    conform_saw(r, "", cuStreamCreate(NULL, CU_STREAM_NON_BLOCKING));
}

/* ---- bad flags ----------------------------------------------------------- */

/* All INVALID_VALUE, by the documented flag sets. */

/* Flags: CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED only. */
static void host_alloc_invalid_flag(struct conform_run *r)
{
    void *h;
    conform_saw(r, "", cuMemHostAlloc(&h, CONFORM_BYTES, 0x40));
}

/* The same with the top bit, after a cuMemAllocHost block of that size was
 * released and its fence has passed: cudefer marks cuMemAllocHost blocks
 * with that bit for its reuse of released blocks, so a reuse must not let
 * the invalid flag through (measured: INVALID_VALUE with cudefer too). */
static void host_alloc_invalid_flag_after_release(struct conform_run *r)
{
    void *h;
    released_host_block(r);
    conform_saw(r, "", cuMemHostAlloc(&h, CONFORM_BYTES, 0x80000000u));
}

/* Flags: CU_MEMHOSTREGISTER_PORTABLE, _DEVICEMAP, _IOMEMORY, _READ_ONLY. */
static void register_invalid_flags(struct conform_run *r)
{
    void *h = pages(r);
    conform_saw(r, "", cuMemHostRegister(h, CONFORM_BYTES, 0x40));
}

/* Documented: flags must be CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST. */
static void alloc_managed_flags_0(struct conform_run *r)
{
    CUdeviceptr p;
    conform_saw(r, "", cuMemAllocManaged(&p, CONFORM_BYTES, 0));
}

static void alloc_managed_invalid_flag(struct conform_run *r)
{
    CUdeviceptr p;
    conform_saw(r, "", cuMemAllocManaged(&p, CONFORM_BYTES, CU_MEM_ATTACH_SINGLE));
}

/* Flags: CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING. */
static void stream_create_invalid_flags(struct conform_run *r)
{
    CUstream s;
    conform_saw(r, "", cuStreamCreate(&s, 0x10));
}

/* ---- destroyed streams, allocations during a capture --------------------- */

/* The real driver crashes (SIGSEGV), with and without cudefer: no code to
 * expect. The test driver answers INVALID_HANDLE (a destroyed stream is an
 * invalid resource handle) and cudefer passes that on: the stand-in. */
static void alloc_async_destroyed_stream(struct conform_run *r)
{
    CUstream s;
    CUdeviceptr p;
    need(r, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    need(r, cuStreamDestroy(s), "cuStreamDestroy");
    conform_saw(r, "", cuMemAllocAsync(&p, CONFORM_BYTES, s));
}

/* STREAM_CAPTURE_UNSUPPORTED, then STREAM_CAPTURE_INVALIDATED (an allocation
 * is a potentially unsafe call in the global mode), with and without
 * cudefer. */
static void alloc_in_capture(struct conform_run *r)
{
    CUdeviceptr p;
    CUstream s = capture_begin(r);
    conform_saw(r, "", cuMemAlloc(&p, CONFORM_BYTES));
    capture_end(r, s);
}

/* SUCCESS, SUCCESS. */
static void alloc_relaxed_thread(struct conform_run *r)
{
    during_capture_on_another_thread(r, OTHER_ALLOC, true);
}

/* As cuMemAlloc, with and without cudefer. Here a released block of the
 * same size whose fence has passed is waiting in cudefer for reuse: handing
 * it out is no driver call, but the program must still get the driver's
 * answer. */
static void alloc_host_in_capture(struct conform_run *r)
{
    void *h;
    released_host_block(r);
    CUstream s = capture_begin(r);
    conform_saw(r, "", cuMemAllocHost(&h, CONFORM_BYTES));
    capture_end(r, s);
}

/* ---- the table ----------------------------------------------------------- */

#define OK CUDA_SUCCESS
#define AS_DRIVER CONFORM_AS_DRIVER
#define CRASH CONFORM_CRASH
#define AFTER_DESTROYED CONFORM_AFTER_DESTROYED
#define INVALID_VALUE CUDA_ERROR_INVALID_VALUE
#define INVALID_HANDLE CUDA_ERROR_INVALID_HANDLE
#define NOT_REGISTERED CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
#define DESTROYED CUDA_ERROR_CONTEXT_IS_DESTROYED
#define UNSUPPORTED CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
#define INVALIDATED CUDA_ERROR_STREAM_CAPTURE_INVALIDATED

static const struct conform_case conform_cases[] = {
    /* cuMemFree: wrong, foreign and released pointers, no or a dead context */
    {"cuMemFree(0)", free_null, .call = {OK, AS_DRIVER}},
    {"cuMemFree(never_allocated)", free_never_allocated, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(interior_pointer)", free_interior, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(double)", free_double, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(managed_double)", free_managed_double, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(malloc_pointer)", free_malloc_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(cuMemAllocHost_pointer)", free_alloc_host_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(no_current_context)", free_no_context, .call = {OK, AS_DRIVER}},
    {"cuMemFree(stack_pointer)", free_stack_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(registered_pointer)", free_registered_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(managed_interior_pointer)", free_managed_interior,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(other_context_pointer)", free_other_context_ptr, .call = {OK, AS_DRIVER}},
    {"cuMemFree(after_ctx_destroy)", free_after_ctx_destroy, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFree(destroyed_context_current)", free_destroyed_context_current,
     .after = AFTER_DESTROYED, .call = {DESTROYED, AS_DRIVER}},
    /* cuMemFreeHost */
    {"cuMemFreeHost(malloc_pointer)", free_host_malloc_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(device_pointer)", free_host_device_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(double)", free_host_double, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(NULL)", free_host_null, .call = {OK, AS_DRIVER}},
    {"cuMemFreeHost(interior_pointer)", free_host_interior, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(managed_pointer)", free_host_managed_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(registered_pointer)", free_host_registered_ptr,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(cuMemHostAlloc_double)", free_host_hostalloc_double,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(other_context_pointer)", free_host_other_context_ptr, .call = {OK, AS_DRIVER}},
    {"cuMemFreeHost(after_ctx_destroy)", free_host_after_ctx_destroy,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemFreeHost(no_current_context)", free_host_no_context, .call = {OK, AS_DRIVER}},
    {"cuMemFreeHost(interior_after_free)", free_host_interior_after_free_host,
     .call = {INVALID_VALUE, AS_DRIVER}},
    /* cuMemHostUnregister */
    {"cuMemHostUnregister(never_registered)", unregister_never_registered,
     .call = {NOT_REGISTERED, AS_DRIVER}},
    {"cuMemHostUnregister(double)", unregister_double, .call = {NOT_REGISTERED, AS_DRIVER}},
    {"cuMemHostUnregister(NULL)", unregister_null, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostUnregister(cuMemAllocHost_pointer)", unregister_alloc_host_ptr,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostUnregister(interior_pointer)", unregister_interior,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostUnregister(device_pointer)", unregister_device_ptr,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostUnregister(no_current_context)", unregister_no_context, .call = {OK, AS_DRIVER}},
    {"cuMemHostUnregister(interior_after_unregister)", unregister_interior_after_unregister,
     .call = {NOT_REGISTERED, AS_DRIVER}},
    {"cuMemHostUnregister(after_ctx_destroy)", unregister_after_ctx_destroy,
     .call = {NOT_REGISTERED, AS_DRIVER}},
    {"cuMemHostUnregister(after_ctx_destroy_inside_a_new_registration)",
     unregister_after_ctx_destroy_inside_a_new_registration, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostUnregister(after_cuMemFreeHost)", unregister_after_free_host,
     .call = {NOT_REGISTERED, AS_DRIVER}},
    {"cuMemHostUnregister(interior_after_cuMemFreeHost)", unregister_interior_after_free_host,
     .call = {NOT_REGISTERED, AS_DRIVER}},
    /* arrays, modules, libraries */
    {"cuArrayDestroy(double)", array_destroy_double, .call = {CRASH, INVALID_HANDLE}},
    {"cuArrayDestroy(NULL)", array_destroy_null, .call = {INVALID_HANDLE, AS_DRIVER}},
    {"cuArrayDestroy(after_ctx_destroy)", array_destroy_after_ctx_destroy,
     .call = {DESTROYED, AS_DRIVER}},
    {"cuArrayDestroy(double_after_ctx_destroy)", array_destroy_double_after_ctx_destroy,
     .call = {CRASH, DESTROYED}},
    {"cuMipmappedArrayDestroy(double)", mipmapped_destroy_double, .call = {CRASH, INVALID_HANDLE}},
    {"cuModuleUnload(double)", module_unload_double, .call = {INVALID_HANDLE, AS_DRIVER}},
    {"cuModuleUnload(NULL)", module_unload_null, .call = {INVALID_HANDLE, AS_DRIVER}},
    {"cuModuleUnload(after_ctx_destroy)", module_unload_after_ctx_destroy,
     .call = {INVALID_HANDLE, AS_DRIVER}},
    {"cuLibraryUnload(double)", library_unload_double, .call = {CRASH, INVALID_HANDLE}},
    {"cuLibraryUnload(NULL)", library_unload_null, .call = {INVALID_HANDLE, AS_DRIVER}},
    {"cuArrayDestroy(no_current_context)", array_destroy_no_context, .call = {OK, AS_DRIVER}},
    {"cuMipmappedArrayDestroy(no_current_context)", mipmapped_destroy_no_context,
     .call = {OK, AS_DRIVER}},
    {"cuModuleUnload(no_current_context)", module_unload_no_context, .call = {OK, AS_DRIVER}},
    {"cuLibraryUnload(no_current_context)", library_unload_no_context, .call = {OK, AS_DRIVER}},
    {"cuLibraryUnload(double_destroyed_context_current)",
     library_unload_double_destroyed_context_current, .after = AFTER_DESTROYED,
     .call = {CRASH, INVALID_HANDLE}},
    /* destroyed contexts */
    {"cuCtxSynchronize(destroyed_context_current)", ctx_sync_destroyed_current,
     .after = AFTER_DESTROYED, .call = {DESTROYED, AS_DRIVER}},
    {"cuCtxSynchronize_v2(destroyed_context)", ctx_sync_v2_destroyed,
     .call = {DESTROYED, AS_DRIVER}},
    /* NULL arguments */
    {"cuMemAlloc(NULL_pointer)", alloc_null_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemAlloc(zero_bytes)", alloc_zero_bytes, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemAllocHost(NULL_pointer)", alloc_host_null_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemAllocManaged(NULL_pointer)", alloc_managed_null_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostRegister(NULL_pointer)", register_null_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuArrayCreate(NULL_descriptor)", array_create_null_desc, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuStreamCreate(NULL_pointer)", stream_create_null_ptr, .call = {INVALID_VALUE, AS_DRIVER}},
    /* bad flags */
    {"cuMemHostAlloc(invalid_flag)", host_alloc_invalid_flag, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostAlloc(invalid_flag_after_release)", host_alloc_invalid_flag_after_release,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemHostRegister(invalid_flags)", register_invalid_flags,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemAllocManaged(flags_0)", alloc_managed_flags_0, .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuMemAllocManaged(invalid_flag)", alloc_managed_invalid_flag,
     .call = {INVALID_VALUE, AS_DRIVER}},
    {"cuStreamCreate(invalid_flags)", stream_create_invalid_flags,
     .call = {INVALID_VALUE, AS_DRIVER}},
    /* destroyed streams */
    {"cuMemAllocAsync(destroyed_stream)", alloc_async_destroyed_stream, .call = {CRASH, CRASH},
     .stand_in = INVALID_HANDLE},
    /* calls during a global-mode capture: on the capturing thread, on another
     * thread in the global mode, on another thread in the relaxed mode */
    {"cuMemFree(in_global_capture)", free_in_capture, .call = {UNSUPPORTED, OK},
     .end_capture = {INVALIDATED, OK}, .captures = true},
    {"cuMemFreeHost(in_global_capture)", free_host_in_capture, .call = {UNSUPPORTED, OK},
     .end_capture = {INVALIDATED, OK}, .captures = true},
    {"cuMemAlloc(in_global_capture)", alloc_in_capture, .call = {UNSUPPORTED, AS_DRIVER},
     .end_capture = {INVALIDATED, AS_DRIVER}, .captures = true},
    {"cuMemAllocHost(in_global_capture)", alloc_host_in_capture, .call = {UNSUPPORTED, AS_DRIVER},
     .end_capture = {INVALIDATED, AS_DRIVER}, .captures = true},
    {"cuMemFree(global_capture_other_thread)", free_global_capture_other_thread,
     .call = {UNSUPPORTED, OK}, .end_capture = {INVALIDATED, OK}, .captures = true},
    {"cuMemFree(relaxed_thread_during_capture)", free_relaxed_thread, .call = {OK, AS_DRIVER},
     .end_capture = {OK, AS_DRIVER}, .captures = true},
    {"cuMemFreeHost(relaxed_thread_during_capture)", free_host_relaxed_thread,
     .call = {OK, AS_DRIVER}, .end_capture = {OK, AS_DRIVER}, .captures = true},
    {"cuMemAlloc(relaxed_thread_during_capture)", alloc_relaxed_thread, .call = {OK, AS_DRIVER},
     .end_capture = {OK, AS_DRIVER}, .captures = true},
};

#undef OK
#undef AS_DRIVER
#undef CRASH
#undef AFTER_DESTROYED
#undef INVALID_VALUE
#undef INVALID_HANDLE
#undef NOT_REGISTERED
#undef DESTROYED
#undef UNSUPPORTED
#undef INVALIDATED

#define CONFORM_N_CASES (sizeof conform_cases / sizeof conform_cases[0])

/* ---- reading the table --------------------------------------------------- */

/* The case called name, or NULL. */
static inline const struct conform_case *conform_find(const char *name)
{
    for (size_t i = 0; i < CONFORM_N_CASES; i++)
        if (strcmp(conform_cases[i].name, name) == 0)
            return &conform_cases[i];
    return NULL;
}

/* The answer of the case for its code number i (0: the call, 1: the end of
 * its capture). */
static inline struct conform_answer conform_answer_of(const struct conform_case *c, int i)
{
    return i == 0 ? c->call : c->end_capture;
}

/* How many codes the case sees. */
static inline int conform_n_codes(const struct conform_case *c)
{
    return c->captures ? 2 : 1;
}

/* The code a driver should answer: the real driver's measured one, or with
 * cudefer loaded cudefer's. CONFORM_CRASH where the driver crashes. */
static inline int conform_expected(struct conform_answer a, bool with_cudefer)
{
    if (with_cudefer && a.cudefer != CONFORM_AS_DRIVER)
        return a.cudefer;
    return a.driver;
}

#endif
