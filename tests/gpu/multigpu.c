/* multigpu.c - releases of memory that a kernel on ANOTHER GPU still uses.
 *
 * Two devices, the primary context of each (as the CUDA runtime makes
 * them), peer access enabled both ways (cuCtxEnablePeerAccess). A writer
 * kernel (cudefer_spin from bench/kernels.h, WRITER_MS long) runs on device
 * 1 and keeps writing memory that belongs to device 0's context; SETTLE_MS
 * into it the main thread releases that memory in device 0's context. Then
 * both contexts are synchronised: device 1's cuCtxSynchronize returns
 * CUDA_ERROR_ILLEGAL_ADDRESS if the memory went away under the writer. The
 * shim fences a release behind every context it knows, so with the shim
 * every case but the control must end with fault=0. One case per process:
 * a fault kills the context.
 *
 * usage: multigpu <case>
 *   peer          device memory of device 0 (cuMemAlloc, cuMemFree), the
 *                 writer on a non-blocking stream of device 1's context
 *   peer_legacy   the same, but the writer runs on device 1's legacy
 *                 stream, launched from a context-independent library
 *                 (cuLibraryLoadData with no current context): nothing is
 *                 allocated and no stream or module is made in device 1's
 *                 context, so the shim has never seen that context (the
 *                 CUDA 12+ runtime launches its kernels this way)
 *   peer_flush    as peer, and right after the release cudefer_flush()
 *                 (when the shim is loaded) while the writer still runs:
 *                 the real release at a flush must wait for the writer too
 *   managed       managed memory allocated in device 0's context
 *                 (cuMemAllocManaged, cuMemFree), written by device 1
 *   managed_sync  as managed, and right after the release cuCtxSynchronize
 *                 in device 0's context (a flush point of the shim) while
 *                 device 1's writer still runs
 *   hostmap       pinned host memory of device 0's context
 *                 (cuMemHostAlloc PORTABLE | DEVICEMAP, cuMemFreeHost),
 *                 written by device 1 through its device pointer
 *   unsafe        the control: device memory as in peer, released with a
 *                 bare cuMemFreeAsync on a stream of device 0 followed by a
 *                 synchronisation of that stream: expected to fault, which
 *                 shows that the check can fail
 *   ctx_managed, ctx_managed_sync, ctx_hostmap, ctx_hostmap_sync
 *                 as managed, managed_sync, hostmap and hostmap with the
 *                 synchronisation, on ONE GPU: the writer runs in a second
 *                 context of device 0 (cuCtxCreate), which reaches managed
 *                 and portable mapped pinned memory with no peer access
 *                 (scripts/gpu-check.sh, check 17). Without the shim the
 *                 driver's release waits for its own context only (the
 *                 writer faults); with it, the release waits for neither,
 *                 and neither does the synchronisation of device 0's
 *                 primary context right after it (sync0_ms,
 *                 writer_after_sync0=1), while the memory stays until the
 *                 writer has ended
 *
 * prints:
 *   RESULT multigpu case=<c> devices=<n> peer=<0|1> release_rc=<code>
 *          release_ms=<ms> writer_running=<0|1> sync0_ms=<ms>
 *          writer_after_sync0=<0|1> sync1_rc=<code> sync0_rc=<code>
 *          fault=<0|1> cudefer=<0|1> simulated=<0|1>
 * (sync0_ms and writer_after_sync0 are of the synchronisation right after
 * the release, in the _sync cases; -1 otherwise)
 * or, without two devices that can reach each other:
 *   RESULT multigpu case=<c> devices=<n> peer=<0|1> skipped=1
 */
#include "gpu.h"

#include <stdbool.h>

#define BUFFER_BYTES (64 * GC_MIB)
#define WRITER_MS 400.0
#define SETTLE_MS 40.0

enum memory { DEVICE, MANAGED, HOSTMAP };

struct test {
    const char *name;
    enum memory memory;
    bool legacy;   /* writer on device 1's legacy stream, shim unaware */
    bool flush;    /* cudefer_flush right after the release */
    bool sync0;    /* cuCtxSynchronize in device 0's context right after */
    bool unsafe;   /* the control */
    bool same;     /* one GPU: the writer in a second context of device 0 */
};

static const struct test tests[] = {
    {"peer", DEVICE, false, false, false, false, false},
    {"peer_legacy", DEVICE, true, false, false, false, false},
    {"peer_flush", DEVICE, false, true, false, false, false},
    {"managed", MANAGED, false, false, false, false, false},
    {"managed_sync", MANAGED, false, false, true, false, false},
    {"hostmap", HOSTMAP, false, false, false, false, false},
    {"unsafe", DEVICE, false, false, false, true, false},
    {"ctx_managed", MANAGED, false, false, false, false, true},
    {"ctx_managed_sync", MANAGED, false, false, true, false, true},
    {"ctx_hostmap", HOSTMAP, false, false, false, false, true},
    {"ctx_hostmap_sync", HOSTMAP, false, false, true, false, true},
};

/* The peer-access calls, looked up so that scripts/gpu-multi.sh can smoke-
 * test this program over the project's test driver, which has none of them
 * (then GPU_MULTI_SMOKE=1 makes every device pair reachable). */
static CUresult can_access(int *can, CUdevice dev, CUdevice peer)
{
    __typeof__(cuDeviceCanAccessPeer) *fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "cuDeviceCanAccessPeer");
    if (fn)
        return fn(can, dev, peer);
    *can = getenv("GPU_MULTI_SMOKE") != NULL;
    return CUDA_SUCCESS;
}

/* Kernels of context `from` may use the memory of context `to`. */
static void enable_peer(CUcontext from, CUcontext to)
{
    __typeof__(cuCtxEnablePeerAccess) *fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "cuCtxEnablePeerAccess");
    GC_CHECK(cuCtxSetCurrent(from));
    CUresult rc = fn ? fn(to, 0) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        gc_fail("cuCtxEnablePeerAccess", rc, __FILE__, __LINE__);
}

int main(int argc, char **argv)
{
    const struct test *t = NULL;
    for (size_t i = 0; argc == 2 && i < sizeof tests / sizeof tests[0]; i++)
        if (strcmp(argv[1], tests[i].name) == 0)
            t = &tests[i];
    if (!t)
        gc_die("usage: multigpu <peer|peer_legacy|peer_flush|managed|managed_sync|hostmap|"
               "unsafe|ctx_managed|ctx_managed_sync|ctx_hostmap|ctx_hostmap_sync>");

    GC_CHECK(cuInit(0));
    int ndev = 0, can01 = 0, can10 = 0;
    GC_CHECK(cuDeviceGetCount(&ndev));
    CUdevice dev0 = 0, dev1 = 1;
    if (ndev >= 2 && !t->same) {
        GC_CHECK(cuDeviceGet(&dev0, 0));
        GC_CHECK(cuDeviceGet(&dev1, 1));
        GC_CHECK(can_access(&can01, dev0, dev1));
        GC_CHECK(can_access(&can10, dev1, dev0));
    }
    bool peer = can01 && can10;
    if (!t->same && (ndev < 2 || !peer)) {
        printf("RESULT multigpu case=%s devices=%d peer=%d skipped=1\n", t->name, ndev, peer);
        return 0;
    }

    /* The kernel for device 1. In peer_legacy it comes from a library loaded
     * while no context is current: the shim sees no context at that load. */
    CUlibrary lib = NULL;
    CUkernel spin_kernel = NULL;
    if (t->legacy) {
        GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
        GC_CHECK(cuLibraryGetKernel(&spin_kernel, lib, "cudefer_spin"));
    }

    CUcontext ctx0, ctx1;
    GC_CHECK(cuDevicePrimaryCtxRetain(&ctx0, dev0));
    if (t->same) {
        GC_CHECK(cuCtxCreate(&ctx1, NULL, 0, dev0));
    } else {
        GC_CHECK(cuDevicePrimaryCtxRetain(&ctx1, dev1));
        enable_peer(ctx0, ctx1);
        enable_peer(ctx1, ctx0);
    }

    /* Device 1: the writer's stream and function. */
    GC_CHECK(cuCtxSetCurrent(ctx1));
    CUstream s1 = CU_STREAM_LEGACY;
    CUfunction spin;
    struct gc_kernels k1 = {0};
    if (t->legacy) {
        /* Not wrapped by the shim: the context stays unseen. */
        GC_CHECK(cuKernelGetFunction(&spin, spin_kernel));
    } else {
        gc_load_kernels(&k1);
        spin = k1.spin;
        GC_CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    }

    /* Device 0: the memory, and for the control a stream of its own. */
    GC_CHECK(cuCtxSetCurrent(ctx0));
    CUdeviceptr buf = 0;
    void *host = NULL;
    switch (t->memory) {
    case DEVICE: GC_CHECK(cuMemAlloc(&buf, BUFFER_BYTES)); break;
    case MANAGED: GC_CHECK(cuMemAllocManaged(&buf, BUFFER_BYTES, CU_MEM_ATTACH_GLOBAL)); break;
    case HOSTMAP:
        GC_CHECK(cuMemHostAlloc(&host, BUFFER_BYTES,
                                CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
        break;
    }
    CUstream s0 = NULL;
    if (t->unsafe)
        GC_CHECK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));

    /* Device 1 reaches the memory: a short write first (peer mapping and
     * the first launch set up), then the long writer. */
    GC_CHECK(cuCtxSetCurrent(ctx1));
    if (host)
        GC_CHECK(cuMemHostGetDevicePointer(&buf, host, 0));
    unsigned long long words = BUFFER_BYTES / 4;
    {
        unsigned long long ns = 100000;
        void *args[] = {&ns, &buf, &words};
        GC_CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, NULL));
        GC_CHECK(cuCtxSynchronize());
    }
    {
        unsigned long long ns = (unsigned long long)(WRITER_MS * 1e6);
        void *args[] = {&ns, &buf, &words};
        GC_CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, NULL));
    }
    gc_sleep_ms(SETTLE_MS);
    bool running = cuStreamQuery(s1) == CUDA_ERROR_NOT_READY;

    /* The release, in device 0's context. */
    GC_CHECK(cuCtxSetCurrent(ctx0));
    double t0 = gc_now_ms();
    CUresult rc;
    if (t->unsafe) {
        rc = cuMemFreeAsync(buf, s0);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamSynchronize(s0); /* the memory is surely back now */
    } else if (host) {
        rc = cuMemFreeHost(host);
    } else {
        rc = cuMemFree(buf);
    }
    double release_ms = gc_now_ms() - t0;
    if (t->flush)
        gc_cudefer_flush();
    CUresult early0 = CUDA_SUCCESS;
    double sync0_ms = -1;
    int after_sync0 = -1;
    if (t->sync0) {
        double s0 = gc_now_ms();
        early0 = cuCtxSynchronize();
        sync0_ms = gc_now_ms() - s0;
        GC_CHECK(cuCtxSetCurrent(ctx1));
        after_sync0 = cuStreamQuery(s1) == CUDA_ERROR_NOT_READY;
        GC_CHECK(cuCtxSetCurrent(ctx0));
    }

    GC_CHECK(cuCtxSetCurrent(ctx1));
    CUresult sync1 = cuCtxSynchronize();
    GC_CHECK(cuCtxSetCurrent(ctx0));
    CUresult sync0 = cuCtxSynchronize();
    if (early0 != CUDA_SUCCESS)
        sync0 = early0;

    printf("RESULT multigpu case=%s devices=%d peer=%d release_rc=%s release_ms=%.4f "
           "writer_running=%d sync0_ms=%.4f writer_after_sync0=%d",
           t->name, ndev, (int)peer, gc_rc(rc), release_ms, (int)running, sync0_ms,
           after_sync0);
    printf(" sync1_rc=%s sync0_rc=%s fault=%d cudefer=%d simulated=%d\n", gc_rc(sync1),
           gc_rc(sync0), sync1 != CUDA_SUCCESS || sync0 != CUDA_SUCCESS, gc_cudefer_loaded(),
           gc_test_driver());
    fflush(stdout);
    if (sync1 != CUDA_SUCCESS || sync0 != CUDA_SUCCESS)
        return 0; /* a context is dead: nothing more to release */

    /* Orderly teardown, through the shim's teardown paths. */
    if (s0)
        GC_CHECK(cuStreamDestroy(s0));
    GC_CHECK(cuCtxSetCurrent(ctx1));
    if (!t->legacy) {
        GC_CHECK(cuStreamDestroy(s1));
        GC_CHECK(cuModuleUnload(k1.module));
    }
    GC_CHECK(cuCtxSetCurrent(NULL));
    if (lib)
        GC_CHECK(cuLibraryUnload(lib));
    if (t->same)
        GC_CHECK(cuCtxDestroy(ctx1));
    else
        GC_CHECK(cuDevicePrimaryCtxRelease(dev1));
    GC_CHECK(cuDevicePrimaryCtxRelease(dev0));
    return 0;
}
