/* registered.c - check 8: cuMemHostUnregister while a kernel writes the
 * registered memory, and another thread launches meanwhile.
 *
 * A cudefer_spin kernel (400 ms) on stream A keeps writing a 1 MiB
 * page-aligned buffer registered with CU_MEMHOSTREGISTER_DEVICEMAP,
 * through its device pointer. 50 ms in, the main thread calls
 * cuMemHostUnregister, then at once sets the buffer to 0 (memset), then
 * cuCtxSynchronize, and counts the words that are not 0: what the GPU wrote
 * after the unregister returned. The driver waits for the kernel (0 words,
 * about 350 ms). Meanwhile, 100 ms in, a second thread launches a 500 ms
 * kernel on stream B (non-blocking too) and times its launch call.
 *
 * With cudefer the unregister must wait for the work submitted before it
 * (the first kernel: the program may reuse the pages once it returns) and
 * for nothing more: not for the second kernel, which ends about 550 ms after
 * the unregister began. And the second thread's launch must not block.
 *
 * usage: registered
 *
 * prints:
 *   RESULT registered unregister_rc=<code> unregister_ms=<ms>
 *          first_left_ms=<ms> second_end_ms=<ms> overwritten_words=<n>
 *          launch_rc=<code> launch_ms=<ms> sync_rc=<code> writer_running=<0|1>
 *          cudefer=<0|1> simulated=<0|1>
 *   RESULT registered_freed alloc_host_rc=<code> alloc_host_same=<0|1>
 *          managed_rc=<code> managed_same=<0|1>
 * Then a buffer of 64 MiB, registered, unregistered and unmapped (as free
 * does), and an allocation of its size at once (cuMemAllocHost, then
 * again with cuMemAllocManaged): the driver tries that address, and
 * refuses it while it still holds the registration (ALREADY_MAPPED,
 * INVALID_VALUE; facts unmapped), which cudefer's held unregister must not
 * cause. *_same: the allocation landed on the freed buffer's address.
 * first_left_ms: what was left of the first kernel when the unregister
 * began; second_end_ms: when the second kernel ends, from that moment (its
 * launch's return plus 500 ms); writer_running: the first kernel still ran
 * just before the unregister (else the row means nothing); simulated: over
 * the test driver (no kernel runs).
 */
#include "gpu.h"

#include <sys/mman.h>

#define BUFFER_BYTES (1 * GC_MIB)
#define WRITER_MS 400.0
#define UNREGISTER_AT_MS 50.0
#define LAUNCH_AT_MS 100.0
#define SECOND_MS 500.0

static struct gc_kernels kernels;
static CUcontext context;

#define FREED_BYTES (64 * GC_MIB)

/* The second part: one allocation (managed or pinned) right after the
 * registered buffer was unregistered and unmapped; its result in *rc,
 * whether it landed on the buffer's address in *same. */
static void after_freed_buffer(bool managed, CUresult *rc, int *same)
{
    void *p = mmap(NULL, FREED_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        gc_die("mmap failed");
    memset(p, 1, FREED_BYTES);
    GC_CHECK(cuMemHostRegister(p, FREED_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP));
    GC_CHECK(cuMemHostUnregister(p));
    munmap(p, FREED_BYTES);
    void *h = NULL;
    CUdeviceptr m = 0;
    *rc = managed ? cuMemAllocManaged(&m, FREED_BYTES, CU_MEM_ATTACH_GLOBAL)
                  : cuMemAllocHost(&h, FREED_BYTES);
    if (managed)
        h = (void *)(uintptr_t)m;
    *same = *rc == CUDA_SUCCESS && h == p;
    if (*rc == CUDA_SUCCESS)
        GC_CHECK(managed ? cuMemFree(m) : cuMemFreeHost(h));
}

/* The second thread: one launch, LAUNCH_AT_MS after start_ms. */
static struct {
    pthread_t thread;
    CUstream stream;
    double start_ms;
    double launch_ms;     /* how long the launch call took */
    double returned_at;   /* when it returned (gc_now_ms) */
    CUresult rc;
} second;

static void *second_main(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(context));
    gc_sleep_until(second.start_ms + LAUNCH_AT_MS);
    double t0 = gc_now_ms();
    second.rc = gc_spin(&kernels, second.stream, SECOND_MS, 0, 0);
    second.returned_at = gc_now_ms();
    second.launch_ms = second.returned_at - t0;
    return NULL;
}

static size_t nonzero_words(const uint32_t *w, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += w[i] != 0;
    return count;
}

/* A registration, its device pointer written by a short kernel, and its
 * unregister once idle: first uses out of the way. */
static void warm_up(CUstream a)
{
    void *host = gc_xpages(BUFFER_BYTES);
    CUdeviceptr dev;
    GC_CHECK(cuMemHostRegister(host, BUFFER_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP));
    GC_CHECK(cuMemHostGetDevicePointer(&dev, host, 0));
    GC_CHECK(gc_spin(&kernels, a, 1.0, dev, BUFFER_BYTES / 4));
    GC_CHECK(gc_spin(&kernels, second.stream, 1.0, 0, 0));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuMemHostUnregister(host));
    GC_CHECK(cuCtxSynchronize());
    free(host);
}

int main(void)
{
    CUstream a;
    context = gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&second.stream, CU_STREAM_NON_BLOCKING));
    warm_up(a);

    uint32_t *host = gc_xpages(BUFFER_BYTES);
    size_t words = BUFFER_BYTES / 4;
    CUdeviceptr dev;
    GC_CHECK(cuMemHostRegister(host, BUFFER_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP));
    GC_CHECK(cuMemHostGetDevicePointer(&dev, host, 0));

    double start = gc_now_ms();
    GC_CHECK(gc_spin(&kernels, a, WRITER_MS, dev, words));
    second.start_ms = start;
    if (pthread_create(&second.thread, NULL, second_main, NULL) != 0)
        gc_die("pthread_create failed");
    gc_sleep_until(start + UNREGISTER_AT_MS);

    bool running = cuStreamQuery(a) == CUDA_ERROR_NOT_READY;
    double t0 = gc_now_ms();
    CUresult rc = cuMemHostUnregister(host);
    double unregister_ms = gc_now_ms() - t0;
    memset(host, 0, BUFFER_BYTES);
    pthread_join(second.thread, NULL);
    CUresult sync = cuCtxSynchronize();
    size_t overwritten = nonzero_words(host, words);

    printf("RESULT registered unregister_rc=%s unregister_ms=%.3f first_left_ms=%.1f",
           gc_rc(rc), unregister_ms, WRITER_MS - (t0 - start));
    printf(" second_end_ms=%.1f overwritten_words=%zu launch_rc=%s launch_ms=%.4f",
           second.returned_at + SECOND_MS - t0, overwritten, gc_rc(second.rc), second.launch_ms);
    printf(" sync_rc=%s writer_running=%d cudefer=%d simulated=%d\n", gc_rc(sync), (int)running,
           gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        return 0;

    CUresult host_rc, managed_rc;
    int host_same, managed_same;
    after_freed_buffer(false, &host_rc, &host_same);
    after_freed_buffer(true, &managed_rc, &managed_same);
    printf("RESULT registered_freed alloc_host_rc=%s alloc_host_same=%d managed_rc=%s "
           "managed_same=%d cudefer=%d simulated=%d\n", gc_rc(host_rc), host_same,
           gc_rc(managed_rc), managed_same, gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);

    free(host);
    GC_CHECK(cuStreamDestroy(a));
    GC_CHECK(cuStreamDestroy(second.stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
