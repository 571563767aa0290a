/* oom.c - check 5: freed memory must come back in time for allocations.
 *
 * Loop: 200 rounds of cuMemAlloc 2 GiB, a kernel touching a few words of
 * it, cuMemFree - no synchronisation inside the loop. A shim that frees
 * asynchronously must not make any of these allocations fail.
 *
 * Refill: allocate most of the free memory (90% of cuMemGetInfo's free) in
 * 4 GiB chunks and touch each, free them all, then at once allocate them
 * all again: the frees are still in flight, so only a flush and retry on
 * out-of-memory lets the second round succeed.
 *
 * usage: oom [rounds]     (default 200)
 *
 * prints:
 *   RESULT oom_loop rounds=<n> oom=<n> other_errors=<n> free_errors=<n> ms=<ms>
 *          per_round_ms=<ms> sync_rc=<code>
 *   RESULT oom_refill chunks=<n> chunk_gib=4 free_gib=<g> first_oom=<n>
 *          second_oom=<n> other_errors=<n> free_errors=<n> second_ms=<ms>
 *          sync_rc=<code>
 *   RESULT oom_memory free_start_gib=<g> free_end_gib=<g>
 */
#include "gpu.h"

#define LOOP_BYTES (2 * GC_GIB)
#define CHUNK_BYTES (4 * GC_GIB)
#define MAX_CHUNKS 512
#define TOUCH_WORDS 16

static struct gc_kernels kernels;
static CUstream stream;

struct tally {
    int oom, other_errors, free_errors;
};

static double free_gib(void)
{
    size_t free_bytes, total;
    GC_CHECK(cuMemGetInfo(&free_bytes, &total));
    return (double)free_bytes / (double)GC_GIB;
}

/* Allocates and touches one block; 0 when the allocation failed. */
static CUdeviceptr alloc_touched(size_t bytes, struct tally *t)
{
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc(&p, bytes);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        t->oom++;
        return 0;
    }
    if (rc != CUDA_SUCCESS) {
        if (t->other_errors++ == 0)
            fprintf(stderr, "cuMemAlloc(%zu): %s\n", bytes, gc_rc(rc));
        return 0;
    }
    GC_CHECK(gc_touch(&kernels, stream, p, TOUCH_WORDS));
    return p;
}

static void release(CUdeviceptr p, struct tally *t)
{
    if (!p)
        return;
    CUresult rc = cuMemFree(p);
    if (rc != CUDA_SUCCESS && t->free_errors++ == 0)
        fprintf(stderr, "cuMemFree: %s\n", gc_rc(rc));
}

static void loop(int rounds)
{
    struct tally t = {0};
    double t0 = gc_now_ms();
    for (int r = 0; r < rounds; r++)
        release(alloc_touched(LOOP_BYTES, &t), &t);
    double ms = gc_now_ms() - t0;
    CUresult sync = cuCtxSynchronize();
    printf("RESULT oom_loop rounds=%d oom=%d other_errors=%d free_errors=%d ms=%.1f", rounds,
           t.oom, t.other_errors, t.free_errors, ms);
    printf(" per_round_ms=%.3f sync_rc=%s\n", ms / rounds, gc_rc(sync));
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        exit(0);
}

static void refill(void)
{
    static CUdeviceptr chunks[MAX_CHUNKS];
    double gib = free_gib();
    size_t n = (size_t)(gib * 0.9 * (double)GC_GIB) / CHUNK_BYTES;
    if (n > MAX_CHUNKS)
        n = MAX_CHUNKS;

    struct tally first = {0}, second = {0};
    for (size_t i = 0; i < n; i++)
        chunks[i] = alloc_touched(CHUNK_BYTES, &first);
    for (size_t i = 0; i < n; i++)
        release(chunks[i], &first);

    double t0 = gc_now_ms();
    for (size_t i = 0; i < n; i++)
        chunks[i] = alloc_touched(CHUNK_BYTES, &second);
    double second_ms = gc_now_ms() - t0;
    for (size_t i = 0; i < n; i++)
        release(chunks[i], &second);
    CUresult sync = cuCtxSynchronize();

    printf("RESULT oom_refill chunks=%zu chunk_gib=4 free_gib=%.1f first_oom=%d second_oom=%d", n,
           gib, first.oom, second.oom);
    printf(" other_errors=%d free_errors=%d second_ms=%.1f sync_rc=%s\n",
           first.other_errors + second.other_errors, first.free_errors + second.free_errors,
           second_ms, gc_rc(sync));
    fflush(stdout);
    if (sync != CUDA_SUCCESS)
        exit(0);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    if (rounds < 1)
        gc_die("usage: oom [rounds]");
    gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(gc_touch(&kernels, stream, 0, 0));
    GC_CHECK(cuCtxSynchronize());
    double start = free_gib();

    loop(rounds);
    refill();

    gc_cudefer_flush();
    printf("RESULT oom_memory free_start_gib=%.2f free_end_gib=%.2f\n", start, free_gib());
    GC_CHECK(cuStreamDestroy(stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
