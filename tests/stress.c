/* stress.c - 16 threads mix every call the shim cares about, over the test
 * driver with the shim preloaded; plain C (no Criterion) so that it also
 * runs under ThreadSanitizer (scripts/test runs it in a TSan build).
 *
 * Each thread makes a number of operations, picked at random: allocations
 * (device, managed, pinned by cuMemAllocHost and cuMemHostAlloc, registered
 * pages, arrays), releases of what it holds, kernel launches (testdrv_launch)
 * that write what it holds, stream and context synchronisation, stream
 * destruction and creation, and now and then cudefer_flush. Half the
 * threads work in the primary context, half in a second context. At the end
 * every thread releases what it still holds, and the main thread checks:
 *   - every call returned CUDA_SUCCESS;
 *   - after a flush nothing is left (testdrv_live of every kind is 0, and
 *     the program's streams are gone);
 *   - every driver object was released exactly once: the driver saw as many
 *     releases as allocations of each kind (a release made twice would be
 *     one more, a lost one one fewer);
 *   - no kernel touched released memory (testdrv_faults) and nothing named
 *     a destroyed context.
 * A watchdog thread aborts the run, with a message, if it takes longer than
 * its limit: every wait of the program is bounded.
 *
 * usage: test_stress [OPERATIONS]
 *   OPERATIONS  total over all threads (default: $STRESS_OPS, else 40000,
 *               which takes about two seconds, and well under a minute under
 *               ThreadSanitizer)
 * environment: STRESS_OPS (as above), STRESS_TIMEOUT (the watchdog's limit
 * in seconds; default 120, or one second per 2000 operations if that is
 * more: 500 s for a million, a tenth of what a normal run takes, a third
 * under ThreadSanitizer), STRESS_SEED (default 1), and CUDEFER_DEVICE_CACHE
 * (default here 32k, so that device frees go both ways: reuse and
 * cuMemFreeAsync).
 * Prints "N passed, N failed" and statistics; exit status 0 when all passed.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "own.h"
#include "testdriver.h"

#define THREADS 16
#define STREAMS 2          /* per thread */
#define HELD 8             /* objects a thread holds at most */
#define REG_PAGES 32       /* pages a thread may register, one at a time each */
#define PAGE 4096
#define DEFAULT_OPS 40000

static CUcontext contexts[2];
static unsigned long long total_ops;
static unsigned timeout_s;
static unsigned seed = 1;
static int passed, failed;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void check(int ok, const char *fmt, ...)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Found by main before the workers start. */
static int (*flush_fn)(void);

static int cudefer_flush(void)
{
    return flush_fn ? flush_fn() : -1;
}

/* ---- objects ---------------------------------------------------------------- */

enum kind { DEVICE, MANAGED, HOST, HOST_ALLOC, REGISTERED, ARRAY, KINDS };
static const char *const kind_name[KINDS] = {
    "device", "managed", "pinned (cuMemAllocHost)", "pinned (cuMemHostAlloc)", "registered",
    "array",
};

struct object {
    enum kind kind;
    uintptr_t addr; /* memory, or the CUarray */
    size_t bytes;
    int page;       /* REGISTERED: index in the thread's pages */
};

struct worker {
    int index;
    CUcontext ctx;
    CUstream streams[STREAMS];
    uint64_t rng;
    struct object held[HELD];
    int nheld;
    char *pages;                 /* REG_PAGES pages */
    bool page_registered[REG_PAGES];
    unsigned long long ops;      /* this thread's share */
    _Atomic unsigned long long done;
    unsigned long long made[KINDS], launches, syncs, ctx_syncs,
        stream_swaps, flushes;
    unsigned long long streams_created, streams_destroyed;
    char error[256];             /* the first failed call */
};

static struct worker workers[THREADS];

static uint64_t next_random(struct worker *w)
{
    /* xorshift64* */
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return w->rng * 0x2545F4914F6CDD1Dull;
}

static bool ok(struct worker *w, CUresult rc, const char *what)
{
    if (rc == CUDA_SUCCESS)
        return true;
    if (!w->error[0])
        snprintf(w->error, sizeof w->error, "thread %d, operation %llu: %s returned %d",
                 w->index, (unsigned long long)w->done, what, (int)rc);
    return false;
}

/* Sizes vary a little so that pinned blocks are sometimes reused by the
 * shim and sometimes not. */
static size_t some_bytes(struct worker *w)
{
    static const size_t sizes[] = {4096, 8192, 65536};
    return sizes[next_random(w) % 3];
}

static bool allocate(struct worker *w, enum kind kind)
{
    struct object o = {.kind = kind, .bytes = some_bytes(w), .page = -1};
    CUresult rc = CUDA_SUCCESS;
    switch (kind) {
    case DEVICE: {
        CUdeviceptr p;
        rc = cuMemAlloc(&p, o.bytes);
        o.addr = (uintptr_t)p;
        break;
    }
    case MANAGED: {
        CUdeviceptr p;
        rc = cuMemAllocManaged(&p, o.bytes, CU_MEM_ATTACH_GLOBAL);
        o.addr = (uintptr_t)p;
        break;
    }
    case HOST: {
        void *p;
        rc = cuMemAllocHost(&p, o.bytes);
        o.addr = (uintptr_t)p;
        break;
    }
    case HOST_ALLOC: {
        void *p;
        rc = cuMemHostAlloc(&p, o.bytes, CU_MEMHOSTALLOC_DEVICEMAP);
        o.addr = (uintptr_t)p;
        break;
    }
    case REGISTERED: {
        int page = (int)(next_random(w) % REG_PAGES);
        for (int i = 0; i < REG_PAGES && w->page_registered[page]; i++)
            page = (page + 1) % REG_PAGES;
        if (w->page_registered[page])
            return true; /* all registered: nothing to do */
        o.page = page;
        o.bytes = PAGE;
        o.addr = (uintptr_t)(w->pages + (size_t)page * PAGE);
        rc = cuMemHostRegister((void *)o.addr, PAGE, 0);
        if (rc == CUDA_SUCCESS)
            w->page_registered[page] = true;
        /* The page's own earlier unregister may still be pending in the
         * shim, even in another thread's flush: the registration must
         * succeed all the same. */
        break;
    }
    case ARRAY: {
        CUarray a;
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 32 + (next_random(w) % 3) * 32, .Height = 32,
                                   .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        rc = cuArrayCreate(&a, &d);
        o.addr = (uintptr_t)a;
        break;
    }
    case KINDS:
        return false;
    }
    if (!ok(w, rc, kind_name[kind]))
        return false;
    w->held[w->nheld++] = o;
    w->made[kind]++;
    return true;
}

static bool release(struct worker *w, int i)
{
    struct object o = w->held[i];
    w->held[i] = w->held[--w->nheld];
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    switch (o.kind) {
    case DEVICE:
    case MANAGED: rc = cuMemFree((CUdeviceptr)o.addr); break;
    case HOST:
    case HOST_ALLOC: rc = cuMemFreeHost((void *)o.addr); break;
    case REGISTERED:
        rc = cuMemHostUnregister((void *)o.addr);
        w->page_registered[o.page] = false;
        break;
    case ARRAY: rc = cuArrayDestroy((CUarray)o.addr); break;
    case KINDS: return false;
    }
    return ok(w, rc, "a release");
}

/* A kernel on one of the thread's streams that writes a held object (not
 * an array) for a few microseconds, or touches nothing. */
static bool launch(struct worker *w)
{
    CUstream s = w->streams[next_random(w) % STREAMS];
    unsigned usec = 1 + (unsigned)(next_random(w) % 20);
    w->launches++;
    if (w->nheld) {
        struct object *o = &w->held[next_random(w) % (uint64_t)w->nheld];
        if (o->kind != ARRAY)
            return ok(w, testdrv_launch(s, usec, (CUdeviceptr)o->addr, o->bytes, TESTDRV_WRITE),
                      "testdrv_launch");
    }
    return ok(w, testdrv_launch(s, usec, 0, 0, TESTDRV_NONE), "testdrv_launch");
}

static bool swap_stream(struct worker *w)
{
    int i = (int)(next_random(w) % STREAMS);
    w->stream_swaps++;
    if (!ok(w, cuStreamDestroy(w->streams[i]), "cuStreamDestroy"))
        return false;
    w->streams_destroyed++;
    unsigned flags = next_random(w) % 2 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    if (!ok(w, cuStreamCreate(&w->streams[i], flags), "cuStreamCreate"))
        return false;
    w->streams_created++;
    return true;
}

static bool one_operation(struct worker *w)
{
    unsigned pick = (unsigned)(next_random(w) % 1000);
    if (pick < 380) {                   /* allocate, or release when full */
        if (w->nheld == HELD)
            return release(w, (int)(next_random(w) % HELD));
        return allocate(w, (enum kind)(next_random(w) % KINDS));
    }
    if (pick < 620) {                   /* release, or allocate when empty */
        if (w->nheld == 0)
            return allocate(w, (enum kind)(next_random(w) % KINDS));
        return release(w, (int)(next_random(w) % (uint64_t)w->nheld));
    }
    if (pick < 860)
        return launch(w);
    if (pick < 920) {
        w->syncs++;
        return ok(w, cuStreamSynchronize(w->streams[next_random(w) % STREAMS]),
                  "cuStreamSynchronize");
    }
    if (pick < 950) {
        w->ctx_syncs++;
        return ok(w, cuCtxSynchronize(), "cuCtxSynchronize");
    }
    if (pick < 995)
        return swap_stream(w);
    w->flushes++;
    return ok(w, cudefer_flush() == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, "cudefer_flush");
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    if (!ok(w, cuCtxSetCurrent(w->ctx), "cuCtxSetCurrent"))
        return NULL;
    for (int i = 0; i < STREAMS; i++) {
        if (!ok(w, cuStreamCreate(&w->streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate"))
            return NULL;
        w->streams_created++;
    }
    for (unsigned long long n = 0; n < w->ops; n++) {
        if (!one_operation(w))
            return NULL;
        atomic_store_explicit(&w->done, n + 1, memory_order_relaxed);
    }
    while (w->nheld)
        if (!release(w, w->nheld - 1))
            return NULL;
    for (int i = 0; i < STREAMS; i++) {
        if (!ok(w, cuStreamDestroy(w->streams[i]), "cuStreamDestroy"))
            return NULL;
        w->streams_destroyed++;
    }
    return NULL;
}

/* ---- the watchdog ---------------------------------------------------------------- */

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cv = PTHREAD_COND_INITIALIZER;
static bool finished;
static const char *volatile phase = "starting";

static unsigned long long ops_done(void)
{
    unsigned long long n = 0;
    for (int i = 0; i < THREADS; i++)
        n += atomic_load_explicit(&workers[i].done, memory_order_relaxed);
    return n;
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_s;
    pthread_mutex_lock(&watch_lock);
    while (!finished) {
        if (pthread_cond_timedwait(&watch_cv, &watch_lock, &deadline) == ETIMEDOUT && !finished) {
            fprintf(stderr,
                    "stress: WATCHDOG: the run took more than %u s (phase: %s; %llu of %llu "
                    "operations done): a hang or a deadlock. Aborting.\n",
                    timeout_s, phase, ops_done(), total_ops);
            for (int i = 0; i < THREADS; i++)
                fprintf(stderr, "stress:   thread %2d: %llu of %llu\n", i,
                        atomic_load_explicit(&workers[i].done, memory_order_relaxed),
                        workers[i].ops);
            abort();
        }
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

/* ---- main ---------------------------------------------------------------------------- */

static unsigned long long parse_count(const char *s, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v == 0) {
        fprintf(stderr, "stress: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

static uint64_t calls(const char *a, const char *b)
{
    return testdrv_calls(a) + (b ? testdrv_calls(b) : 0);
}

int main(int argc, char **argv)
{
    const char *env;
    total_ops = DEFAULT_OPS;
    if ((env = getenv("STRESS_OPS")) && *env)
        total_ops = parse_count(env, "STRESS_OPS");
    if (argc > 1)
        total_ops = parse_count(argv[1], "operation count");
    timeout_s = 120;
    if (total_ops / 2000 > timeout_s)
        timeout_s = (unsigned)(total_ops / 2000);
    if ((env = getenv("STRESS_TIMEOUT")) && *env)
        timeout_s = (unsigned)parse_count(env, "STRESS_TIMEOUT");
    if ((env = getenv("STRESS_SEED")) && *env)
        seed = (unsigned)parse_count(env, "STRESS_SEED");

    /* A small device cache (unless the environment sets one): released
     * device blocks are both kept for reuse and handed to cuMemFreeAsync
     * behind their fence, so a fence that is missing shows as a fault. */
    setenv("CUDEFER_DEVICE_CACHE", "32k", 0);
    /* Odd seeds hold it to 32k alone; even ones let it keep up to the
     * program's peak (the default), which moves as the threads allocate. */
    setenv("CUDEFER_DEVICE_CACHE_PEAK", seed % 2 ? "0" : "200", 0);

    pthread_t watchdog;
    if (pthread_create(&watchdog, NULL, watchdog_main, NULL) != 0) {
        fprintf(stderr, "stress: no watchdog thread\n");
        return 2;
    }

    CUdevice dev;
    CUcontext popped;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&contexts[0], dev) ||
        cuCtxSetCurrent(contexts[0]) || cuCtxCreate(&contexts[1], NULL, 0, dev) ||
        cuCtxPopCurrent(&popped)) {
        fprintf(stderr, "stress: no context\n");
        return 2;
    }
    flush_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    check(flush_fn != NULL, "cudefer_flush is not there: is the shim preloaded?");

    uint64_t t0 = now_ns();
    phase = "workers running";
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        struct worker *w = &workers[i];
        w->index = i;
        w->ctx = contexts[i % 2];
        w->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + seed;
        w->ops = total_ops / THREADS + ((unsigned long long)i < total_ops % THREADS);
        w->pages = aligned_alloc(PAGE, (size_t)REG_PAGES * PAGE);
        if (!w->pages) {
            fprintf(stderr, "stress: out of memory\n");
            return 2;
        }
        memset(w->pages, 0, (size_t)REG_PAGES * PAGE);
        pthread_create(&t[i], NULL, worker_main, w);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        check(!workers[i].error[0], "%s", workers[i].error);
    }
    double work_s = (double)(now_ns() - t0) / 1e9;

    /* Everything is released by the program: now the queues must empty. */
    phase = "final flush";
    for (int c = 0; c < 2; c++) {
        check(cuCtxSetCurrent(contexts[c]) == CUDA_SUCCESS, "cuCtxSetCurrent");
        check(cuCtxSynchronize() == CUDA_SUCCESS, "cuCtxSynchronize of context %d", c);
    }
    check(cudefer_flush() == 0, "cudefer_flush");
    for (int i = 0; i < 5000 && (program_live(TESTDRV_DEVICE) || program_live(TESTDRV_MANAGED) ||
                                 testdrv_pending_free_bytes());
         i++)
        usleep(1000);

    static const struct {
        enum testdrv_kind kind;
        const char *name;
    } live[] = {
        {TESTDRV_DEVICE, "device"}, {TESTDRV_MANAGED, "managed"}, {TESTDRV_HOST, "pinned"},
        {TESTDRV_REGISTERED, "registered"}, {TESTDRV_ARRAY, "array"},
    };
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        check(program_live(live[i].kind) == 0, "%zu %s objects left after the flush",
              program_live(live[i].kind), live[i].name);
    check(testdrv_pending_free_bytes() == 0, "%zu device bytes freed but not given back",
          testdrv_pending_free_bytes());

    /* Exactly once: the driver saw as many releases as allocations. Device
     * memory goes back by cuMemFreeAsync (the shim's) or cuMemFree (managed,
     * or what the shim passed through); the shim's own warm-up block of each
     * context is in both counts. */
    uint64_t dev_allocs = calls("cuMemAlloc_v2", "cuMemAllocManaged");
    uint64_t dev_frees = calls("cuMemFree_v2", "cuMemFreeAsync");
    check(dev_allocs == dev_frees, "device and managed: %llu allocations, %llu releases",
          (unsigned long long)dev_allocs, (unsigned long long)dev_frees);
    /* cudefer's own pinned words (own.h) stay until their contexts end:
     * both contexts are alive here. */
    uint64_t host_allocs = calls("cuMemAllocHost_v2", "cuMemHostAlloc") -
                           testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES);
    uint64_t host_frees = calls("cuMemFreeHost", NULL);
    check(host_allocs == host_frees, "pinned: %llu allocations, %llu releases",
          (unsigned long long)host_allocs, (unsigned long long)host_frees);
    /* Registrations: one driver call per successful one (the shim calls
     * again only after a failure), so count the program's successes. */
    unsigned long long registered = 0;
    for (int i = 0; i < THREADS; i++) {
        registered += workers[i].made[REGISTERED];
    }
    uint64_t regs = calls("cuMemHostRegister_v2", NULL);
    uint64_t unregs = calls("cuMemHostUnregister", NULL);
    check(registered == unregs, "registered: %llu registrations, %llu unregistrations",
          registered, (unsigned long long)unregs);
    uint64_t arrays = calls("cuArrayCreate_v2", NULL), destroys = calls("cuArrayDestroy", NULL);
    check(arrays == destroys, "arrays: %llu created, %llu destroyed",
          (unsigned long long)arrays, (unsigned long long)destroys);

    /* The program's streams are gone; what is left is the shim's two
     * private streams of each context. */
    unsigned long long created = 0, destroyed = 0;
    for (int i = 0; i < THREADS; i++) {
        created += workers[i].streams_created;
        destroyed += workers[i].streams_destroyed;
    }
    check(created == destroyed, "streams: %llu created, %llu destroyed", created, destroyed);
    check(program_live(TESTDRV_STREAM) <= 4, "%zu streams left (the shim has two per context)",
          program_live(TESTDRV_STREAM));

    phase = "teardown of the second context";
    check(cuCtxDestroy(contexts[1]) == CUDA_SUCCESS, "cuCtxDestroy");
    check(testdrv_faults() == 0, "%llu kernel touches of released memory",
          (unsigned long long)testdrv_faults());
    check(testdrv_dead_context_calls() == 0, "%llu calls named a destroyed context",
          (unsigned long long)testdrv_dead_context_calls());

    pthread_mutex_lock(&watch_lock);
    finished = true;
    pthread_cond_signal(&watch_cv);
    pthread_mutex_unlock(&watch_lock);
    pthread_join(watchdog, NULL);

    unsigned long long made[KINDS] = {0}, launches = 0, syncs = 0, ctx_syncs = 0, swaps = 0,
                       flushes = 0;
    for (int i = 0; i < THREADS; i++) {
        for (int k = 0; k < KINDS; k++)
            made[k] += workers[i].made[k];
        launches += workers[i].launches;
        syncs += workers[i].syncs;
        ctx_syncs += workers[i].ctx_syncs;
        swaps += workers[i].stream_swaps;
        flushes += workers[i].flushes;
    }
    printf("stress: %llu operations by %d threads in %.2f s (%.0f per second); seed %u\n",
           ops_done(), THREADS, work_s, (double)ops_done() / work_s, seed);
    printf("stress: made");
    for (int k = 0; k < KINDS; k++)
        printf(" %llu %s%s", made[k], kind_name[k], k + 1 < KINDS ? "," : "\n");
    printf("stress: %llu launches, %llu stream and %llu context synchronisations, %llu stream "
           "swaps, %llu cudefer_flush; driver: %llu device, %llu pinned, %llu registered, "
           "%llu array allocations\n",
           launches, syncs, ctx_syncs, swaps, flushes, (unsigned long long)dev_allocs,
           (unsigned long long)host_allocs, (unsigned long long)regs,
           (unsigned long long)arrays);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
