/* capture_ptsz.c - check 12: a capture made through the per-thread default
 * stream entry points (the _ptsz names that code built with
 * --default-stream per-thread calls) must end for cudefer too.
 *
 * cuStreamBeginCapture_v2_ptsz(0, relaxed), a kernel (cuLaunchKernel_ptsz),
 * cuStreamEndCapture_ptsz(0, &graph); then 8 x (cuMemAlloc 512 MiB,
 * cuMemFree) and cuCtxSynchronize. If cudefer missed the end of the
 * capture it would keep every release queued, unfenced, for a capture it
 * thinks is live: 4 GiB held. Measured: device memory in use (cuMemGetInfo)
 * above the level before the loop, once it settles (sampled for up to 1 s).
 * The driver alone holds nothing; cudefer may hold at most its device cache
 * (CUDEFER_DEVICE_CACHE, 256 MiB by default).
 *
 * Then each context's own per-thread stream: the thread captures its
 * per-thread stream in context A, pushes a second context B, captures B's,
 * ends B's, pops, releases a pinned block (queued: A's capture is live),
 * destroys B, releases a device block and ends A's capture. The driver
 * ends it with success; a cudefer that took B's end for A's would have
 * fenced its releases in A during A's capture and invalidated it.
 *
 * usage: capture_ptsz
 *
 * prints:
 *   RESULT capture_ptsz begin_rc=<code> launch_rc=<code> end_rc=<code>
 *          loop_errors=<n> sync_rc=<code> held_mib=<n> settle_ms=<ms>
 *          two_ctx_begin_rc=<code> two_ctx_end_rc=<code>
 *          cudefer=<0|1> simulated=<0|1>
 */
#include "gpu.h"

/* The driver exports the per-thread-stream variants; cuda.h declares them
 * only when the whole file is built for per-thread default streams. */
extern __typeof__(cuStreamBeginCapture) cuStreamBeginCapture_v2_ptsz;
extern __typeof__(cuStreamEndCapture) cuStreamEndCapture_ptsz;
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;

#define BLOCK_BYTES (512 * GC_MIB)
#define ROUNDS 8
#define HELD_GOAL_MIB 256.0
#define SETTLE_MS 1000.0

/* The second part (above): *begin is the worst of the four begins and
 * ends before A's end, *end A's end. */
static void two_contexts(const struct gc_kernels *k, CUresult *begin, CUresult *end)
{
    unsigned long long zero = 0;
    CUdeviceptr none = 0;
    void *args[] = {&none, &zero};
    CUcontext a, b, popped;
    CUdevice dev;
    GC_CHECK(cuCtxGetCurrent(&a));
    GC_CHECK(cuCtxGetDevice(&dev));
    GC_CHECK(cuCtxCreate(&b, NULL, 0, dev));
    GC_CHECK(cuCtxSetCurrent(a));
    void *early, *late;
    CUdeviceptr d;
    GC_CHECK(cuMemAllocHost(&early, 4096));
    GC_CHECK(cuMemAllocHost(&late, 4096));
    GC_CHECK(cuMemAlloc(&d, 4096));
    CUgraph ga = NULL, gb = NULL;
    const CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult rc[4];
    rc[0] = cuStreamBeginCapture_v2_ptsz(NULL, relaxed);
    rc[1] = cuLaunchKernel_ptsz(k->touch, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    GC_CHECK(cuCtxPushCurrent(b));
    rc[2] = cuStreamBeginCapture_v2_ptsz(NULL, relaxed);
    rc[3] = cuStreamEndCapture_ptsz(NULL, &gb);
    GC_CHECK(cuCtxPopCurrent(&popped));
    *begin = CUDA_SUCCESS;
    for (int i = 0; i < 4; i++)
        if (rc[i] != CUDA_SUCCESS && *begin == CUDA_SUCCESS)
            *begin = rc[i];
    GC_CHECK(cuMemFreeHost(early));
    GC_CHECK(cuCtxDestroy(b));
    GC_CHECK(cuMemFreeHost(late));
    GC_CHECK(cuMemFree(d));
    *end = cuStreamEndCapture_ptsz(NULL, &ga);
    if (ga)
        GC_CHECK(cuGraphDestroy(ga));
    if (gb)
        GC_CHECK(cuGraphDestroy(gb));
    GC_CHECK(cuCtxSynchronize());
}

int main(void)
{
    struct gc_kernels kernels;
    gc_init();
    gc_load_kernels(&kernels);
    /* Warm-up: the kernel's first launch, on the per-thread stream. */
    unsigned long long zero = 0;
    CUdeviceptr none = 0;
    void *args[] = {&none, &zero};
    GC_CHECK(cuLaunchKernel_ptsz(kernels.touch, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    GC_CHECK(cuCtxSynchronize());

    CUgraph graph = NULL;
    CUresult begin = cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED);
    CUresult launch = cuLaunchKernel_ptsz(kernels.touch, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    CUresult end = cuStreamEndCapture_ptsz(NULL, &graph);
    if (end == CUDA_SUCCESS && graph)
        GC_CHECK(cuGraphDestroy(graph));
    GC_CHECK(cuCtxSynchronize());

    double before = gc_used_mib();
    int errors = 0;
    for (int i = 0; i < ROUNDS; i++) {
        CUdeviceptr p;
        CUresult rc = cuMemAlloc(&p, BLOCK_BYTES);
        if (rc == CUDA_SUCCESS)
            rc = cuMemFree(p);
        if (rc != CUDA_SUCCESS && errors++ == 0)
            fprintf(stderr, "round %d: %s\n", i, gc_rc(rc));
    }
    CUresult sync = cuCtxSynchronize();
    double t0 = gc_now_ms(), held = gc_used_mib() - before;
    while (held > HELD_GOAL_MIB && gc_now_ms() - t0 < SETTLE_MS) {
        gc_sleep_ms(20);
        held = gc_used_mib() - before;
    }

    double settle = gc_now_ms() - t0;

    CUresult two_begin, two_end;
    two_contexts(&kernels, &two_begin, &two_end);

    printf("RESULT capture_ptsz begin_rc=%s launch_rc=%s end_rc=%s loop_errors=%d",
           gc_rc(begin), gc_rc(launch), gc_rc(end), errors);
    printf(" sync_rc=%s held_mib=%.0f settle_ms=%.0f two_ctx_begin_rc=%s two_ctx_end_rc=%s",
           gc_rc(sync), held, settle, gc_rc(two_begin), gc_rc(two_end));
    printf(" cudefer=%d simulated=%d\n", gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
