/* conform.c - check 6: the return codes of releases and allocations given
 * bad input, and how the context behaves afterwards.
 *
 * Each case runs in a process of its own (some break the context, the
 * driver crashes on some); the script runs every case with and without the
 * shim and compares the codes. tests/test_conformance.c has the same cases
 * (Criterion test conformance::<f>_<arg> for the case <f>(<arg>)), with the
 * codes expected of the real driver, over the test driver; keep the two
 * lists in step.
 *
 * usage: conform list        prints the case names, one a line
 *        conform <case>      runs one case
 *
 * prints, per call whose code is the finding:
 *   RESULT conform case=<name> rc=<code> after=<behaviour afterwards>
 * (the capture cases also report cuStreamEndCapture, as <name>.end_capture).
 * Each line is printed twice: at once with after=pending, so that the code
 * is kept if the follow-up dies, and again with the behaviour afterwards
 * once it ran (the last line counts). The behaviour afterwards is, in
 * whatever context the case left current: a 1 MiB cuMemAlloc, a launch of
 * a kernel writing it (cuKernelGetFunction of a library loaded before the
 * case, then cuLaunchKernel on the legacy stream), cuCtxSynchronize:
 *   after=alloc:<code>,launch:<code>,sync:<code>
 * with codes without their CUDA_ / CUDA_ERROR_ prefix.
 * A set-up call that fails ends the program with status 2 and no RESULT.
 */
#include "gpucheck.h"

#include <pthread.h>
#include <stdbool.h>

#define BYTES (1 * GC_MIB)

static const char *current_case;
static CUcontext primary;
static CUkernel touch_kernel; /* of a library loaded before the case */

/* ---- results ----------------------------------------------------------------- */

#define MAX_LINES 4
static struct {
    const char *suffix;
    CUresult rc;
} lines[MAX_LINES];
static int nlines;

static void report(const char *suffix, CUresult rc)
{
    if (nlines < MAX_LINES) {
        lines[nlines].suffix = suffix;
        lines[nlines].rc = rc;
        nlines++;
    }
    printf("RESULT conform case=%s%s rc=%s after=pending\n", current_case, suffix, gc_rc(rc));
    fflush(stdout);
}

static const char *brief(CUresult rc)
{
    const char *name = gc_rc(rc);
    if (strncmp(name, "CUDA_ERROR_", 11) == 0)
        return name + 11;
    if (strncmp(name, "CUDA_", 5) == 0)
        return name + 5;
    return name;
}

static CUresult launch_touch(CUstream s, CUdeviceptr buf, unsigned long long words)
{
    CUfunction f;
    CUresult rc = cuKernelGetFunction(&f, touch_kernel);
    return rc == CUDA_SUCCESS ? gc_touch_with(f, s, buf, words) : rc;
}

/* The follow-up, in whatever context is current now. */
static void behaviour_after(char *out, size_t n)
{
    CUdeviceptr p = 0;
    CUresult alloc = cuMemAlloc(&p, BYTES);
    bool have = alloc == CUDA_SUCCESS;
    CUresult launch = launch_touch(NULL, have ? p : 0, have ? 16 : 0);
    CUresult sync = cuCtxSynchronize();
    if (have)
        cuMemFree(p);
    char a[64], l[64];
    snprintf(a, sizeof a, "%s", brief(alloc));
    snprintf(l, sizeof l, "%s", brief(launch));
    snprintf(out, n, "alloc:%s,launch:%s,sync:%s", a, l, brief(sync));
}

static void finish_case(void)
{
    char after[256];
    behaviour_after(after, sizeof after);
    for (int i = 0; i < nlines; i++)
        printf("RESULT conform case=%s%s rc=%s after=%s\n", current_case, lines[i].suffix,
               gc_rc(lines[i].rc), after);
    fflush(stdout);
}

/* ---- objects ------------------------------------------------------------------- */

static CUdeviceptr device_alloc(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAlloc(&p, BYTES));
    return p;
}

static CUdeviceptr managed_alloc(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_GLOBAL));
    return p;
}

static void *host_alloc(void)
{
    void *h;
    GC_CHECK(cuMemAllocHost(&h, BYTES));
    return h;
}

static void *registered(void)
{
    void *h = gc_xpages(BYTES);
    GC_CHECK(cuMemHostRegister(h, BYTES, 0));
    return h;
}

/* A second context of device 0, current (pushed) on return. */
static CUcontext other_context(void)
{
    CUdevice dev;
    CUcontext ctx;
    GC_CHECK(cuDeviceGet(&dev, 0));
    GC_CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    return ctx;
}

static void *destroy_main(void *arg)
{
    CUcontext ctx = *(CUcontext *)arg;
    GC_CHECK(cuCtxDestroy(ctx));
    return NULL;
}

/* Destroys ctx from another thread: it stays current, destroyed, here. */
static void destroy_from_another_thread(CUcontext ctx)
{
    pthread_t t;
    if (pthread_create(&t, NULL, destroy_main, &ctx) != 0)
        gc_die("pthread_create failed");
    pthread_join(t, NULL);
}

/* A released cuMemAllocHost block of BYTES whose fence has passed: what
 * the shim could hand out again without a driver call. (Not
 * cuCtxSynchronize, which would release the shim's queue.) */
static void released_host_block(void)
{
    void *h = host_alloc();
    GC_CHECK(cuMemFreeHost(h));
    GC_CHECK(cuStreamSynchronize(CU_STREAM_LEGACY));
    gc_sleep_ms(50);
}

/* ---- capture ---------------------------------------------------------------------- */

/* A global-mode capture of a new stream on this thread, with one kernel. */
static CUstream capture_begin(void)
{
    CUstream s;
    CUdeviceptr q = device_alloc();
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(launch_touch(s, q, 16));
    GC_CHECK(cuStreamSynchronize(s));
    GC_CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    GC_CHECK(launch_touch(s, q, 16));
    return s;
}

static void capture_end(CUstream s)
{
    CUgraph g = NULL;
    CUresult end = cuStreamEndCapture(s, &g);
    report(".end_capture", end);
    if (end == CUDA_SUCCESS && g)
        GC_CHECK(cuGraphDestroy(g));
}

enum call { FREE, FREE_HOST, ALLOC };

struct other_thread {
    enum call call;
    bool relaxed;
    CUdeviceptr dptr;
    void *host;
    CUresult rc;
};

static void *other_thread_main(void *arg)
{
    struct other_thread *o = arg;
    GC_CHECK(cuCtxSetCurrent(primary));
    if (o->relaxed) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        GC_CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    }
    switch (o->call) {
    case FREE: o->rc = cuMemFree(o->dptr); break;
    case FREE_HOST: o->rc = cuMemFreeHost(o->host); break;
    case ALLOC: o->rc = cuMemAlloc(&o->dptr, BYTES); break;
    }
    return NULL;
}

/* This thread captures in the global mode while another thread, in the
 * global or the relaxed mode, makes the call. */
static void during_capture_on_another_thread(enum call call, bool relaxed)
{
    struct other_thread o = {.call = call, .relaxed = relaxed};
    if (call == FREE)
        o.dptr = device_alloc();
    if (call == FREE_HOST)
        o.host = host_alloc();
    CUstream s = capture_begin();
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread_main, &o) != 0)
        gc_die("pthread_create failed");
    pthread_join(t, NULL);
    report("", o.rc);
    capture_end(s);
}

/* ---- cuMemFree --------------------------------------------------------------------- */

static void free_null(void)
{
    report("", cuMemFree(0));
}

static void free_never_allocated(void)
{
    report("", cuMemFree((CUdeviceptr)0xdead0000ull));
}

static void free_interior(void)
{
    CUdeviceptr p = device_alloc();
    report("", cuMemFree(p + 256));
}

static void free_double(void)
{
    CUdeviceptr p = device_alloc();
    GC_CHECK(cuMemFree(p));
    report("", cuMemFree(p));
}

static void free_managed_double(void)
{
    CUdeviceptr p = managed_alloc();
    GC_CHECK(cuMemFree(p));
    report("", cuMemFree(p));
}

static void free_malloc_ptr(void)
{
    void *h = gc_xmalloc(BYTES);
    report("", cuMemFree((CUdeviceptr)(uintptr_t)h));
    free(h);
}

static void free_alloc_host_ptr(void)
{
    void *h = host_alloc();
    report("", cuMemFree((CUdeviceptr)(uintptr_t)h));
}

static void free_no_context(void)
{
    CUdeviceptr p = device_alloc();
    CUcontext popped;
    GC_CHECK(cuCtxPopCurrent(&popped));
    report("", cuMemFree(p));
    GC_CHECK(cuCtxPushCurrent(popped));
}

static void free_stack_ptr(void)
{
    char on_stack[64];
    report("", cuMemFree((CUdeviceptr)(uintptr_t)on_stack));
}

static void free_registered_ptr(void)
{
    void *h = registered();
    report("", cuMemFree((CUdeviceptr)(uintptr_t)h));
}

static void free_managed_interior(void)
{
    CUdeviceptr p = managed_alloc();
    report("", cuMemFree(p + 4096));
}

static void free_other_context_ptr(void)
{
    CUcontext b = other_context(), popped;
    CUdeviceptr p = device_alloc();
    GC_CHECK(cuCtxPopCurrent(&popped));
    if (popped != b)
        gc_die("popped another context");
    report("", cuMemFree(p));
}

static void free_in_capture(void)
{
    CUdeviceptr p = device_alloc();
    CUstream s = capture_begin();
    report("", cuMemFree(p));
    capture_end(s);
}

static void free_global_capture_other_thread(void)
{
    during_capture_on_another_thread(FREE, false);
}

static void free_relaxed_thread(void)
{
    during_capture_on_another_thread(FREE, true);
}

static void free_after_ctx_destroy(void)
{
    CUcontext b = other_context();
    CUdeviceptr p = device_alloc();
    GC_CHECK(cuCtxDestroy(b));
    report("", cuMemFree(p));
}

static void free_destroyed_context_current(void)
{
    CUdeviceptr p = device_alloc();
    destroy_from_another_thread(other_context());
    report("", cuMemFree(p));
}

/* ---- cuMemFreeHost --------------------------------------------------------------------- */

static void free_host_malloc_ptr(void)
{
    void *h = gc_xmalloc(BYTES);
    report("", cuMemFreeHost(h));
    free(h);
}

static void free_host_device_ptr(void)
{
    CUdeviceptr p = device_alloc();
    report("", cuMemFreeHost((void *)(uintptr_t)p));
}

static void free_host_double(void)
{
    void *h = host_alloc();
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemFreeHost(h));
}

static void free_host_null(void)
{
    report("", cuMemFreeHost(NULL));
}

static void free_host_interior(void)
{
    char *h = host_alloc();
    report("", cuMemFreeHost(h + 256));
}

static void free_host_managed_ptr(void)
{
    CUdeviceptr p = managed_alloc();
    report("", cuMemFreeHost((void *)(uintptr_t)p));
}

static void free_host_registered_ptr(void)
{
    void *h = registered();
    report("", cuMemFreeHost(h));
}

static void free_host_hostalloc_double(void)
{
    void *h;
    GC_CHECK(cuMemHostAlloc(&h, BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemFreeHost(h));
}

static void free_host_other_context_ptr(void)
{
    CUcontext b = other_context(), popped;
    void *h = host_alloc();
    GC_CHECK(cuCtxPopCurrent(&popped));
    if (popped != b)
        gc_die("popped another context");
    report("", cuMemFreeHost(h));
}

static void free_host_in_capture(void)
{
    void *h = host_alloc();
    CUstream s = capture_begin();
    report("", cuMemFreeHost(h));
    capture_end(s);
}

static void free_host_relaxed_thread(void)
{
    during_capture_on_another_thread(FREE_HOST, true);
}

static void free_host_no_context(void)
{
    void *h = host_alloc();
    CUcontext popped;
    GC_CHECK(cuCtxPopCurrent(&popped));
    report("", cuMemFreeHost(h));
    GC_CHECK(cuCtxPushCurrent(popped));
}

static void free_host_after_ctx_destroy(void)
{
    CUcontext b = other_context();
    void *h = host_alloc();
    GC_CHECK(cuCtxDestroy(b));
    report("", cuMemFreeHost(h));
}

/* ---- cuMemHostUnregister ------------------------------------------------------------------ */

static void unregister_never_registered(void)
{
    void *h = gc_xpages(BYTES);
    report("", cuMemHostUnregister(h));
    free(h);
}

static void unregister_double(void)
{
    void *h = registered();
    GC_CHECK(cuMemHostUnregister(h));
    report("", cuMemHostUnregister(h));
    free(h);
}

static void unregister_null(void)
{
    report("", cuMemHostUnregister(NULL));
}

static void unregister_alloc_host_ptr(void)
{
    void *h = host_alloc();
    report("", cuMemHostUnregister(h));
}

static void unregister_interior(void)
{
    char *h = registered();
    report("", cuMemHostUnregister(h + 4096));
}

static void unregister_no_context(void)
{
    void *h = registered();
    CUcontext popped;
    GC_CHECK(cuCtxPopCurrent(&popped));
    report("", cuMemHostUnregister(h));
    GC_CHECK(cuCtxPushCurrent(popped));
}

/* An address inside a range released just before: the driver has
 * forgotten the range (with cudefer, the release may still be queued). */
static void unregister_interior_after_unregister(void)
{
    char *h = registered();
    GC_CHECK(cuMemHostUnregister(h));
    report("", cuMemHostUnregister(h + 4096));
}

static void unregister_after_free_host(void)
{
    void *h = host_alloc();
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemHostUnregister(h));
}

static void unregister_interior_after_free_host(void)
{
    char *h = host_alloc();
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemHostUnregister(h + 4096));
}

static void free_host_interior_after_free_host(void)
{
    char *h = host_alloc();
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemFreeHost(h + 256));
}

static void unregister_device_ptr(void)
{
    CUdeviceptr p = device_alloc();
    report("", cuMemHostUnregister((void *)(uintptr_t)p));
}

/* ---- arrays, modules, libraries -------------------------------------------------------------- */

static CUarray array_create(void)
{
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuArrayCreate(&a, &d));
    return a;
}

static void array_destroy_double(void)
{
    CUarray a = array_create();
    GC_CHECK(cuArrayDestroy(a));
    report("", cuArrayDestroy(a));
}

static void array_destroy_after_ctx_destroy(void)
{
    CUcontext b = other_context();
    CUarray a = array_create();
    GC_CHECK(cuCtxDestroy(b));
    report("", cuArrayDestroy(a));
}

static void array_destroy_double_after_ctx_destroy(void)
{
    CUcontext b = other_context();
    CUarray a = array_create();
    GC_CHECK(cuArrayDestroy(a));
    GC_CHECK(cuCtxDestroy(b));
    report("", cuArrayDestroy(a));
}

static void array_destroy_null(void)
{
    report("", cuArrayDestroy(NULL));
}

static void mipmapped_destroy_double(void)
{
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuMipmappedArrayCreate(&m, &d, 2));
    GC_CHECK(cuMipmappedArrayDestroy(m));
    report("", cuMipmappedArrayDestroy(m));
}

static void module_unload_double(void)
{
    CUmodule m;
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    GC_CHECK(cuModuleUnload(m));
    report("", cuModuleUnload(m));
}

static void module_unload_null(void)
{
    report("", cuModuleUnload(NULL));
}

static void module_unload_after_ctx_destroy(void)
{
    CUcontext b = other_context();
    CUmodule m;
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    GC_CHECK(cuCtxDestroy(b));
    report("", cuModuleUnload(m));
}

/* The release with no current context (the object names its context). */
static void pop_and_report(CUresult (*release)(void *), void *handle)
{
    CUcontext popped;
    GC_CHECK(cuCtxPopCurrent(&popped));
    report("", release(handle));
    GC_CHECK(cuCtxPushCurrent(popped));
}

static CUresult array_destroy_any(void *a) { return cuArrayDestroy(a); }
static CUresult mipmapped_destroy_any(void *m) { return cuMipmappedArrayDestroy(m); }
static CUresult module_unload_any(void *m) { return cuModuleUnload(m); }
static CUresult library_unload_any(void *l) { return cuLibraryUnload(l); }

static void array_destroy_no_context(void)
{
    CUarray a = array_create();
    pop_and_report(array_destroy_any, a);
}

static void mipmapped_destroy_no_context(void)
{
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuMipmappedArrayCreate(&m, &d, 2));
    pop_and_report(mipmapped_destroy_any, m);
}

static void module_unload_no_context(void)
{
    CUmodule m;
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    pop_and_report(module_unload_any, m);
}

static void library_unload_no_context(void)
{
    CUlibrary l;
    GC_CHECK(cuLibraryLoadData(&l, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    pop_and_report(library_unload_any, l);
}

static void library_unload_double_destroyed_context_current(void)
{
    CUlibrary l;
    GC_CHECK(cuLibraryLoadData(&l, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryUnload(l));
    destroy_from_another_thread(other_context());
    report("", cuLibraryUnload(l));
}

static void library_unload_double(void)
{
    CUlibrary l;
    CUkernel k;
    CUfunction f;
    GC_CHECK(cuLibraryLoadData(&l, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&k, l, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&f, k));
    GC_CHECK(cuLibraryUnload(l));
    report("", cuLibraryUnload(l));
}

static void library_unload_null(void)
{
    report("", cuLibraryUnload(NULL));
}

/* ---- contexts ----------------------------------------------------------------------------------- */

static void ctx_sync_destroyed_current(void)
{
    destroy_from_another_thread(other_context());
    report("", cuCtxSynchronize());
}

static void ctx_sync_v2_destroyed(void)
{
    CUcontext b = other_context();
    GC_CHECK(cuCtxDestroy(b));
    report("", cuCtxSynchronize_v2(b));
}

/* ---- allocations: NULL arguments, bad flags, destroyed streams, capture --------------------- */

static void alloc_null_ptr(void)
{
    report("", cuMemAlloc(NULL, BYTES));
}

static void alloc_zero_bytes(void)
{
    CUdeviceptr p;
    report("", cuMemAlloc(&p, 0));
}

static void alloc_host_null_ptr(void)
{
    report("", cuMemAllocHost(NULL, BYTES));
}

static void alloc_managed_null_ptr(void)
{
    report("", cuMemAllocManaged(NULL, BYTES, CU_MEM_ATTACH_GLOBAL));
}

static void register_null_ptr(void)
{
    report("", cuMemHostRegister(NULL, BYTES, 0));
}

static void array_create_null_desc(void)
{
    CUarray a;
    report("", cuArrayCreate(&a, NULL));
}

static void stream_create_null_ptr(void)
{
    report("", cuStreamCreate(NULL, CU_STREAM_NON_BLOCKING));
}

static void host_alloc_invalid_flag(void)
{
    void *h;
    report("", cuMemHostAlloc(&h, BYTES, 0x40));
}

static void host_alloc_invalid_flag_after_release(void)
{
    void *h;
    released_host_block();
    report("", cuMemHostAlloc(&h, BYTES, 0x80000000u));
}

static void register_invalid_flags(void)
{
    void *h = gc_xpages(BYTES);
    report("", cuMemHostRegister(h, BYTES, 0x40));
}

static void alloc_managed_flags_0(void)
{
    CUdeviceptr p;
    report("", cuMemAllocManaged(&p, BYTES, 0));
}

static void alloc_managed_invalid_flag(void)
{
    CUdeviceptr p;
    report("", cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_SINGLE));
}

static void stream_create_invalid_flags(void)
{
    CUstream s;
    report("", cuStreamCreate(&s, 0x10));
}

static void alloc_async_destroyed_stream(void)
{
    CUstream s;
    CUdeviceptr p;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamDestroy(s));
    report("", cuMemAllocAsync(&p, BYTES, s));
}

static void alloc_in_capture(void)
{
    CUdeviceptr p;
    CUstream s = capture_begin();
    report("", cuMemAlloc(&p, BYTES));
    capture_end(s);
}

static void alloc_relaxed_thread(void)
{
    during_capture_on_another_thread(ALLOC, true);
}

static void alloc_host_in_capture(void)
{
    void *h;
    released_host_block();
    CUstream s = capture_begin();
    report("", cuMemAllocHost(&h, BYTES));
    capture_end(s);
}

/* ---- the table ---------------------------------------------------------------------------------- */

struct conform_case {
    const char *name;
    void (*run)(void);
};

static const struct conform_case cases[] = {
    /* cuMemFree: wrong, foreign and released pointers, no or a dead context */
    {"cuMemFree(0)", free_null},
    {"cuMemFree(never_allocated)", free_never_allocated},
    {"cuMemFree(interior_pointer)", free_interior},
    {"cuMemFree(double)", free_double},
    {"cuMemFree(managed_double)", free_managed_double},
    {"cuMemFree(malloc_pointer)", free_malloc_ptr},
    {"cuMemFree(cuMemAllocHost_pointer)", free_alloc_host_ptr},
    {"cuMemFree(no_current_context)", free_no_context},
    {"cuMemFree(stack_pointer)", free_stack_ptr},
    {"cuMemFree(registered_pointer)", free_registered_ptr},
    {"cuMemFree(managed_interior_pointer)", free_managed_interior},
    {"cuMemFree(other_context_pointer)", free_other_context_ptr},
    {"cuMemFree(after_ctx_destroy)", free_after_ctx_destroy},
    {"cuMemFree(destroyed_context_current)", free_destroyed_context_current},
    /* cuMemFreeHost */
    {"cuMemFreeHost(malloc_pointer)", free_host_malloc_ptr},
    {"cuMemFreeHost(device_pointer)", free_host_device_ptr},
    {"cuMemFreeHost(double)", free_host_double},
    {"cuMemFreeHost(NULL)", free_host_null},
    {"cuMemFreeHost(interior_pointer)", free_host_interior},
    {"cuMemFreeHost(managed_pointer)", free_host_managed_ptr},
    {"cuMemFreeHost(registered_pointer)", free_host_registered_ptr},
    {"cuMemFreeHost(cuMemHostAlloc_double)", free_host_hostalloc_double},
    {"cuMemFreeHost(other_context_pointer)", free_host_other_context_ptr},
    {"cuMemFreeHost(after_ctx_destroy)", free_host_after_ctx_destroy},
    {"cuMemFreeHost(no_current_context)", free_host_no_context},
    {"cuMemFreeHost(interior_after_free)", free_host_interior_after_free_host},
    /* cuMemHostUnregister */
    {"cuMemHostUnregister(never_registered)", unregister_never_registered},
    {"cuMemHostUnregister(double)", unregister_double},
    {"cuMemHostUnregister(NULL)", unregister_null},
    {"cuMemHostUnregister(cuMemAllocHost_pointer)", unregister_alloc_host_ptr},
    {"cuMemHostUnregister(interior_pointer)", unregister_interior},
    {"cuMemHostUnregister(device_pointer)", unregister_device_ptr},
    {"cuMemHostUnregister(no_current_context)", unregister_no_context},
    {"cuMemHostUnregister(interior_after_unregister)", unregister_interior_after_unregister},
    {"cuMemHostUnregister(after_cuMemFreeHost)", unregister_after_free_host},
    {"cuMemHostUnregister(interior_after_cuMemFreeHost)", unregister_interior_after_free_host},
    /* arrays, modules, libraries */
    {"cuArrayDestroy(double)", array_destroy_double},
    {"cuArrayDestroy(NULL)", array_destroy_null},
    {"cuArrayDestroy(after_ctx_destroy)", array_destroy_after_ctx_destroy},
    {"cuArrayDestroy(double_after_ctx_destroy)", array_destroy_double_after_ctx_destroy},
    {"cuMipmappedArrayDestroy(double)", mipmapped_destroy_double},
    {"cuModuleUnload(double)", module_unload_double},
    {"cuModuleUnload(NULL)", module_unload_null},
    {"cuModuleUnload(after_ctx_destroy)", module_unload_after_ctx_destroy},
    {"cuLibraryUnload(double)", library_unload_double},
    {"cuLibraryUnload(NULL)", library_unload_null},
    {"cuArrayDestroy(no_current_context)", array_destroy_no_context},
    {"cuMipmappedArrayDestroy(no_current_context)", mipmapped_destroy_no_context},
    {"cuModuleUnload(no_current_context)", module_unload_no_context},
    {"cuLibraryUnload(no_current_context)", library_unload_no_context},
    {"cuLibraryUnload(double_destroyed_context_current)",
     library_unload_double_destroyed_context_current},
    /* destroyed contexts */
    {"cuCtxSynchronize(destroyed_context_current)", ctx_sync_destroyed_current},
    {"cuCtxSynchronize_v2(destroyed_context)", ctx_sync_v2_destroyed},
    /* NULL arguments */
    {"cuMemAlloc(NULL_pointer)", alloc_null_ptr},
    {"cuMemAlloc(zero_bytes)", alloc_zero_bytes},
    {"cuMemAllocHost(NULL_pointer)", alloc_host_null_ptr},
    {"cuMemAllocManaged(NULL_pointer)", alloc_managed_null_ptr},
    {"cuMemHostRegister(NULL_pointer)", register_null_ptr},
    {"cuArrayCreate(NULL_descriptor)", array_create_null_desc},
    {"cuStreamCreate(NULL_pointer)", stream_create_null_ptr},
    /* bad flags */
    {"cuMemHostAlloc(invalid_flag)", host_alloc_invalid_flag},
    {"cuMemHostAlloc(invalid_flag_after_release)", host_alloc_invalid_flag_after_release},
    {"cuMemHostRegister(invalid_flags)", register_invalid_flags},
    {"cuMemAllocManaged(flags_0)", alloc_managed_flags_0},
    {"cuMemAllocManaged(invalid_flag)", alloc_managed_invalid_flag},
    {"cuStreamCreate(invalid_flags)", stream_create_invalid_flags},
    /* destroyed streams */
    {"cuMemAllocAsync(destroyed_stream)", alloc_async_destroyed_stream},
    /* calls during a global-mode capture: on the capturing thread, on another
     * thread in the global mode, on another thread in the relaxed mode */
    {"cuMemFree(in_global_capture)", free_in_capture},
    {"cuMemFreeHost(in_global_capture)", free_host_in_capture},
    {"cuMemAlloc(in_global_capture)", alloc_in_capture},
    {"cuMemAllocHost(in_global_capture)", alloc_host_in_capture},
    {"cuMemFree(global_capture_other_thread)", free_global_capture_other_thread},
    {"cuMemFree(relaxed_thread_during_capture)", free_relaxed_thread},
    {"cuMemFreeHost(relaxed_thread_during_capture)", free_host_relaxed_thread},
    {"cuMemAlloc(relaxed_thread_during_capture)", alloc_relaxed_thread},
};

int main(int argc, char **argv)
{
    size_t n = sizeof cases / sizeof cases[0];
    if (argc != 2)
        gc_die("usage: conform list | conform <case>");
    if (strcmp(argv[1], "list") == 0) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cases[i].name) == 0) {
            CUlibrary lib;
            current_case = cases[i].name;
            primary = gc_init();
            GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
            GC_CHECK(cuLibraryGetKernel(&touch_kernel, lib, "cudefer_touch"));
            cases[i].run();
            finish_case();
            return 0;
        }
    }
    gc_die("unknown case '%s' (conform list names them)", argv[1]);
}
