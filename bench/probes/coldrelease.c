/* coldrelease.c - a probe, built and run by hand on a GPU machine: what a
 * release costs its caller when it comes 50 ms after the program's previous
 * call, as in the stall check (tests/gpu/stall.c), under a running kernel,
 * against the driver calls such a release makes when it is cudefer's (two
 * cuCtxGetCurrent and a cuCtxRecordEvent, counted over the test driver),
 * made by hand at the same moment. Every figure is the median (and p10,
 * p90) of REPS releases, each 50 ms after the call before it, all under one
 * spinning kernel on another stream.
 *
 *   release     cuMemFree of a 4 KiB block
 *   calls       two cuCtxGetCurrent and a cuCtxRecordEvent of the context
 *   warmed      cuMemFree(0) first, then (timed) cuMemFree of the block:
 *               how much of a cold release is cold code and data of the
 *               releasing path rather than the driver's own calls
 *   release_hot the same cuMemFree with no sleep before it
 *
 *   gcc -std=gnu17 -O2 -I bench -I /usr/local/cuda/include \
 *       bench/probes/coldrelease.c -o /tmp/coldrelease \
 *       -L/usr/local/cuda/lib64/stubs -lcuda -lpthread -ldl
 *   /tmp/coldrelease; LD_PRELOAD=.../libcudefer.so /tmp/coldrelease
 *
 * Every line also says in how many releases the kernel still ran right
 * after the release (under_kernel). Without cudefer the first cuMemFree
 * waits for the kernel, so the later ones of its mode run on an idle GPU.
 *
 * Prints RESULT lines (bench/gpu.h).
 */
#include "gpu.h"
#include "kernels.h"

#include <stdlib.h>

enum { REPS = 25 };
enum mode { RELEASE, CALLS, WARMED, RELEASE_HOT, MODES };
static const char *const mode_names[MODES] = {"release", "calls", "warmed", "release_hot"};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    CUcontext ctx = gc_init();
    struct gc_kernels k;
    gc_load_kernels(&k);
    CUstream s;
    CUevent ev;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    /* The context set up (with cudefer: its private streams and word). */
    CUdeviceptr warm;
    GC_CHECK(cuMemAlloc(&warm, 4096));
    GC_CHECK(cuMemFree(warm));
    GC_CHECK(cuCtxSynchronize());
    for (int m = 0; m < MODES; m++) {
        double t[REPS];
        CUdeviceptr p[REPS];
        int under = 0;
        for (int r = 0; r < REPS; r++)
            GC_CHECK(cuMemAlloc(&p[r], 4096));
        GC_CHECK(gc_spin(&k, s, REPS * 60.0 + 500.0, 0, 0));
        gc_sleep_ms(50.0);
        for (int r = 0; r < REPS; r++) {
            if (m != RELEASE_HOT)
                gc_sleep_ms(50.0);
            if (m == WARMED)
                GC_CHECK(cuMemFree(0));
            double a = gc_now_ms();
            if (m == CALLS) {
                CUcontext cur;
                GC_CHECK(cuCtxGetCurrent(&cur));
                GC_CHECK(cuCtxGetCurrent(&cur));
                GC_CHECK(cuCtxRecordEvent(ctx, ev));
            } else {
                GC_CHECK(cuMemFree(p[r]));
            }
            t[r] = (gc_now_ms() - a) * 1000.0;
            under += cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
        }
        GC_CHECK(cuCtxSynchronize());
        if (m == CALLS)
            for (int r = 0; r < REPS; r++)
                GC_CHECK(cuMemFree(p[r]));
        qsort(t, REPS, sizeof t[0], cmp);
        printf("RESULT cold_release mode=%s reps=%d median_us=%.2f p10_us=%.2f p90_us=%.2f "
               "max_us=%.2f under_kernel=%d\n",
               mode_names[m], REPS, t[REPS / 2], t[REPS / 10], t[REPS * 9 / 10], t[REPS - 1],
               under);
        fflush(stdout);
    }
    GC_CHECK(cuEventDestroy(ev));
    GC_CHECK(cuStreamDestroy(s));
    gc_fini();
    return 0;
}
