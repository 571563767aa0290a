/* test_engine.c - the release engine over the test driver.
 *
 * Each test runs in its own process (Criterion forks), so a test may set
 * CUDEFER_* variables before its first CUDA call: the shim reads them then.
 * "Waited" is measured by the test driver itself: the calls a thread made
 * that may wait for GPU work, and the time it spent blocked inside them. */
#include "common.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KERNEL_US 1000000u /* the 1 s kernel of the measured stall table */

/* Found at run time, as a program that also runs without cudefer would. */
static int cudefer_flush(void)
{
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    cr_assert_not_null(flush, "cudefer_flush is not there: is the shim preloaded?");
    return flush();
}

/* Waits, up to ms milliseconds, until the test driver counts at most
 * at_most live objects of kind (device blocks go back through frees that
 * cudefer's waiter settles a moment later). */
static void live_settles(enum testdrv_kind kind, size_t at_most, int ms)
{
    for (int i = 0; i < ms && program_live(kind) > at_most; i++)
        usleep(1000);
}

/* ---- what to release ---------------------------------------------------- */

enum what {
    DEVICE, MANAGED, HOST, HOST_ALLOC, REGISTERED, ARRAY, MODULE, LIBRARY, WHAT_COUNT
};

static const char *const what_option[WHAT_COUNT] = {
    "CUDEFER_DEVICE", "CUDEFER_MANAGED", "CUDEFER_HOST", "CUDEFER_HOST",
    "CUDEFER_REGISTERED", "CUDEFER_ARRAY", "CUDEFER_MODULE", "CUDEFER_LIBRARY",
};

static const char ptx[] = "// the test driver accepts any image\n";

struct object {
    enum what what;
    CUdeviceptr dptr;
    void *host;
    CUarray array;
    CUmodule module;
    CUlibrary library;
};

/* An object of kind what; memory of the given size (arrays, modules and
 * libraries have their own). */
static struct object make_sized(enum what what, size_t bytes)
{
    struct object o = {.what = what};
    switch (what) {
    case DEVICE: CU_OK(cuMemAlloc(&o.dptr, bytes)); break;
    case MANAGED: CU_OK(cuMemAllocManaged(&o.dptr, bytes, CU_MEM_ATTACH_GLOBAL)); break;
    case HOST: CU_OK(cuMemAllocHost(&o.host, bytes)); break;
    case HOST_ALLOC: CU_OK(cuMemHostAlloc(&o.host, bytes, CU_MEMHOSTALLOC_DEVICEMAP)); break;
    case REGISTERED:
        o.host = aligned_alloc(4096, bytes);
        CU_OK(cuMemHostRegister(o.host, bytes, 0));
        break;
    case ARRAY: {
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 256, .Height = 256,
                                   .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        CU_OK(cuArrayCreate(&o.array, &d));
        break;
    }
    case MODULE: CU_OK(cuModuleLoadData(&o.module, ptx)); break;
    case LIBRARY: {
        CUkernel k;
        CUfunction f;
        CU_OK(cuLibraryLoadData(&o.library, ptx, NULL, NULL, 0, NULL, NULL, 0));
        /* Once one of its kernels is loaded, its unload waits. */
        CU_OK(cuLibraryGetKernel(&k, o.library, "k"));
        CU_OK(cuKernelGetFunction(&f, k));
        break;
    }
    case WHAT_COUNT: break;
    }
    return o;
}

static struct object make(enum what what)
{
    return make_sized(what, 1 << 20);
}

static CUresult release(struct object *o)
{
    switch (o->what) {
    case DEVICE:
    case MANAGED: return cuMemFree(o->dptr);
    case HOST:
    case HOST_ALLOC: return cuMemFreeHost(o->host);
    case REGISTERED: return cuMemHostUnregister(o->host);
    case ARRAY: return cuArrayDestroy(o->array);
    case MODULE: return cuModuleUnload(o->module);
    case LIBRARY: return cuLibraryUnload(o->library);
    case WHAT_COUNT: break;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- the stall: a release while a 1 s kernel runs on another stream ----- */

struct launcher {
    CUcontext ctx;
    CUstream stream;
    atomic_int go;
    uint64_t blocked_ns;
};

static void *launch_meanwhile(void *arg)
{
    struct launcher *l = arg;
    cuCtxSetCurrent(l->ctx);
    while (!atomic_load(&l->go))
        ;
    /* Well inside a release that waits for the 1 s kernel. */
    usleep(50000);
    uint64_t before = testdrv_thread_blocked_ns();
    testdrv_launch(l->stream, 10, 0, 0, TESTDRV_NONE);
    l->blocked_ns = testdrv_thread_blocked_ns() - before;
    return NULL;
}

struct stall {
    CUresult rc;
    uint64_t wait_calls;  /* calls of the releasing thread that may wait */
    uint64_t blocked_ns;  /* time the releasing thread was blocked */
    uint64_t other_ns;    /* time another thread's launch was blocked */
};

static struct stall stall_of(enum what what)
{
    CUcontext ctx = test_context();
    struct object o = make(what);
    CUstream busy = test_stream(CU_STREAM_NON_BLOCKING);
    struct launcher l = {.ctx = ctx, .stream = test_stream(CU_STREAM_NON_BLOCKING)};
    pthread_t t;
    pthread_create(&t, NULL, launch_meanwhile, &l);
    CU_OK(testdrv_launch(busy, KERNEL_US, 0, 0, TESTDRV_NONE));
    usleep(20000);

    struct stall s;
    uint64_t calls = testdrv_thread_wait_calls(), blocked = testdrv_thread_blocked_ns();
    atomic_store(&l.go, 1);
    s.rc = release(&o);
    s.wait_calls = testdrv_thread_wait_calls() - calls;
    s.blocked_ns = testdrv_thread_blocked_ns() - blocked;
    pthread_join(t, NULL);
    s.other_ns = l.blocked_ns;
    CU_OK(cuCtxSynchronize());
    return s;
}

static void expect_free_of_waits(enum what what)
{
    struct stall s = stall_of(what);
    cr_assert_eq(s.rc, CUDA_SUCCESS);
    cr_expect_eq(s.wait_calls, 0, "%s: the caller made %llu calls that may wait",
                 what_option[what], (unsigned long long)s.wait_calls);
    cr_expect_lt(s.blocked_ns, 5 * MS, "%s: the caller was blocked %llu ns", what_option[what],
                 (unsigned long long)s.blocked_ns);
    cr_expect_lt(s.other_ns, 5 * MS, "%s: another thread's launch was blocked %llu ns",
                 what_option[what], (unsigned long long)s.other_ns);
}

/* With the kind switched off the driver's own release runs: the test can
 * tell the difference. */
static void expect_blocking_when_off(enum what what, bool stalls_others)
{
    setenv(what_option[what], "0", 1);
    struct stall s = stall_of(what);
    cr_assert_eq(s.rc, CUDA_SUCCESS);
    cr_expect_gt(s.wait_calls, 0);
    cr_expect_gt(s.blocked_ns, 500 * MS, "%s=0: the caller was blocked only %llu ns",
                 what_option[what], (unsigned long long)s.blocked_ns);
    if (stalls_others)
        cr_expect_gt(s.other_ns, 500 * MS, "%s=0: the other launch waited only %llu ns",
                     what_option[what], (unsigned long long)s.other_ns);
}

#define STALL_TESTS(name, what, stalls)                                                  \
    Test(stall, name, .timeout = 20) { expect_free_of_waits(what); }                     \
    Test(stall, name##_off_blocks, .timeout = 20) { expect_blocking_when_off(what, stalls); }

STALL_TESTS(device, DEVICE, true)
STALL_TESTS(managed, MANAGED, true)
STALL_TESTS(host, HOST, true)
STALL_TESTS(host_alloc, HOST_ALLOC, true)
/* The pages are the program's when cuMemHostUnregister returns: it waits
 * for the work submitted before it (the 1 s kernel), and only for that;
 * another thread's launch does not wait. */
Test(stall, registered, .timeout = 20)
{
    struct stall s = stall_of(REGISTERED);
    cr_assert_eq(s.rc, CUDA_SUCCESS);
    cr_expect_gt(s.blocked_ns, 500 * MS, "the unregister did not wait for the work before it");
    cr_expect_lt(s.other_ns, 5 * MS, "another thread's launch was blocked %llu ns",
                 (unsigned long long)s.other_ns);
}
Test(stall, registered_deferred_with_defer, .timeout = 20)
{
    setenv("CUDEFER_REGISTERED", "defer", 1);
    expect_free_of_waits(REGISTERED);
}
Test(stall, registered_off_blocks, .timeout = 20) { expect_blocking_when_off(REGISTERED, true); }
STALL_TESTS(array, ARRAY, true)
STALL_TESTS(module, MODULE, false)
STALL_TESTS(library, LIBRARY, false)

Test(stall, master_switch_off_passes_through, .timeout = 20)
{
    setenv("CUDEFER_ENABLE", "0", 1);
    struct stall s = stall_of(DEVICE);
    cr_expect_gt(s.blocked_ns, 500 * MS);
}

/* ---- the use after free of a bare cuMemFreeAsync does not happen --------- */

static void writer_then_free(CUstream writer_stream, bool ptds)
{
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, 1 << 20));
    CU_OK(testdrv_launch(writer_stream, 200000, buf, 1 << 20, TESTDRV_WRITE));
    (void)ptds;
    usleep(10000);
    CU_OK(cuMemFree(buf));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "a kernel wrote to memory the shim let go");
}

Test(hazard, writer_on_non_blocking_stream, .timeout = 10)
{
    test_context();
    writer_then_free(test_stream(CU_STREAM_NON_BLOCKING), false);
}

Test(hazard, writer_on_blocking_stream, .timeout = 10)
{
    test_context();
    writer_then_free(test_stream(CU_STREAM_DEFAULT), false);
}

Test(hazard, writer_on_legacy_stream, .timeout = 10)
{
    test_context();
    writer_then_free(CU_STREAM_LEGACY, false);
}

Test(hazard, writer_on_per_thread_stream, .timeout = 10)
{
    test_context();
    writer_then_free(CU_STREAM_PER_THREAD, true);
}

Test(hazard, writer_under_pre_12_5_fence, .timeout = 10)
{
    /* Before 12.5 the fence is events on the streams the program made. */
    setenv("TESTDRIVER_VERSION", "12040", 1);
    test_context();
    writer_then_free(test_stream(CU_STREAM_NON_BLOCKING), false);
    writer_then_free(test_stream(CU_STREAM_DEFAULT), false);
    writer_then_free(CU_STREAM_LEGACY, false);
}

/* Before 12.5 (the fence is events on the streams the program made): a
 * 1 MiB block in *buf, and a stream of the program whose 200 ms kernel
 * writes it. */
static CUstream writer_pre_12_5(CUdeviceptr *buf)
{
    setenv("TESTDRIVER_VERSION", "12040", 1);
    test_context();
    CU_OK(cuMemAlloc(buf, 1 << 20));
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(testdrv_launch(s, 200000, *buf, 1 << 20, TESTDRV_WRITE));
    return s;
}

Test(hazard, stream_destroyed_while_writing_pre_12_5, .timeout = 10)
{
    CUdeviceptr buf;
    CUstream s = writer_pre_12_5(&buf);
    CU_OK(cuStreamDestroy(s)); /* its work still runs */
    CU_OK(cuMemFree(buf));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* Before 12.5, a stream destroyed in the middle of its capture: the work
 * it ran before the capture still guards the blocks it wrote, and the
 * fences after it still work. The final record of such a stream used to be
 * made inside the capture (a node of the graph), which no stream outside
 * it may wait for: every later fence failed, and every later release went
 * to the driver's own, waiting call. */
Test(hazard, stream_destroyed_in_its_capture_pre_12_5, .timeout = 10)
{
    CUdeviceptr buf;
    CUstream s = writer_pre_12_5(&buf);
    CU_OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cuMemFree(buf));   /* while the capture is live: deferred unfenced */
    CU_OK(cuStreamDestroy(s)); /* ends the capture; the writer still runs */
    usleep(20000);
    CUdeviceptr again;
    CU_OK(cuMemAlloc(&again, 1 << 20));
    cr_expect_neq(again, buf, "the block was handed out again while its writer ran");
    /* Given back for real only once the writer is done. */
    cr_assert_eq(cudefer_flush(), 0);
    cr_expect_eq(testdrv_faults(), 0, "the block was freed while its writer ran");
    /* A later release, under a kernel that runs long, does not wait. */
    CUdeviceptr other;
    CU_OK(cuMemAlloc(&other, 4096));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    uint64_t calls = testdrv_thread_wait_calls();
    CU_OK(cuMemFree(other));
    cr_expect_eq(testdrv_thread_wait_calls(), calls,
                 "a release after the destroyed capture went to the driver's waiting call");
    CU_OK(cuMemFree(again));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "a kernel wrote to memory the shim let go");
}

/* A kernel of another device's context reads the memory through peer
 * access: the fence covers every context the shim knows. */
/* Two devices of the test driver, and their primary contexts retained. */
static void two_devices(CUcontext *a, CUcontext *b)
{
    setenv("TESTDRIVER_DEVICES", "2", 1);
    CUdevice d0, d1;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&d0, 0));
    CU_OK(cuDeviceGet(&d1, 1));
    CU_OK(cuDevicePrimaryCtxRetain(a, d0));
    CU_OK(cuDevicePrimaryCtxRetain(b, d1));
}

Test(hazard, writer_in_another_context, .timeout = 10)
{
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(b));
    CUstream sb = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuCtxSetCurrent(a));
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, 1 << 20));
    CU_OK(testdrv_launch(sb, 200000, buf, 1 << 20, TESTDRV_WRITE));
    usleep(10000);
    CU_OK(cuMemFree(buf));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "the free did not wait for the other context's kernel");
}

/* The other context is one the program only launches in (a kernel from a
 * library loaded with no context, on its legacy stream): the shim knows it
 * from its retain. And a flush right after the release, while that kernel
 * still runs, must wait for it too: the driver's own release waits for its
 * own context only. Both measured faulting on two H200s before. */
static void writer_in_unseen_context(bool flush)
{
    if (!flush)
        setenv("CUDEFER_DEVICE_CACHE", "0", 1);
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(a));
    /* The driver's one-time set-up of stream-ordered frees (a block of its
     * own, counted live) is done before the count below. */
    cr_assert_eq(cudefer_flush(), 0);
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, 1 << 20));
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(testdrv_launch(CU_STREAM_LEGACY, 200000, buf, 1 << 20, TESTDRV_WRITE));
    CU_OK(cuCtxSetCurrent(a));
    usleep(10000);
    CU_OK(cuMemFree(buf));
    if (flush)
        cr_expect_eq(cudefer_flush(), 0);
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "the release did not wait for the other context's kernel");
}

Test(hazard, writer_in_a_context_with_no_allocation, .timeout = 10)
{
    writer_in_unseen_context(false);
}

Test(hazard, flush_while_another_context_writes, .timeout = 10)
{
    writer_in_unseen_context(true);
}

/* ---- the kernel that waits for the host ---------------------------------- */

Test(hazard, kernel_waiting_for_the_releasing_thread_completes, .timeout = 10)
{
    test_context();
    static volatile int flag;
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, 4096));
    CU_OK(testdrv_launch_spin(test_stream(CU_STREAM_NON_BLOCKING), &flag));
    /* Without the shim this cuMemFree waits for the spinning kernel, which
     * waits for the flag set below: a deadlock (the timeout fails it). */
    CU_OK(cuMemFree(buf));
    flag = 1;
    CU_OK(cuCtxSynchronize());
}

/* ---- flush points -------------------------------------------------------- */

Test(flush, ctx_synchronize_releases_the_queue, .timeout = 10)
{
    test_context();
    void *h;
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(cuMemFreeHost(h));
    cr_expect_eq(program_live(TESTDRV_HOST), 1, "the release was not deferred");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_HOST), 0, "cuCtxSynchronize left it queued");
}

Test(flush, explicit_flush, .timeout = 10)
{
    test_context();
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                               .NumChannels = 1};
    CU_OK(cuArrayCreate(&a, &d));
    CU_OK(cuArrayDestroy(a));
    cr_expect_eq(program_live(TESTDRV_ARRAY), 1);
    cr_expect_eq(cudefer_flush(), 0);
    cr_expect_eq(program_live(TESTDRV_ARRAY), 0);
}

Test(flush, device_memory_comes_back_without_a_sync, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "0", 1); /* straight to cuMemFreeAsync */
    test_context();
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, 1 << 20));
    CU_OK(cuMemFree(p));
    /* The waiter synchronises the completed free: no program sync needed. */
    for (int i = 0; i < 500 && program_live(TESTDRV_DEVICE) + testdrv_pending_free_bytes(); i++)
        usleep(1000);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0);
    cr_expect_eq(testdrv_pending_free_bytes(), 0);
}

/* Beyond CUDEFER_MAX_DEFERRED_ENTRIES a release is still deferred without
 * waiting (the limits are soft) and counted; an allocation never releases
 * the queue, so it never waits for the GPU; the next flush point gives
 * everything back. */
Test(flush, over_the_limit_a_release_still_does_not_wait, .timeout = 10)
{
    setenv("CUDEFER_MAX_DEFERRED_ENTRIES", "4", 1);
    test_context();
    void *h[6];
    for (int i = 0; i < 6; i++)
        CU_OK(cuMemAllocHost(&h[i], 4096));
    uint64_t calls = testdrv_thread_wait_calls();
    uint64_t frees = testdrv_calls("cuMemFreeHost");
    for (int i = 0; i < 6; i++)
        CU_OK(cuMemFreeHost(h[i]));
    cr_expect_eq(testdrv_thread_wait_calls(), calls, "a release past the limit waited");
    cr_expect_eq(testdrv_calls("cuMemFreeHost"), frees, "a release reached the driver");
    cr_expect_eq(program_live(TESTDRV_HOST), 6, "the releases are held");
    void *more;
    CU_OK(cuMemAllocHost(&more, 8192));
    cr_expect_eq(testdrv_thread_wait_calls(), calls, "the allocation waited");
    cr_expect_eq(program_live(TESTDRV_HOST), 7, "the allocation released the queue");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_HOST), 1, "the flush point gave the queue back");
    CU_OK(cuMemFreeHost(more));
}

/* ---- out of memory: flush, then retry once ------------------------------- */

/* Device frees still behind a running kernel: the allocation that fails for
 * want of their memory succeeds after the flush waits for them. */
static void device_oom_retry(CUresult (*alloc)(size_t), const char *name)
{
    setenv("TESTDRIVER_DEVICE_BYTES", "67108864", 1);
    test_context();
    CUdeviceptr big;
    CU_OK(cuMemAlloc(&big, 48 << 20));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 200000, 0, 0, TESTDRV_NONE));
    CU_OK(cuMemFree(big));
    uint64_t before = testdrv_calls(name);
    cr_expect_eq(alloc(48 << 20), CUDA_SUCCESS, "%s was not retried after the flush", name);
    cr_expect_eq(testdrv_calls(name), before + 2, "%s: expected one failure and one retry", name);
}

static CUresult alloc_device(size_t n) { CUdeviceptr p; return cuMemAlloc(&p, n); }
static CUresult alloc_pitch(size_t n)
{
    CUdeviceptr p;
    size_t pitch;
    return cuMemAllocPitch(&p, &pitch, n / 1024, 1024, 4);
}
static CUresult alloc_managed(size_t n) { CUdeviceptr p; return cuMemAllocManaged(&p, n, 1); }
static CUresult alloc_async(size_t n) { CUdeviceptr p; return cuMemAllocAsync(&p, n, 0); }
static CUresult alloc_array(size_t n)
{
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = n / 4096, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                               .NumChannels = 1};
    return cuArrayCreate(&a, &d);
}
static CUresult alloc_array3d(size_t n)
{
    CUarray a;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = n / 4096, .Height = 1024, .Depth = 0,
                                 .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    return cuArray3DCreate(&a, &d);
}
static CUresult alloc_vmm(size_t n)
{
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    return cuMemCreate(&h, n, &prop, 0);
}

static CUresult alloc_from_pool(size_t n)
{
    CUdeviceptr p;
    CUmemoryPool pool;
    CUresult rc = cuDeviceGetDefaultMemPool(&pool, 0);
    return rc ? rc : cuMemAllocFromPoolAsync(&p, n, pool, 0);
}
static CUresult alloc_mipmapped(size_t n)
{
    CUmipmappedArray a;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = n / 4096, .Height = 1024, .Depth = 0,
                                 .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    return cuMipmappedArrayCreate(&a, &d, 1);
}

Test(oom, cuMemAlloc, .timeout = 10) { device_oom_retry(alloc_device, "cuMemAlloc_v2"); }
Test(oom, cuMemAllocFromPoolAsync, .timeout = 10)
{
    device_oom_retry(alloc_from_pool, "cuMemAllocFromPoolAsync");
}
Test(oom, cuMipmappedArrayCreate, .timeout = 10)
{
    device_oom_retry(alloc_mipmapped, "cuMipmappedArrayCreate");
}

/* Registrations count against pinned memory: queued pinned memory goes
 * first, then the registration is retried. */
Test(oom, cuMemHostRegister, .timeout = 10)
{
    setenv("TESTDRIVER_HOST_BYTES", "67108864", 1);
    test_context();
    void *h;
    CU_OK(cuMemAllocHost(&h, 48 << 20));
    CU_OK(cuMemFreeHost(h));
    char *mem = aligned_alloc(4096, 40 << 20);
    uint64_t before = testdrv_calls("cuMemHostRegister_v2");
    cr_expect_eq(cuMemHostRegister(mem, 40 << 20, 0), CUDA_SUCCESS);
    cr_expect_eq(testdrv_calls("cuMemHostRegister_v2"), before + 2);
    CU_OK(cuMemHostUnregister(mem));
    CU_OK(cuCtxSynchronize());
    free(mem);
}
Test(oom, cuMemAllocPitch, .timeout = 10) { device_oom_retry(alloc_pitch, "cuMemAllocPitch_v2"); }
Test(oom, cuMemAllocManaged, .timeout = 10) { device_oom_retry(alloc_managed, "cuMemAllocManaged"); }
Test(oom, cuMemAllocAsync, .timeout = 10) { device_oom_retry(alloc_async, "cuMemAllocAsync"); }
Test(oom, cuArrayCreate, .timeout = 10) { device_oom_retry(alloc_array, "cuArrayCreate_v2"); }
Test(oom, cuArray3DCreate, .timeout = 10) { device_oom_retry(alloc_array3d, "cuArray3DCreate_v2"); }
Test(oom, cuMemCreate, .timeout = 10) { device_oom_retry(alloc_vmm, "cuMemCreate"); }

static void host_oom_retry(bool host_alloc)
{
    setenv("TESTDRIVER_HOST_BYTES", "67108864", 1);
    test_context();
    void *h;
    CU_OK(cuMemAllocHost(&h, 48 << 20));
    CU_OK(cuMemFreeHost(h));
    const char *name = host_alloc ? "cuMemHostAlloc" : "cuMemAllocHost_v2";
    uint64_t before = testdrv_calls(name);
    /* Another size, so that the queued block cannot simply be reused. */
    CUresult rc = host_alloc ? cuMemHostAlloc(&h, 40 << 20, 0) : cuMemAllocHost(&h, 40 << 20);
    cr_expect_eq(rc, CUDA_SUCCESS);
    cr_expect_eq(testdrv_calls(name), before + 2);
    cr_expect_eq(program_live(TESTDRV_HOST), 1);
}

Test(oom, cuMemAllocHost, .timeout = 10) { host_oom_retry(false); }
Test(oom, cuMemHostAlloc, .timeout = 10) { host_oom_retry(true); }

Test(oom, nothing_queued_means_no_retry, .timeout = 10)
{
    setenv("TESTDRIVER_DEVICE_BYTES", "67108864", 1);
    test_context();
    CUdeviceptr p;
    uint64_t before = testdrv_calls("cuMemAlloc_v2");
    cr_expect_eq(cuMemAlloc(&p, 128 << 20), CUDA_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(testdrv_calls("cuMemAlloc_v2"), before + 1);
}

Test(oom, many_rounds_larger_than_the_device, .timeout = 60)
{
    /* 200 rounds of most of the device, freed with no synchronisation. */
    setenv("TESTDRIVER_DEVICE_BYTES", "268435456", 1);
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 200; i++) {
        CUdeviceptr p;
        CU_OK(cuMemAlloc(&p, 200 << 20));
        CU_OK(testdrv_launch(s, 100, p, 4096, TESTDRV_WRITE));
        CU_OK(cuMemFree(p));
    }
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* ---- registrations ------------------------------------------------------- */

Test(registered, overlapping_registration_after_unregister, .timeout = 10)
{
    test_context();
    char *mem = aligned_alloc(4096, 1 << 20);
    CU_OK(cuMemHostRegister(mem, 1 << 20, 0));
    CU_OK(cuMemHostUnregister(mem));
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 1, "the unregister was not deferred");
    /* The program may now register the same range, or part of it, again. */
    CU_OK(cuMemHostRegister(mem + 4096, 8192, 0));
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 1);
    CU_OK(cuMemHostUnregister(mem + 4096));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 0);
    free(mem);
}

/* A registration over the program's own live registration gets the
 * driver's CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED at once, although
 * another range's unregister is pending and a kernel runs: only an
 * unregister in the way is made first (it would wait for that kernel). */
Test(registered, already_registered_answers_at_once, .timeout = 10)
{
    test_context();
    char *mine = aligned_alloc(4096, 8192), *other = aligned_alloc(4096, 4096);
    CU_OK(cuMemHostRegister(mine, 8192, 0));
    CU_OK(cuMemHostRegister(other, 4096, 0));
    CU_OK(cuMemHostUnregister(other));
    cr_assert_eq(program_live(TESTDRV_REGISTERED), 2, "the unregister was not deferred");
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    uint64_t calls = testdrv_thread_wait_calls(), blocked = testdrv_thread_blocked_ns();
    cr_expect_eq(cuMemHostRegister(mine + 4096, 4096, 0),
                 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    cr_expect_eq(testdrv_thread_wait_calls(), calls, "the registration made a call that waits");
    cr_expect_lt(testdrv_thread_blocked_ns() - blocked, 50000000ull,
                 "the registration waited for the kernel");
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 2, "the pending unregister was made");
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemHostUnregister(mine));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 0);
    free(mine);
    free(other);
}

/* ---- teardown ------------------------------------------------------------ */

static void queue_one_of_each(void)
{
    for (enum what w = DEVICE; w < WHAT_COUNT; w++) {
        struct object o = make(w);
        CU_OK(release(&o));
    }
}

static void expect_nothing_left(void)
{
    for (enum testdrv_kind k = TESTDRV_DEVICE; k <= TESTDRV_LIBRARY; k++)
        cr_expect_eq(program_live(k), 0, "kind %d: %zu objects left", (int)k, program_live(k));
    cr_expect_eq(testdrv_dead_context_calls(), 0, "the shim called into a destroyed context");
}

Test(teardown, ctx_destroy_with_queued_entries, .timeout = 10)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 100000, 0, 0, TESTDRV_NONE));
    queue_one_of_each();
    CU_OK(cuCtxDestroy(ctx));
    expect_nothing_left();
}

/* One of each kind queued in the primary context, which end() then takes
 * away: nothing may be left. */
static void primary_ends_with_entries(CUresult (*end)(CUdevice))
{
    CUdevice dev;
    test_context();
    CU_OK(cuDeviceGet(&dev, 0));
    queue_one_of_each();
    CU_OK(end(dev));
    expect_nothing_left();
}

Test(teardown, last_primary_release, .timeout = 10)
{
    primary_ends_with_entries(cuDevicePrimaryCtxRelease);
}

Test(teardown, primary_reset, .timeout = 10)
{
    primary_ends_with_entries(cuDevicePrimaryCtxReset);
}

/* An array its context's destruction freed: every release of it gets the
 * driver's answer for that (CONTEXT_IS_DESTROYED, measured on the H200),
 * and the dead handle never reaches the driver. */
Test(teardown, torn_array_answers_every_release, .timeout = 10)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                               .NumChannels = 1};
    CU_OK(cuArrayCreate(&a, &d));
    CU_OK(cuCtxDestroy(ctx));
    uint64_t calls = testdrv_calls("cuArrayDestroy");
    for (int i = 0; i < 3; i++)
        cr_expect_eq(cuArrayDestroy(a), CUDA_ERROR_CONTEXT_IS_DESTROYED, "release %d", i + 1);
    cr_expect_eq(testdrv_calls("cuArrayDestroy"), calls, "the dead handle reached the driver");
    cr_expect_eq(testdrv_dead_context_calls(), 0);
}

Test(teardown, context_used_again_after_destroy, .timeout = 10)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    for (int round = 0; round < 3; round++) {
        CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
        queue_one_of_each();
        CU_OK(cuCtxDestroy(ctx));
    }
    expect_nothing_left();
}

/* ---- fork ---------------------------------------------------------------- */

Test(process, forked_child_starts_empty, .timeout = 10)
{
    test_context();
    void *h;
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(cuMemFreeHost(h));
    uint64_t frees = testdrv_calls("cuMemFreeHost");
    pid_t pid = fork();
    if (pid == 0) {
        /* The parent's queue is not the child's to release. */
        cudefer_flush();
        _exit(testdrv_calls("cuMemFreeHost") == frees ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child released the parent's queue");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_HOST), 0);
}

/* ---- capture ------------------------------------------------------------- */

struct capture {
    CUcontext ctx;
    CUstream stream;
    atomic_int begun, release_done;
    CUresult end_rc;
};

static void *capture_thread(void *arg)
{
    struct capture *c = arg;
    cuCtxSetCurrent(c->ctx);
    CU_OK(cuStreamBeginCapture(c->stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    atomic_store(&c->begun, 1);
    testdrv_launch(c->stream, 100, 0, 0, TESTDRV_NONE);
    while (!atomic_load(&c->release_done))
        usleep(100);
    CUgraph g;
    c->end_rc = cuStreamEndCapture(c->stream, &g);
    return NULL;
}

Test(capture, releases_during_a_capture_keep_it_valid, .timeout = 10)
{
    CUcontext ctx = test_context();
    CUdeviceptr d;
    void *h;
    CU_OK(cuMemAlloc(&d, 4096));
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 50000, d, 4096, TESTDRV_WRITE));
    struct capture c = {.ctx = ctx, .stream = test_stream(CU_STREAM_NON_BLOCKING)};
    pthread_t t;
    pthread_create(&t, NULL, capture_thread, &c);
    while (!atomic_load(&c.begun))
        usleep(100);
    /* This thread is in the global capture mode, as programs are. */
    cr_expect_eq(cuMemFree(d), CUDA_SUCCESS);
    cr_expect_eq(cuMemFreeHost(h), CUDA_SUCCESS);
    atomic_store(&c.release_done, 1);
    pthread_join(t, NULL);
    cr_expect_eq(c.end_rc, CUDA_SUCCESS, "the capture was invalidated");
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    CU_OK(cuCtxSynchronize());
    live_settles(TESTDRV_DEVICE, 0, 500);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0, "the release queued during capture stayed");
    cr_expect_eq(program_live(TESTDRV_HOST), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

/* ---- bad input gets the driver's answer ---------------------------------- */

Test(errors, device_memory)
{
    test_context();
    CUdeviceptr p;
    int on_stack;
    CU_OK(cuMemAlloc(&p, 4096));
    cr_expect_eq(cuMemFree(0), CUDA_SUCCESS);
    cr_expect_eq(cuMemFree(p + 256), CUDA_ERROR_INVALID_VALUE, "not an allocation's base");
    cr_expect_eq(cuMemFree((CUdeviceptr)&on_stack), CUDA_ERROR_INVALID_VALUE, "host pointer");
    cr_expect_eq(cuMemFree(p), CUDA_SUCCESS);
    cr_expect_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "double free");
    cr_expect_eq(cuMemFree((CUdeviceptr)0xdead0000), CUDA_ERROR_INVALID_VALUE, "never given out");
}

/* Measured on the H200: cuMemFree with no current context frees the memory
 * and returns CUDA_SUCCESS; the shim defers it all the same. */
Test(errors, no_current_context, .timeout = 10)
{
    CUcontext ctx = test_context(), popped;
    CUdeviceptr p;
    void *h;
    CU_OK(cuMemAlloc(&p, 4096));
    CU_OK(cuMemAllocHost(&h, 4096));
    CU_OK(cuCtxPopCurrent(&popped));
    cr_assert_eq(popped, ctx);
    uint64_t calls = testdrv_thread_wait_calls();
    cr_expect_eq(cuMemFree(p), CUDA_SUCCESS);
    cr_expect_eq(cuMemFreeHost(h), CUDA_SUCCESS);
    cr_expect_eq(testdrv_thread_wait_calls(), calls, "a release without a context waited");
    cr_expect_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE, "double free without a context");
    CU_OK(cuCtxPushCurrent(ctx));
    CU_OK(cuCtxSynchronize());
    live_settles(TESTDRV_DEVICE, 0, 500);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0);
    cr_expect_eq(program_live(TESTDRV_HOST), 0);
}

Test(errors, host_registrations_arrays_modules)
{
    test_context();
    void *h;
    char stack[64];
    CU_OK(cuMemAllocHost(&h, 4096));
    cr_expect_eq(cuMemFreeHost(stack), CUDA_ERROR_INVALID_VALUE);
    cr_expect_eq(cuMemFreeHost(h), CUDA_SUCCESS);
    cr_expect_eq(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE, "double cuMemFreeHost");

    char *mem = aligned_alloc(4096, 8192);
    cr_expect_eq(cuMemHostUnregister(mem), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CU_OK(cuMemHostRegister(mem, 8192, 0));
    cr_expect_eq(cuMemHostUnregister(mem), CUDA_SUCCESS);
    cr_expect_eq(cuMemHostUnregister(mem), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

    struct object a = make(ARRAY), m = make(MODULE), l = make(LIBRARY);
    for (int i = 0; i < 2; i++) {
        CUresult want = i ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
        cr_expect_eq(release(&a), want, "cuArrayDestroy #%d", i + 1);
        cr_expect_eq(release(&m), want, "cuModuleUnload #%d", i + 1);
        cr_expect_eq(release(&l), want, "cuLibraryUnload #%d", i + 1);
    }
    CU_OK(cuCtxSynchronize());
    expect_nothing_left();
    free(mem);
}

/* ---- many threads -------------------------------------------------------- */

struct worker {
    CUcontext ctx;
    CUstream stream;
};

static void *churn(void *arg)
{
    struct worker *w = arg;
    cuCtxSetCurrent(w->ctx);
    for (int i = 0; i < 300; i++) {
        CUdeviceptr d;
        void *h;
        if (cuMemAlloc(&d, 4096) == CUDA_SUCCESS) {
            testdrv_launch(w->stream, 5, d, 4096, TESTDRV_WRITE);
            if (cuMemFree(d) != CUDA_SUCCESS)
                return (void *)1;
        }
        if (cuMemAllocHost(&h, 4096) == CUDA_SUCCESS && cuMemFreeHost(h) != CUDA_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

Test(threads, sixteen_threads_release_concurrently, .timeout = 60)
{
    CUcontext ctx = test_context();
    pthread_t t[16];
    struct worker w[16];
    for (int i = 0; i < 16; i++) {
        w[i] = (struct worker){ctx, test_stream(CU_STREAM_NON_BLOCKING)};
        pthread_create(&t[i], NULL, churn, &w[i]);
    }
    for (int i = 0; i < 16; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_expect_null(ret, "thread %d saw a failed release", i);
    }
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(cudefer_flush(), 0);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0);
    cr_expect_eq(program_live(TESTDRV_HOST), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

/* ---- reuse of released blocks -------------------------------------------- */

/* For the reusable kinds (DEVICE, MANAGED, HOST): the allocating call the
 * test driver counts, the kind it counts live blocks of, and a block's
 * address. */
static const char *alloc_call(enum what what)
{
    return what == MANAGED ? "cuMemAllocManaged"
           : what == DEVICE ? "cuMemAlloc_v2" : "cuMemAllocHost_v2";
}

static enum testdrv_kind live_kind(enum what what)
{
    return what == MANAGED ? TESTDRV_MANAGED : what == DEVICE ? TESTDRV_DEVICE : TESTDRV_HOST;
}

static uintptr_t address_of(const struct object *o)
{
    return o->what == MANAGED || o->what == DEVICE ? (uintptr_t)o->dptr : (uintptr_t)o->host;
}

/* A released block is handed out again only once no kernel submitted before
 * its release can still run, and only for the same size and flags. */
static void reuse_after_fence(enum what what)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    const char *call = alloc_call(what);
    struct object first = make(what);
    uintptr_t addr = address_of(&first);
    CU_OK(testdrv_launch(s, 100000, (CUdeviceptr)addr, 4096, TESTDRV_WRITE));
    CU_OK(release(&first));

    /* The kernel still runs: the block is not handed out (the bin holds
     * fewer blocks than a reuse waits for). */
    uint64_t calls = testdrv_calls(call);
    struct object second = make(what);
    uintptr_t addr2 = address_of(&second);
    cr_expect_neq(addr2, addr, "a block was reused while a kernel could still write it");
    cr_expect_eq(testdrv_calls(call), calls + 1);

    CU_OK(cuStreamSynchronize(s));
    /* The fence event follows on the shim's own stream a moment later. */
    usleep(50000);
    calls = testdrv_calls(call);
    struct object third = make(what);
    uintptr_t addr3 = address_of(&third);
    cr_expect_eq(addr3, addr, "the fenced block was not reused");
    cr_expect_eq(testdrv_calls(call), calls, "reuse must not call the driver");
    /* It is the program's again: a second release is not a double free. */
    cr_expect_eq(release(&third), CUDA_SUCCESS);
    cr_expect_eq(release(&second), CUDA_SUCCESS);
    CU_OK(cuCtxSynchronize());
    enum testdrv_kind kind = live_kind(what);
    /* Device blocks go back through stream-ordered frees, which the waiter
     * settles. */
    live_settles(kind, 0, 500);
    cr_expect_eq(program_live(kind), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

Test(reuse, device_after_its_fence, .timeout = 10) { reuse_after_fence(DEVICE); }
Test(reuse, pinned_host_after_its_fence, .timeout = 10) { reuse_after_fence(HOST); }
Test(reuse, managed_after_its_fence, .timeout = 10) { reuse_after_fence(MANAGED); }

/* A managed block costs little to allocate and much at its first use (the
 * GPU faults its pages in), so an allocation of managed memory may wait for
 * a block of its size that the same thread released while a kernel still
 * ran: the driver's release would have made that thread wait as long.
 * Another thread's release, or device memory, is not waited for beyond the
 * measured cost of an allocation. */
#define BIG ((size_t)64 << 20)

struct big_block {
    bool managed;
    CUdeviceptr d;
    uint64_t release_ns;
};

static CUdeviceptr big_alloc(bool managed)
{
    CUdeviceptr d;
    if (managed)
        CU_OK(cuMemAllocManaged(&d, BIG, CU_MEM_ATTACH_GLOBAL));
    else
        CU_OK(cuMemAlloc(&d, BIG));
    return d;
}

/* Allocates a block, queues a 300 ms kernel writing it, releases it (timed)
 * and returns it. */
static void big_released_under_a_kernel(struct big_block *b, CUstream s, CUevent after)
{
    b->d = big_alloc(b->managed);
    CU_OK(testdrv_launch(s, 300000, b->d, 4096, TESTDRV_WRITE));
    CU_OK(cuEventRecord(after, s));
    uint64_t t0 = now_ns();
    CU_OK(cuMemFree(b->d));
    b->release_ns = now_ns() - t0;
}

static void *big_release_thread(void *arg)
{
    struct big_block *b = arg;
    CU_OK(cuCtxSetCurrent(test_context()));
    CUstream s;
    CUevent after;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    big_released_under_a_kernel(b, s, after);
    return NULL;
}

Test(reuse, managed_waits_for_what_its_own_release_skipped, .timeout = 20)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUevent after;
    CU_OK(cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    struct big_block b = {.managed = true};
    big_released_under_a_kernel(&b, s, after);
    cr_expect_lt(b.release_ns, 50 * MS, "the release waited %llu ms",
                 (unsigned long long)(b.release_ns / MS));
    uint64_t calls = testdrv_calls("cuMemAllocManaged");
    uint64_t t0 = now_ns();
    CUdeviceptr e = big_alloc(true);
    uint64_t took = now_ns() - t0;
    /* The kernel had ended when the block came back. */
    cr_expect_eq(cuEventQuery(after), CUDA_SUCCESS,
                 "the block was handed back while its kernel still ran");
    cr_expect_eq(e, b.d, "the allocation did not wait for the block its thread released");
    cr_expect_eq(testdrv_calls("cuMemAllocManaged"), calls, "the driver allocated anyway");
    cr_expect_gt(took, 100 * MS, "the allocation returned after %llu ms, before the kernel ended",
                 (unsigned long long)(took / MS));
    CU_OK(cuMemFree(e));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_MANAGED), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

/* The released block, another allocation of its size made at once by the
 * main thread, and whether that one waited. */
static void big_no_wait(struct big_block *b, bool other_thread)
{
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUevent after;
    CU_OK(cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    if (other_thread) {
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, big_release_thread, b), 0);
        pthread_join(t, NULL);
    } else {
        big_released_under_a_kernel(b, s, after);
    }
    uint64_t t0 = now_ns();
    CUdeviceptr e = big_alloc(b->managed);
    uint64_t took = now_ns() - t0;
    cr_expect_lt(took, 100 * MS, "the allocation waited %llu ms for the released block",
                 (unsigned long long)(took / MS));
    cr_expect_neq(e, b->d, "the block was handed back while its kernel still ran");
    CU_OK(cuMemFree(e));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

Test(reuse, managed_does_not_wait_for_another_threads_release, .timeout = 20)
{
    test_context();
    struct big_block b = {.managed = true};
    big_no_wait(&b, true);
}

Test(reuse, device_does_not_wait_for_its_own_release, .timeout = 20)
{
    test_context();
    struct big_block b = {.managed = false};
    big_no_wait(&b, false);
}

Test(reuse, managed_does_not_wait_with_reuse_wait_off, .timeout = 20)
{
    setenv("CUDEFER_REUSE_WAIT", "0", 1);
    test_context();
    struct big_block b = {.managed = true};
    big_no_wait(&b, false);
}

Test(reuse, only_same_size_and_flags, .timeout = 10)
{
    test_context();
    void *a, *b, *c;
    CU_OK(cuMemHostAlloc(&a, 8192, CU_MEMHOSTALLOC_DEVICEMAP));
    CU_OK(cuMemFreeHost(a));
    usleep(50000); /* its fence passes on the shim's own stream */
    CU_OK(cuMemHostAlloc(&b, 8192, CU_MEMHOSTALLOC_PORTABLE));
    cr_expect_neq(b, a, "reused across flags");
    CU_OK(cuMemAllocHost(&c, 8192));
    cr_expect_neq(c, a, "cuMemAllocHost got cuMemHostAlloc memory");
    CU_OK(cuMemHostAlloc(&c, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    cr_expect_neq(c, a, "reused across sizes");
    CU_OK(cuMemHostAlloc(&c, 8192, CU_MEMHOSTALLOC_DEVICEMAP));
    cr_expect_eq(c, a, "same size and flags: reused");
}

Test(reuse, off_with_the_kind, .timeout = 10)
{
    setenv("CUDEFER_HOST", "0", 1);
    test_context();
    void *a, *b;
    CU_OK(cuMemAllocHost(&a, 4096));
    CU_OK(cuMemFreeHost(a));
    cr_expect_eq(program_live(TESTDRV_HOST), 0, "released by the driver at once");
    CU_OK(cuMemAllocHost(&b, 4096));
    CU_OK(cuMemFreeHost(b));
}

/* ---- CUDEFER_KEEP: blocks kept for reuse across a synchronisation -------- */

/* With CUDEFER_KEEP=3M, a synchronisation releases everything but the three
 * newest 1 MiB blocks whose last use has finished; they serve the next
 * allocations with no driver call. What a reuse cannot take (a registration,
 * a module) and the older blocks go back as before. */
static void kept_across_a_synchronisation(enum what what)
{
    setenv("CUDEFER_KEEP", "3M", 1);
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    enum testdrv_kind kind = live_kind(what);
    const char *call = alloc_call(what);
    struct object o[5];
    uintptr_t addr[5];
    for (int i = 0; i < 5; i++) {
        o[i] = make(what);
        addr[i] = address_of(&o[i]);
    }
    struct object reg = make(REGISTERED), mod = make(MODULE);
    CU_OK(testdrv_launch(s, 20000, (CUdeviceptr)addr[4], 4096, TESTDRV_WRITE));
    for (int i = 0; i < 5; i++)
        CU_OK(release(&o[i]));
    CU_OK(release(&reg));
    CU_OK(release(&mod));
    CU_OK(cuCtxSynchronize());
    /* device blocks go back through frees the waiter settles */
    live_settles(kind, 3, 500);
    cr_expect_eq(program_live(kind), 3, "kept %llu blocks, want the 3 newest",
                 (unsigned long long)program_live(kind));
    cr_expect_eq(program_live(TESTDRV_REGISTERED), 0, "the unregister was not made");
    cr_expect_eq(program_live(TESTDRV_MODULE), 0, "the unload was not made");

    /* The kept blocks are the newest three, handed out without the driver. */
    uint64_t calls = testdrv_calls(call);
    bool seen[5] = {false};
    for (int i = 0; i < 3; i++) {
        struct object n = make(what);
        uintptr_t a = address_of(&n);
        for (int j = 0; j < 5; j++)
            seen[j] |= a == addr[j];
        o[i] = n;
    }
    cr_expect_eq(testdrv_calls(call), calls, "a kept block was not reused");
    cr_expect(seen[2] && seen[3] && seen[4] && !seen[0] && !seen[1],
              "the kept blocks are not the newest three");

    /* cudefer_flush() takes everything back, kept blocks included. */
    for (int i = 0; i < 3; i++)
        CU_OK(release(&o[i]));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(kind), 3);
    cr_expect_eq(cudefer_flush(), 0);
    cr_expect_eq(program_live(kind), 0, "cudefer_flush() left kept blocks");
    cr_expect_eq(testdrv_faults(), 0);
}

Test(keep, device_across_a_synchronisation, .timeout = 10)
{
    kept_across_a_synchronisation(DEVICE);
}
Test(keep, pinned_across_a_synchronisation, .timeout = 10)
{
    kept_across_a_synchronisation(HOST);
}
Test(keep, managed_across_a_synchronisation, .timeout = 10)
{
    kept_across_a_synchronisation(MANAGED);
}

/* An allocation that runs short of memory takes kept blocks back. */
Test(keep, taken_back_when_memory_runs_short, .timeout = 10)
{
    setenv("CUDEFER_KEEP", "1G", 1);
    setenv("TESTDRIVER_HOST_BYTES", "67108864", 1);
    test_context();
    void *h;
    CU_OK(cuMemAllocHost(&h, 48 << 20));
    CU_OK(cuMemFreeHost(h));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(program_live(TESTDRV_HOST), 1, "the block was not kept");
    CU_OK(cuMemAllocHost(&h, 40 << 20));
    cr_expect_eq(program_live(TESTDRV_HOST), 1, "the kept block was not taken back");
    CU_OK(cuMemFreeHost(h));
}

/* ---- a kernel fault while releases are queued ---------------------------- */

/* Runs scenario() in a child process with CUDEFER_REPORT set, and puts the
 * JSON report the shim writes at the child's exit into text. The child's
 * exit status must be 0 (the scenario exits 1 where its own checks fail). */
static void report_of(void (*scenario)(void), char *text, size_t cap)
{
    char path[] = "/tmp/cudefer-report-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("CUDEFER_REPORT", path, 1);
        scenario();
        exit(0); /* the report is written on the way out */
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)",
              status);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    memset(text, 0, cap);
    size_t n = fread(text, 1, cap - 1, f);
    fclose(f);
    unlink(path);
    cr_assert_gt(n, 0, "no report written");
}

/* A pinned block and a registration queued, then a fault (the program's
 * own unfenced cuMemFreeAsync under a writer): the program gets the
 * driver's error, one more release gets it too, nothing crashes or hangs,
 * and what was queued is kept for the context's destruction, which frees
 * it all. The fault ended the device: a new context answers the driver's
 * CUDA_ERROR_ILLEGAL_ADDRESS (as on an H200, tests/gpu/facts.c xctx). */
static void fault_with_releases_queued(void)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate(&ctx, NULL, 0, dev))
        exit(1);
    void *h, *pages = aligned_alloc(4096, 1 << 16);
    CUdeviceptr buf, other;
    if (cuMemAllocHost(&h, 4096) || cuMemFreeHost(h) || cuMemAlloc(&buf, 1 << 20) ||
        cuMemAlloc(&other, 4096) || cuMemHostRegister(pages, 1 << 16, 0) ||
        cuMemHostUnregister(pages))
        exit(1);
    CUstream a, b;
    if (cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) || cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) ||
        testdrv_launch(a, 100000, buf, 1 << 20, TESTDRV_WRITE) || cuMemFreeAsync(buf, b))
        exit(1);
    if (cuCtxSynchronize() != CUDA_ERROR_ILLEGAL_ADDRESS ||
        cuMemFree(other) != CUDA_ERROR_ILLEGAL_ADDRESS)
        exit(1);
    /* Its destruction frees everything; the shim calls nothing dead. */
    if (cuCtxDestroy(ctx) != CUDA_SUCCESS || testdrv_dead_context_calls())
        exit(1);
    for (enum testdrv_kind k = TESTDRV_DEVICE; k <= TESTDRV_LIBRARY; k++)
        if (program_live(k))
            exit(1);
    CUcontext again;
    if (cuCtxCreate(&again, NULL, 0, dev) != CUDA_ERROR_ILLEGAL_ADDRESS)
        exit(1);
}

Test(faults, sticky_error_keeps_the_queue_for_teardown, .timeout = 10)
{
    char text[16384];
    report_of(fault_with_releases_queued, text, sizeof text);
    /* What the context's destruction freed is counted as dropped: the
     * queued pinned block, the registration, and the block released after
     * the fault. */
    const char *want = "\"dropped\": {\"device\": 1, \"managed\": 0, \"host\": 1, "
                       "\"registered\": 1,";
    cr_expect_not_null(strstr(text, want), "%s", text);
}

/* ---- statistics at exit -------------------------------------------------- */

static void a_release_of_each_memory_kind(void)
{
    test_context();
    void *h;
    CUdeviceptr d;
    cuMemAllocHost(&h, 4096);
    cuMemFreeHost(h);
    cuMemAlloc(&d, 4096);
    cuMemFree(d);
    cuCtxSynchronize();
}

Test(stats, json_report_at_exit, .timeout = 10)
{
    char text[16384];
    report_of(a_release_of_each_memory_kind, text, sizeof text);
    const char *want = "\"deferred\": {\"device\": 1, \"managed\": 0, \"host\": 1";
    cr_expect_not_null(strstr(text, want), "%s", text);
    cr_expect_not_null(strstr(text, "\"sync\": 1"), "%s", text);
    cr_expect_not_null(strstr(text, "\"peak_deferred_bytes\": 4096"), "%s", text);
}

/* Twenty device releases while a 300 ms kernel runs: each would have
 * waited in the driver for the rest of it. The waiter times the work
 * behind the first, and the others join that watch instead of recording an
 * event each (a release costs one event record, its fence's). Exits 2 when
 * the releases recorded more events than that. */
/* In a child: twenty device blocks of 4 KiB in d, and a 300 ms kernel
 * running on another block, which stays for the teardown. Exits 1 when a
 * call fails. */
static void twenty_blocks_under_a_kernel(CUdeviceptr d[20])
{
    test_context();
    CUstream s;
    CUdeviceptr buf;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuMemAlloc(&buf, 4096))
        exit(1);
    for (int i = 0; i < 20; i++)
        if (cuMemAlloc(&d[i], 4096))
            exit(1);
    if (testdrv_launch(s, 300000, buf, 4096, TESTDRV_WRITE))
        exit(1);
}

static void releases_under_one_kernel(void)
{
    CUdeviceptr d[20];
    twenty_blocks_under_a_kernel(d);
    uint64_t records = testdrv_calls("cuEventRecord");
    for (int i = 0; i < 20; i++)
        if (cuMemFree(d[i]))
            exit(1);
    if (testdrv_calls("cuEventRecord") - records > 20 + 1)
        exit(2);
    /* The kernel's block stays for the teardown: a release on an idle GPU
     * may count as waiting too (the fence's event is not complete the
     * moment after it is recorded). */
    if (cuCtxSynchronize())
        exit(1);
}

static double json_number(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    cr_assert_not_null(p, "no %s in %s", key, text);
    return strtod(p + strlen(key), NULL);
}

Test(stats, waiting_avoided_under_a_kernel, .timeout = 20)
{
    char text[16384];
    report_of(releases_under_one_kernel, text, sizeof text);
    cr_expect_eq(json_number(text, "\"saved\": {\"would_wait\": "), 20, "%s", text);
    /* Each release would have waited about 0.3 s; the lower bound is the
     * end of the first one's work, seen by the waiter within a few ms. */
    double avoided = json_number(text, "\"avoided_s\": ");
    cr_expect(avoided > 20 * 0.25 && avoided < 20 * 0.4, "avoided %.3f s: %s", avoided, text);
    double longest = json_number(text, "\"longest_ms\": ");
    cr_expect(longest > 250 && longest < 400, "longest %.1f ms", longest);
}

/* The same twenty releases with a report but CUDEFER_SAVINGS=0: no event
 * query, one context record each, and the report says nothing was saved
 * (null), where it would otherwise say 20. Exits 3 when a release asked
 * more of the driver. */
static void releases_under_one_kernel_unsaved(void)
{
    setenv("CUDEFER_SAVINGS", "0", 1);
    CUdeviceptr d[20];
    twenty_blocks_under_a_kernel(d);
    uint64_t queries = testdrv_calls("cuEventQuery"), records = testdrv_calls("cuCtxRecordEvent");
    for (int i = 0; i < 20; i++)
        if (cuMemFree(d[i]))
            exit(1);
    if (testdrv_calls("cuEventQuery") != queries ||
        testdrv_calls("cuCtxRecordEvent") - records != 20)
        exit(3);
    if (cuCtxSynchronize())
        exit(1);
}

Test(stats, savings_off_gathers_nothing_for_the_report, .timeout = 20)
{
    char text[16384];
    report_of(releases_under_one_kernel_unsaved, text, sizeof text);
    cr_expect_not_null(strstr(text, "\"saved\": null"), "%s", text);
    cr_expect_not_null(strstr(text, "\"would_wait\": null"), "%s", text);
    cr_expect_not_null(strstr(text, "\"deferred\": {\"device\": 20"), "%s", text);
}

/* Four blocks of each kind released under kernels, and allocated again
 * once the kernels have ended: handed out again in every case. The first
 * look asks the event, and asks the GPU for the word (four numbers wait);
 * the three after it (20 ms later each) read the word. So with the fences'
 * words (CUDEFER_FENCE_WORD=1) the words answer nine looks, three a kind;
 * without them none. */
static void reuses_after_their_kernels(void)
{
    static const enum what kinds[] = {DEVICE, HOST, MANAGED};
    setenv("CUDEFER_FENCE_WORD", "1", 0);
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    for (size_t i = 0; i < 3; i++) {
        struct object first[4];
        uintptr_t addr[4];
        for (int j = 0; j < 4; j++) {
            first[j] = make(kinds[i]);
            addr[j] = address_of(&first[j]);
            if (testdrv_launch(s, 20000, (CUdeviceptr)addr[j], 4096, TESTDRV_WRITE))
                exit(1);
        }
        for (int j = 0; j < 4; j++)
            if (release(&first[j]))
                exit(1);
        if (cuStreamSynchronize(s))
            exit(1);
        for (int j = 0; j < 4; j++) {
            usleep(20000);
            struct object again = make(kinds[i]);
            if (address_of(&again) != addr[j])
                exit(2);
            first[j] = again;
        }
        for (int j = 0; j < 4; j++)
            if (release(&first[j]))
                exit(1);
    }
    if (cuCtxSynchronize() || testdrv_faults())
        exit(3);
}

static void reuses_after_their_kernels_without_words(void)
{
    setenv("CUDEFER_FENCE_WORD", "0", 1);
    reuses_after_their_kernels();
}

Test(reuse, the_fences_words_answer, .timeout = 20)
{
    char text[16384];
    report_of(reuses_after_their_kernels, text, sizeof text);
    cr_expect_eq(json_number(text, "\"reuse_word_answers\": "), 9, "%s", text);
    cr_expect_eq(json_number(text, "\"reuse_fence_queries\": "), 3,
                 "each of the 12 reuses looked once: the other looks asked the driver\n%s",
                 text);
    cr_expect_not_null(strstr(text, "\"reused\": {\"device\": 4, \"managed\": 4, \"host\": 4"),
                       "%s", text);
    report_of(reuses_after_their_kernels_without_words, text, sizeof text);
    cr_expect_eq(json_number(text, "\"reuse_word_answers\": "), 0, "%s", text);
    cr_expect_eq(json_number(text, "\"reuse_fence_queries\": "), 12, "%s", text);
    cr_expect_not_null(strstr(text, "\"reused\": {\"device\": 4, \"managed\": 4, \"host\": 4"),
                       "%s", text);
}

/* A loop of 40 iterations over four released 4 KiB blocks of one kind:
 * allocate, release, and 2 ms for the GPU (idle) to land the fences'
 * word's writes. With four blocks in rotation the word misses at least
 * every fourth look, whatever the timing: a look asks for a write once four
 * numbers wait, after it has read the word, and the look that asks is the
 * one at the newest number of the four. A miss queries the event until 16
 * allocations in a row found the bin refilled (a loop); from then on, in a
 * small device, pinned or managed bin, it takes a new block instead
 * (cache.c, may_grow), until the word answers or the bin holds 16 blocks.
 * Without the words (CUDEFER_FENCE_WORD=0) every look queries the event
 * and no bin grows that way. Which allocation returns a new block is not
 * asserted: a fence still running when the machine is loaded makes one
 * too. */
static enum what trail_kind;

static void reuse_while_the_word_trails(void)
{
    test_context();
    struct object first[4];
    for (int j = 0; j < 4; j++)
        first[j] = make_sized(trail_kind, 4096);
    for (int j = 0; j < 4; j++)
        CU_OK(release(&first[j]));
    for (int i = 1; i <= 40; i++) {
        struct object got = make_sized(trail_kind, 4096);
        CU_OK(release(&got));
        usleep(2000);
    }
    if (cuCtxSynchronize() || testdrv_faults())
        exit(3);
}

static void reuse_while_the_word_trails_without_words(void)
{
    setenv("CUDEFER_FENCE_WORD", "0", 1);
    reuse_while_the_word_trails();
}

static void expect_growth_while_the_word_trails(enum what kind)
{
    char text[16384];
    trail_kind = kind;
    report_of(reuse_while_the_word_trails, text, sizeof text);
    double queries = json_number(text, "\"reuse_fence_queries\": ");
    double lags = json_number(text, "\"reuse_word_lags\": ");
    double answers = json_number(text, "\"reuse_word_answers\": ");
    cr_expect(lags >= 1 && lags <= 12, "the bin grew by %.0f blocks\n%s", lags, text);
    cr_expect_geq(queries + lags + answers, 40, "%s", text);
    report_of(reuse_while_the_word_trails_without_words, text, sizeof text);
    cr_expect_geq(json_number(text, "\"reuse_fence_queries\": "), 40, "%s", text);
    cr_expect_eq(json_number(text, "\"reuse_word_lags\": "), 0, "%s", text);
    cr_expect_eq(json_number(text, "\"reuse_word_answers\": "), 0, "%s", text);
}

Test(reuse, a_small_device_bin_grows_while_the_word_trails, .timeout = 20)
{
    expect_growth_while_the_word_trails(DEVICE);
}

Test(reuse, a_small_pinned_bin_grows_while_the_word_trails, .timeout = 20)
{
    expect_growth_while_the_word_trails(HOST);
}

Test(reuse, a_small_managed_bin_grows_while_the_word_trails, .timeout = 20)
{
    expect_growth_while_the_word_trails(MANAGED);
}

/* Where no statistics are shown (neither CUDEFER_STATS nor CUDEFER_REPORT),
 * a release under a kernel asks the driver for its fence and nothing more:
 * no event query of whether it would have waited, no watch with a record
 * of its own. The same releases with a report gathered both (above). */
Test(stats, nothing_gathered_where_nothing_is_shown, .timeout = 20)
{
    if (getenv("CUDEFER_STATS") || getenv("CUDEFER_REPORT"))
        cr_skip_test("CUDEFER_STATS or CUDEFER_REPORT is set in the environment");
    test_context();
    CUstream s;
    CUdeviceptr buf, d[20];
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuMemAlloc(&buf, 4096));
    for (int i = 0; i < 20; i++)
        CU_OK(cuMemAlloc(&d[i], 4096));
    CU_OK(testdrv_launch(s, 300000, buf, 4096, TESTDRV_WRITE));
    uint64_t queries = testdrv_calls("cuEventQuery"), records = testdrv_calls("cuCtxRecordEvent");
    for (int i = 0; i < 20; i++)
        CU_OK(cuMemFree(d[i]));
    cr_expect_eq(testdrv_calls("cuEventQuery") - queries, 0);
    cr_expect_eq(testdrv_calls("cuCtxRecordEvent") - records, 20);
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemFree(buf));
}

/* Over CUDEFER_DEVICE_CACHE the oldest fenced device blocks go to the
 * driver's stream-ordered free at once, without waiting (held to it alone:
 * the program's peak would keep all four). */
Test(reuse, device_cache_limit_frees_the_oldest, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "1M", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "0", 1);
    test_context();
    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&p[i], 512 << 10));
    uint64_t frees = testdrv_calls("cuMemFreeAsync");
    for (int i = 0; i < 4; i++) {
        CU_OK(cuMemFree(p[i]));
        usleep(20000); /* let each fence pass */
    }
    cr_expect_eq(testdrv_calls("cuMemFreeAsync"), frees + 2, "expected two blocks evicted");
    live_settles(TESTDRV_DEVICE, 2, 500);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 2, "the cache kept more than its limit");
    /* The two newest are still there to serve allocations of their size. */
    CUdeviceptr q;
    CU_OK(cuMemAlloc(&q, 512 << 10));
    cr_expect(q == p[2] || q == p[3], "the newest blocks were not kept");
}

/* With CUDEFER_DEVICE_CACHE_PEAK=100 the cache may keep what brings the
 * program's device memory back to its peak: a step that
 * releases more than CUDEFER_DEVICE_CACHE and allocates the same sizes
 * again is served from it, with no new block and no free. */
Test(reuse, device_cache_keeps_up_to_the_peak, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "1M", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "100", 1);
    test_context();
    CUdeviceptr p[8], q[8];
    for (int step = 0; step < 3; step++) {
        uint64_t allocs = testdrv_calls("cuMemAlloc_v2"), frees = testdrv_calls("cuMemFreeAsync");
        for (int i = 0; i < 8; i++)
            CU_OK(cuMemAlloc(&p[i], 512 << 10));
        if (step > 0)
            cr_expect_eq(testdrv_calls("cuMemAlloc_v2"), allocs, "step %d allocated anew", step);
        for (int i = 0; i < 8; i++)
            CU_OK(cuMemFree(p[i]));
        usleep(20000); /* the fences pass, the waiter has its turn */
        cr_expect_eq(testdrv_calls("cuMemFreeAsync"), frees, "step %d evicted", step);
        cr_expect_eq(program_live(TESTDRV_DEVICE), 8, "the cache kept %llu of 8 blocks",
                     (unsigned long long)program_live(TESTDRV_DEVICE));
    }
    /* Memory the program holds anew shrinks the room: four blocks of
     * another size (live 1 MiB of a 4 MiB peak: room 3 MiB) send the
     * oldest cached blocks back, each eviction down to three quarters of
     * the room it found (the waiter may run between two allocations):
     * at most 3 MiB of 512 KiB blocks stay. */
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&q[i], 256 << 10));
    live_settles(TESTDRV_DEVICE, 4 + 6, 500);
    cr_expect_leq(program_live(TESTDRV_DEVICE), 4 + 6,
                  "%llu blocks: expected the 4 new and at most 6 of 512 KiB (3 MiB)",
                  (unsigned long long)program_live(TESTDRV_DEVICE));
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(q[i]));
}

/* CUDEFER_DEVICE_CACHE_PEAK=200: the program's memory plus the cache may
 * reach twice its peak. The same step, then the four new blocks of
 * another size (live 1 MiB of a 2 MiB peak: room 3 MiB): the four cached
 * ones of 2 MiB stay, where a room of 1 MiB (100) sends some back. */
static uint64_t cached_after_growing(const char *percent)
{
    setenv("CUDEFER_DEVICE_CACHE", "1M", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", percent, 1);
    test_context();
    CUdeviceptr p[4], q[4];
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&p[i], 512 << 10));
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(p[i]));
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&q[i], 256 << 10));
    usleep(50000); /* the waiter's turn */
    return program_live(TESTDRV_DEVICE) - 4;
}

Test(reuse, device_cache_peak_percent_keeps_more, .timeout = 10)
{
    uint64_t cached = cached_after_growing("200");
    cr_expect_eq(cached, 4, "kept %llu of 4 blocks within twice the peak",
                 (unsigned long long)cached);
}

Test(reuse, device_cache_peak_percent_of_100, .timeout = 10)
{
    uint64_t cached = cached_after_growing("100");
    cr_expect_leq(cached, 2, "kept %llu blocks of 512 KiB in a room of 1 MiB",
                  (unsigned long long)cached);
}

/* The peak is the program's, not the cache's: memory the program never
 * held at once is not kept beyond CUDEFER_DEVICE_CACHE. */
Test(reuse, device_cache_peak_is_what_was_held_at_once, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "1M", 1);
    test_context();
    uint64_t frees = testdrv_calls("cuMemFreeAsync");
    for (int i = 0; i < 8; i++) {
        CUdeviceptr p;
        /* A new size each time: no reuse, one block held at a time. */
        CU_OK(cuMemAlloc(&p, (size_t)(512 + i) << 10));
        CU_OK(cuMemFree(p));
        usleep(5000);
    }
    live_settles(TESTDRV_DEVICE, 1, 500);
    cr_expect_leq(program_live(TESTDRV_DEVICE), 2, "kept %llu blocks beyond the 1 MiB cache",
                  (unsigned long long)program_live(TESTDRV_DEVICE));
    cr_expect_geq(testdrv_calls("cuMemFreeAsync"), frees + 6, "expected six blocks evicted");
}

/* Each release's fence takes an event from its context's pool. A
 * synchronisation keeps as many spare events as were out at once since the
 * previous one, so a loop that releases as many blocks between two of its
 * synchronisations makes no new events (nor destroys any) after its first
 * round; cudefer_flush trims the pool back. */
static uint64_t events_destroyed(void)
{
    return testdrv_calls("cuEventDestroy") + testdrv_calls("cuEventDestroy_v2");
}

Test(reuse, fence_events_kept_across_synchronisations, .timeout = 10)
{
    test_context();
    enum { N = 300 };
    CUdeviceptr p[N];
    uint64_t made[3], gone[3];
    for (int round = 0; round < 3; round++) {
        uint64_t c0 = testdrv_calls("cuEventCreate"), d0 = events_destroyed();
        /* New sizes each round: the cache serves none of them. */
        for (int i = 0; i < N; i++)
            CU_OK(cuMemAlloc(&p[i], (size_t)(round + 1) << 12));
        for (int i = 0; i < N; i++)
            CU_OK(cuMemFree(p[i]));
        CU_OK(cuCtxSynchronize());
        made[round] = testdrv_calls("cuEventCreate") - c0;
        gone[round] = events_destroyed() - d0;
    }
    cr_expect_geq(made[0], N / 2, "the first round made %llu events", (unsigned long long)made[0]);
    for (int round = 1; round < 3; round++) {
        cr_expect_leq(made[round], 16, "round %d made %llu events", round,
                      (unsigned long long)made[round]);
        cr_expect_leq(gone[round], 16, "round %d destroyed %llu events", round,
                      (unsigned long long)gone[round]);
    }
    uint64_t d0 = events_destroyed();
    cudefer_flush();
    cr_expect_geq(events_destroyed() - d0, N / 2,
                  "cudefer_flush kept the spare events");
}

/* From the program's side, with threads: at any moment the threads all
 * stop at, once the waiter has had its turn, the device memory the driver
 * has out (the program's plus cudefer's cache) is at most
 * CUDEFER_DEVICE_CACHE_PEAK percent of the most the program held at once,
 * or what it holds plus CUDEFER_DEVICE_CACHE. The program counts a block
 * as its own from before its allocation until after its release, so that
 * its peak is at least the one cudefer sees. */
#define PEAK_THREADS 4
#define PEAK_ROUNDS 30
#define PEAK_OPS 40
#define PEAK_HELD 6

struct peak_run {
    CUcontext ctx;
    pthread_barrier_t stop, go;
    _Atomic long long live, peak;
    long long percent;
};

struct peak_worker {
    struct peak_run *run;
    unsigned seed;
};

static void peak_note(struct peak_run *run, long long delta)
{
    long long now = atomic_fetch_add(&run->live, delta) + delta;
    long long most = atomic_load(&run->peak);
    while (now > most && !atomic_compare_exchange_weak(&run->peak, &most, now))
        ;
}

static void *peak_thread(void *arg)
{
    static const size_t sizes[] = {4 << 10, 12 << 10, 64 << 10, 200 << 10,
                                   512 << 10, 1 << 20, 3 << 20, 8 << 20};
    struct peak_worker *w = arg;
    CUdeviceptr held[PEAK_HELD];
    size_t bytes[PEAK_HELD];
    int n = 0;
    if (cuCtxSetCurrent(w->run->ctx) != CUDA_SUCCESS)
        return (void *)1;
    for (int round = 0; round < PEAK_ROUNDS; round++) {
        for (int op = 0; op < PEAK_OPS; op++) {
            if (n < PEAK_HELD && (n == 0 || rand_r(&w->seed) % 2)) {
                size_t b = sizes[rand_r(&w->seed) % 8];
                peak_note(w->run, (long long)b);
                if (cuMemAlloc(&held[n], b) != CUDA_SUCCESS)
                    return (void *)2;
                bytes[n++] = b;
            } else {
                int i = (int)(rand_r(&w->seed) % (unsigned)n);
                if (cuMemFree(held[i]) != CUDA_SUCCESS)
                    return (void *)3;
                peak_note(w->run, -(long long)bytes[i]);
                held[i] = held[--n];
                bytes[i] = bytes[n];
            }
        }
        pthread_barrier_wait(&w->run->stop); /* main checks */
        pthread_barrier_wait(&w->run->go);
    }
    while (n > 0) {
        n--;
        if (cuMemFree(held[n]) != CUDA_SUCCESS)
            return (void *)3;
        peak_note(w->run, -(long long)bytes[n]);
    }
    return NULL;
}

static void footprint_within_the_peak(const char *percent)
{
    struct peak_run run = {.percent = atoll(percent)};
    setenv("CUDEFER_DEVICE_CACHE", "64k", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", percent, 1);
    run.ctx = test_context();
    size_t base = program_live_bytes(TESTDRV_DEVICE);
    pthread_barrier_init(&run.stop, NULL, PEAK_THREADS + 1);
    pthread_barrier_init(&run.go, NULL, PEAK_THREADS + 1);
    pthread_t t[PEAK_THREADS];
    struct peak_worker w[PEAK_THREADS];
    for (int i = 0; i < PEAK_THREADS; i++) {
        w[i] = (struct peak_worker){&run, 7u + (unsigned)i};
        cr_assert_eq(pthread_create(&t[i], NULL, peak_thread, &w[i]), 0);
    }
    long long worst = 0, kept = 0;
    for (int round = 0; round < PEAK_ROUNDS; round++) {
        pthread_barrier_wait(&run.stop);
        long long live = atomic_load(&run.live), peak = atomic_load(&run.peak);
        long long bound = peak * run.percent / 100;
        if (live + (64 << 10) > bound)
            bound = live + (64 << 10);
        long long out = 0;
        for (int ms = 0; ms < 1000; ms++) {
            out = (long long)(program_live_bytes(TESTDRV_DEVICE) - base);
            if (out <= bound)
                break;
            usleep(1000);
        }
        cr_expect_leq(out, bound, "round %d: %lld bytes out, the program holding %lld of a "
                      "peak of %lld (bound %lld)", round, out, live, peak, bound);
        worst = out - bound > worst ? out - bound : worst;
        kept = out - live > kept ? out - live : kept;
        pthread_barrier_wait(&run.go);
    }
    for (int i = 0; i < PEAK_THREADS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_expect_null(ret, "thread %d: a call failed (%p)", i, ret);
    }
    /* The cache did keep blocks (the bound is not met by keeping none). */
    cr_expect_gt(kept, 64 << 10, "the cache never held more than 64 KiB");
    cr_expect_eq(testdrv_faults(), 0);
    pthread_barrier_destroy(&run.stop);
    pthread_barrier_destroy(&run.go);
}

Test(reuse, footprint_within_the_peak_at_100, .timeout = 60)
{
    footprint_within_the_peak("100");
}

Test(reuse, footprint_within_the_peak_at_200, .timeout = 60)
{
    footprint_within_the_peak("200");
}

/* The report says what the program held at its peak (what
 * CUDEFER_DEVICE_CACHE_PEAK is a percentage of) beside what the cache
 * held: eight blocks of 512 KiB at once, then released and taken again. */
static void eight_blocks_twice(void)
{
    test_context();
    CUdeviceptr p[8];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 8; i++)
            if (cuMemAlloc(&p[i], 512 << 10) != CUDA_SUCCESS)
                exit(1);
        for (int i = 0; i < 8; i++)
            if (cuMemFree(p[i]) != CUDA_SUCCESS)
                exit(1);
        usleep(20000);
    }
    CUdeviceptr big;
    /* One more, after the others went back: not a new peak. */
    if (cuCtxSynchronize() != CUDA_SUCCESS || cuMemAlloc(&big, 3 << 20) != CUDA_SUCCESS ||
        cuMemFree(big) != CUDA_SUCCESS)
        exit(1);
}

Test(reuse, report_says_the_programs_peak, .timeout = 10)
{
    char text[8192];
    report_of(eight_blocks_twice, text, sizeof text);
    cr_expect_eq(json_number(text, "\"peak_program_device_bytes\": "), 8 * (512 << 10), "%s",
                 text);
    cr_expect_eq(json_number(text, "\"peak_cached_device_bytes\": "), 8 * (512 << 10), "%s",
                 text);
}

/* The count of cached blocks: 256 at the default limit, one a MiB of a
 * larger CUDEFER_DEVICE_CACHE (a model's many activations of a few MiB each
 * must not be bounded by their count instead). */
static uint64_t cached_after_releasing(int n)
{
    test_context();
    CUdeviceptr *p = calloc((size_t)n, sizeof *p);
    cr_assert_not_null(p);
    for (int i = 0; i < n; i++)
        CU_OK(cuMemAlloc(&p[i], 4096));
    for (int i = 0; i < n; i++)
        CU_OK(cuMemFree(p[i]));
    free(p);
    usleep(50000);
    return program_live(TESTDRV_DEVICE);
}

Test(reuse, device_cache_count_at_the_default, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "0", 1);
    uint64_t live = cached_after_releasing(400);
    cr_expect_leq(live, 256, "kept %llu blocks, more than 256", (unsigned long long)live);
    cr_expect_geq(live, 192, "kept %llu blocks: evicted below three quarters",
                  (unsigned long long)live);
}

/* With the program's peak (the default) the count is what it held. */
Test(reuse, device_cache_count_follows_the_peak, .timeout = 10)
{
    uint64_t live = cached_after_releasing(400);
    cr_expect_eq(live, 400, "kept %llu of the 400 blocks the program held at once",
                 (unsigned long long)live);
}

Test(reuse, device_cache_count_grows_with_its_bytes, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "1G", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "0", 1);
    uint64_t live = cached_after_releasing(400);
    cr_expect_eq(live, 400, "kept %llu of 400 blocks under a 1 GiB cache",
                 (unsigned long long)live);
}

/* The same eviction while kernels still write the blocks: the stream-ordered
 * frees wait for them on the GPU (with one context known the fence is the
 * context's record, which the private stream does not wait for by itself),
 * and the releases do not wait on the host. */
Test(reuse, device_cache_eviction_under_writers, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "1M", 1);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", "0", 1);
    test_context();
    CUstream s;
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&p[i], 512 << 10));
    for (int i = 0; i < 4; i++)
        CU_OK(testdrv_launch(s, 200000, p[i], 512 << 10, TESTDRV_WRITE));
    uint64_t frees = testdrv_calls("cuMemFreeAsync");
    uint64_t waits = testdrv_thread_wait_calls();
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(p[i]));
    cr_expect_eq(testdrv_thread_wait_calls(), waits, "a release waited");
    cr_expect_eq(testdrv_calls("cuMemFreeAsync"), frees + 2, "expected two blocks evicted");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0, "an evicted block was freed under its writer");
}

/* The fence of a release: with one context known, that context's record
 * alone (no stream wait, no second record); once a second context is
 * known, that context records its work too. */
struct fence_calls {
    uint64_t ctx_records, stream_waits, writes;
};

static struct fence_calls fence_calls_of_a_release(void)
{
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, 4096));
    uint64_t rec = testdrv_calls("cuCtxRecordEvent"), wait = testdrv_calls("cuStreamWaitEvent");
    uint64_t write = testdrv_calls("cuStreamWriteValue32_v2");
    CU_OK(cuMemFree(p));
    return (struct fence_calls){testdrv_calls("cuCtxRecordEvent") - rec,
                                testdrv_calls("cuStreamWaitEvent") - wait,
                                testdrv_calls("cuStreamWriteValue32_v2") - write};
}

Test(fence, one_record_with_one_context, .timeout = 10)
{
    test_context();
    struct fence_calls one = fence_calls_of_a_release();
    /* A watch of the waiting avoided may add a record of its own. */
    cr_expect(one.ctx_records >= 1 && one.ctx_records <= 2, "%llu context records",
              (unsigned long long)one.ctx_records);
    /* The word's write is asked for by a reuse, not by the release. */
    cr_expect_eq(one.stream_waits, 0);
    cr_expect_eq(one.writes, 0);
    /* A registration's release, whose caller waits for its fence at once,
     * keeps the private stream's wait and record (fence.h). */
    char *pages = aligned_alloc(4096, 4096);
    CU_OK(cuMemHostRegister(pages, 4096, 0));
    uint64_t wait = testdrv_calls("cuStreamWaitEvent");
    CU_OK(cuMemHostUnregister(pages));
    cr_expect_geq(testdrv_calls("cuStreamWaitEvent") - wait, 1);

    CUcontext first = test_context(), second;
    CUdevice dev;
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuCtxCreate(&second, NULL, 0, dev));
    CUdeviceptr q;
    CU_OK(cuMemAlloc(&q, 4096)); /* the engine knows the second context now */
    CU_OK(cuCtxSetCurrent(first));
    struct fence_calls two = fence_calls_of_a_release();
    cr_expect_geq(two.ctx_records, 2, "the other context was not fenced");
    /* The other context's record is joined on the host: no stream of the
     * first context waits for it (its synchronisation would). */
    cr_expect_eq(two.stream_waits, 0);
    cr_expect_eq(two.writes, 0);
    CU_OK(cuCtxSetCurrent(second));
    CU_OK(cuMemFree(q));
    CU_OK(cuCtxDestroy(second));
}

/* Four blocks released, their kernels ended, four allocations of their
 * size: with CUDEFER_FENCE_WORD=1 the first look asks the GPU for the word
 * (one record, one stream wait, one write), and the looks after read it:
 * one write for the four. Without the word (CUDEFER_FENCE_WORD=0), no write,
 * and no pinned word made. */
static uint64_t writes_of_four_reuses(void)
{
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p[4], q[4];
    for (int i = 0; i < 4; i++) {
        CU_OK(cuMemAlloc(&p[i], 4096));
        CU_OK(testdrv_launch(s, 20000, p[i], 4096, TESTDRV_WRITE));
    }
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(p[i]));
    CU_OK(cuStreamSynchronize(s));
    uint64_t writes = testdrv_calls("cuStreamWriteValue32_v2");
    for (int i = 0; i < 4; i++) {
        usleep(20000);
        CU_OK(cuMemAlloc(&q[i], 4096));
        cr_expect_eq(q[i], p[i], "block %d was not reused", i);
    }
    writes = testdrv_calls("cuStreamWriteValue32_v2") - writes;
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(q[i]));
    return writes;
}

Test(fence, one_word_written_for_many_reuses, .timeout = 10)
{
    setenv("CUDEFER_FENCE_WORD", "1", 1);
    cr_expect_eq(writes_of_four_reuses(), 1);
    cr_expect_eq(testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES), 1);
}

Test(fence, one_word_by_default, .timeout = 10)
{
    unsetenv("CUDEFER_FENCE_WORD");
    cr_expect_eq(writes_of_four_reuses(), 1);
    cr_expect_eq(testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES), 1);
}

Test(fence, no_word_written_without_it, .timeout = 10)
{
    setenv("CUDEFER_FENCE_WORD", "0", 1);
    cr_expect_eq(writes_of_four_reuses(), 0);
    cr_expect_eq(testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES), 0);
}

/* ---- fences across contexts, joined on the host ---------------------------- */

/* A kernel of device 1's context spins on a flag that the test sets only
 * after its calls in device 0's context, as a thread per GPU driving
 * collectives would (common.h: a watchdog ends it after 2 s). */
static void spin_in(CUcontext ctx, struct spin *sp)
{
    CU_OK(cuCtxSetCurrent(ctx));
    spin_start(sp, test_stream(CU_STREAM_NON_BLOCKING));
}

static void spin_end(CUcontext ctx, struct spin *sp)
{
    spin_release(sp);
    CU_OK(cuCtxSetCurrent(ctx));
    CU_OK(cuCtxSynchronize());
}

/* After a release in device 0's context, its synchronisation waits for its
 * own work only (the driver's does), and keeps the block, which the
 * spinning kernel, submitted before the release, may still use through
 * peer access; once that kernel has ended, the next synchronisation
 * releases it. */
static void own_synchronisation(enum what what)
{
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(a));
    struct object o = make(what);
    struct spin sp = {0};
    spin_in(b, &sp);
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(release(&o));
    uint64_t foreign = testdrv_thread_foreign_syncs(), t0 = now_ns();
    CU_OK(cuCtxSynchronize());
    uint64_t took = now_ns() - t0;
    bool flag_set = sp.flag;
    cr_expect_eq(testdrv_thread_foreign_syncs(), foreign,
                 "the synchronisation waited for the other context's kernel");
    cr_expect(!flag_set && took < 1000 * MS, "the synchronisation took %.0f ms",
              (double)took / MS);
    enum testdrv_kind kind = live_kind(what);
    cr_expect_eq(program_live(kind), 1, "released while another context's kernel could use it");
    spin_end(b, &sp);
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuCtxSynchronize());
    live_settles(kind, 0, 500);
    cr_expect_eq(program_live(kind), 0, "kept after the other context's kernel ended");
    cr_expect_eq(testdrv_faults(), 0);
}

Test(across, device_synchronisation_waits_for_its_own_context, .timeout = 20)
{
    own_synchronisation(DEVICE);
}
Test(across, pinned_synchronisation_waits_for_its_own_context, .timeout = 20)
{
    own_synchronisation(HOST);
}
Test(across, managed_synchronisation_waits_for_its_own_context, .timeout = 20)
{
    own_synchronisation(MANAGED);
}

/* A released block is not handed out again while a kernel of another
 * context submitted before its release still writes it, even once its own
 * context's record has passed; it is once that kernel has ended. */
Test(across, reuse_waits_for_another_contexts_kernel, .timeout = 20)
{
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(b));
    CUstream sb = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuCtxSetCurrent(a));
    CUdeviceptr buf, other, again;
    CU_OK(cuMemAlloc(&buf, 1 << 20));
    CU_OK(testdrv_launch(sb, 300000, buf, 1 << 20, TESTDRV_WRITE));
    CU_OK(cuMemFree(buf));
    usleep(20000); /* device 0's own record has passed */
    CU_OK(cuMemAlloc(&other, 1 << 20));
    cr_expect_neq(other, buf, "reused while another context's kernel writes it");
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuMemAlloc(&again, 1 << 20));
    cr_expect_eq(again, buf, "not reused once the other context's kernel ended");
    CU_OK(cuMemFree(again));
    CU_OK(cuMemFree(other));
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(testdrv_faults(), 0);
}

/* More releases than another context's ring holds records for: its newest
 * record is made again for the later ones, and then stands for every fence
 * from its first on. A block released while work submitted before it still
 * runs there is not reused once only the older records have completed. */
static volatile int ring_first, ring_second;

Test(across, a_full_ring_holds_back_what_its_newest_record_covers, .timeout = 20)
{
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(b));
    CUstream sb = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(testdrv_launch_spin(sb, &ring_first));
    CU_OK(cuCtxSetCurrent(a));
    enum { SMALL = 40, ODD = (1 << 20) + 4096 };
    CUdeviceptr small[SMALL], odd, again;
    for (int i = 0; i < SMALL; i++)
        CU_OK(cuMemAlloc(&small[i], 4096));
    CU_OK(cuMemAlloc(&odd, ODD));
    for (int i = 0; i < 31; i++) /* records 1-31 of b's ring: the first kernel */
        CU_OK(cuMemFree(small[i]));
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(testdrv_launch_spin(sb, &ring_second));
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuMemFree(odd)); /* record 32 fills the ring: both kernels */
    for (int i = 31; i < SMALL; i++) /* made again into record 32 */
        CU_OK(cuMemFree(small[i]));
    ring_first = 1;
    usleep(30000); /* records 1-31 complete; the second kernel still runs */
    CU_OK(cuMemAlloc(&again, ODD));
    cr_expect_neq(again, odd, "reused while the other context's kernel submitted before its "
                  "release still ran");
    ring_second = 1;
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxSetCurrent(a));
    CUdeviceptr later;
    CU_OK(cuMemAlloc(&later, ODD));
    cr_expect_eq(later, odd, "not reused once the other context's work ended");
    CU_OK(cuMemFree(later));
    CU_OK(cuMemFree(again));
    CU_OK(cuCtxSynchronize());
}

/* Without a device cache, a block whose other context's record has not
 * passed waits on the books; the waiter frees it once it has, with no call
 * of the program. */
Test(across, uncached_block_freed_by_the_waiter, .timeout = 20)
{
    setenv("CUDEFER_DEVICE_CACHE", "0", 1);
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(a));
    /* The driver's one-time set-up of stream-ordered frees (a block of its
     * own, counted live) is done before the count below. */
    cr_assert_eq(cudefer_flush(), 0);
    CUdeviceptr buf;
    CU_OK(cuMemAlloc(&buf, 1 << 20));
    struct spin sp = {0};
    spin_in(b, &sp);
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuMemFree(buf));
    usleep(50000);
    size_t live = program_live(TESTDRV_DEVICE);
    cr_expect_eq(live, 1, "%zu live device blocks: freed under another context's kernel", live);
    sp.flag = 1;
    live_settles(TESTDRV_DEVICE, 0, 1000);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0, "the waiter did not free it");
    spin_end(b, &sp);
    cr_expect_eq(testdrv_faults(), 0);
}

/* ---- out-of-memory storms ------------------------------------------------ */

struct storm {
    CUcontext ctx;
    atomic_int oom, other;
};

static void *storm_thread(void *arg)
{
    struct storm *st = arg;
    cuCtxSetCurrent(st->ctx);
    CUstream s;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        atomic_fetch_add(&st->other, 1);
        return NULL;
    }
    for (int i = 0; i < 40; i++) {
        CUdeviceptr p;
        void *h;
        CUresult rc = cuMemAlloc(&p, (24 + i % 8) << 20);
        if (rc == CUDA_SUCCESS) {
            testdrv_launch(s, 200, p, 4096, TESTDRV_WRITE);
            if (cuMemFree(p) != CUDA_SUCCESS)
                atomic_fetch_add(&st->other, 1);
        } else {
            atomic_fetch_add(rc == CUDA_ERROR_OUT_OF_MEMORY ? &st->oom : &st->other, 1);
        }
        rc = cuMemAllocHost(&h, (6 + i % 4) << 20);
        if (rc == CUDA_SUCCESS) {
            if (cuMemFreeHost(h) != CUDA_SUCCESS)
                atomic_fetch_add(&st->other, 1);
        } else {
            atomic_fetch_add(rc == CUDA_ERROR_OUT_OF_MEMORY ? &st->oom : &st->other, 1);
        }
    }
    cuStreamDestroy(s);
    return NULL;
}

/* Eight threads keep allocating blocks of a device (and pinned host memory)
 * that holds only a few of them at once, freeing each at once: flushes and
 * retries from several threads at the same time neither crash, nor hang,
 * nor fail with anything but out-of-memory, and nothing is left over. */
Test(oom, storm_from_several_threads, .timeout = 60)
{
    setenv("TESTDRIVER_DEVICE_BYTES", "134217728", 1);
    setenv("TESTDRIVER_HOST_BYTES", "67108864", 1);
    struct storm st = {.ctx = test_context()};
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, storm_thread, &st);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&st.other), 0, "a call failed with something else than OOM");
    /* 8 threads x 31 MiB at most fit in 128 MiB only with frees returned
     * promptly; some OOM under the storm is allowed, most must succeed. */
    cr_expect_lt(atomic_load(&st.oom), 8 * 40, "every allocation failed");
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(cudefer_flush(), 0);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0);
    cr_expect_eq(program_live(TESTDRV_HOST), 0);
    cr_expect_eq(testdrv_faults(), 0);
}

/* A capture also ends when its stream is destroyed: releases are fenced
 * again at once, not left queued until the next flush. */
Test(capture, ends_with_its_stream, .timeout = 10)
{
    setenv("CUDEFER_DEVICE_CACHE", "0", 1);
    test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    cuStreamDestroy(s); /* whatever the driver answers, the capture is over */
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, 4096));
    uint64_t frees = testdrv_calls("cuMemFreeAsync");
    CU_OK(cuMemFree(p));
    cr_expect_eq(testdrv_calls("cuMemFreeAsync"), frees + 1,
                 "the release stayed queued as if the capture were live");
}

/* A capture belongs to its stream's context, not to the context current
 * when it began: destroying that other context does not end it, so a
 * release afterwards only queues and the capture stays valid. */
Test(capture, belongs_to_its_streams_context, .timeout = 10)
{
    CUcontext a = test_context();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, 4096));
    CUdevice dev;
    CUcontext b;
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuCtxCreate(&b, NULL, 0, dev)); /* b is current now */
    CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cuCtxDestroy(b));
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuMemFree(p));
    CUgraph g;
    cr_expect_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS, "the capture was invalidated");
    cr_expect_eq(testdrv_invalidated_captures(), 0);
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(cudefer_flush(), 0);
    cr_expect_eq(program_live(TESTDRV_DEVICE), 0, "the release queued during capture stayed");
}

/* ---- what cuMemGetInfo says ---------------------------------------------- */

/* Sets up the current context's slot (a release, then everything given
 * back), so that what follows starts from nothing held. */
static void settle_context(void)
{
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, 4096));
    CU_OK(cuMemFree(d));
    CU_OK(cuCtxSynchronize());
    cr_assert_eq(cudefer_flush(), 0);
    for (int i = 0; i < 500 && testdrv_pending_free_bytes(); i++)
        usleep(1000);
}

/* Device memory the program released and cudefer holds (here: its fences
 * wait for a running kernel) counts as free, as after the driver's own
 * waiting releases; the driver alone counts it as used until cudefer
 * hands it back. */
Test(meminfo, released_device_memory_counts_free, .timeout = 10)
{
    test_context();
    settle_context();
    size_t f0 = 0, t0 = 0;
    CU_OK(cuMemGetInfo_v2(&f0, &t0));
    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemAlloc(&p[i], 2 << 20));
    size_t f_live = 0, t = 0;
    CU_OK(cuMemGetInfo_v2(&f_live, &t));
    cr_assert_eq(f_live, f0 - (4 * (2 << 20)), "the program's own blocks must count as used");
    size_t in_driver = testdrv_live_bytes(TESTDRV_DEVICE);
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    for (int i = 0; i < 4; i++)
        CU_OK(cuMemFree(p[i]));
    size_t f1 = 0;
    CU_OK(cuMemGetInfo_v2(&f1, &t));
    cr_expect_eq(t, t0);
    cr_expect_eq(testdrv_live_bytes(TESTDRV_DEVICE), in_driver,
                 "cudefer was expected to hold the four blocks (the driver still has them)");
    cr_expect_eq(f1, f0, "released blocks cudefer holds must count as free (%zu, want %zu)", f1,
                 f0);
    /* The 32-bit name (cuda.h maps cuMemGetInfo onto _v2), as a program
     * that binds the old symbol reaches it. */
    CUresult (*get_info_32)(unsigned *, unsigned *) =
        (CUresult(*)(unsigned *, unsigned *))dlsym(RTLD_DEFAULT, "cuMemGetInfo");
    cr_assert_not_null(get_info_32);
    unsigned f32 = 0, t32 = 0;
    CU_OK(get_info_32(&f32, &t32));
    if (f0 < UINT_MAX)
        cr_expect_eq(f32, (unsigned)f0, "the 32-bit answer differs");
    /* The synchronisation hands them to the driver and settles them before
     * it returns (their fences passed in the program's own wait): right
     * after it the figure is the driver's own, with nothing left for the
     * waiter, and it stays there. */
    CU_OK(cuCtxSynchronize());
    size_t f2 = 0;
    CU_OK(cuMemGetInfo_v2(&f2, &t));
    cr_expect_eq(f2, f0, "right after the synchronisation: %zu, want %zu", f2, f0);
    cr_expect_eq(testdrv_pending_free_bytes(), 0,
                 "the synchronisation left %zu bytes of frees unsettled",
                 testdrv_pending_free_bytes());
    usleep(20000);
    CU_OK(cuMemGetInfo_v2(&f2, &t));
    cr_expect_eq(f2, f0, "after the waiter's passes: %zu, want %zu", f2, f0);
}

/* Small blocks too: they move the real driver's figure byte for byte
 * (bench/RESULTS.md, run 81), and the synchronisation settles them. */
Test(meminfo, small_blocks_are_settled_by_the_synchronisation, .timeout = 10)
{
    test_context();
    settle_context();
    size_t f0 = 0, t = 0;
    CU_OK(cuMemGetInfo_v2(&f0, &t));
    CUdeviceptr p[8];
    for (int i = 0; i < 8; i++)
        CU_OK(cuMemAlloc(&p[i], 64 << 10));
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 100000, 0, 0, TESTDRV_NONE));
    for (int i = 0; i < 8; i++)
        CU_OK(cuMemFree(p[i]));
    CU_OK(cuCtxSynchronize());
    size_t f = 0;
    CU_OK(cuMemGetInfo_v2(&f, &t));
    cr_expect_eq(f, f0, "right after the synchronisation: %zu, want %zu", f, f0);
    cr_expect_eq(testdrv_pending_free_bytes(), 0, "the synchronisation left %zu bytes unsettled",
                 testdrv_pending_free_bytes());
}

/* Only the current context's device: blocks held for a context of another
 * device are not added to its answer (each device has its own capacity). */
Test(meminfo, another_devices_blocks_are_not_added, .timeout = 10)
{
    CUcontext a, b;
    two_devices(&a, &b);
    CU_OK(cuCtxSetCurrent(b));
    settle_context();
    CU_OK(cuCtxSetCurrent(a));
    settle_context();
    size_t fa = 0, t = 0;
    CU_OK(cuMemGetInfo_v2(&fa, &t));
    CU_OK(cuCtxSetCurrent(b));
    size_t f0 = 0;
    CU_OK(cuMemGetInfo_v2(&f0, &t));
    CUdeviceptr d;
    CU_OK(cuMemAlloc(&d, 1 << 20));
    size_t in_driver = testdrv_live_bytes(TESTDRV_DEVICE);
    CU_OK(testdrv_launch(test_stream(CU_STREAM_NON_BLOCKING), 300000, 0, 0, TESTDRV_NONE));
    CU_OK(cuMemFree(d));
    cr_assert_eq(testdrv_live_bytes(TESTDRV_DEVICE), in_driver,
                 "cudefer was expected to hold the block (the driver still has it)");
    size_t f = 0;
    CU_OK(cuMemGetInfo_v2(&f, &t));
    cr_expect_eq(f, f0, "device 1's own answer adds its block");
    CU_OK(cuCtxSetCurrent(a));
    CU_OK(cuMemGetInfo_v2(&f, &t));
    cr_expect_eq(f, fa, "device 0's answer must not add device 1's block");
    CU_OK(cuCtxSetCurrent(b));
    CU_OK(cuCtxSynchronize());
}
