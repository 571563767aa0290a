/* regphases.c - a probe, built and run by hand on a GPU machine: where an
 * iteration of cudefer-loops' "registered 64 MiB, full touch" row spends
 * its time, with and without cudefer. Each iteration registers the same
 * 64 MiB (DEVICEMAP), fills every word with a kernel on a non-blocking
 * stream and unregisters; the probe times the cuMemHostRegister call, the
 * launch, the kernel itself (two timing events around it, read after the
 * run) and the cuMemHostUnregister call. Without cudefer the unregister
 * waits for the kernel and unpins the pages; with it, the unregister waits
 * for the kernel and the next registration makes the driver's unregister
 * first, so the same work moves from one call to the other: the sum and
 * the kernel's own time are what to compare.
 *
 *   gcc -std=gnu17 -O2 -I bench -I /usr/local/cuda/include \
 *       bench/probes/regphases.c -o /tmp/regphases \
 *       -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -ldl
 *   /tmp/regphases [MiB]; LD_PRELOAD=.../libcudefer.so /tmp/regphases [MiB]
 *
 * Prints one RESULT line: the median of each phase in µs over ITERS
 * iterations after WARM, and where the buffer's first page lies (the NUMA
 * node, from get_mempolicy's MPOL_F_ADDR|MPOL_F_NODE, -1 if unknown).
 */
#include "gpu.h"

#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { WARM = 4, ITERS = 30 };

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

/* The NUMA node of the page at p (get_mempolicy without libnuma). */
static int node_of(void *p)
{
    int node = -1;
    const unsigned long mpol_f_node = 1, mpol_f_addr = 2;
    if (syscall(SYS_get_mempolicy, &node, NULL, 0UL, p, mpol_f_node | mpol_f_addr) != 0)
        return -1;
    return node;
}

int main(int argc, char **argv)
{
    size_t bytes = (argc > 1 ? (size_t)atol(argv[1]) : 64) * GC_MIB;
    gc_init();
    struct gc_kernels k;
    gc_load_kernels(&k);
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent e0, e1;
    GC_CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    GC_CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    void *reg = gc_xpages(bytes);
    double reg_us[ITERS], launch_us[ITERS], kernel_us[ITERS], unreg_us[ITERS], total_us[ITERS];
    unsigned long long words = bytes / 4, blocks = (words + 255) / 256;
    if (blocks > 1056)
        blocks = 1056;
    for (int i = 0; i < WARM + ITERS; i++) {
        CUdeviceptr d;
        double t0 = gc_now_ms();
        GC_CHECK(cuMemHostRegister(reg, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
        GC_CHECK(cuMemHostGetDevicePointer(&d, reg, 0));
        double t1 = gc_now_ms();
        void *args[] = {&d, &words};
        GC_CHECK(cuEventRecord(e0, s));
        GC_CHECK(cuLaunchKernel(k.fill, (unsigned)blocks, 1, 1, 256, 1, 1, 0, s, args, NULL));
        GC_CHECK(cuEventRecord(e1, s));
        double t2 = gc_now_ms();
        GC_CHECK(cuMemHostUnregister(reg));
        double t3 = gc_now_ms();
        float ms = 0;
        GC_CHECK(cuEventSynchronize(e1));
        GC_CHECK(cuEventElapsedTime(&ms, e0, e1));
        if (i < WARM)
            continue;
        int j = i - WARM;
        reg_us[j] = (t1 - t0) * 1e3;
        launch_us[j] = (t2 - t1) * 1e3;
        unreg_us[j] = (t3 - t2) * 1e3;
        total_us[j] = (t3 - t0) * 1e3;
        kernel_us[j] = ms * 1e3;
    }
    double t0 = gc_now_ms();
    GC_CHECK(cuCtxSynchronize());
    double sync_us = (gc_now_ms() - t0) * 1e3;
    printf("RESULT regphases mib=%zu register_us=%.1f launch_us=%.1f kernel_us=%.1f "
           "unregister_us=%.1f iteration_us=%.1f final_sync_us=%.1f node=%d cudefer=%d\n",
           (size_t)(bytes / GC_MIB), median(reg_us, ITERS), median(launch_us, ITERS),
           median(kernel_us, ITERS), median(unreg_us, ITERS), median(total_us, ITERS), sync_us,
           node_of(reg), gc_cudefer_loaded());
    free(reg);
    GC_CHECK(cuModuleUnload(k.module));
    gc_fini();
    return 0;
}
