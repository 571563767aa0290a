/* phases.c - cudefer-phases: where one loop iteration's time goes, call by
 * call, in the process it runs in (with or without cudefer preloaded; run it
 * both ways and compare).
 *
 * Four loops of cudefer-loops' rows, each twice (the second is the figure
 * to read; the first warms the driver up), with no synchronisation inside:
 *   dev4k   cuMemAlloc(4 KiB) / cudefer_touch of 16 words / cuMemFree
 *   dev4kf  the same with cudefer_fill of every word (the full touch)
 *   host4k  cuMemAllocHost(4 KiB) / cuMemHostGetDevicePointer / touch /
 *           cuMemFreeHost
 *   reg4k   cuMemHostRegister(4 KiB, DEVICEMAP) / cuMemHostGetDevicePointer
 *           / cudefer_fill of the page / cuMemHostUnregister
 * and prints the mean ns of each call. Then the driver calls a fence is made
 * of, on an idle GPU: cuEventQuery of an event recorded on a stream and of
 * one recorded with cuCtxRecordEvent, cuCtxGetCurrent, cuCtxRecordEvent,
 * cuEventRecord, and a cuEventCreate with its cuEventDestroy (ns per call). And the ways a 4 KiB device block goes back
 * to the driver on an idle GPU: cuMemFree, cuMemFreeAsync, the same behind
 * a cuStreamWaitEvent of a passed event, and that wait alone (ns a block).
 *
 * Then three ways of reusing a released device block, written out with the
 * driver's calls (read them in the run without cudefer), over cudefer-loops'
 * device rows (4 KiB and 64 MiB, light and full touch; us an iteration):
 *   pool     cuMemAllocAsync / cuMemFreeAsync from the device's default
 *            pool, release threshold at the maximum;
 *   fenced   what cudefer does: a release records a fence
 *            (cuCtxRecordEvent); an allocation takes the oldest released
 *            block whose fence has passed, else makes a new one (cuMemAlloc;
 *            at 16 blocks out it waits for the oldest fence instead);
 *   word     as fenced, but the GPU also writes the release's number into
 *            a host-visible word after its fence (cuStreamWaitEvent and
 *            cuStreamWriteValue32 on a stream of its own), and an
 *            allocation reads the word instead of querying the event
 *            (not run where the driver has no cuStreamWriteValue32_v2);
 *   barrier  an allocation takes the newest released block at once and
 *            makes every later work of the context wait for its fence on
 *            the GPU (cuCtxWaitEvent, driver 12.5+).
 * And what that barrier does to another stream: a kernel of 50 ms writes a
 * block, which is released; the next allocation on another thread's stream
 * takes it (barrier) or a new one (fenced), and that stream's tiny kernel is
 * timed to its end (ms).
 *
 * With --sample, the dev4k loop runs ITERS more times (default 300000;
 * --sample-full: the dev4kf loop)
 * under a SIGPROF timer of 1 ms of process CPU time (every thread's), and
 * the sampled program counters are printed per library and, where the
 * dynamic symbol table names one, per function (static functions of a
 * library show as "-"; resolve them with addr2line and the offsets of
 * --sample-offsets). Each sample also keeps its stack (backtrace): for
 * the samples in the driver and in libc (its locks), the first frame
 * outside that library is counted as the caller ("sample-caller" lines:
 * the sampled library, the caller's library and its symbol or offset).
 *
 * --smoke makes every count a hundred times smaller (over the test driver,
 * where the figures mean nothing: the run checks that every call succeeds).
 *
 * Usage: cudefer-phases [--smoke] [--sample[-full] [ITERS]] [--sample-offsets]
 * Exit status: 0, or 1 when a CUDA call fails.
 */
#include "gpu.h"
#include "kernels.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>

/* Iterations of each loop; a hundredth with --smoke. */
static int N = 3000;

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* ---- the loops ----------------------------------------------------------- */

/* What every loop uses, and the ns each of its calls took (summed). */
struct run {
    const struct gc_kernels *k;
    CUstream s;
    void *page;                /* reg4k's page */
    unsigned long long t[4];   /* per call, in the order of the loop's names */
    unsigned long long mark;   /* when the call now timed began */
};

/* Adds the time since the last mark to call i's sum. */
static void lap(struct run *r, int i)
{
    unsigned long long now = now_ns();
    r->t[i] += now - r->mark;
    r->mark = now;
}

/* One dev4k iteration; full: cudefer-loops' full touch (every word of
 * the block) instead of 16 words. */
static void dev4k_touching(struct run *r, bool full)
{
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, 4096));
    lap(r, 0);
    GC_CHECK(full ? gc_fill(r->k, r->s, d, 4096) : gc_touch(r->k, r->s, d, 16));
    lap(r, 1);
    GC_CHECK(cuMemFree(d));
    lap(r, 2);
}

static void dev4k_once(struct run *r)
{
    dev4k_touching(r, false);
}

static void dev4kf_once(struct run *r)
{
    dev4k_touching(r, true);
}

static void host4k_once(struct run *r)
{
    CUdeviceptr d;
    void *h;
    GC_CHECK(cuMemAllocHost(&h, 4096));
    lap(r, 0);
    GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
    lap(r, 1);
    GC_CHECK(gc_touch(r->k, r->s, d, 16));
    lap(r, 2);
    GC_CHECK(cuMemFreeHost(h));
    lap(r, 3);
}

static void reg4k_once(struct run *r)
{
    CUdeviceptr d;
    GC_CHECK(cuMemHostRegister(r->page, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
    lap(r, 0);
    GC_CHECK(cuMemHostGetDevicePointer(&d, r->page, 0));
    lap(r, 1);
    GC_CHECK(gc_fill(r->k, r->s, d, 4096));
    lap(r, 2);
    GC_CHECK(cuMemHostUnregister(r->page));
    lap(r, 3);
}

struct loop {
    const char *name;
    void (*once)(struct run *r);
    int share;                 /* of N iterations: N / share */
    const char *calls[4];      /* NULL after the last */
};

static const struct loop loops[] = {
    {"dev4k ", dev4k_once, 1, {"cuMemAlloc", "launch", "cuMemFree", NULL}},
    {"dev4kf", dev4kf_once, 1, {"cuMemAlloc", "launch", "cuMemFree", NULL}},
    {"host4k", host4k_once, 3,
     {"cuMemAllocHost", "cuMemHostGetDevicePointer", "launch", "cuMemFreeHost"}},
    {"reg4k ", reg4k_once, 3,
     {"cuMemHostRegister", "cuMemHostGetDevicePointer", "launch", "cuMemHostUnregister"}},
};

/* iters iterations of l with no synchronisation inside, then one; the sums
 * in r->t. */
static void run_loop(const struct loop *l, struct run *r, int iters)
{
    memset(r->t, 0, sizeof r->t);
    r->mark = now_ns();
    for (int i = 0; i < iters; i++)
        l->once(r);
    GC_CHECK(cuCtxSynchronize());
}

/* Each loop twice (the first warms the driver up), the second printed. */
static void run_loops(struct run *r)
{
    for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
        const struct loop *l = &loops[i];
        int iters = N / l->share;
        run_loop(l, r, iters);
        run_loop(l, r, iters);
        printf("%s", l->name);
        for (int c = 0; c < 4 && l->calls[c]; c++)
            printf("  %s %.0f", l->calls[c], (double)r->t[c] / iters);
        printf(" ns\n");
    }
}

/* ns per call of the driver calls a fence is made of, on an idle GPU. */
static void fence_calls(CUstream s)
{
    const int M = N * 200 / 3;
    CUevent on_stream, on_ctx;
    CUcontext ctx;
    GC_CHECK(cuEventCreate(&on_stream, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(cuEventCreate(&on_ctx, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(cuCtxGetCurrent(&ctx));
    GC_CHECK(cuEventRecord(on_stream, s));
    GC_CHECK(cuCtxRecordEvent(ctx, on_ctx));
    GC_CHECK(cuCtxSynchronize());
    unsigned long long a = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuEventQuery(on_stream));
    unsigned long long b = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuEventQuery(on_ctx));
    unsigned long long c = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuCtxGetCurrent(&ctx));
    unsigned long long d = now_ns();
    for (int i = 0; i < M / 10; i++)
        GC_CHECK(cuCtxRecordEvent(ctx, on_ctx));
    unsigned long long e = now_ns();
    GC_CHECK(cuCtxSynchronize());
    unsigned long long f0 = now_ns();
    for (int i = 0; i < M / 10; i++)
        GC_CHECK(cuEventRecord(on_stream, s));
    unsigned long long f = now_ns();
    GC_CHECK(cuCtxSynchronize());
    for (int i = 0; i < M / 10; i++) {
        CUevent ev;
        GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        GC_CHECK(cuEventDestroy(ev));
    }
    unsigned long long g = now_ns();
    printf("calls  query(stream's event) %.0f  query(context's record) %.0f  "
           "cuCtxGetCurrent %.0f  cuCtxRecordEvent %.0f  cuEventRecord %.0f  "
           "cuEventCreate+cuEventDestroy %.0f ns\n",
           (double)(b - a) / M, (double)(c - b) / M, (double)(d - c) / M,
           (double)(e - d) / (M / 10), (double)(f - f0) / (M / 10), (double)(g - f) / (M / 10));
    GC_CHECK(cuEventDestroy(on_stream));
    GC_CHECK(cuEventDestroy(on_ctx));
}

/* Allocates n blocks of 4 KiB, synchronised: the GPU is idle after. */
static void alloc_4k(CUdeviceptr *d, int n)
{
    for (int i = 0; i < n; i++)
        GC_CHECK(cuMemAlloc(&d[i], 4096));
    GC_CHECK(cuCtxSynchronize());
}

/* ns per block of the ways a device block can go back to the driver, on
 * an idle GPU: cuMemFree; cuMemFreeAsync on an idle stream; the same
 * behind a cuStreamWaitEvent of an event that has passed (a fenced free);
 * and that cuStreamWaitEvent alone. */
static void free_calls(CUstream s)
{
    const int M = N;
    CUdeviceptr *d = calloc((size_t)M, sizeof *d);
    if (!d)
        gc_die("out of host memory");
    CUevent ev;
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(cuEventRecord(ev, s));
    unsigned long long t[4];
    alloc_4k(d, M);
    unsigned long long a = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuMemFree(d[i]));
    t[0] = now_ns() - a;
    alloc_4k(d, M);
    a = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuMemFreeAsync(d[i], s));
    t[1] = now_ns() - a;
    GC_CHECK(cuStreamSynchronize(s));
    alloc_4k(d, M);
    a = now_ns();
    for (int i = 0; i < M; i++) {
        GC_CHECK(cuStreamWaitEvent(s, ev, 0));
        GC_CHECK(cuMemFreeAsync(d[i], s));
    }
    t[2] = now_ns() - a;
    GC_CHECK(cuStreamSynchronize(s));
    a = now_ns();
    for (int i = 0; i < M; i++)
        GC_CHECK(cuStreamWaitEvent(s, ev, 0));
    t[3] = now_ns() - a;
    GC_CHECK(cuStreamSynchronize(s));
    printf("frees  cuMemFree %.0f  cuMemFreeAsync %.0f  cuStreamWaitEvent+cuMemFreeAsync %.0f  "
           "cuStreamWaitEvent %.0f ns\n", (double)t[0] / M, (double)t[1] / M, (double)t[2] / M,
           (double)t[3] / M);
    GC_CHECK(cuEventDestroy(ev));
    free(d);
}

/* ---- ways of reusing a released block ---------------------------------------- */

enum policy { P_POOL, P_FENCED, P_WORD, P_BARRIER, P_COUNT };
static const char *const policy_names[P_COUNT] = {"pool", "fenced", "word", "barrier"};

/* The word policy: a release's fence also makes the GPU write the
 * release's number into a host-visible word, after the fence, on a stream
 * of its own; an allocation reads the word instead of asking the driver
 * about the event. NULL where the driver has no cuStreamWriteValue32 (the
 * test driver): that policy is then not run. */
typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
static write_value_fn write_value;
static volatile cuuint32_t *word;
static CUdeviceptr word_dev;
static CUstream word_stream;
static cuuint32_t word_seq;

#define RING 16

/* Released blocks, oldest first, each with its fence. */
struct ring {
    CUdeviceptr d[RING];
    CUevent ev[RING];
    int head, n;
    CUevent spare[RING + 1];
    int nspare;
    cuuint32_t seq[RING]; /* the word policy: each block's number */
};

static CUevent ring_event(struct ring *q)
{
    if (q->nspare)
        return q->spare[--q->nspare];
    CUevent ev;
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    return ev;
}

static void ring_put(struct ring *q, CUcontext ctx, CUdeviceptr d)
{
    CUevent ev = ring_event(q);
    GC_CHECK(cuCtxRecordEvent(ctx, ev));
    int i = (q->head + q->n) % RING;
    q->d[i] = d;
    q->ev[i] = ev;
    q->n++;
}

/* The word policy's release: the fence, then the number written after it. */
static void ring_put_word(struct ring *q, CUcontext ctx, CUdeviceptr d)
{
    ring_put(q, ctx, d);
    int i = (q->head + q->n - 1) % RING;
    q->seq[i] = ++word_seq;
    GC_CHECK(cuStreamWaitEvent(word_stream, q->ev[i], 0));
    GC_CHECK(write_value(word_stream, word_dev, q->seq[i], 0));
}

/* Takes the oldest (newest: false) released block; its fence in *ev. */
static CUdeviceptr ring_take(struct ring *q, bool oldest, CUevent *ev)
{
    int i = oldest ? q->head : (q->head + q->n - 1) % RING;
    if (oldest)
        q->head = (q->head + 1) % RING;
    q->n--;
    *ev = q->ev[i];
    return q->d[i];
}

static CUdeviceptr policy_alloc(enum policy p, struct ring *q, CUcontext ctx, CUstream s,
                                size_t bytes)
{
    CUdeviceptr d;
    CUevent ev;
    switch (p) {
    case P_POOL:
        GC_CHECK(cuMemAllocAsync(&d, bytes, s));
        return d;
    case P_FENCED:
        if (q->n && (q->n == RING || cuEventQuery(q->ev[q->head]) == CUDA_SUCCESS)) {
            d = ring_take(q, true, &ev);
            GC_CHECK(cuEventSynchronize(ev)); /* passed, or the ring is full */
            q->spare[q->nspare++] = ev;
            return d;
        }
        GC_CHECK(cuMemAlloc(&d, bytes));
        return d;
    case P_WORD:
        /* Numbers grow with each release, and the GPU writes them in that
         * order: the word at or past a block's number means its fence has
         * passed. */
        if (q->n && (q->n == RING || *word >= q->seq[q->head])) {
            d = ring_take(q, true, &ev);
            if (*word < q->seq[(q->head + RING - 1) % RING])
                GC_CHECK(cuEventSynchronize(ev)); /* the ring is full */
            q->spare[q->nspare++] = ev;
            return d;
        }
        GC_CHECK(cuMemAlloc(&d, bytes));
        return d;
    case P_BARRIER:
        if (q->n) {
            d = ring_take(q, false, &ev);
            GC_CHECK(cuCtxWaitEvent(ctx, ev));
            q->spare[q->nspare++] = ev;
            return d;
        }
        GC_CHECK(cuMemAlloc(&d, bytes));
        return d;
    default:
        gc_die("no policy %d", (int)p);
        return 0;
    }
}

static void policy_free(enum policy p, struct ring *q, CUcontext ctx, CUstream s, CUdeviceptr d)
{
    if (p == P_POOL)
        GC_CHECK(cuMemFreeAsync(d, s));
    else if (p == P_WORD)
        ring_put_word(q, ctx, d);
    else
        ring_put(q, ctx, d);
}

/* Gives back every block and event of q (synchronised first). */
static void ring_drain(struct ring *q)
{
    GC_CHECK(cuCtxSynchronize());
    while (q->n) {
        CUevent ev;
        GC_CHECK(cuMemFree(ring_take(q, true, &ev)));
        GC_CHECK(cuEventDestroy(ev));
    }
    while (q->nspare)
        GC_CHECK(cuEventDestroy(q->spare[--q->nspare]));
}

/* us an iteration of allocate / touch / release with policy p, the second
 * of two runs (the first warms up; the pool keeps its memory between). */
static double policy_loop(enum policy p, const struct gc_kernels *k, CUcontext ctx, CUstream s,
                          size_t bytes, bool full, int iters)
{
    struct ring q = {.n = 0};
    double us = 0;
    for (int run = 0; run < 2; run++) {
        GC_CHECK(cuCtxSynchronize());
        double t0 = gc_now_ms();
        for (int i = 0; i < iters; i++) {
            CUdeviceptr d = policy_alloc(p, &q, ctx, s, bytes);
            GC_CHECK(full ? gc_fill(k, s, d, bytes) : gc_touch(k, s, d, 16));
            policy_free(p, &q, ctx, s, d);
        }
        GC_CHECK(cuCtxSynchronize());
        us = (gc_now_ms() - t0) * 1e3 / iters;
    }
    ring_drain(&q);
    return us;
}

/* ms from a tiny kernel's launch on stream `other` to its end, right after
 * an allocation with policy p that follows the release of a block a 50 ms
 * kernel on s still writes. */
static double policy_other_stream(enum policy p, const struct gc_kernels *k, CUcontext ctx,
                                  CUstream s, CUstream other)
{
    struct ring q = {.n = 0};
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, 4096));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(gc_spin(k, s, 50.0, d, 16));
    ring_put(&q, ctx, d);
    CUdeviceptr e = policy_alloc(p, &q, ctx, other, 4096);
    double t0 = gc_now_ms();
    GC_CHECK(gc_touch(k, other, e, 16));
    GC_CHECK(cuStreamSynchronize(other));
    double ms = gc_now_ms() - t0;
    GC_CHECK(cuCtxSynchronize());
    if (e != d)
        GC_CHECK(cuMemFree(e));
    ring_drain(&q);
    return ms;
}

static void policies(const struct gc_kernels *k, CUstream s)
{
    CUcontext ctx;
    GC_CHECK(cuCtxGetCurrent(&ctx));
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    CUmemoryPool pool;
    GC_CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t max = UINT64_MAX;
    GC_CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max));
    static const struct {
        const char *name;
        size_t bytes;
        bool full;
        int share;
    } rows[] = {
        {"dev4k light ", 4096, false, 1},        {"dev4k full  ", 4096, true, 1},
        {"dev64m light", 64 << 20, false, 10}, {"dev64m full ", 64 << 20, true, 10},
    };
    write_value = (write_value_fn)dlsym(RTLD_DEFAULT, "cuStreamWriteValue32_v2");
    void *host_word = NULL;
    if (write_value) {
        GC_CHECK(cuMemHostAlloc(&host_word, sizeof(cuuint32_t), CU_MEMHOSTALLOC_DEVICEMAP));
        GC_CHECK(cuMemHostGetDevicePointer(&word_dev, host_word, 0));
        word = host_word;
        *word = 0;
        word_seq = 0;
        GC_CHECK(cuStreamCreate(&word_stream, CU_STREAM_NON_BLOCKING));
    }
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int iters = N / rows[i].share;
        printf("reuse  %s", rows[i].name);
        for (int p = 0; p < P_COUNT; p++) {
            if (p == P_WORD && !write_value) {
                printf("  %s n/a", policy_names[p]);
                continue;
            }
            printf("  %s %.2f", policy_names[p],
                   policy_loop((enum policy)p, k, ctx, s, rows[i].bytes, rows[i].full, iters));
        }
        printf(" us\n");
    }
    if (write_value) {
        GC_CHECK(cuStreamSynchronize(word_stream));
        GC_CHECK(cuStreamDestroy(word_stream));
        GC_CHECK(cuMemFreeHost(host_word));
    }
    cuuint64_t zero = 0;
    GC_CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
    GC_CHECK(cuMemPoolTrimTo(pool, 0));
    CUstream other;
    GC_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    double fenced = policy_other_stream(P_FENCED, k, ctx, s, other);
    double barrier = policy_other_stream(P_BARRIER, k, ctx, s, other);
    printf("other stream's kernel after the allocation  fenced %.3f  barrier %.3f ms "
           "(the released block's kernel: 50 ms)\n", fenced, barrier);
    GC_CHECK(cuStreamDestroy(other));
}

/* ---- the sampler ------------------------------------------------------------ */

#define MAX_SAMPLES 200000
#define STACK_DEPTH 12
static void *samples[MAX_SAMPLES];
static void *stacks[MAX_SAMPLES][STACK_DEPTH];
static unsigned char depths[MAX_SAMPLES];
static volatile sig_atomic_t nsamples;

static void on_prof(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
#if defined(__x86_64__)
    void *pc = (void *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    void *pc = (void *)((ucontext_t *)uc)->uc_mcontext.pc;
#else
    void *pc = NULL;
    (void)uc;
#endif
    if (nsamples < MAX_SAMPLES) {
        /* backtrace() was called once before the timer started: its
         * unwinder is loaded, and it allocates nothing here. */
        depths[nsamples] = (unsigned char)backtrace(stacks[nsamples], STACK_DEPTH);
        samples[nsamples++] = pc;
    }
}

/* The library holding p ("?" when none), and *base its load address. */
static const char *library_of(void *p, Dl_info *di)
{
    if (!dladdr(p, di) || !di->dli_fname)
        return "?";
    const char *base = strrchr(di->dli_fname, '/');
    return base ? base + 1 : di->dli_fname;
}

/* Sample i's caller: the first frame of its stack, past the interrupted
 * one, outside the interrupted library, libc and the driver, and whether
 * the stack went through the driver on the way. name: "[libcuda <-] LIB
 * SYMBOL", or "LIB +0xOFFSET" (of the call instruction's last byte) where
 * no dynamic symbol names it. */
static bool caller_of(int i, const char *lib, char *name, size_t size)
{
    int from = 0;
    for (int j = 0; j < depths[i]; j++)
        if (stacks[i][j] == samples[i]) {
            from = j + 1;
            break;
        }
    bool via_driver = false;
    for (int j = from ? from : 2; j < depths[i]; j++) {
        Dl_info di;
        void *ret = (char *)stacks[i][j] - 1;
        const char *l = library_of(ret, &di);
        if (strcmp(l, lib) == 0 || strncmp(l, "libc.so", 7) == 0)
            continue;
        if (strncmp(l, "libcuda.so", 10) == 0) {
            via_driver = true;
            continue;
        }
        const char *via = via_driver ? "libcuda <- " : "";
        if (di.dli_sname)
            snprintf(name, size, "%s%s %s", via, l, di.dli_sname);
        else
            snprintf(name, size, "%s%s +0x%lx", via, l,
                     (unsigned long)((char *)ret - (char *)di.dli_fbase));
        return true;
    }
    return false;
}

struct count {
    char name[512];
    unsigned long n;
};

static int by_count(const void *a, const void *b)
{
    const struct count *x = a, *y = b;
    return (y->n > x->n) - (y->n < x->n);
}

static void add(struct count *c, size_t *n, size_t cap, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(c[i].name, name) == 0) {
            c[i].n++;
            return;
        }
    if (*n < cap) {
        snprintf(c[*n].name, sizeof c[*n].name, "%s", name);
        c[(*n)++].n = 1;
    }
}

static void print_counts(const char *what, struct count *c, size_t n, size_t top)
{
    qsort(c, n, sizeof *c, by_count);
    printf("sample %s:\n", what);
    for (size_t i = 0; i < n && i < top; i++)
        printf("  %6lu  %s\n", c[i].n, c[i].name);
}

static void sample(struct run *r, const struct loop *l, int iters, bool offsets)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    void *warm[2];
    backtrace(warm, 2);
    struct itimerval on = {{0, 1000}, {0, 1000}}, off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_PROF, &on, NULL);
    run_loop(l, r, iters);
    setitimer(ITIMER_PROF, &off, NULL);

    static struct count libs[64], funcs[512], callers[512];
    size_t nlibs = 0, nfuncs = 0, ncallers = 0;
    for (int i = 0; i < nsamples; i++) {
        Dl_info di;
        char name[300];
        if (!dladdr(samples[i], &di) || !di.dli_fname) {
            add(libs, &nlibs, 64, "?");
            continue;
        }
        add(libs, &nlibs, 64, di.dli_fname);
        const char *base = strrchr(di.dli_fname, '/');
        snprintf(name, sizeof name, "%s %s", base ? base + 1 : di.dli_fname,
                 di.dli_sname ? di.dli_sname : "-");
        add(funcs, &nfuncs, 512, name);
        const char *lib = base ? base + 1 : di.dli_fname;
        char caller[256], key[400];
        if ((strncmp(lib, "libcuda.so", 10) == 0 || strncmp(lib, "libc.so", 7) == 0) &&
            caller_of(i, lib, caller, sizeof caller)) {
            snprintf(key, sizeof key, "%s <- %s", lib, caller);
            add(callers, &ncallers, 512, key);
        }
        if (offsets)
            printf("sample-offset %s 0x%lx\n", di.dli_fname,
                   (unsigned long)((char *)samples[i] - (char *)di.dli_fbase));
    }
    printf("sample: %d samples over %d %s iterations (%.0f ns an iteration)\n", (int)nsamples,
           iters, l->name, (double)(r->t[0] + r->t[1] + r->t[2]) / iters);
    print_counts("by library", libs, nlibs, 10);
    print_counts("by function", funcs, nfuncs, 25);
    qsort(callers, ncallers, sizeof *callers, by_count);
    for (size_t i = 0; i < ncallers && i < 60; i++)
        printf("sample-caller %6lu  %s\n", callers[i].n, callers[i].name);
}

int main(int argc, char **argv)
{
    int sample_iters = 0;
    bool offsets = false, full = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sample") == 0 || strcmp(argv[i], "--sample-full") == 0) {
            full = strcmp(argv[i], "--sample-full") == 0;
            sample_iters = 300000;
            if (i + 1 < argc && atoi(argv[i + 1]) > 0)
                sample_iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--sample-offsets") == 0) {
            offsets = true;
        } else if (strcmp(argv[i], "--smoke") == 0) {
            N = 30;
        } else {
            fprintf(stderr, "usage: cudefer-phases [--smoke] [--sample[-full] [ITERS]] "
                    "[--sample-offsets]\n");
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    gc_init();
    struct gc_kernels k;
    gc_load_kernels(&k);
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    printf("cudefer %s\n", gc_cudefer_loaded() ? "loaded" : "not loaded");
    struct run r = {.k = &k, .s = s, .page = gc_xpages(4096)};
    run_loops(&r);
    fence_calls(s);
    free_calls(s);
    policies(&k, s);
    if (sample_iters)
        sample(&r, &loops[full ? 1 : 0], sample_iters, offsets);
    GC_CHECK(cuStreamDestroy(s));
    free(r.page);
    return 0;
}
