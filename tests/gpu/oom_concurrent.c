/* oom_concurrent.c - check 11: an allocation that runs out of memory while
 * another thread's flush sits in a real release.
 *
 * The device is filled until about 100 MiB are free; then two 100 MiB
 * blocks allocated before the fill are freed while the GPU is idle (the
 * driver alone has about 300 MiB free then; cudefer keeps them in its
 * device cache). A 1.5 s kernel starts. Thread A calls cuMemFreeHost of a
 * pinned block (cudefer queues it; the driver alone waits for the kernel)
 * and then cudefer_flush() (absent without cudefer), which sits in the real
 * cuMemFreeHost until the kernel ends. 200 ms into that, thread B calls
 * cuMemAlloc(150 MiB): it fits only if the freed blocks come back, and with
 * the driver alone it succeeds. With cudefer its out-of-memory answer must
 * release what is held and retry, although A's flush is under way.
 *
 * usage: oom_concurrent
 *
 * prints:
 *   RESULT oom_concurrent free_after_fill_mib=<n> freed_mib=200 alloc_rc=<code>
 *          alloc_ms=<ms> kernel_running=<0|1> a_free_host_rc=<code>
 *          a_flushed=<0|1> sync_rc=<code> cudefer=<0|1> simulated=<0|1>
 * kernel_running: the 1.5 s kernel still ran when B allocated (else the
 * row means nothing).
 *
 * Then the same need while another thread's capture is live: B's block is
 * freed with a 300 ms kernel running (cudefer keeps it, fenced), thread C
 * begins a global capture on a stream of its own and keeps it live, and
 * the main thread, in the relaxed mode, allocates 250 MiB, which fits only
 * with B's block back. cudefer's stream-ordered frees wait for the capture
 * to end; its out-of-memory answer must not:
 *   RESULT oom_capture alloc_rc=<code> alloc_ms=<ms> kernel_running=<0|1>
 *          begin_rc=<code> end_rc=<code> cudefer=<0|1> simulated=<0|1>
 * end_rc: the capture survived (CUDA_SUCCESS) or was invalidated.
 */
#include "gpu.h"

#define HELD_BYTES (100 * GC_MIB) /* each of the two blocks freed */
#define LEFT_BYTES (100 * GC_MIB) /* free after the fill, about */
#define SMALL_CHUNK (32 * GC_MIB)
#define B_BYTES (150 * GC_MIB)
#define KERNEL_MS 1500.0
#define B_AT_MS 200.0
#define MAX_CHUNKS 4096

static struct gc_kernels kernels;
static CUcontext context;

static size_t free_bytes(void)
{
    size_t free_b, total;
    GC_CHECK(cuMemGetInfo(&free_b, &total));
    return free_b;
}

/* Allocates chunks until about LEFT_BYTES are free: 1 GiB ones, then
 * SMALL_CHUNK ones. Returns how many it made. */
static int fill(CUdeviceptr *chunks)
{
    int n = 0;
    while (n < MAX_CHUNKS && free_bytes() > GC_GIB + LEFT_BYTES + SMALL_CHUNK &&
           cuMemAlloc(&chunks[n], GC_GIB) == CUDA_SUCCESS)
        n++;
    while (n < MAX_CHUNKS && free_bytes() > LEFT_BYTES + SMALL_CHUNK &&
           cuMemAlloc(&chunks[n], SMALL_CHUNK) == CUDA_SUCCESS)
        n++;
    return n;
}

static struct {
    void *pinned;
    CUresult free_host_rc;
    bool flushed;
} a;

/* Thread A: a release the driver alone waits for, then cudefer's flush,
 * which really releases it and so waits for the kernel. */
static void *thread_a(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(context));
    a.free_host_rc = cuMemFreeHost(a.pinned);
    a.flushed = gc_cudefer_loaded();
    gc_cudefer_flush();
    return NULL;
}

static struct {
    CUresult rc;
    double ms;
    CUdeviceptr p;
} b;

static void *thread_b(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(context));
    double t0 = gc_now_ms();
    b.rc = cuMemAlloc(&b.p, B_BYTES);
    b.ms = gc_now_ms() - t0;
    return NULL;
}

#define C_BYTES (250 * GC_MIB)
#define C_KERNEL_MS 300.0

static struct {
    atomic_int live, end;
    CUresult begin_rc, end_rc;
} c;

/* Thread C: a global capture kept live until the main thread is done. */
static void *thread_c(void *arg)
{
    (void)arg;
    CUstream cs;
    GC_CHECK(cuCtxSetCurrent(context));
    GC_CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    c.begin_rc = cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (c.begin_rc == CUDA_SUCCESS)
        GC_CHECK(gc_spin(&kernels, cs, 1.0, 0, 0));
    atomic_store(&c.live, 1);
    while (!atomic_load(&c.end))
        gc_sleep_until(gc_now_ms() + 1.0);
    CUgraph g = NULL;
    c.end_rc = c.begin_rc == CUDA_SUCCESS ? cuStreamEndCapture(cs, &g) : c.begin_rc;
    if (g)
        GC_CHECK(cuGraphDestroy(g));
    GC_CHECK(cuStreamDestroy(cs));
    return NULL;
}

/* The second phase (file comment): b.p is B's block. */
static void capture_phase(CUstream s, CUdeviceptr block)
{
    GC_CHECK(gc_spin(&kernels, s, C_KERNEL_MS, 0, 0));
    GC_CHECK(cuMemFree(block));
    pthread_t tc;
    if (pthread_create(&tc, NULL, thread_c, NULL) != 0)
        gc_die("pthread_create failed");
    while (!atomic_load(&c.live))
        gc_sleep_until(gc_now_ms() + 1.0);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    GC_CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    bool running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    CUdeviceptr p = 0;
    double t0 = gc_now_ms();
    CUresult rc = cuMemAlloc(&p, C_BYTES);
    double ms = gc_now_ms() - t0;
    atomic_store(&c.end, 1);
    pthread_join(tc, NULL);
    GC_CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    GC_CHECK(cuCtxSynchronize());
    printf("RESULT oom_capture alloc_rc=%s alloc_ms=%.3f kernel_running=%d begin_rc=%s "
           "end_rc=%s cudefer=%d simulated=%d\n", gc_rc(rc), ms, (int)running,
           gc_rc(c.begin_rc), gc_rc(c.end_rc), gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemFree(p));
}

int main(void)
{
    static CUdeviceptr chunks[MAX_CHUNKS];
    CUstream s;
    context = gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(gc_spin(&kernels, s, 1.0, 0, 0));
    GC_CHECK(cuMemAllocHost(&a.pinned, GC_MIB));
    GC_CHECK(cuCtxSynchronize());

    CUdeviceptr held[2];
    GC_CHECK(cuMemAlloc(&held[0], HELD_BYTES));
    GC_CHECK(cuMemAlloc(&held[1], HELD_BYTES));
    int n = fill(chunks);
    size_t left = free_bytes();
    GC_CHECK(cuMemFree(held[0]));
    GC_CHECK(cuMemFree(held[1]));

    GC_CHECK(gc_spin(&kernels, s, KERNEL_MS, 0, 0));
    double start = gc_now_ms();
    pthread_t ta, tb;
    if (pthread_create(&ta, NULL, thread_a, NULL) != 0)
        gc_die("pthread_create failed");
    gc_sleep_until(start + B_AT_MS);
    bool running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    if (pthread_create(&tb, NULL, thread_b, NULL) != 0)
        gc_die("pthread_create failed");
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    CUresult sync = cuCtxSynchronize();

    printf("RESULT oom_concurrent free_after_fill_mib=%.0f freed_mib=%.0f alloc_rc=%s",
           (double)left / (double)GC_MIB, 2.0 * (double)HELD_BYTES / (double)GC_MIB,
           gc_rc(b.rc));
    printf(" alloc_ms=%.3f kernel_running=%d a_free_host_rc=%s a_flushed=%d sync_rc=%s", b.ms,
           (int)running, gc_rc(a.free_host_rc), (int)a.flushed, gc_rc(sync));
    printf(" cudefer=%d simulated=%d\n", gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        return 0;

    if (b.rc == CUDA_SUCCESS)
        capture_phase(s, b.p);
    for (int i = 0; i < n; i++)
        GC_CHECK(cuMemFree(chunks[i]));
    printf("RESULT oom_concurrent_fill chunks=%d\n", n);
    GC_CHECK(cuStreamDestroy(s));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
