/* reuse.c - whose memory an allocation hands back, in a program that keeps
 * the GPU behind.
 *
 *   test_reuse [OPS [THREADS [SEED]]]     (or REUSE_OPS, REUSE_THREADS,
 *                                           REUSE_SEED; REUSE_TIMEOUT,
 *                                           REUSE_STALL_S, default 10,
 *                                           REUSE_KEEP_GOING as in harness.h)
 *
 * Threads allocate device, pinned and managed blocks of two sizes in two
 * contexts (the primary context of device 0 and a context of device 1),
 * launch kernels that write them on several streams (non-blocking,
 * blocking and per-thread; a managed block also from the other context),
 * and release them without synchronising: the common loop of a program
 * that allocates, launches and frees, in which most allocations could be
 * served by a block released a moment before, while its kernels may still
 * run. That is where cudefer decides when a released block is the
 * program's again (its fence's word or its event, shim/engine/fence.h),
 * and where a wrong answer lets the GPU write memory the program got back.
 * Synchronisations and flushes are rare, so that released blocks stay for
 * reuse. Now and then a thread runs a tight loop over one small size of
 * one kind (op_loop), the benchmarks' loop, where a size's rotation may
 * grow.
 *
 * Invariants:
 *  - reuse-early: when an allocation returns a range, every kernel that
 *    wrote memory overlapping it and was submitted before that memory's
 *    release has finished (an event recorded after each writer, on its
 *    stream, is complete);
 *  - one owner: an allocation never returns a range that overlaps a block
 *    the program holds;
 *  - testdrv_faults() == 0 and testdrv_dead_context_calls() == 0;
 *  - every call succeeds;
 *  - nothing leaks: after every release, a synchronisation of both
 *    contexts and cudefer_flush, the driver holds the program's blocks of
 *    the start;
 *  - coverage: with the shim, at least one allocation in 20 returned
 *    memory released before (else the run says nothing about reuse).
 *
 * Seeds that are multiples of 3 reuse without the fences' words
 * (hx_word_by_seed); even seeds gather what cudefer saved
 * (hx_savings_by_seed). REUSE_DRIVER_ALONE=1 runs without the shim (the
 * driver alone meets every invariant but coverage: a check of the harness).
 */
#include "harness.h"
#include "own.h"
#include "testdriver.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_OPS 20000
#define DEFAULT_THREADS 8
#define HELD 4      /* blocks a thread holds at most */
#define WRITERS 4   /* tracked writers of a block (at most HX_WRITERS) */
#define STREAMS 3   /* per thread and context: non-blocking, blocking, per-thread */

enum kind { K_DEVICE, K_HOST, K_MANAGED, K_KINDS };
static const char *const kind_names[K_KINDS] = {"device", "pinned", "managed"};
static const enum testdrv_kind live_kinds[K_KINDS] = {TESTDRV_DEVICE, TESTDRV_HOST,
                                                      TESTDRV_MANAGED};

static struct hx_ctx ctxs[2] = {{.name = "primary(0)"}, {.name = "context(1)"}};
static bool driver_alone;

struct block {
    enum kind kind;
    uintptr_t p;
    size_t size;
    int ctx;
    CUevent ev[WRITERS];
    int nev;
};

struct worker {
    struct hx_thread t;
    CUstream streams[2][STREAMS];
    struct block held[HELD];
    int nheld;
    unsigned long long allocs, releases, launches, syncs, flushes;
};

static struct worker workers[HX_MAX_THREADS];

/* ---- memory held (memory released while its writers may run: harness.h) -------- */

_Static_assert(WRITERS <= HX_WRITERS, "the table keeps every writer's event");

static pthread_mutex_t tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct owned {
    uintptr_t lo, hi;
    int thread;
} owned[HX_MAX_THREADS * HELD];
static size_t nowned;

/* An allocation returned b: nothing written before a release still runs on
 * it, and nobody holds any of it. */
static void check_returned(struct worker *w, const struct block *b)
{
    uintptr_t lo = b->p, hi = b->p + b->size;
    pthread_mutex_lock(&tab_lock);
    for (size_t i = 0; i < nowned; i++)
        if (owned[i].lo < hi && lo < owned[i].hi)
            hx_fail(&w->t, "one-owner", "%s block %#lx of %zu bytes overlaps one that thread %d "
                    "holds", kind_names[b->kind], (unsigned long)lo, b->size, owned[i].thread);
    owned[nowned++] = (struct owned){lo, hi, w->t.index};
    pthread_mutex_unlock(&tab_lock);
    char call[64];
    snprintf(call, sizeof call, "the allocation of a %s block", kind_names[b->kind]);
    hx_released_check(&w->t, lo, hi, call);
}

/* b is about to be released: its writers go to the table, and it is no
 * longer held. */
static void note_released(struct worker *w, struct block *b)
{
    pthread_mutex_lock(&tab_lock);
    for (size_t i = 0; i < nowned; i++)
        if (owned[i].lo == b->p && owned[i].thread == w->t.index) {
            owned[i] = owned[--nowned];
            break;
        }
    pthread_mutex_unlock(&tab_lock);
    char what[64];
    snprintf(what, sizeof what, "%s %#lx", kind_names[b->kind], (unsigned long)b->p);
    hx_released_note(b->p, b->p + b->size, what, b->ev, b->nev);
    b->nev = 0;
}


/* ---- operations --------------------------------------------------------------------- */

static bool ok(struct worker *w, const char *call, CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        hx_fail(&w->t, "result", "%s returned %s", call, hx_rc(rc));
    return rc == CUDA_SUCCESS;
}

static void enter(struct worker *w, int c)
{
    ok(w, "cuCtxSetCurrent", cuCtxSetCurrent(ctxs[c].h));
}

static CUstream stream_of(struct worker *w, int c, int i)
{
    return i == STREAMS - 1 ? CU_STREAM_PER_THREAD : w->streams[c][i];
}

/* Allocates a block of kind, size and context and holds it: false when it
 * failed. */
static bool alloc_block(struct worker *w, enum kind kind, size_t size, int ctx)
{
    struct block b = {.kind = kind, .size = size, .ctx = ctx};
    enter(w, b.ctx);
    CUresult rc;
    if (b.kind == K_HOST) {
        void *h = NULL;
        hx_begin(&w->t, "cuMemAllocHost(%zu) in %s", b.size, ctxs[b.ctx].name);
        rc = cuMemAllocHost(&h, b.size);
        b.p = (uintptr_t)h;
    } else {
        CUdeviceptr d = 0;
        hx_begin(&w->t, "%s(%zu) in %s", b.kind == K_DEVICE ? "cuMemAlloc" : "cuMemAllocManaged",
                 b.size, ctxs[b.ctx].name);
        rc = b.kind == K_DEVICE ? cuMemAlloc(&d, b.size)
                                : cuMemAllocManaged(&d, b.size, CU_MEM_ATTACH_GLOBAL);
        b.p = (uintptr_t)d;
    }
    hx_end(&w->t, rc);
    if (!ok(w, kind_names[b.kind], rc))
        return false;
    hx_note(&w->t, "returned %#lx", (unsigned long)b.p);
    check_returned(w, &b);
    w->held[w->nheld++] = b;
    w->allocs++;
    return true;
}

static void op_alloc(struct worker *w)
{
    if (w->nheld == HELD)
        return;
    enum kind kind = (enum kind)hx_below(&w->t, K_KINDS);
    size_t size = hx_below(&w->t, 4) ? 4096 : 65536;
    alloc_block(w, kind, size, (int)hx_below(&w->t, 2));
}

/* A kernel that writes b (a managed one, at times, from the other
 * context), and an event behind it. */
static void launch_on(struct worker *w, struct block *b)
{
    if (b->nev == WRITERS)
        return;
    int c = b->kind == K_MANAGED && !hx_below(&w->t, 4) ? 1 - b->ctx : b->ctx;
    int si = (int)hx_below(&w->t, STREAMS);
    CUstream s = stream_of(w, c, si);
    unsigned usec = hx_below(&w->t, 8) ? 1 + hx_below(&w->t, 100) : 200 + hx_below(&w->t, 1500);
    enter(w, c);
    CUevent ev = NULL;
    if (!ok(w, "cuEventCreate", cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING)))
        return;
    hx_begin(&w->t, "testdrv_launch(stream %d of %s, %u us, %s %#lx)", si, ctxs[c].name, usec,
             kind_names[b->kind], (unsigned long)b->p);
    CUresult rc = testdrv_launch(s, usec, (CUdeviceptr)b->p, b->size, TESTDRV_WRITE);
    hx_end(&w->t, rc);
    if (!ok(w, "testdrv_launch", rc) || !ok(w, "cuEventRecord", cuEventRecord(ev, s))) {
        cuEventDestroy(ev);
        return;
    }
    b->ev[b->nev++] = ev;
    w->launches++;
}

static void op_launch(struct worker *w)
{
    if (w->nheld)
        launch_on(w, &w->held[hx_below(&w->t, (unsigned)w->nheld)]);
}

/* Releases the held block i. */
static void release_held(struct worker *w, int i)
{
    struct block b = w->held[i];
    w->held[i] = w->held[--w->nheld];
    note_released(w, &b);
    enter(w, b.ctx);
    CUresult rc;
    if (b.kind == K_HOST) {
        hx_begin(&w->t, "cuMemFreeHost(%#lx)", (unsigned long)b.p);
        rc = cuMemFreeHost((void *)b.p);
    } else {
        hx_begin(&w->t, "cuMemFree(%s %#lx)", kind_names[b.kind], (unsigned long)b.p);
        rc = cuMemFree((CUdeviceptr)b.p);
    }
    hx_end(&w->t, rc);
    ok(w, "the release", rc);
    w->releases++;
}

static void op_release(struct worker *w)
{
    if (w->nheld)
        release_held(w, (int)hx_below(&w->t, (unsigned)w->nheld));
}

/* Now and then: the loop of a program that allocates one small size of
 * device, pinned or managed memory, launches a kernel on it and releases it,
 * 20 to 60 times without synchronising, where cudefer's reuse may grow the
 * size's rotation with new blocks instead of asking the driver about the
 * oldest one's fence (shim/engine/cache.c, may_grow). Every allocation is
 * checked as any other (reuse-early, one owner). */
static void op_loop(struct worker *w)
{
    if (w->nheld == HELD)
        return;
    size_t size = hx_below(&w->t, 2) ? 4096 : 16384;
    int ctx = (int)hx_below(&w->t, 2);
    enum kind k = (enum kind)hx_below(&w->t, K_KINDS);
    unsigned n = 20 + hx_below(&w->t, 41);
    for (unsigned i = 0; i < n; i++) {
        if (!alloc_block(w, k, size, ctx))
            return;
        launch_on(w, &w->held[w->nheld - 1]);
        release_held(w, w->nheld - 1);
    }
}

/* Rare: a stream's or a context's synchronisation (a flush point), or
 * cudefer_flush. */
static void op_sync(struct worker *w)
{
    int c = (int)hx_below(&w->t, 2);
    enter(w, c);
    unsigned pick = hx_below(&w->t, 8);
    if (pick == 0) {
        hx_begin(&w->t, "cuCtxSynchronize in %s", ctxs[c].name);
        CUresult rc = cuCtxSynchronize();
        hx_end(&w->t, rc);
        ok(w, "cuCtxSynchronize", rc);
    } else if (pick == 1 && !driver_alone) {
        hx_begin(&w->t, "cudefer_flush");
        int rc = hx_flush();
        hx_end(&w->t, CUDA_SUCCESS);
        if (rc != 0)
            hx_fail(&w->t, "result", "cudefer_flush returned %d", rc);
        w->flushes++;
        return;
    } else {
        int si = (int)hx_below(&w->t, STREAMS);
        hx_begin(&w->t, "cuStreamSynchronize(stream %d of %s)", si, ctxs[c].name);
        CUresult rc = cuStreamSynchronize(stream_of(w, c, si));
        hx_end(&w->t, rc);
        ok(w, "cuStreamSynchronize", rc);
    }
    w->syncs++;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int c = 0; c < 2; c++) {
        enter(w, c);
        ok(w, "cuStreamCreate", cuStreamCreate(&w->streams[c][0], CU_STREAM_NON_BLOCKING));
        ok(w, "cuStreamCreate", cuStreamCreate(&w->streams[c][1], CU_STREAM_DEFAULT));
    }
    for (unsigned long long n = 0; n < w->t.ops; n++) {
        unsigned pick = hx_below(&w->t, 200);
        if (pick == 0)
            op_loop(w);
        else if (pick < 60)
            op_alloc(w);
        else if (pick < 130)
            op_launch(w);
        else if (pick < 195)
            op_release(w);
        else
            op_sync(w);
        if (testdrv_faults())
            hx_fail(&w->t, "fault", "%llu kernel touches of memory that was not live",
                    (unsigned long long)testdrv_faults());
        if (testdrv_dead_context_calls())
            hx_fail(&w->t, "dead-context", "%llu calls named a destroyed context",
                    (unsigned long long)testdrv_dead_context_calls());
        atomic_store(&w->t.done, n + 1);
    }
    while (w->nheld)
        op_release(w);
    for (int c = 0; c < 2; c++) {
        enter(w, c);
        ok(w, "cuStreamSynchronize", cuStreamSynchronize(w->streams[c][0]));
        ok(w, "cuStreamDestroy", cuStreamDestroy(w->streams[c][0]));
        ok(w, "cuStreamDestroy", cuStreamDestroy(w->streams[c][1]));
    }
    return NULL;
}

static bool settled(const size_t *base)
{
    for (int k = 0; k < K_KINDS; k++)
        if (program_live(live_kinds[k]) > base[k])
            return false;
    return testdrv_pending_free_bytes() == 0;
}

int main(int argc, char **argv)
{
    hx.stall_s = 10;
    hx_parse(argc, argv, "reuse", "REUSE", DEFAULT_OPS, DEFAULT_THREADS, 500);
    const char *env = getenv("REUSE_DRIVER_ALONE");
    driver_alone = env && strcmp(env, "0") != 0;
    if (!hx_shim_loaded() && !driver_alone) {
        fprintf(stderr, "reuse: the shim is not preloaded (REUSE_DRIVER_ALONE=1 runs without "
                        "it)\n");
        return 2;
    }
    setenv("TESTDRIVER_DEVICES", "2", 0);
    const char *savings = hx_savings_by_seed();
    const char *reuse = hx_word_by_seed();
    hx_watchdog_start();
    CUcontext popped;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctxs[0].h, 0) ||
        cuCtxCreate(&ctxs[1].h, NULL, 0, 1) || cuCtxPopCurrent(&popped)) {
        fprintf(stderr, "reuse: no contexts (are there 2 devices?)\n");
        return 2;
    }
    /* What cudefer sets up once per context (its pinned word, its warm-up)
     * is there before the baseline. */
    for (int c = 0; c < 2; c++) {
        CUdeviceptr d;
        if (cuCtxSetCurrent(ctxs[c].h) || cuMemAlloc(&d, 4096) || cuMemFree(d) ||
            cuCtxSynchronize()) {
            fprintf(stderr, "reuse: the warm-up in %s failed\n", ctxs[c].name);
            return 2;
        }
    }
    if (!driver_alone)
        hx_flush();
    size_t base[K_KINDS];
    for (int k = 0; k < K_KINDS; k++)
        base[k] = program_live(live_kinds[k]);
    printf("reuse: %llu operations, %d threads, seed %llu, savings %s, reuse %s%s\n", hx.ops,
           hx.threads, (unsigned long long)hx.seed, savings, reuse,
           driver_alone ? ", the driver alone" : "");
    fflush(stdout);

    hx_watchdog_phase("workers running");
    uint64_t t0 = hx_now_ns();
    pthread_t tid[HX_MAX_THREADS];
    for (int i = 0; i < hx.threads; i++) {
        hx_thread_init(&workers[i].t, i);
        unsigned long long n = (unsigned long long)hx.threads;
        workers[i].t.ops = hx.ops / n + ((unsigned long long)i < hx.ops % n);
        pthread_create(&tid[i], NULL, worker_main, &workers[i]);
    }
    for (int i = 0; i < hx.threads; i++)
        pthread_join(tid[i], NULL);
    double work_s = (double)(hx_now_ns() - t0) / 1e9;

    hx_watchdog_phase("final flush");
    for (int c = 0; c < 2; c++)
        if (cuCtxSetCurrent(ctxs[c].h) || cuCtxSynchronize())
            hx_fail(NULL, "result", "cuCtxSynchronize of %s failed at the end", ctxs[c].name);
    hx_released_clear();
    if (!driver_alone && hx_flush() != 0)
        hx_fail(NULL, "result", "the final cudefer_flush failed");
    for (int i = 0; i < 5000 && !settled(base); i++)
        usleep(1000);
    for (int k = 0; k < K_KINDS; k++)
        if (program_live(live_kinds[k]) != base[k])
            hx_fail(NULL, "leak", "after every release, both synchronisations and "
                    "cudefer_flush the driver holds %zu %s blocks, %zu at the start",
                    program_live(live_kinds[k]), kind_names[k], base[k]);
    if (testdrv_faults())
        hx_fail(NULL, "fault", "%llu kernel touches of memory that was not live",
                (unsigned long long)testdrv_faults());
    hx_watchdog_stop();

    unsigned long long allocs = 0, releases = 0, launches = 0, syncs = 0, flushes = 0;
    for (int i = 0; i < hx.threads; i++) {
        allocs += workers[i].allocs, releases += workers[i].releases;
        launches += workers[i].launches, syncs += workers[i].syncs;
        flushes += workers[i].flushes;
    }
    printf("reuse: %llu operations in %.2f s: %llu allocations, %llu releases, %llu launches, "
           "%llu synchronisations, %llu flushes\n", hx.ops, work_s, allocs, releases, launches,
           syncs, flushes);
    printf("reuse: %llu allocations returned memory released before with its writers tracked "
           "(reuse-early checked); %llu releases went unchecked (the table was full of writers "
           "still running)\n", hx_released_checked(), hx_released_unchecked());
    if (!driver_alone && hx_released_checked() * 20 < allocs)
        hx_fail(NULL, "coverage", "only %llu of %llu allocations returned memory released "
                "before: the run says little about reuse", hx_released_checked(), allocs);
    if (hx_failures()) {
        printf("reuse: FAILED: %u failures (%s)\n", hx_failures(), hx_failed_invariants());
        return 1;
    }
    printf("reuse: every invariant held\n");
    return 0;
}
