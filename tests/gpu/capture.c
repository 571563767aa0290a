/* capture.c - check 7: releases on one thread during a capture on another.
 *
 * Per round: thread 2 allocates device and pinned host buffers (while no
 * capture is live: allocating is itself illegal during a global capture);
 * thread 1 begins a global-mode capture of a stream and records a few
 * kernel launches into it, while thread 2 frees the buffers (cuMemFree,
 * cuMemFreeHost) one by one; then thread 1 ends the capture, which must
 * succeed, instantiates the graph, launches it, and checks what the
 * kernels wrote. Buffers whose free failed are freed again after the
 * capture ended, so nothing leaks either way.
 *
 * usage: capture [rounds]     (default 10)
 *
 * prints:
 *   RESULT capture rounds=<n> captured=<n> graphs_ok=<n> capture_launch_errors=<n>
 *          free_errors=<n> free_host_errors=<n> first_end_rc=<code>
 *          first_free_rc=<code> leftover_errors=<n>
 */
#include "gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define BUFFERS 8
#define BUFFER_BYTES (64 * GC_KIB)
#define LAUNCHES 5
#define WORDS 1024

static struct gc_kernels kernels;
static CUcontext context;
static CUstream stream;
static CUdeviceptr target; /* what the captured kernels write */
static pthread_barrier_t barrier;

static struct {
    _Atomic bool capturing;
    _Atomic bool freed;
    int free_errors, free_host_errors, leftover_errors;
    CUresult first_free_rc;
    CUdeviceptr dev[BUFFERS];
    void *host[BUFFERS];
    bool dev_left[BUFFERS], host_left[BUFFERS];
} t2;

static void note_free(CUresult rc, int *errors)
{
    if (rc == CUDA_SUCCESS)
        return;
    if ((*errors)++ == 0 && t2.first_free_rc == CUDA_SUCCESS)
        t2.first_free_rc = rc;
}

static void t2_allocate(void)
{
    for (int i = 0; i < BUFFERS; i++) {
        GC_CHECK(cuMemAlloc(&t2.dev[i], BUFFER_BYTES));
        GC_CHECK(cuMemAllocHost(&t2.host[i], BUFFER_BYTES));
    }
}

static void t2_free_all(void)
{
    for (int i = 0; i < BUFFERS; i++) {
        CUresult rc = cuMemFree(t2.dev[i]);
        t2.dev_left[i] = rc != CUDA_SUCCESS;
        note_free(rc, &t2.free_errors);
        gc_sleep_ms(0.2);
        rc = cuMemFreeHost(t2.host[i]);
        t2.host_left[i] = rc != CUDA_SUCCESS;
        note_free(rc, &t2.free_host_errors);
        gc_sleep_ms(0.2);
    }
}

/* After the capture: whatever could not be freed during it. */
static void t2_free_leftovers(void)
{
    for (int i = 0; i < BUFFERS; i++) {
        if (t2.dev_left[i] && cuMemFree(t2.dev[i]) != CUDA_SUCCESS)
            t2.leftover_errors++;
        if (t2.host_left[i] && cuMemFreeHost(t2.host[i]) != CUDA_SUCCESS)
            t2.leftover_errors++;
    }
}

static void *thread2_main(void *arg)
{
    int rounds = *(int *)arg;
    GC_CHECK(cuCtxSetCurrent(context));
    for (int r = 0; r < rounds; r++) {
        t2_allocate();
        pthread_barrier_wait(&barrier); /* A: allocated, no capture live */
        while (!atomic_load(&t2.capturing))
            gc_sleep_ms(0.05);
        t2_free_all();
        atomic_store(&t2.freed, true);
        pthread_barrier_wait(&barrier); /* B: the capture has ended */
        t2_free_leftovers();
        pthread_barrier_wait(&barrier); /* C: round over */
    }
    return NULL;
}

struct tally {
    int captured, graphs_ok, launch_errors;
    CUresult first_end_rc;
};

/* Records LAUNCHES kernels into a global capture while thread 2 frees. */
static CUgraph capture_round(struct tally *t)
{
    CUgraph g = NULL;
    GC_CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    atomic_store(&t2.capturing, true);
    for (int i = 0; i < LAUNCHES; i++) {
        if (gc_touch(&kernels, stream, target, WORDS) != CUDA_SUCCESS)
            t->launch_errors++;
        gc_sleep_ms(1.0);
    }
    while (!atomic_load(&t2.freed))
        gc_sleep_ms(0.05);
    CUresult end = cuStreamEndCapture(stream, &g);
    atomic_store(&t2.capturing, false);
    if (end != CUDA_SUCCESS) {
        if (t->first_end_rc == CUDA_SUCCESS)
            t->first_end_rc = end;
        return NULL;
    }
    t->captured++;
    return g;
}

/* Launches the graph over a poisoned target and checks what it wrote. */
static bool run_graph(CUgraph g)
{
    static uint32_t words[WORDS];
    CUgraphExec exec;
    GC_CHECK(cuGraphInstantiate(&exec, g, 0));
    GC_CHECK(cuMemsetD8Async(target, 0xff, WORDS * 4, stream));
    GC_CHECK(cuGraphLaunch(exec, stream));
    GC_CHECK(cuStreamSynchronize(stream));
    GC_CHECK(cuMemcpyDtoH(words, target, sizeof words));
    GC_CHECK(cuGraphExecDestroy(exec));
    GC_CHECK(cuGraphDestroy(g));
    for (uint32_t i = 0; i < WORDS; i++)
        if (words[i] != i)
            return false;
    return true;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    if (rounds < 1)
        gc_die("usage: capture [rounds]");
    context = gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuMemAlloc(&target, WORDS * 4));
    GC_CHECK(gc_touch(&kernels, stream, target, WORDS));
    GC_CHECK(cuCtxSynchronize());

    pthread_t thread2;
    if (pthread_barrier_init(&barrier, NULL, 2) != 0 ||
        pthread_create(&thread2, NULL, thread2_main, &rounds) != 0)
        gc_die("pthread set-up failed");

    struct tally t = {0, 0, 0, CUDA_SUCCESS};
    for (int r = 0; r < rounds; r++) {
        atomic_store(&t2.freed, false);
        pthread_barrier_wait(&barrier); /* A */
        CUgraph g = capture_round(&t);
        pthread_barrier_wait(&barrier); /* B */
        if (g && run_graph(g))
            t.graphs_ok++;
        pthread_barrier_wait(&barrier); /* C */
    }
    pthread_join(thread2, NULL);

    printf("RESULT capture rounds=%d captured=%d graphs_ok=%d capture_launch_errors=%d", rounds,
           t.captured, t.graphs_ok, t.launch_errors);
    printf(" free_errors=%d free_host_errors=%d first_end_rc=%s first_free_rc=%s", t2.free_errors,
           t2.free_host_errors, gc_rc(t.first_end_rc), gc_rc(t2.first_free_rc));
    printf(" leftover_errors=%d\n", t2.leftover_errors);
    fflush(stdout);

    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuMemFree(target));
    GC_CHECK(cuStreamDestroy(stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
