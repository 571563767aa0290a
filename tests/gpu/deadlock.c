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
#include "gpu.h"

int main(int argc, char **argv)
{
    struct gc_kernels kernels;
    struct gc_flag flag = {0};
    CUstream a;
    CUdeviceptr buf;

    double watchdog_ms = argc > 1 ? atof(argv[1]) : 2000.0;
    gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    gc_flag_init(&flag);
    GC_CHECK(cuMemAlloc(&buf, GC_MIB));

    /* Warm-up: the first launch on A, and one release. */
    CUdeviceptr warm;
    GC_CHECK(gc_touch(&kernels, a, buf, 16));
    GC_CHECK(cuStreamSynchronize(a));
    GC_CHECK(cuMemAlloc(&warm, GC_MIB));
    GC_CHECK(cuMemFree(warm));
    GC_CHECK(cuCtxSynchronize());

    double start = gc_now_ms();
    GC_CHECK(gc_wait_flag(&kernels, a, flag.dev));
    gc_sleep_ms(20);
    bool waiting = cuStreamQuery(a) == CUDA_ERROR_NOT_READY;
    gc_flag_arm(&flag, watchdog_ms);

    double t0 = gc_now_ms();
    CUresult rc = cuMemFree(buf);
    double release_ms = gc_now_ms() - t0;
    gc_flag_set(&flag);
    CUresult sync = cuCtxSynchronize();
    double total_ms = gc_now_ms() - start;
    bool fired = gc_flag_disarm(&flag);

    printf("RESULT deadlock release_rc=%s release_ms=%.4f kernel_waiting=%d watchdog_fired=%d",
           gc_rc(rc), release_ms, (int)waiting, (int)fired);
    printf(" sync_rc=%s total_ms=%.1f\n", gc_rc(sync), total_ms);
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        return 0;

    gc_flag_free(&flag);
    GC_CHECK(cuStreamDestroy(a));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
