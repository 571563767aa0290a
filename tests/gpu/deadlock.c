/* deadlock.c - check 4: a release while the GPU waits for the host.
 *
 * A cudefer_wait_flag kernel on stream A spins until a host flag (in
 * cuMemHostAlloc DEVICEMAP memory) is set. The main thread frees a device
 * buffer and only then sets the flag. With the blocking driver cuMemFree
 * waits for the kernel, which waits for the main thread: a deadlock. A
 * watchdog thread sets the flag after 2 s so that the program ends either
 * way; it reports whether it had to.
 *
 * usage: deadlock [watchdog_ms]     (default 2000)
 *
 * prints:
 *   RESULT deadlock release_rc=<code> release_ms=<ms> kernel_waiting=<0|1>
 *          watchdog_fired=<0|1> sync_rc=<code> total_ms=<ms>
 */
#include "gpucheck.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

static struct {
    pthread_t thread;
    double after_ms;
    volatile uint32_t *flag;
    _Atomic bool done;
    _Atomic bool fired;
} watchdog;

static void set_flag(volatile uint32_t *flag)
{
    __atomic_store_n(flag, 1u, __ATOMIC_SEQ_CST);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    double start = gc_now_ms();
    while (!atomic_load(&watchdog.done)) {
        if (gc_now_ms() - start >= watchdog.after_ms) {
            atomic_store(&watchdog.fired, true);
            set_flag(watchdog.flag);
            return NULL;
        }
        gc_sleep_ms(1.0);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct gc_kernels kernels;
    CUstream a;
    void *host;
    CUdeviceptr flag_dev, buf;

    watchdog.after_ms = argc > 1 ? atof(argv[1]) : 2000.0;
    gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    GC_CHECK(cuMemHostGetDevicePointer(&flag_dev, host, 0));
    watchdog.flag = host;
    *watchdog.flag = 0;
    GC_CHECK(cuMemAlloc(&buf, GC_MIB));

    /* Warm-up: the first launch on A, and one release. */
    CUdeviceptr warm;
    GC_CHECK(gc_touch(&kernels, a, buf, 16));
    GC_CHECK(cuStreamSynchronize(a));
    GC_CHECK(cuMemAlloc(&warm, GC_MIB));
    GC_CHECK(cuMemFree(warm));
    GC_CHECK(cuCtxSynchronize());

    double start = gc_now_ms();
    GC_CHECK(gc_wait_flag(&kernels, a, flag_dev));
    gc_sleep_ms(20);
    bool waiting = cuStreamQuery(a) == CUDA_ERROR_NOT_READY;
    if (pthread_create(&watchdog.thread, NULL, watchdog_main, NULL) != 0)
        gc_die("pthread_create failed");

    double t0 = gc_now_ms();
    CUresult rc = cuMemFree(buf);
    double release_ms = gc_now_ms() - t0;
    set_flag(watchdog.flag);
    CUresult sync = cuCtxSynchronize();
    double total_ms = gc_now_ms() - start;
    atomic_store(&watchdog.done, true);
    pthread_join(watchdog.thread, NULL);

    printf("RESULT deadlock release_rc=%s release_ms=%.4f kernel_waiting=%d watchdog_fired=%d",
           gc_rc(rc), release_ms, (int)waiting, (int)atomic_load(&watchdog.fired));
    printf(" sync_rc=%s total_ms=%.1f\n", gc_rc(sync), total_ms);
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        return 0;

    GC_CHECK(cuMemFreeHost(host));
    GC_CHECK(cuStreamDestroy(a));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
