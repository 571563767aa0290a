/* hazard.c - check 3: releasing memory that a running kernel still writes.
 *
 * A writer kernel (cudefer_spin with buf = the memory, 300 ms) runs on
 * stream A; 30 ms into it the main thread releases the memory; then
 * cuCtxSynchronize must return CUDA_SUCCESS. Without a fence the memory
 * goes back while the kernel writes it and the context dies with
 * CUDA_ERROR_ILLEGAL_ADDRESS. One variant per process: a fault kills the
 * context.
 *
 * usage: hazard <stream> <memory>
 *   stream: nonblocking | blocking | legacy | perthread | ptsz | unsafe
 *     perthread: cuLaunchKernel on the CU_STREAM_PER_THREAD handle
 *     ptsz:      cuLaunchKernel_ptsz on stream 0 (the per-thread default
 *                stream, as code built with --default-stream per-thread)
 *     unsafe:    the control: A non-blocking, and instead of cuMemFree a
 *                bare cuMemFreeAsync on another non-blocking stream
 *                (followed by a synchronisation of that stream): expected
 *                to fault, which proves that the check can fail. With
 *                cudefer loaded it is also the fault check: a pinned block
 *                is released (queued) while the writer runs, before the
 *                fault; after it, one more cuMemFree must get the driver's
 *                error, and the program must exit normally (cudefer's
 *                stderr then says what it dropped)
 *   memory: device (cuMemAlloc, cuMemFree) | managed (cuMemAllocManaged,
 *     cuMemFree) | hostmap (cuMemHostAlloc DEVICEMAP written through its
 *     device pointer, cuMemFreeHost)
 *
 * prints:
 *   RESULT hazard stream=<s> memory=<m> release_rc=<code> release_ms=<ms>
 *          writer_running=<0|1> sync_rc=<code> fault=<0|1>
 *          queued=<releases made before the fault> after_rc=<code of a
 *          cuMemFree after the fault, or - when none was made>
 */
#include "gpu.h"

#include <stdbool.h>

/* The driver exports the per-thread-stream variant; cuda.h declares it only
 * when the whole file is built for per-thread default streams. */
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;

#define BUFFER_BYTES (64 * GC_MIB)
#define WRITER_MS 300.0
#define SETTLE_MS 30.0

static struct gc_kernels kernels;

struct variant {
    const char *name;
    CUstream stream;  /* where the writer runs (and what is queried) */
    bool ptsz;        /* launched with cuLaunchKernel_ptsz on stream 0 */
    bool unsafe;
};

static struct variant make_variant(const char *name)
{
    struct variant v = {name, NULL, false, false};
    if (strcmp(name, "nonblocking") == 0 || strcmp(name, "unsafe") == 0) {
        GC_CHECK(cuStreamCreate(&v.stream, CU_STREAM_NON_BLOCKING));
        v.unsafe = name[0] == 'u';
    } else if (strcmp(name, "blocking") == 0) {
        GC_CHECK(cuStreamCreate(&v.stream, CU_STREAM_DEFAULT));
    } else if (strcmp(name, "legacy") == 0) {
        v.stream = CU_STREAM_LEGACY;
    } else if (strcmp(name, "perthread") == 0) {
        v.stream = CU_STREAM_PER_THREAD;
    } else if (strcmp(name, "ptsz") == 0) {
        v.stream = CU_STREAM_PER_THREAD; /* stream 0 of the _ptsz calls */
        v.ptsz = true;
    } else {
        gc_die("unknown stream variant '%s'", name);
    }
    return v;
}

static CUresult launch_writer(const struct variant *v, double ms, CUdeviceptr buf,
                              unsigned long long words)
{
    unsigned long long ns = (unsigned long long)(ms * 1e6);
    void *args[] = {&ns, &buf, &words};
    if (v->ptsz)
        return cuLaunchKernel_ptsz(kernels.spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    return gc_launch(kernels.spin, v->stream, args);
}

struct memory {
    const char *name;
    CUdeviceptr dptr; /* what the kernel writes */
    void *host;       /* hostmap only */
};

static struct memory make_memory(const char *name)
{
    struct memory m = {name, 0, NULL};
    if (strcmp(name, "device") == 0) {
        GC_CHECK(cuMemAlloc(&m.dptr, BUFFER_BYTES));
    } else if (strcmp(name, "managed") == 0) {
        GC_CHECK(cuMemAllocManaged(&m.dptr, BUFFER_BYTES, CU_MEM_ATTACH_GLOBAL));
    } else if (strcmp(name, "hostmap") == 0) {
        GC_CHECK(cuMemHostAlloc(&m.host, BUFFER_BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
        GC_CHECK(cuMemHostGetDevicePointer(&m.dptr, m.host, 0));
    } else {
        gc_die("unknown memory '%s'", name);
    }
    return m;
}

static CUresult release(const struct memory *m)
{
    return m->host ? cuMemFreeHost(m->host) : cuMemFree(m->dptr);
}

/* The control: the use-after-free the shim must never commit. */
static CUresult release_unsafe(const struct memory *m)
{
    CUstream other;
    GC_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CUresult rc = cuMemFreeAsync(m->dptr, other);
    if (rc == CUDA_SUCCESS)
        rc = cuStreamSynchronize(other); /* the memory is surely back now */
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        gc_die("usage: hazard <nonblocking|blocking|legacy|perthread|ptsz|unsafe> "
               "<device|managed|hostmap>");
    gc_init();
    gc_load_kernels(&kernels);
    struct variant v = make_variant(argv[1]);
    if (v.unsafe && strcmp(argv[2], "device") != 0)
        gc_die("the unsafe control is for device memory only");

    /* Warm-up: the writer's first launch on its stream, and a short run
     * over the memory kind's first buffer. */
    GC_CHECK(launch_writer(&v, 0.1, 0, 0));
    GC_CHECK(cuCtxSynchronize());

    struct memory m = make_memory(argv[2]);
    unsigned long long words = BUFFER_BYTES / 4;
    /* The fault check (cudefer loaded): a block to release after the fault,
     * and one released before it, which cudefer queues behind the writer
     * (the driver alone would wait for the writer here, and the control
     * would no longer fault). */
    bool fault_check = v.unsafe && gc_cudefer_loaded();
    CUdeviceptr spare = 0;
    void *pinned = NULL;
    if (fault_check) {
        GC_CHECK(cuMemAlloc(&spare, GC_MIB));
        GC_CHECK(cuMemAllocHost(&pinned, GC_MIB));
    }
    GC_CHECK(launch_writer(&v, WRITER_MS, m.dptr, words));
    gc_sleep_ms(SETTLE_MS);
    int queued = 0;
    if (fault_check) {
        GC_CHECK(cuMemFreeHost(pinned));
        queued++;
    }

    bool running = cuStreamQuery(v.stream) == CUDA_ERROR_NOT_READY;
    double t0 = gc_now_ms();
    CUresult rc = v.unsafe ? release_unsafe(&m) : release(&m);
    double release_ms = gc_now_ms() - t0;
    CUresult sync = cuCtxSynchronize();
    const char *after = "-";
    if (fault_check && sync != CUDA_SUCCESS)
        after = gc_rc(cuMemFree(spare));

    printf("RESULT hazard stream=%s memory=%s release_rc=%s release_ms=%.4f writer_running=%d",
           v.name, m.name, gc_rc(rc), release_ms, (int)running);
    printf(" sync_rc=%s fault=%d queued=%d after_rc=%s\n", gc_rc(sync), sync != CUDA_SUCCESS,
           queued, after);
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        return 0; /* the context is dead: nothing more to release */

    if (v.stream && v.stream != CU_STREAM_LEGACY && v.stream != CU_STREAM_PER_THREAD)
        GC_CHECK(cuStreamDestroy(v.stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
