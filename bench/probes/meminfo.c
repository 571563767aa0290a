/* meminfo.c - a probe, built and run by hand on a GPU machine: what
 * cuMemGetInfo says after a program releases device memory while a kernel
 * runs on another stream, and how long the releases took, without and with
 * cudefer. The driver alone waits in each cuMemFree for the kernel and then
 * counts the memory free; cudefer returns at once, holds the blocks until
 * their fences pass, and adds what it holds for the current device to the
 * free figure. The two runs print about the same free figures (the
 * driver's own memory moves by a few MiB between calls) up to the
 * releases; right after the cuCtxSynchronize, cudefer's figure was low by
 * the blocks its flush had just handed to the driver and not yet settled
 * (bench/RESULTS.md, run 80), and is the driver's since the synchronisation
 * settles them itself (run 81).
 *
 *   gcc -std=gnu17 -O2 -I bench -I /usr/local/cuda/include \
 *       bench/probes/meminfo.c -o /tmp/meminfo \
 *       -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -ldl
 *   /tmp/meminfo [BLOCKS [BLOCK_KIB]]      (default 64 blocks of 8192 KiB)
 *   LD_PRELOAD=.../libcudefer.so /tmp/meminfo [BLOCKS [BLOCK_KIB]]
 *
 * Prints RESULT lines (bench/gpu.h): free MiB before the blocks, with them,
 * right after their releases (the kernel still running), and after a
 * cuCtxSynchronize; the releases' total ms; whether the kernel still ran
 * after the releases.
 */
#include "gpu.h"
#include "kernels.h"

enum { MOST_BLOCKS = 65536 };

static double free_mib(void)
{
    size_t f = 0, t = 0;
    GC_CHECK(cuMemGetInfo(&f, &t));
    return (double)f / (1 << 20);
}

int main(int argc, char **argv)
{
    int blocks = argc > 1 ? atoi(argv[1]) : 64;
    size_t block_bytes = (argc > 2 ? (size_t)atol(argv[2]) : 8192) << 10;
    if (blocks < 1 || blocks > MOST_BLOCKS || block_bytes == 0)
        gc_die("usage: meminfo [BLOCKS (1-%d) [BLOCK_KIB]]", MOST_BLOCKS);
    gc_init();
    struct gc_kernels k;
    gc_load_kernels(&k);
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* The context set up (with cudefer: its private streams and word). */
    CUdeviceptr warm;
    GC_CHECK(cuMemAlloc(&warm, 4096));
    GC_CHECK(cuMemFree(warm));
    GC_CHECK(cuCtxSynchronize());
    double before = free_mib();
    static CUdeviceptr p[MOST_BLOCKS];
    for (int i = 0; i < blocks; i++)
        GC_CHECK(cuMemAlloc(&p[i], block_bytes));
    double held = free_mib();
    GC_CHECK(gc_spin(&k, s, 500.0, 0, 0));
    gc_sleep_ms(20.0);
    double t0 = gc_now_ms();
    for (int i = 0; i < blocks; i++)
        GC_CHECK(cuMemFree(p[i]));
    double release_ms = gc_now_ms() - t0;
    double after = free_mib();
    int running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    GC_CHECK(cuCtxSynchronize());
    double synced = free_mib();
    printf("RESULT meminfo blocks=%d block_kib=%zu free_before_mib=%.1f free_held_mib=%.1f "
           "free_after_release_mib=%.1f free_after_sync_mib=%.1f release_ms=%.3f "
           "kernel_still_running=%d\n",
           blocks, block_bytes >> 10, before, held, after, synced, release_ms, running);
    GC_CHECK(cuStreamDestroy(s));
    gc_fini();
    return 0;
}
