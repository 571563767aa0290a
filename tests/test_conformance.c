/* test_conformance.c - bad input gets the real driver's answer.
 *
 * The same cases as tests/gpu/conform.c (the real-GPU check), run over the
 * test driver: the GPU case f(arg) is the test conformance::f_arg here. Each case asserts the code the
 * REAL driver gives, and then the behaviour afterwards: a follow-up
 * allocation, a kernel touching it and cuCtxSynchronize still succeed, or
 * the context is broken in the same way as on the real driver.
 *
 * The suite runs twice (tests/meson.build): with the shim preloaded
 * ("conformance"), where the shim must give the driver's codes, and over
 * the test driver alone ("conformance-driver"), which checks that the test
 * driver imitates the real driver on these cases. Where DESIGN.md asks the
 * shim to differ (a release during a global capture only queues, so the
 * capture stays valid) the expectation names both codes. Where the real
 * driver crashes (a second cuArrayDestroy, cuMipmappedArrayDestroy or
 * cuLibraryUnload of one handle: SIGSEGV measured) only the shim's answer,
 * CUDA_ERROR_INVALID_HANDLE, is checked. cuMemAllocAsync on a destroyed
 * stream crashes the real driver with and without the shim; the case keeps
 * the test driver's answer.
 *
 * Where the codes come from:
 *   MEASURED on the H200 (2026-11-29)
 *               tests/gpu/conform.c on an NVIDIA H200, driver 580.159.04,
 *               CUDA 13.0, without and with the shim:
 *               bench/results/2026-11-29-gpu-check-3.txt, section
 *               "### conformance" (code, and the follow-up allocation,
 *               launch and cuCtxSynchronize), summarised in bench/RESULTS.md.
 *               Every case has its measurement.
 *   UNMEASURED  our reading of the CUDA driver API documentation (cuda.h
 *               and the reference manual): only what the GPU check does
 *               not do (a follow-up with no context current).
 * Every case of tests/gpu/conform.c is here; keep the two lists in step.
 *
 * Criterion runs each test in a process of its own, so a case may break
 * its context for good. */
#include "common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BYTES (1u << 20)

/* ---- helpers ------------------------------------------------------------- */

static bool shim_loaded(void)
{
    return dlsym(RTLD_DEFAULT, "cudefer_version") != NULL;
}

static const char *name_of(CUresult rc)
{
    const char *s = NULL;
    if (cuGetErrorName(rc, &s) != CUDA_SUCCESS || !s)
        return "an unknown code";
    return s;
}

static int cudefer_flush(void)
{
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    return flush ? flush() : 0;
}

/* The code of the real driver; with the shim loaded, with_shim (the same
 * code unless DESIGN.md asks for another). */
static void expect_code_either(const char *what, CUresult got, CUresult driver,
                               CUresult with_shim)
{
    CUresult want = shim_loaded() ? with_shim : driver;
    cr_expect_eq(got, want, "%s returned %s (%d), expected %s (%d)%s", what, name_of(got),
                 (int)got, name_of(want), (int)want,
                 want != driver ? " (the shim's answer by design)" : "");
}

#define EXPECT_CODE(call, driver) expect_code_either(#call, (call), (driver), (driver))
#define EXPECT_CODE_SHIM(call, driver, with_shim)                                     \
    expect_code_either(#call, (call), (driver), (with_shim))

/* The real driver crashes on this call; the shim answers with_shim. Over
 * the test driver alone there is nothing to compare (it does not crash). */
static void only_with_the_shim(const char *why)
{
    if (!shim_loaded())
        cr_skip_test("the real driver crashes here (%s); only the shim's answer is checked", why);
}

/* ---- the behaviour afterwards --------------------------------------------- */

struct after {
    CUresult alloc, launch, sync;
};

/* In whatever context is current: allocate, launch a kernel that writes
 * the new memory (or touches nothing if the allocation failed), and
 * synchronise the context. */
static struct after behaviour_after(void)
{
    struct after a;
    CUdeviceptr p = 0;
    a.alloc = cuMemAlloc(&p, BYTES);
    bool have = a.alloc == CUDA_SUCCESS;
    a.launch = testdrv_launch(CU_STREAM_LEGACY, 50, have ? p : 0, have ? 4096 : 0,
                              TESTDRV_WRITE);
    a.sync = cuCtxSynchronize();
    if (have)
        cr_expect_eq(cuMemFree(p), a.sync == CUDA_SUCCESS ? CUDA_SUCCESS : a.sync);
    return a;
}

static void expect_after(CUresult alloc, CUresult launch, CUresult sync)
{
    struct after a = behaviour_after();
    cr_expect_eq(a.alloc, alloc, "afterwards cuMemAlloc returned %s, expected %s",
                 name_of(a.alloc), name_of(alloc));
    cr_expect_eq(a.launch, launch, "afterwards a launch returned %s, expected %s",
                 name_of(a.launch), name_of(launch));
    cr_expect_eq(a.sync, sync, "afterwards cuCtxSynchronize returned %s, expected %s",
                 name_of(a.sync), name_of(sync));
    cr_expect_eq(testdrv_faults(), 0, "a kernel touched memory that was not live");
}

/* The usual end of a case: the context is unharmed. */
static void expect_fine_afterwards(void)
{
    expect_after(CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS);
}

/* ---- objects --------------------------------------------------------------- */

static CUdeviceptr device_alloc(void)
{
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, BYTES));
    return p;
}

static CUdeviceptr managed_alloc(void)
{
    CUdeviceptr p;
    CU_OK(cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_GLOBAL));
    return p;
}

static void *host_alloc(void)
{
    void *h;
    CU_OK(cuMemAllocHost(&h, BYTES));
    return h;
}

static void *pages(void)
{
    void *h = aligned_alloc(4096, BYTES);
    cr_assert_not_null(h);
    memset(h, 0, BYTES);
    return h;
}

static void *registered(void)
{
    void *h = pages();
    CU_OK(cuMemHostRegister(h, BYTES, 0));
    return h;
}

static const char ptx[] = "// the test driver accepts any image\n";

/* A second context of device 0, made current (pushed) by cuCtxCreate. */
static CUcontext other_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
    return ctx;
}

/* cuCtxDestroy from another thread: the context stays current on this
 * one, destroyed (cuda.h: "attempting to access ctx from those threads
 * will result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED"). */
static void *destroy_main(void *arg)
{
    CUcontext ctx = *(CUcontext *)arg;
    *(CUresult *)arg = cuCtxDestroy(ctx) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    return NULL;
}

static void destroy_from_another_thread(CUcontext ctx)
{
    union {
        CUcontext ctx;
        CUresult rc;
    } arg = {.ctx = ctx};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, destroy_main, &arg), 0);
    pthread_join(t, NULL);
    cr_assert_eq(arg.rc, CUDA_SUCCESS, "cuCtxDestroy from another thread failed");
}

/* The release of an object with no current context: the object names its
 * context. Afterwards (as for cuMemFree) the follow-up runs with the
 * context pushed back. */
static void release_with_no_context(const char *what, CUresult (*release)(void *), void *h)
{
    CUcontext popped;
    CU_OK(cuCtxPopCurrent(&popped));
    expect_code_either(what, release(h), CUDA_SUCCESS, CUDA_SUCCESS);
    CU_OK(cuCtxPushCurrent(popped));
    expect_fine_afterwards();
    cr_expect_eq(cudefer_flush(), 0);
}

static CUresult array_destroy_any(void *a) { return cuArrayDestroy(a); }
static CUresult mipmapped_destroy_any(void *m) { return cuMipmappedArrayDestroy(m); }
static CUresult module_unload_any(void *m) { return cuModuleUnload(m); }
static CUresult library_unload_any(void *l) { return cuLibraryUnload(l); }

static CUresult mem_free_host_any(void *h) { return cuMemFreeHost(h); }
static CUresult host_unregister_any(void *h) { return cuMemHostUnregister(h); }

/* ---- cuMemFree ------------------------------------------------------------------ */

/* MEASURED on the H200 (2026-11-29): SUCCESS. */
Test(conformance, cuMemFree_0)
{
    test_context();
    EXPECT_CODE(cuMemFree(0), CUDA_SUCCESS);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_never_allocated)
{
    test_context();
    EXPECT_CODE(cuMemFree((CUdeviceptr)0xdead0000ull), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_interior_pointer)
{
    test_context();
    CUdeviceptr p = device_alloc();
    EXPECT_CODE(cuMemFree(p + 256), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_double)
{
    test_context();
    CUdeviceptr p = device_alloc();
    CU_OK(cuMemFree(p));
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_managed_double)
{
    test_context();
    CUdeviceptr p = managed_alloc();
    CU_OK(cuMemFree(p));
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_malloc_pointer)
{
    test_context();
    void *h = malloc(BYTES);
    EXPECT_CODE(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
    free(h);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFree_cuMemAllocHost_pointer)
{
    test_context();
    void *h = host_alloc();
    EXPECT_CODE(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFreeHost(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS (the memory is freed; the pointer
 * names its context). */
Test(conformance, cuMemFree_no_current_context)
{
    CUcontext ctx = test_context(), popped;
    CUdeviceptr p = device_alloc();
    CU_OK(cuCtxPopCurrent(&popped));
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
    /* With no context the follow-up has nothing to work in (UNMEASURED:
     * INVALID_CONTEXT, the documented code; the GPU check runs its
     * follow-up after pushing the context back, as below, where all of it
     * succeeds: MEASURED on the H200, 2026-11-29). */
    expect_after(CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT,
                 CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxPushCurrent(ctx));
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as for a malloc pointer. */
Test(conformance, cuMemFree_stack_pointer)
{
    test_context();
    char on_stack[64];
    EXPECT_CODE(cuMemFree((CUdeviceptr)(uintptr_t)on_stack), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE (registered memory is
 * released by cuMemHostUnregister only). */
Test(conformance, cuMemFree_registered_pointer)
{
    test_context();
    void *h = registered();
    EXPECT_CODE(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as for device memory. */
Test(conformance, cuMemFree_managed_interior_pointer)
{
    test_context();
    CUdeviceptr p = managed_alloc();
    EXPECT_CODE(cuMemFree(p + 4096), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS. cuMemFree needs no current
 * context, so the memory of another context is freed too: the pointer names it.
 */
Test(conformance, cuMemFree_other_context_pointer)
{
    CUcontext a = test_context(), b = other_context(), popped;
    CUdeviceptr p = device_alloc();
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, b);
    CU_OK(cuCtxSetCurrent(a));
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuCtxDestroy(b));
    cudefer_flush();
    cr_expect_eq(testdrv_live(TESTDRV_DEVICE), 0);
    cr_expect_eq(testdrv_dead_context_calls(), 0);
}

/* MEASURED on the H200 (2026-11-29): STREAM_CAPTURE_UNSUPPORTED during this
 * thread's own global-mode capture (a "potentially unsafe API call",
 * cuStreamBeginCapture documentation), then STREAM_CAPTURE_INVALIDATED from
 * cuStreamEndCapture. The shim only queues the release: SUCCESS, SUCCESS
 * (measured too, by design), the capture stays valid, and the release happens
 * once it ended (DESIGN.md). */
static void capture_begin(CUstream *s)
{
    *s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamBeginCapture(*s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(testdrv_launch(*s, 10, 0, 0, TESTDRV_NONE));
}

static CUresult capture_end(CUstream s)
{
    CUgraph g = NULL;
    CUresult rc = cuStreamEndCapture(s, &g);
    if (rc == CUDA_SUCCESS)
        CU_OK(cuGraphDestroy(g));
    return rc;
}

Test(conformance, cuMemFree_in_global_capture)
{
    test_context();
    CUdeviceptr p = device_alloc();
    CUstream s;
    capture_begin(&s);
    EXPECT_CODE_SHIM(cuMemFree(p), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_SUCCESS);
    EXPECT_CODE_SHIM(capture_end(s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_SUCCESS);
    expect_fine_afterwards();
    cudefer_flush();
    cr_expect_eq(testdrv_live(TESTDRV_DEVICE), shim_loaded() ? 0 : 1,
                 "with the shim the queued free happens after the capture");
}

/* ---- a release from another thread during a capture ---------------------------- */

enum call { FREE, FREE_HOST, ALLOC };

struct other_thread {
    CUcontext ctx;
    enum call call;
    bool relaxed;
    CUdeviceptr dptr;
    void *host;
    CUresult rc;
};

static void *other_thread_main(void *arg)
{
    struct other_thread *o = arg;
    cuCtxSetCurrent(o->ctx);
    if (o->relaxed) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) {
            o->rc = CUDA_ERROR_UNKNOWN;
            return NULL;
        }
    }
    switch (o->call) {
    case FREE: o->rc = cuMemFree(o->dptr); break;
    case FREE_HOST: o->rc = cuMemFreeHost(o->host); break;
    case ALLOC: o->rc = cuMemAlloc(&o->dptr, BYTES); break;
    }
    return NULL;
}

/* This thread captures in the global mode; another thread, in the global
 * or the relaxed mode, makes the call meanwhile. */
static void during_capture_on_another_thread(enum call call, bool relaxed, CUresult want,
                                             CUresult want_shim, CUresult end,
                                             CUresult end_shim)
{
    struct other_thread o = {.ctx = test_context(), .call = call, .relaxed = relaxed};
    if (call == FREE)
        o.dptr = device_alloc();
    if (call == FREE_HOST)
        o.host = host_alloc();
    CUstream s;
    capture_begin(&s);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, other_thread_main, &o), 0);
    pthread_join(t, NULL);
    expect_code_either(call == FREE ? "cuMemFree" : call == FREE_HOST ? "cuMemFreeHost" : "cuMemAlloc",
                       o.rc, want, want_shim);
    expect_code_either("cuStreamEndCapture", capture_end(s), end, end_shim);
    expect_fine_afterwards();
    if (call == ALLOC && o.rc == CUDA_SUCCESS)
        CU_OK(cuMemFree(o.dptr));
    CU_OK(cuCtxSynchronize());
    cudefer_flush();
    if (o.rc == CUDA_SUCCESS) {
        cr_expect_eq(testdrv_live(TESTDRV_DEVICE), 0);
        cr_expect_eq(testdrv_live(TESTDRV_HOST), 0);
    }
}

/* MEASURED on the H200 (2026-11-29): STREAM_CAPTURE_UNSUPPORTED, then
 * STREAM_CAPTURE_INVALIDATED (and the capture check: every free failed and
 * every capture was invalidated). With the shim SUCCESS twice, by design
 * (measured too). */
Test(conformance, cuMemFree_global_capture_other_thread)
{
    during_capture_on_another_thread(FREE, false, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                     CUDA_SUCCESS, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                                     CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, SUCCESS (DESIGN.md section 2:
 * "cuMemFree from a thread in relaxed mode does not" invalidate the
 * capture). */
Test(conformance, cuMemFree_relaxed_thread_during_capture)
{
    during_capture_on_another_thread(FREE, true, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS,
                                     CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, SUCCESS (the relaxed mode permits
 * unsafe calls). */
Test(conformance, cuMemFreeHost_relaxed_thread_during_capture)
{
    during_capture_on_another_thread(FREE_HOST, true, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS,
                                     CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, SUCCESS. */
Test(conformance, cuMemAlloc_relaxed_thread_during_capture)
{
    during_capture_on_another_thread(ALLOC, true, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS,
                                     CUDA_SUCCESS);
}

/* ---- cuMemFreeHost ------------------------------------------------------------ */

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFreeHost_malloc_pointer)
{
    test_context();
    void *h = malloc(BYTES);
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    free(h);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFreeHost_device_pointer)
{
    test_context();
    CUdeviceptr p = device_alloc();
    EXPECT_CODE(cuMemFreeHost((void *)(uintptr_t)p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFreeHost_double)
{
    test_context();
    void *h = host_alloc();
    CU_OK(cuMemFreeHost(h));
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, free(NULL) semantics (as measured
 * on an RTX 4090, driver 590.48.01, by lupinemachines/lupine#850;
 * cudaFreeHost(NULL) forwards it to the driver). */
Test(conformance, cuMemFreeHost_NULL)
{
    test_context();
    EXPECT_CODE(cuMemFreeHost(NULL), CUDA_SUCCESS);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as cuMemFree of an interior
 * pointer. */
Test(conformance, cuMemFreeHost_interior_pointer)
{
    test_context();
    char *h = host_alloc();
    EXPECT_CODE(cuMemFreeHost(h + 256), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFreeHost(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE (managed memory is released
 * by cuMemFree). */
Test(conformance, cuMemFreeHost_managed_pointer)
{
    test_context();
    CUdeviceptr p = managed_alloc();
    EXPECT_CODE(cuMemFreeHost((void *)(uintptr_t)p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. */
Test(conformance, cuMemFreeHost_registered_pointer)
{
    test_context();
    void *h = registered();
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as for cuMemAllocHost
 * memory. */
Test(conformance, cuMemFreeHost_cuMemHostAlloc_double)
{
    test_context();
    void *h;
    CU_OK(cuMemHostAlloc(&h, BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
    CU_OK(cuMemFreeHost(h));
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, as cuMemFree of another context's
 * memory. */
Test(conformance, cuMemFreeHost_other_context_pointer)
{
    CUcontext a = test_context(), b = other_context(), popped;
    void *h = host_alloc();
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, b);
    CU_OK(cuCtxSetCurrent(a));
    EXPECT_CODE(cuMemFreeHost(h), CUDA_SUCCESS);
    expect_fine_afterwards();
    CU_OK(cuCtxDestroy(b));
    cr_expect_eq(testdrv_live(TESTDRV_HOST), 0);
    cr_expect_eq(testdrv_dead_context_calls(), 0);
}

/* MEASURED on the H200 (2026-11-29): STREAM_CAPTURE_UNSUPPORTED, then
 * STREAM_CAPTURE_INVALIDATED, as cuMemFree. The shim only queues: SUCCESS
 * twice, by design (measured too). */
Test(conformance, cuMemFreeHost_in_global_capture)
{
    test_context();
    void *h = host_alloc();
    CUstream s;
    capture_begin(&s);
    EXPECT_CODE_SHIM(cuMemFreeHost(h), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_SUCCESS);
    EXPECT_CODE_SHIM(capture_end(s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_SUCCESS);
    expect_fine_afterwards();
    cr_expect_eq(testdrv_live(TESTDRV_HOST), shim_loaded() ? 0 : 1,
                 "cuCtxSynchronize releases what was queued during the capture");
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, as cuMemFree. */
Test(conformance, cuMemFreeHost_no_current_context)
{
    test_context();
    void *h = host_alloc();
    release_with_no_context("cuMemFreeHost", mem_free_host_any, h);
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as for any pointer the
 * driver does not know. */
Test(conformance, cuMemFreeHost_interior_after_free)
{
    test_context();
    char *h = host_alloc();
    CU_OK(cuMemFreeHost(h));
    EXPECT_CODE(cuMemFreeHost(h + 256), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* ---- cuMemHostUnregister -------------------------------------------------------- */

/* MEASURED on the H200 (2026-11-29): HOST_MEMORY_NOT_REGISTERED. */
Test(conformance, cuMemHostUnregister_never_registered)
{
    test_context();
    void *h = pages();
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): HOST_MEMORY_NOT_REGISTERED. */
Test(conformance, cuMemHostUnregister_double)
{
    test_context();
    void *h = registered();
    CU_OK(cuMemHostUnregister(h));
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE (as measured on an RTX 4090,
 * driver 590.48.01, by lupinemachines/lupine#858). */
Test(conformance, cuMemHostUnregister_NULL)
{
    test_context();
    EXPECT_CODE(cuMemHostUnregister(NULL), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, not
 * HOST_MEMORY_NOT_REGISTERED: the driver knows the address (pinned by
 * cuMemAllocHost), it is just not a registration. HOST_MEMORY_NOT_REGISTERED is
 * for addresses it does not know (never registered, or unregistered already).
 */
Test(conformance, cuMemHostUnregister_cuMemAllocHost_pointer)
{
    test_context();
    void *h = host_alloc();
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFreeHost(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE (the documentation: "the
 * memory range whose base address is specified by p"; an address inside a
 * registration is a known one, not a base). */
Test(conformance, cuMemHostUnregister_interior_pointer)
{
    test_context();
    char *h = registered();
    EXPECT_CODE(cuMemHostUnregister(h + 4096), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE (device memory: an address
 * the driver knows, not a registration). */
Test(conformance, cuMemHostUnregister_device_pointer)
{
    test_context();
    CUdeviceptr p = device_alloc();
    EXPECT_CODE(cuMemHostUnregister((void *)(uintptr_t)p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
    EXPECT_CODE(cuMemFree(p), CUDA_SUCCESS);
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, as cuMemFree (the memory
 * names its context). */
Test(conformance, cuMemHostUnregister_no_current_context)
{
    test_context();
    void *h = registered();
    release_with_no_context("cuMemHostUnregister", host_unregister_any, h);
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* MEASURED on the H200 (2026-11-29): HOST_MEMORY_NOT_REGISTERED: the driver
 * has forgotten the range. With the shim the unregister may still be
 * queued, the driver then knows the address; the shim gives the code of
 * an unknown one. */
Test(conformance, cuMemHostUnregister_interior_after_unregister)
{
    test_context();
    char *h = registered();
    CU_OK(cuMemHostUnregister(h));
    EXPECT_CODE(cuMemHostUnregister(h + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): HOST_MEMORY_NOT_REGISTERED (freed
 * pinned memory is unknown to the driver, whatever the shim holds). */
Test(conformance, cuMemHostUnregister_after_cuMemFreeHost)
{
    test_context();
    void *h = host_alloc();
    CU_OK(cuMemFreeHost(h));
    EXPECT_CODE(cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): HOST_MEMORY_NOT_REGISTERED, as above. */
Test(conformance, cuMemHostUnregister_interior_after_cuMemFreeHost)
{
    test_context();
    char *h = host_alloc();
    CU_OK(cuMemFreeHost(h));
    EXPECT_CODE(cuMemHostUnregister(h + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    expect_fine_afterwards();
}

/* ---- arrays, modules, libraries ----------------------------------------------- */

static CUarray array_create(void)
{
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                               .NumChannels = 1};
    CU_OK(cuArrayCreate(&a, &d));
    return a;
}

/* MEASURED on the H200 (2026-11-29): the driver crashes (SIGSEGV); the shim
 * answers INVALID_HANDLE. */
Test(conformance, cuArrayDestroy_double)
{
    only_with_the_shim("SIGSEGV in cuArrayDestroy");
    test_context();
    CUarray a = array_create();
    CU_OK(cuArrayDestroy(a));
    EXPECT_CODE(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): CONTEXT_IS_DESTROYED (a module
 * answers INVALID_HANDLE there). The shim gives the same code itself: the
 * context's teardown kept the array's record, TORN, and the dead handle
 * does not reach the driver. */
Test(conformance, cuArrayDestroy_after_ctx_destroy)
{
    test_context();
    CUcontext b = other_context();
    CUarray a = array_create();
    CU_OK(cuCtxDestroy(b));
    EXPECT_CODE(cuArrayDestroy(a), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): the driver crashes (SIGSEGV); the shim
 * answers CONTEXT_IS_DESTROYED, as for an array its context's destruction
 * freed: the first destroy was still queued when the context went, and
 * the record stays TORN. */
Test(conformance, cuArrayDestroy_double_after_ctx_destroy)
{
    only_with_the_shim("SIGSEGV in cuArrayDestroy");
    test_context();
    CUcontext b = other_context();
    CUarray a = array_create();
    CU_OK(cuArrayDestroy(a));
    CU_OK(cuCtxDestroy(b));
    EXPECT_CODE(cuArrayDestroy(a), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_HANDLE. */
Test(conformance, cuArrayDestroy_NULL)
{
    test_context();
    EXPECT_CODE(cuArrayDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): the driver crashes (SIGSEGV), as on a
 * second cuArrayDestroy; the shim answers INVALID_HANDLE. */
Test(conformance, cuMipmappedArrayDestroy_double)
{
    only_with_the_shim("SIGSEGV in cuMipmappedArrayDestroy");
    test_context();
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                 .NumChannels = 1};
    CU_OK(cuMipmappedArrayCreate(&m, &d, 2));
    CU_OK(cuMipmappedArrayDestroy(m));
    EXPECT_CODE(cuMipmappedArrayDestroy(m), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_HANDLE. */
Test(conformance, cuModuleUnload_double)
{
    test_context();
    CUmodule m;
    CU_OK(cuModuleLoadData(&m, ptx));
    CU_OK(cuModuleUnload(m));
    EXPECT_CODE(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_HANDLE. */
Test(conformance, cuModuleUnload_NULL)
{
    test_context();
    EXPECT_CODE(cuModuleUnload(NULL), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): the driver crashes (SIGSEGV); the shim
 * answers INVALID_HANDLE. */
Test(conformance, cuLibraryUnload_double)
{
    only_with_the_shim("SIGSEGV in cuLibraryUnload");
    test_context();
    CUlibrary l;
    CUkernel k;
    CUfunction f;
    CU_OK(cuLibraryLoadData(&l, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryGetKernel(&k, l, "cudefer_touch"));
    CU_OK(cuKernelGetFunction(&f, k));
    CU_OK(cuLibraryUnload(l));
    EXPECT_CODE(cuLibraryUnload(l), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): the driver crashes (SIGSEGV), as on
 * any second cuLibraryUnload; the shim answers INVALID_HANDLE, also when the
 * current context is destroyed (the library names no context) and the
 * first unload is still queued. */
Test(conformance, cuLibraryUnload_double_destroyed_context_current)
{
    only_with_the_shim("SIGSEGV in cuLibraryUnload");
    test_context();
    CUlibrary l;
    CU_OK(cuLibraryLoadData(&l, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryUnload(l));
    destroy_from_another_thread(other_context());
    EXPECT_CODE(cuLibraryUnload(l), CUDA_ERROR_INVALID_HANDLE);
    expect_after(CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_CONTEXT_IS_DESTROYED,
                 CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

/* MEASURED on the H200 (2026-11-29): INVALID_HANDLE. */
Test(conformance, cuLibraryUnload_NULL)
{
    test_context();
    EXPECT_CODE(cuLibraryUnload(NULL), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): SUCCESS, as cuMemFree. */
Test(conformance, cuArrayDestroy_no_current_context)
{
    test_context();
    release_with_no_context("cuArrayDestroy", array_destroy_any, array_create());
    cr_expect_eq(testdrv_live(TESTDRV_ARRAY), 0, "the array was not destroyed");
}

/* MEASURED on the H200 (2026-11-29): SUCCESS. */
Test(conformance, cuMipmappedArrayDestroy_no_current_context)
{
    test_context();
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                 .NumChannels = 1};
    CU_OK(cuMipmappedArrayCreate(&m, &d, 2));
    release_with_no_context("cuMipmappedArrayDestroy", mipmapped_destroy_any, m);
    cr_expect_eq(testdrv_live(TESTDRV_ARRAY), 0, "the array was not destroyed");
}

/* MEASURED on the H200 (2026-11-29): SUCCESS. */
Test(conformance, cuModuleUnload_no_current_context)
{
    test_context();
    CUmodule m;
    CU_OK(cuModuleLoadData(&m, ptx));
    release_with_no_context("cuModuleUnload", module_unload_any, m);
    cr_expect_eq(testdrv_live(TESTDRV_MODULE), 0, "the module was not unloaded");
}

/* MEASURED on the H200 (2026-11-29): SUCCESS (a library names no context). */
Test(conformance, cuLibraryUnload_no_current_context)
{
    test_context();
    CUlibrary l;
    CU_OK(cuLibraryLoadData(&l, ptx, NULL, NULL, 0, NULL, NULL, 0));
    release_with_no_context("cuLibraryUnload", library_unload_any, l);
    cr_expect_eq(testdrv_live(TESTDRV_LIBRARY), 0, "the library was not unloaded");
}

/* ---- destroyed contexts ----------------------------------------------------------- */

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE. cuCtxDestroy freed the
 * memory; its pointer is one the driver does not know any more. */
Test(conformance, cuMemFree_after_ctx_destroy)
{
    test_context();
    CUcontext b = other_context();
    CUdeviceptr p = device_alloc();
    CU_OK(cuCtxDestroy(b)); /* popped: the primary context is current again */
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_VALUE, as cuMemFree. */
Test(conformance, cuMemFreeHost_after_ctx_destroy)
{
    test_context();
    CUcontext b = other_context();
    void *h = host_alloc();
    CU_OK(cuCtxDestroy(b));
    EXPECT_CODE(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): INVALID_HANDLE, as for a second
 * unload, and the follow-up succeeds (documented as undefined: "the context
 * or its resources [must not be] accessed or passed in subsequent API
 * calls"). The shim answers itself: the context's teardown left the
 * module's record TORN, and the dead handle never reaches the driver. */
Test(conformance, cuModuleUnload_after_ctx_destroy)
{
    test_context();
    CUcontext b = other_context();
    CUmodule m;
    CU_OK(cuModuleLoadData(&m, ptx));
    CU_OK(cuCtxDestroy(b));
    EXPECT_CODE(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): CONTEXT_IS_DESTROYED, with and without
 * the shim (cuCtxDestroy: a context destroyed while current to another
 * thread stays current there, and "attempting to access ctx from those
 * threads will result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED"),
 * although the memory is another live context's. Everything afterwards
 * fails the same way (measured). */
Test(conformance, cuMemFree_destroyed_context_current)
{
    test_context();
    CUdeviceptr p = device_alloc();
    CUcontext b = other_context();
    destroy_from_another_thread(b);
    /* The shim asks whether an unknown current context lives and leaves
     * the release to the driver when it does not (retire(),
     * current_context_usable()). */
    EXPECT_CODE(cuMemFree(p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    expect_after(CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_CONTEXT_IS_DESTROYED,
                 CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

/* MEASURED on the H200 (2026-11-29): CONTEXT_IS_DESTROYED (as above). */
Test(conformance, cuCtxSynchronize_destroyed_context_current)
{
    test_context();
    CUcontext b = other_context();
    destroy_from_another_thread(b);
    EXPECT_CODE(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    expect_after(CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_CONTEXT_IS_DESTROYED,
                 CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

/* MEASURED on the H200 (2026-11-29): CONTEXT_IS_DESTROYED (not INVALID_CONTEXT,
 * the documented code of a bad context: the driver still tells a destroyed
 * context's handle). */
Test(conformance, cuCtxSynchronize_v2_destroyed_context)
{
    test_context();
    CUcontext b = other_context();
    CU_OK(cuCtxDestroy(b));
    EXPECT_CODE(cuCtxSynchronize_v2(b), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    expect_fine_afterwards();
}

/* ---- NULL arguments ----------------------------------------------------------------- */

/* All MEASURED on the H200 (2026-11-29): INVALID_VALUE, the documented code of
 * a bad argument. */

Test(conformance, cuMemAlloc_NULL_pointer)
{
    test_context();
    EXPECT_CODE(cuMemAlloc(NULL, BYTES), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* Documented: "If bytesize is 0, cuMemAlloc() returns
 * CUDA_ERROR_INVALID_VALUE". */
Test(conformance, cuMemAlloc_zero_bytes)
{
    test_context();
    CUdeviceptr p;
    EXPECT_CODE(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuMemAllocHost_NULL_pointer)
{
    test_context();
    EXPECT_CODE(cuMemAllocHost(NULL, BYTES), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuMemAllocManaged_NULL_pointer)
{
    test_context();
    EXPECT_CODE(cuMemAllocManaged(NULL, BYTES, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuMemHostRegister_NULL_pointer)
{
    test_context();
    EXPECT_CODE(cuMemHostRegister(NULL, BYTES, 0), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuArrayCreate_NULL_descriptor)
{
    test_context();
    CUarray a;
    EXPECT_CODE(cuArrayCreate(&a, NULL), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuStreamCreate_NULL_pointer)
{
    test_context();
    EXPECT_CODE(cuStreamCreate(NULL, CU_STREAM_NON_BLOCKING), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* ---- bad flags ----------------------------------------------------------------------- */

/* All MEASURED on the H200 (2026-11-29): INVALID_VALUE, by the documented flag
 * sets. */

/* Flags: CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED only. */
Test(conformance, cuMemHostAlloc_invalid_flag)
{
    test_context();
    void *h;
    EXPECT_CODE(cuMemHostAlloc(&h, BYTES, 0x40), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* The same with the top bit, after a cuMemAllocHost block of that size was
 * released and its fence has passed: the shim marks cuMemAllocHost blocks
 * with that bit (CD_FLAGS_ALLOC_HOST) for its reuse of released blocks, so
 * a reuse must not let the invalid flag through. */
Test(conformance, cuMemHostAlloc_invalid_flag_after_release)
{
    test_context();
    void *h = host_alloc(), *again = NULL;
    CU_OK(cuMemFreeHost(h));
    CU_OK(cuStreamSynchronize(CU_STREAM_LEGACY));
    usleep(50000); /* the fence passes on the shim's own stream */
    /* The shim's reuse serves only flags the driver accepts (measured:
     * INVALID_VALUE with the shim too). */
    EXPECT_CODE(cuMemHostAlloc(&again, BYTES, 0x80000000u), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* Flags: CU_MEMHOSTREGISTER_PORTABLE, _DEVICEMAP, _IOMEMORY, _READ_ONLY. */
Test(conformance, cuMemHostRegister_invalid_flags)
{
    test_context();
    void *h = pages();
    EXPECT_CODE(cuMemHostRegister(h, BYTES, 0x40), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* Documented: flags must be CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST. */
Test(conformance, cuMemAllocManaged_flags_0)
{
    test_context();
    CUdeviceptr p;
    EXPECT_CODE(cuMemAllocManaged(&p, BYTES, 0), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

Test(conformance, cuMemAllocManaged_invalid_flag)
{
    test_context();
    CUdeviceptr p;
    EXPECT_CODE(cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* Flags: CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING. */
Test(conformance, cuStreamCreate_invalid_flags)
{
    test_context();
    CUstream s;
    EXPECT_CODE(cuStreamCreate(&s, 0x10), CUDA_ERROR_INVALID_VALUE);
    expect_fine_afterwards();
}

/* ---- destroyed streams, allocations during capture ----------------------------------- */

/* MEASURED on the H200 (2026-11-29): the real driver crashes (SIGSEGV), with
 * and without the shim: a measured crash, no code to expect. The test driver
 * answers INVALID_HANDLE (a destroyed stream is an invalid resource handle) and
 * the shim passes that on; kept as the test driver's answer. */
Test(conformance, cuMemAllocAsync_destroyed_stream)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamDestroy(s));
    CUdeviceptr p;
    EXPECT_CODE(cuMemAllocAsync(&p, BYTES, s), CUDA_ERROR_INVALID_HANDLE);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): STREAM_CAPTURE_UNSUPPORTED, then
 * STREAM_CAPTURE_INVALIDATED (an allocation is a potentially unsafe call in
 * the global mode), with and without the shim. */
Test(conformance, cuMemAlloc_in_global_capture)
{
    test_context();
    CUstream s;
    CUdeviceptr p;
    capture_begin(&s);
    EXPECT_CODE(cuMemAlloc(&p, BYTES), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_CODE(capture_end(s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    expect_fine_afterwards();
}

/* MEASURED on the H200 (2026-11-29): as cuMemAlloc, with and without the shim.
 * Here a released block of the same size whose fence has passed is waiting
 * in the shim for reuse: handing it out is no driver call, but the program
 * must still get the driver's answer. */
Test(conformance, cuMemAllocHost_in_global_capture)
{
    test_context();
    void *h = host_alloc(), *again = NULL;
    CU_OK(cuMemFreeHost(h));
    CU_OK(cuStreamSynchronize(CU_STREAM_LEGACY));
    usleep(50000); /* the fence passes on the shim's own stream */
    CUstream s;
    capture_begin(&s);
    EXPECT_CODE(cuMemAllocHost(&again, BYTES), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT_CODE(capture_end(s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    expect_fine_afterwards();
}
