/* green.c - check 13: releases in green contexts, and what is left once
 * they are destroyed.
 *
 * Three green contexts, one after the other (cuDeviceGetDevResource,
 * cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate,
 * cuCtxFromGreenCtx, current while it lives). In each, while a 300 ms
 * kernel on a green stream keeps writing a 64 MiB device block allocated
 * there: a 64 MiB device block and a 16 MiB pinned block are allocated and
 * freed, then the written block itself is freed; then the green stream is
 * synchronised (a release that does not wait for the green kernel makes it
 * fault), its stream destroyed and the green context destroyed. At the end
 * cuCtxSynchronize on the primary context, and device memory in use above
 * the level before the first green context, once it settles (sampled for
 * up to 1 s). The driver alone leaves about nothing.
 *
 * The green entry points are looked up with cuGetProcAddress, so that the
 * program starts on a driver without them and says so.
 *
 * usage: green
 *
 * prints, per green context:
 *   RESULT green ctx=<i> alloc_rc=<code> free_rc=<code> alloc_host_rc=<code>
 *          free_host_rc=<code> release_rc=<code> writer_running=<0|1>
 *          sync_rc=<code> fault=<0|1> destroy_rc=<code>
 * and at the end
 *   RESULT green_memory held_mib=<n> settle_ms=<ms> sync_rc=<code>
 *          cudefer=<0|1> simulated=<0|1>
 * or, when a green context cannot be set up:
 *   RESULT green_setup ok=0 step=<call> rc=<code> cudefer=<0|1> simulated=<0|1>
 * (writer_running: the kernel still ran just before the release of the
 * block it writes; else the row means nothing).
 */
#include "gpu.h"

#define CONTEXTS 3
#define BLOCK_BYTES (64 * GC_MIB)
#define PINNED_BYTES (16 * GC_MIB)
#define WRITER_MS 300.0
#define SETTLE_MS 1000.0
#define HELD_GOAL_MIB 64.0

static struct {
    __typeof__(cuDeviceGetDevResource) *get_resource;
    __typeof__(cuDevSmResourceSplitByCount) *split;
    __typeof__(cuDevResourceGenerateDesc) *generate_desc;
    __typeof__(cuGreenCtxCreate) *create;
    __typeof__(cuGreenCtxDestroy) *destroy;
    __typeof__(cuCtxFromGreenCtx) *to_context;
    __typeof__(cuGreenCtxStreamCreate) *stream_create;
} green;

static CUkernel spin_kernel; /* of a library: loaded into each context at its use */

/* Ends the program cleanly: the green set-up step failed. */
static void setup_failed(const char *step, CUresult rc)
{
    printf("RESULT green_setup ok=0 step=%s rc=%s cudefer=%d simulated=%d\n", step, gc_rc(rc),
           gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    exit(0);
}

static void find(const char *name, void **fn)
{
    CUdriverProcAddressQueryResult status;
    CUresult rc = cuGetProcAddress(name, fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (rc != CUDA_SUCCESS || !*fn)
        setup_failed(name, rc != CUDA_SUCCESS ? rc : CUDA_ERROR_NOT_FOUND);
}

static void find_green_api(void)
{
    find("cuDeviceGetDevResource", (void **)&green.get_resource);
    find("cuDevSmResourceSplitByCount", (void **)&green.split);
    find("cuDevResourceGenerateDesc", (void **)&green.generate_desc);
    find("cuGreenCtxCreate", (void **)&green.create);
    find("cuGreenCtxDestroy", (void **)&green.destroy);
    find("cuCtxFromGreenCtx", (void **)&green.to_context);
    find("cuGreenCtxStreamCreate", (void **)&green.stream_create);
}

static void step(const char *what, CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        setup_failed(what, rc);
}

/* A green context of a quarter of the SMs (at least one). */
static CUgreenCtx make_green(CUdevice dev)
{
    CUdevResource all, group, rest;
    unsigned n = 1;
    step("cuDeviceGetDevResource", green.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned min = all.sm.smCount / 4 ? all.sm.smCount / 4 : 1;
    step("cuDevSmResourceSplitByCount", green.split(&group, &n, &all, &rest, 0, min));
    CUdevResourceDesc desc;
    step("cuDevResourceGenerateDesc", green.generate_desc(&desc, &group, 1));
    CUgreenCtx g;
    step("cuGreenCtxCreate", green.create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    return g;
}

static CUresult spin_on(CUstream s, double ms, CUdeviceptr buf, unsigned long long words)
{
    CUfunction f;
    CUresult rc = cuKernelGetFunction(&f, spin_kernel);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned long long ns = (unsigned long long)(ms * 1e6);
    void *args[] = {&ns, &buf, &words};
    return gc_launch(f, s, args);
}

/* One green context: its releases under a green kernel, then its end. */
static void one_green(int i, CUcontext primary, CUdevice dev)
{
    CUgreenCtx g = make_green(dev);
    CUcontext gctx;
    CUstream gs;
    step("cuCtxFromGreenCtx", green.to_context(&gctx, g));
    step("cuGreenCtxStreamCreate", green.stream_create(&gs, g, CU_STREAM_NON_BLOCKING, 0));
    GC_CHECK(cuCtxSetCurrent(gctx));
    GC_CHECK(spin_on(gs, 1.0, 0, 0)); /* the kernel's first launch here */
    GC_CHECK(cuStreamSynchronize(gs));

    CUdeviceptr written, other = 0;
    void *pinned = NULL;
    GC_CHECK(cuMemAlloc(&written, BLOCK_BYTES));
    GC_CHECK(spin_on(gs, WRITER_MS, written, BLOCK_BYTES / 4));
    gc_sleep_ms(30);
    CUresult alloc = cuMemAlloc(&other, BLOCK_BYTES);
    CUresult free_rc = alloc == CUDA_SUCCESS ? cuMemFree(other) : alloc;
    CUresult alloc_host = cuMemAllocHost(&pinned, PINNED_BYTES);
    CUresult free_host = alloc_host == CUDA_SUCCESS ? cuMemFreeHost(pinned) : alloc_host;
    bool running = cuStreamQuery(gs) == CUDA_ERROR_NOT_READY;
    CUresult release = cuMemFree(written);
    CUresult sync = cuStreamSynchronize(gs);

    GC_CHECK(cuStreamDestroy(gs));
    GC_CHECK(cuCtxSetCurrent(primary));
    CUresult destroy = green.destroy(g);
    printf("RESULT green ctx=%d alloc_rc=%s free_rc=%s alloc_host_rc=%s free_host_rc=%s", i,
           gc_rc(alloc), gc_rc(free_rc), gc_rc(alloc_host), gc_rc(free_host));
    printf(" release_rc=%s writer_running=%d sync_rc=%s fault=%d destroy_rc=%s\n", gc_rc(release),
           (int)running, gc_rc(sync), sync != CUDA_SUCCESS, gc_rc(destroy));
    fflush(stdout);
}

int main(void)
{
    CUcontext primary = gc_init();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    find_green_api();
    CUlibrary lib;
    GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&spin_kernel, lib, "cudefer_spin"));
    GC_CHECK(cuCtxSynchronize());

    double before = gc_used_mib();
    for (int i = 0; i < CONTEXTS; i++)
        one_green(i, primary, dev);
    CUresult sync = cuCtxSynchronize();
    double t0 = gc_now_ms(), held = gc_used_mib() - before;
    while (held > HELD_GOAL_MIB && gc_now_ms() - t0 < SETTLE_MS) {
        gc_sleep_ms(20);
        held = gc_used_mib() - before;
    }
    printf("RESULT green_memory held_mib=%.0f settle_ms=%.0f sync_rc=%s cudefer=%d simulated=%d\n",
           held, gc_now_ms() - t0, gc_rc(sync), gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    GC_CHECK(cuLibraryUnload(lib));
    gc_fini();
    return 0;
}
