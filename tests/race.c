/* race.c - the race harness: N threads (default 16) make random calls from
 * the whole API through the preloaded shim over the test driver, as one
 * correct program, and check cudefer's invariants after every operation and
 * at the end. Plain C (no Criterion), so that it also runs under
 * ThreadSanitizer.
 *
 * usage: test_race [OPS [THREADS [SEED]]]
 *   OPS      operations over all threads (default $RACE_OPS, else 20000)
 *   THREADS  worker threads (default $RACE_THREADS, else 16)
 *   SEED     (default $RACE_SEED, else 1); each thread's choices follow
 *            from it, so a seed replays the same operations per thread (the
 *            interleaving of the threads differs from run to run)
 * environment: RACE_CAPACITY (each device's capacity and the pinned-host
 * one, default 2M: small, so that allocations run out of memory now and
 * then; each device has its own, so 2M keeps them short about as often as
 * the 4M that both devices once shared),
 * RACE_KEEP_GOING=1 (report every failure, not only the first),
 * RACE_TIMEOUT (seconds; default one per 500 operations, at least 120),
 * RACE_STALL_S (seconds, default 5; 0: no limit): one call under way for
 * longer fails the run with 'stall' (its kernels last 40 ms at most; an
 * allocation that waited 6-54 s for a record a live capture kept from
 * being made passed every other check),
 * RACE_SKIP (a comma-separated list of what to leave out, to narrow a
 * failure down: green, own, role, reset, capture, flush, register; without
 * captures, kernels of one shared context also write memory of the other:
 * the meson test race-across),
 * RACE_DRIVER_ALONE=1
 * (run without the shim, whose cudefer_flush is then skipped: the driver
 * alone meets every invariant, which checks the harness itself).
 * CUDEFER_DEVICE_CACHE, unless set, is 64k for odd seeds and the default
 * for even ones, so that both ways of handing device memory back run;
 * CUDEFER_DEVICE_CACHE_PEAK, unless set, is 0 for seeds 3, 7, 11... (the
 * cache held to 64k alone: the most evictions), 100 for seeds 2, 6, 10...
 * and the default otherwise. Even seeds gather what cudefer saved
 * (hx_savings_by_seed). Seeds 3, 6, 9... reuse without the fences' words
 * (hx_word_by_seed).
 *
 * The program. Every thread works in a home context (the primary context of
 * device 0, or a context of device 1 that main creates) with two streams of
 * its own, and from time to time in a span of operations in another
 * context: one it creates (cuCtxCreate, every version) and destroys at the
 * end of the span, possibly with objects still live and releases still
 * queued in cudefer; the primary context of device 1, retained and
 * released (its last release tears it down); or a green context of device 0
 * when the test driver has them (found with dlsym). Operations: allocations
 * of every kind (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged,
 * cuMemAllocHost, cuMemHostAlloc with flags, cuMemHostRegister of pages the
 * thread owns, cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate,
 * cuModuleLoadData, cuLibraryLoadData) and their releases; kernels
 * (testdrv_launch) that write what the thread holds, on its streams, the
 * legacy stream and CU_STREAM_PER_THREAD, and cuLaunchKernel_ptsz of a
 * function of a module or library it holds; stream destruction and creation;
 * kernels of the other shared context that write memory the thread holds
 * in its home context, some of them 20-40 ms long (runs without captures:
 * race-across); a block released and one of the same kind, size and flags
 * allocated right after (what frameworks do, and what reuse serves);
 * cuCtxSynchronize, stream and event synchronisation, stream queries;
 * cuMemGetInfo; cudefer_flush; stream captures of every kind of stream
 * handle (a created stream; CU_STREAM_PER_THREAD; stream 0 through
 * cuStreamBeginCapture_ptsz and _v2_ptsz; cuStreamBeginCaptureToGraph and
 * its _ptsz twin; a capture the program invalidates with cuStreamQuery; a
 * stream destroyed in the middle of its capture; GLOBAL and THREAD_LOCAL
 * captures of a few launches; beside a live per-thread capture, a capture
 * of the per-thread stream of a context made and destroyed for it) with
 * releases made while they are live; a buffer of registered pages freed
 * right after an unregister and a pinned or managed allocation of its size
 * at once (the driver refuses to map over a registration it still holds);
 * the same buffer freed just before its own context's destruction, which
 * a kernel keeps under way (the destruction undoes the registration only
 * when it returns, and other threads' mappings may land on the pages
 * meanwhile); primary context resets.
 *
 * The program is correct, as a real one would be: it never uses an object
 * after releasing it nor releases one twice; it reads the canary of a page
 * only once no registration covers it; a thread whose capture mode forbids
 * it makes no unsafe call (every thread sets its capture mode to RELAXED, so
 * only its own GLOBAL or THREAD_LOCAL capture, which it ends within the same
 * operation, restricts it); no thread uses the legacy stream of a context
 * while a blocking stream of it captures (a per-context count under a lock);
 * a thread resets the primary context of device 1 only while no other
 * thread uses it (a read-write lock: users hold it for reading, a reset
 * takes it for writing with trywrlock), and the retains, releases and
 * resets of that context are not concurrent (a lock around each call).
 *
 * Invariants, after every operation:
 *  - testdrv_dead_context_calls() == 0: no call named a destroyed context;
 *  - testdrv_faults() == 0: no kernel touched memory that was not live;
 *  - reuse-early: an allocation of memory returns no range that a kernel
 *    submitted before its release (in any context) still writes. The
 *    writers of memory of the shared contexts are tracked with an event
 *    recorded after each, and a release hands them to a table that the
 *    allocations returning an overlapping range check;
 *  - a cuCtxSynchronize did not have to wait for unfinished work of another
 *    context (testdrv_thread_foreign_syncs): the program makes no stream
 *    wait for another context's work, so only the engine's fences could;
 *  - every call returns what the driver alone would return to this program:
 *    CUDA_SUCCESS, except what the program causes itself (a capture it
 *    invalidated ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, a stream
 *    query answers CUDA_ERROR_NOT_READY) and the out-of-memory rule below;
 *  - out of memory: the harness retries nothing, and counts under its own
 *    lock the bytes each capacity holds for the program, as on a real
 *    machine: each device's own (device, pitched, managed memory and arrays
 *    made in a context of that device; a green context's device is its
 *    primary's) and pinned host memory, one for both devices (pinned and
 *    registered memory). It counts live objects (an object counts from the
 *    moment its allocation starts until its release or its context's
 *    destruction has returned) plus the requests of allocations of the same
 *    capacity under way in other threads. An allocation may fail with
 *    CUDA_ERROR_OUT_OF_MEMORY only if, at some moment while it ran, that
 *    count of its capacity plus its own request exceeded the capacity less,
 *    for device memory, the bytes of that device the test driver itself
 *    counts as freed but not yet given back (testdrv_pending_free_bytes_on,
 *    read after the failure), or, for pinned host memory, less cudefer's
 *    own pinned words (own.h, read after the failure). Memory the program
 *    released is never counted: an allocation must not fail while cudefer
 *    still holds memory of its capacity that the program released before
 *    it;
 *  - registered pages: right after cuMemHostUnregister returns, every kernel
 *    that wrote the pages before must have finished (an event recorded
 *    after each of them, queried), and the harness fills the pages with a
 *    canary that must still be intact when the pages are registered again
 *    and at the end (a writing kernel of the test driver stamps the host
 *    memory it writes);
 *  - every stream capture invalidated was one the program invalidated;
 *  - meminfo: cuMemGetInfo_v2 answers, with the capacity of the current
 *    context's device as its total and no more free than that.
 * At the end, after every thread has released everything and main has
 * synchronised every context and called cudefer_flush: testdrv_live of
 * every kind is back to its value at the start, no freed device memory is
 * pending, and the checks above hold once more.
 *
 * A failure prints the invariant, the seed and the command that replays the
 * run, and the last operations of the thread that saw it (and fewer of the
 * other threads); then the program exits with status 1 (with
 * RACE_KEEP_GOING=1 it goes on and reports every failure). A watchdog
 * reports a run that hangs.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "own.h"
#include "testdriver.h"

#define STREAMS 2       /* a thread's streams in each context it works in */
#define HELD 10         /* objects a thread holds at most */
#define EVENTS 6        /* events of a registration: its writers' streams */
#define DEFAULT_OPS 20000
#define DEFAULT_THREADS 16
/* One call under way for longer fails the run (RACE_STALL_S). */
#define DEFAULT_STALL_S 5

/* ---- driver entry points reached by name ---------------------------------- */

typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*dev_fn)(CUdevice);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*capture_v2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*to_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                                size_t, CUstreamCaptureMode);
typedef CUresult (*launch_kernel_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, unsigned, CUstream, void **, void **);

static struct {
    ctx_fn ctx_destroy_v1, ctx_destroy_v2;
    dev_fn primary_release_v1, primary_release_v2, primary_reset_v1, primary_reset_v2;
    stream_fn stream_destroy_v1, begin_capture_v1, begin_capture_ptsz, stream_sync_ptsz;
    capture_v2_fn begin_capture_v2_ptsz;
    end_capture_fn end_capture_ptsz;
    to_graph_fn to_graph_ptsz;
    launch_kernel_fn launch_kernel_ptsz;
} api;

static void find_entry_points(void)
{
    api.ctx_destroy_v1 = (ctx_fn)hx_sym("cuCtxDestroy");
    api.ctx_destroy_v2 = (ctx_fn)hx_sym("cuCtxDestroy_v2");
    api.primary_release_v1 = (dev_fn)hx_sym("cuDevicePrimaryCtxRelease");
    api.primary_release_v2 = (dev_fn)hx_sym("cuDevicePrimaryCtxRelease_v2");
    api.primary_reset_v1 = (dev_fn)hx_sym("cuDevicePrimaryCtxReset");
    api.primary_reset_v2 = (dev_fn)hx_sym("cuDevicePrimaryCtxReset_v2");
    api.stream_destroy_v1 = (stream_fn)hx_sym("cuStreamDestroy");
    api.begin_capture_v1 = (stream_fn)hx_sym("cuStreamBeginCapture");
    api.begin_capture_ptsz = (stream_fn)hx_sym("cuStreamBeginCapture_ptsz");
    api.begin_capture_v2_ptsz = (capture_v2_fn)hx_sym("cuStreamBeginCapture_v2_ptsz");
    api.end_capture_ptsz = (end_capture_fn)hx_sym("cuStreamEndCapture_ptsz");
    api.to_graph_ptsz = (to_graph_fn)hx_sym("cuStreamBeginCaptureToGraph_ptsz");
    api.stream_sync_ptsz = (stream_fn)hx_sym("cuStreamSynchronize_ptsz");
    api.launch_kernel_ptsz = (launch_kernel_fn)hx_sym("cuLaunchKernel_ptsz");
}

/* ---- contexts --------------------------------------------------------------- */

static struct hx_ctx slot_primary = {.name = "primary(0)", .dev = 0};
static struct hx_ctx slot_user = {.name = "user(1)", .dev = 1};
static struct hx_ctx slot_role = {.name = "primary(1)", .dev = 1};

/* The primary context of device 1: users hold role_rw for reading, a reset
 * takes it for writing; role_calls keeps its retains, releases and resets
 * apart. */
static pthread_rwlock_t role_rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t role_calls = PTHREAD_MUTEX_INITIALIZER;

/* ---- objects and the accounting of capacity ------------------------------------ */

enum okind { K_DEVICE, K_PITCH, K_MANAGED, K_HOST, K_HOSTALLOC, K_REGISTERED, K_ARRAY,
             K_ARRAY3D, K_MIPMAP, K_MODULE, K_LIBRARY, K_COUNT };
enum cls { CLS_DEVICE, CLS_HOST, CLS_NONE };

/* One row per kind: its calls, its capacity, whether kernels may write it. */
static const struct {
    const char *alloc, *release;
    enum cls cls;
    bool memory;
} kinds[K_COUNT] = {
    [K_DEVICE] = {"cuMemAlloc", "cuMemFree", CLS_DEVICE, true},
    [K_PITCH] = {"cuMemAllocPitch", "cuMemFree", CLS_DEVICE, true},
    [K_MANAGED] = {"cuMemAllocManaged", "cuMemFree", CLS_DEVICE, true},
    [K_HOST] = {"cuMemAllocHost", "cuMemFreeHost", CLS_HOST, true},
    [K_HOSTALLOC] = {"cuMemHostAlloc", "cuMemFreeHost", CLS_HOST, true},
    [K_REGISTERED] = {"cuMemHostRegister", "cuMemHostUnregister", CLS_HOST, true},
    [K_ARRAY] = {"cuArrayCreate", "cuArrayDestroy", CLS_DEVICE, false},
    [K_ARRAY3D] = {"cuArray3DCreate", "cuArrayDestroy", CLS_DEVICE, false},
    [K_MIPMAP] = {"cuMipmappedArrayCreate", "cuMipmappedArrayDestroy", CLS_DEVICE, false},
    [K_MODULE] = {"cuModuleLoadData", "cuModuleUnload", CLS_NONE, false},
    [K_LIBRARY] = {"cuLibraryLoadData", "cuLibraryUnload", CLS_NONE, false},
};

struct obj {
    enum okind kind;
    uintptr_t h;          /* address or handle */
    size_t bytes;         /* counted against its capacity */
    int acct;             /* that capacity (acct_slot) */
    size_t size;          /* bytes a kernel may write (memory) */
    struct hx_ctx *ctx;    /* its context (a library: none) */
    int page, npages;     /* registered pages */
    bool read_only;       /* registered with CU_MEMHOSTREGISTER_READ_ONLY */
    CUstream ev_stream[EVENTS];
    CUevent ev[EVENTS];   /* recorded after the last write on that stream */
    struct hx_ctx *ev_ctx[EVENTS]; /* the context of each event */
    unsigned flags;       /* cuMemAllocManaged's or cuMemHostAlloc's */
    CUfunction fn;        /* module or library: a function in fn_ctx */
    struct hx_ctx *fn_ctx;
};

/* The capacities the program's memory counts against, as the test driver
 * counts them: pinned host memory, one for every device, and each device's
 * own (ACCT_DEVICE + its ordinal; main makes contexts of devices 0 and 1). */
#define DEVICES 2
enum { ACCT_NONE = -1, ACCT_HOST, ACCT_DEVICE, ACCT_COUNT = ACCT_DEVICE + DEVICES };

/* The capacity an object of kind k made in context c counts against (a
 * green context's device is its primary's: hx_ctx.dev says so). */
static int acct_slot(enum okind k, const struct hx_ctx *c)
{
    switch (kinds[k].cls) {
    case CLS_DEVICE: return ACCT_DEVICE + c->dev;
    case CLS_HOST: return ACCT_HOST;
    default: return ACCT_NONE;
    }
}

static size_t capacity[ACCT_COUNT];
static pthread_mutex_t acct_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t acct_live[ACCT_COUNT]; /* bytes of live objects */

/* An allocation under way: its capacity, its request, and the most the
 * program held of that capacity (with every allocation under way) while it
 * ran. */
struct inflight {
    bool active;
    int slot;
    size_t req, peak;
};
static struct inflight inflight[HX_MAX_THREADS];

static size_t acct_total(int slot)
{
    size_t n = acct_live[slot];
    for (int i = 0; i < hx.threads; i++)
        if (inflight[i].active && inflight[i].slot == slot)
            n += inflight[i].req;
    return n;
}

static void acct_begin(int thread, int slot, size_t req)
{
    if (slot == ACCT_NONE)
        return;
    pthread_mutex_lock(&acct_lock);
    inflight[thread] = (struct inflight){true, slot, req, 0};
    size_t total = acct_total(slot);
    for (int i = 0; i < hx.threads; i++)
        if (inflight[i].active && inflight[i].slot == slot && inflight[i].peak < total)
            inflight[i].peak = total;
    pthread_mutex_unlock(&acct_lock);
}

/* Ends the allocation; returns the peak it saw (its request included). */
static size_t acct_end(int thread, int slot, bool ok)
{
    if (slot == ACCT_NONE)
        return 0;
    pthread_mutex_lock(&acct_lock);
    size_t peak = inflight[thread].peak;
    if (ok)
        acct_live[slot] += inflight[thread].req;
    inflight[thread].active = false;
    pthread_mutex_unlock(&acct_lock);
    return peak;
}

static void acct_release(int slot, size_t bytes)
{
    if (slot == ACCT_NONE)
        return;
    pthread_mutex_lock(&acct_lock);
    acct_live[slot] -= bytes;
    pthread_mutex_unlock(&acct_lock);
}

/* ---- workers -------------------------------------------------------------------- */

enum span { SPAN_NONE, SPAN_OWN, SPAN_ROLE, SPAN_GREEN };
enum capkind { CAP_STREAM, CAP_PER_THREAD, CAP_PTSZ, CAP_TO_GRAPH, CAP_TO_GRAPH_PTSZ,
               CAP_KINDS };

struct capture {
    bool live, invalidated, blocking;
    enum capkind kind;
    int stream;           /* CAP_STREAM, CAP_TO_GRAPH: index in the streams */
    struct hx_ctx *ctx;
};

struct worker {
    struct hx_thread t;
    struct hx_ctx *home;
    CUstream home_streams[STREAMS];
    enum span span;
    int span_left, retains;
    struct hx_ctx own;     /* SPAN_OWN, SPAN_GREEN */
    CUstream span_streams[STREAMS];
    struct obj held[HELD];
    int nheld;
    struct hx_pages reg;
    struct capture cap;
    CUgraph graph;        /* kept from a capture, for cuStreamBeginCaptureToGraph */
    CUstream across;      /* a stream of the other shared context (launch_across) */
    size_t again_size;    /* the next allocation's size and flags (again()) */
    int again_flags;      /* -1: chosen at random */
    /* statistics */
    unsigned long long allocs, ooms, releases, launches, syncs, swaps, captures[CAP_KINDS],
        captures_beside, renewals,
        invalidations, spans[4], resets, flushes;
};

static struct worker workers[HX_MAX_THREADS];
static _Atomic unsigned long long expected_invalidations;
static bool have_green;
/* RACE_DRIVER_ALONE=1: run without the shim (no cudefer_flush), to check
 * the harness itself: the driver alone must meet every invariant. */
static bool driver_alone;
/* Events the program made and destroyed (the leak check tells them from
 * cudefer's). */
static _Atomic long program_events;
/* RACE_SKIP: parts of the program left out. */
static bool skip_green, skip_own, skip_role, skip_reset, skip_capture, skip_flush,
    skip_register;
/* Kernels of one shared context write memory of the other (launch_across):
 * with cudefer, in runs without captures. */
static bool across_on;

static struct hx_ctx *cur(struct worker *w)
{
    switch (w->span) {
    case SPAN_NONE: return w->home;
    case SPAN_ROLE: return &slot_role;
    default: return &w->own;
    }
}

static CUstream *cur_streams(struct worker *w)
{
    return w->span == SPAN_NONE ? w->home_streams : w->span_streams;
}

static size_t pick_size(struct worker *w)
{
    if (w->again_size) {
        size_t n = w->again_size;
        w->again_size = 0;
        return n;
    }
    static const size_t sizes[] = {4096, 4096, 16384, 65536, 65536, 262144};
    unsigned i = hx_below(&w->t, 32);
    return i < 31 ? sizes[i % 6] : (size_t)1 << 20;
}

/* ---- blocks handed back while a kernel still writes them ----------------------------- */

/* Counts the program's events it destroys; the table of released memory
 * (harness.h) destroys the writers' events it drops with it. */
static void destroy_event(CUevent ev)
{
    if (ev && cuEventDestroy(ev) == CUDA_SUCCESS)
        atomic_fetch_sub(&program_events, 1);
}

_Static_assert(EVENTS <= HX_WRITERS, "the table keeps every writer's event");

/* o is released: its writers' events (of non-registered memory) go to the
 * table of released memory, where an allocation that returns memory
 * overlapping it checks them (reuse-early). */
static void released_note(struct obj *o)
{
    bool any = false;
    for (int k = 0; k < EVENTS; k++)
        any |= o->ev[k] != NULL;
    if (!any)
        return;
    char what[64];
    snprintf(what, sizeof what, "%s %#lx", kinds[o->kind].alloc, (unsigned long)o->h);
    hx_released_note(o->h, o->h + (o->size ? o->size : 1), what, o->ev, EVENTS);
    for (int k = 0; k < EVENTS; k++) {
        o->ev_stream[k] = NULL;
        o->ev_ctx[k] = NULL;
    }
}

/* Drops a registration's events (dead with its context when !alive). */
static void drop_events(struct obj *o, bool alive)
{
    for (int i = 0; i < EVENTS; i++) {
        if (alive)
            destroy_event(o->ev[i]);
        o->ev[i] = NULL;
        o->ev_stream[i] = NULL;
        o->ev_ctx[i] = NULL;
    }
}

/* Right after cuMemHostUnregister returned: every kernel that wrote the
 * pages before it has finished. */
static void check_writers_done(struct worker *w, struct obj *o)
{
    for (int i = 0; i < EVENTS; i++) {
        if (!o->ev[i])
            continue;
        CUresult rc = cuEventQuery(o->ev[i]);
        if (rc == CUDA_ERROR_NOT_READY)
            hx_fail(&w->t, "unregister-early",
                    "cuMemHostUnregister(%p) returned while a kernel that writes its pages "
                    "(queued before the call) still ran", (void *)o->h);
        else
            hx_expect(&w->t, "cuEventQuery", rc, CUDA_SUCCESS);
    }
}

/* Records, after a kernel that writes o on stream s of context c, the
 * event of o's slot (one of another context is made anew). */
static void record_writer(struct worker *w, struct obj *o, int slot, CUstream s,
                          struct hx_ctx *c)
{
    if (o->ev[slot] && o->ev_ctx[slot] != c) {
        destroy_event(o->ev[slot]);
        o->ev[slot] = NULL;
    }
    if (!o->ev[slot]) {
        if (!hx_expect(&w->t, "cuEventCreate", cuEventCreate(&o->ev[slot], CU_EVENT_DISABLE_TIMING),
                       CUDA_SUCCESS)) {
            o->ev[slot] = NULL;
            return;
        }
        atomic_fetch_add(&program_events, 1);
    }
    o->ev_stream[slot] = s;
    o->ev_ctx[slot] = c;
    hx_expect(&w->t, "cuEventRecord", cuEventRecord(o->ev[slot], s), CUDA_SUCCESS);
}

/* ---- allocations ------------------------------------------------------------------ */

/* Judges an allocation's answer by the out-of-memory rule (file comment). */
static bool judge_alloc(struct worker *w, const char *call, CUresult rc, int slot,
                        size_t req, size_t peak)
{
    if (rc == CUDA_SUCCESS)
        return true;
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || slot == ACCT_NONE)
        return hx_expect(&w->t, call, rc, CUDA_SUCCESS);
    /* What the driver holds of this capacity that is not the program's:
     * the device's frees not yet synchronised, and cudefer's own pinned
     * words (own.h). */
    int dev = slot - ACCT_DEVICE;
    size_t pending = slot != ACCT_HOST
                         ? testdrv_pending_free_bytes_on(dev)
                         : CUDEFER_WORD_BYTES * testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES);
    size_t room = capacity[slot] > pending ? capacity[slot] - pending : 0;
    if (peak <= room) {
        char what[32];
        if (slot == ACCT_HOST)
            snprintf(what, sizeof what, "pinned host");
        else
            snprintf(what, sizeof what, "device %d", dev);
        hx_fail(&w->t, "oom-while-held",
                "%s(%zu bytes) failed with out of memory, yet the program held at most %zu of "
                "the %zu bytes of %s capacity while it ran (request and other threads' "
                "allocations under way included; %zu bytes the driver holds that are not the "
                "program's): memory the program had released was still held back", call, req,
                peak, capacity[slot], what, pending);
    }
    w->ooms++;
    return false;
}

static void allocate(struct worker *w, enum okind k)
{
    if (k == K_REGISTERED && skip_register)
        k = K_DEVICE;
    struct hx_ctx *c = cur(w);
    struct obj o = {.kind = k, .ctx = c, .page = -1, .acct = acct_slot(k, c)};
    size_t n = pick_size(w);
    CUresult rc;
    switch (k) {
    case K_PITCH: {
        size_t width = 1 + hx_below(&w->t, 4096), height = 1 + hx_below(&w->t, 64), pitch = 0;
        unsigned elem = 4u << hx_below(&w->t, 3);
        o.bytes = (width + 511) / 512 * 512 * height;
        acct_begin(w->t.index, o.acct, o.bytes);
        hx_begin(&w->t, "cuMemAllocPitch(%zu x %zu, %u) in %s", width, height, elem, c->name);
        CUdeviceptr p = 0;
        rc = cuMemAllocPitch(&p, &pitch, width, height, elem);
        o.h = (uintptr_t)p;
        o.size = pitch * height;
        break;
    }
    case K_REGISTERED: {
        int np = 1 + (int)hx_below(&w->t, 4), first = hx_pages_free(&w->t, &w->reg, np);
        if (first < 0)
            return;
        for (int p = first; p < first + np; p++)
            hx_page_check(&w->t, &w->reg, p);
        unsigned flags = hx_below(&w->t, 4);
        if (hx_below(&w->t, 8) == 0)
            flags |= CU_MEMHOSTREGISTER_READ_ONLY;
        o.page = first;
        o.npages = np;
        o.read_only = flags & CU_MEMHOSTREGISTER_READ_ONLY;
        o.bytes = o.size = (size_t)np * HX_PAGE;
        o.h = (uintptr_t)hx_page_at(&w->reg, first);
        acct_begin(w->t.index, o.acct, o.bytes);
        hx_begin(&w->t, "cuMemHostRegister(pages %d..%d, %#x) in %s", first, first + np - 1,
                 flags, c->name);
        rc = cuMemHostRegister((void *)o.h, o.bytes, flags);
        break;
    }
    case K_ARRAY:
    case K_ARRAY3D:
    case K_MIPMAP: {
        size_t width = 32 + hx_below(&w->t, 993), height = hx_below(&w->t, 64);
        size_t depth = k == K_ARRAY ? 0 : hx_below(&w->t, 3);
        o.bytes = width * (height ? height : 1) * (depth ? depth : 1) * 4;
        acct_begin(w->t.index, o.acct, o.bytes);
        hx_begin(&w->t, "%s(%zu x %zu x %zu) in %s", kinds[k].alloc, width, height, depth,
                 c->name);
        if (k == K_ARRAY) {
            CUDA_ARRAY_DESCRIPTOR d = {.Width = width, .Height = height,
                                       .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUarray a = NULL;
            rc = cuArrayCreate(&a, &d);
            o.h = (uintptr_t)a;
        } else {
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = width, .Height = height, .Depth = depth,
                                         .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            if (k == K_ARRAY3D) {
                CUarray a = NULL;
                rc = cuArray3DCreate(&a, &d);
                o.h = (uintptr_t)a;
            } else {
                CUmipmappedArray m = NULL;
                rc = cuMipmappedArrayCreate(&m, &d, 1 + hx_below(&w->t, 3));
                o.h = (uintptr_t)m;
            }
        }
        break;
    }
    case K_MODULE: {
        static const char image[] = "// any image loads in the test driver\n";
        hx_begin(&w->t, "cuModuleLoadData in %s", c->name);
        CUmodule m = NULL;
        rc = cuModuleLoadData(&m, image);
        hx_end(&w->t, rc);
        if (!hx_expect(&w->t, "cuModuleLoadData", rc, CUDA_SUCCESS))
            return;
        o.h = (uintptr_t)m;
        hx_begin(&w->t, "cuModuleGetFunction");
        rc = cuModuleGetFunction(&o.fn, m, "k");
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuModuleGetFunction", rc, CUDA_SUCCESS);
        o.fn_ctx = c;
        w->held[w->nheld++] = o;
        w->allocs++;
        return;
    }
    case K_LIBRARY: {
        static const char image[] = "// any image loads in the test driver\n";
        hx_begin(&w->t, "cuLibraryLoadData");
        CUlibrary lib = NULL;
        rc = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
        hx_end(&w->t, rc);
        if (!hx_expect(&w->t, "cuLibraryLoadData", rc, CUDA_SUCCESS))
            return;
        o.h = (uintptr_t)lib;
        o.ctx = NULL;
        if (hx_below(&w->t, 2)) { /* loaded into the current context too */
            CUkernel kern;
            hx_begin(&w->t, "cuLibraryGetKernel + cuKernelGetFunction in %s", c->name);
            rc = cuLibraryGetKernel(&kern, lib, "k");
            if (rc == CUDA_SUCCESS)
                rc = cuKernelGetFunction(&o.fn, kern);
            hx_end(&w->t, rc);
            if (hx_expect(&w->t, "cuKernelGetFunction", rc, CUDA_SUCCESS))
                o.fn_ctx = c;
        }
        w->held[w->nheld++] = o;
        w->allocs++;
        return;
    }
    default: {
        o.bytes = o.size = n;
        acct_begin(w->t.index, o.acct, n);
        if (k == K_DEVICE || k == K_MANAGED) {
            CUdeviceptr p = 0;
            unsigned flags = hx_below(&w->t, 2) ? CU_MEM_ATTACH_GLOBAL : CU_MEM_ATTACH_HOST;
            if (w->again_flags >= 0)
                flags = (unsigned)w->again_flags;
            o.flags = flags;
            hx_begin(&w->t, "%s(%zu) in %s", kinds[k].alloc, n, c->name);
            rc = k == K_DEVICE ? cuMemAlloc(&p, n) : cuMemAllocManaged(&p, n, flags);
            o.h = (uintptr_t)p;
        } else {
            void *p = NULL;
            unsigned flags = hx_below(&w->t, 8);
            if (w->again_flags >= 0)
                flags = (unsigned)w->again_flags;
            o.flags = flags;
            hx_begin(&w->t, "%s(%zu, %#x) in %s", kinds[k].alloc, n, flags, c->name);
            rc = k == K_HOST ? cuMemAllocHost(&p, n) : cuMemHostAlloc(&p, n, flags);
            o.h = (uintptr_t)p;
        }
        break;
    }
    }
    hx_end(&w->t, rc);
    size_t peak = acct_end(w->t.index, o.acct, rc == CUDA_SUCCESS);
    if (!judge_alloc(w, kinds[k].alloc, rc, o.acct, o.bytes, peak))
        return;
    if (k == K_REGISTERED)
        for (int p = o.page; p < o.page + o.npages; p++)
            w->reg.state[p] = HX_PAGE_REGISTERED;
    else if (kinds[k].memory)
        hx_released_check(&w->t, o.h, o.h + (o.size ? o.size : 1), kinds[o.kind].alloc);
    w->held[w->nheld++] = o;
    w->allocs++;
}

/* ---- releases ----------------------------------------------------------------- */

static CUresult release_call(struct obj *o)
{
    switch (o->kind) {
    case K_DEVICE:
    case K_PITCH:
    case K_MANAGED: return cuMemFree((CUdeviceptr)o->h);
    case K_HOST:
    case K_HOSTALLOC: return cuMemFreeHost((void *)o->h);
    case K_REGISTERED: return cuMemHostUnregister((void *)o->h);
    case K_ARRAY:
    case K_ARRAY3D: return cuArrayDestroy((CUarray)o->h);
    case K_MIPMAP: return cuMipmappedArrayDestroy((CUmipmappedArray)o->h);
    case K_MODULE: return cuModuleUnload((CUmodule)o->h);
    case K_LIBRARY: return cuLibraryUnload((CUlibrary)o->h);
    case K_COUNT: break;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* Releases the worker's object i; returns its kind. */
static enum okind release(struct worker *w, int i)
{
    struct obj o = w->held[i];
    w->held[i] = w->held[--w->nheld];
    hx_begin(&w->t, "%s(%#lx) of %s", kinds[o.kind].release, (unsigned long)o.h,
             o.ctx ? o.ctx->name : "no context");
    CUresult rc = release_call(&o);
    hx_end(&w->t, rc);
    hx_expect(&w->t, kinds[o.kind].release, rc, CUDA_SUCCESS);
    if (o.kind == K_REGISTERED) {
        check_writers_done(w, &o);
        drop_events(&o, true);
        hx_pages_set_canaries(&w->t, &w->reg, o.page, o.npages);
    } else if (rc == CUDA_SUCCESS) {
        released_note(&o);
    }
    acct_release(o.acct, o.bytes);
    w->releases++;
    return o.kind;
}

/* After an unregister, now and then, the worker frees its buffer of pages
 * for registrations, allocates pinned or managed memory of the buffer's
 * size at once, which the driver may place on the freed addresses (it
 * refuses to while a registration of them is still there, and without
 * cudefer none is), and takes a new buffer. */
static void renew_pages(struct worker *w)
{
    if (w->nheld == HELD)
        return;
    hx_begin(&w->t, "free the pages for registrations");
    bool unmapped = hx_pages_unmap(&w->t, &w->reg);
    hx_end(&w->t, CUDA_SUCCESS);
    if (!unmapped)
        return;
    w->renewals++;
    w->again_size = (size_t)HX_REG_PAGES * HX_PAGE;
    allocate(w, hx_below(&w->t, 2) ? K_HOST : K_MANAGED);
    w->again_size = 0;
    if (!hx_pages_map(&w->reg))
        hx_fail(&w->t, "result", "mmap of new pages for registrations failed");
}

/* The program's common pattern: a block released and one of the same kind,
 * size and flags allocated right after (which cudefer may serve with the
 * released block, or another one it holds). Checked by reuse-early. */
static void again(struct worker *w)
{
    int pick = -1;
    for (int tries = 0; tries < 4 && pick < 0 && w->nheld; tries++) {
        int i = (int)hx_below(&w->t, (unsigned)w->nheld);
        enum okind k = w->held[i].kind;
        if ((k == K_DEVICE || k == K_MANAGED || k == K_HOST || k == K_HOSTALLOC) &&
            w->held[i].ctx == cur(w))
            pick = i;
    }
    if (pick < 0) {
        allocate(w, K_DEVICE);
        return;
    }
    struct obj o = w->held[pick];
    release(w, pick);
    w->again_size = o.size;
    w->again_flags = (int)o.flags;
    allocate(w, o.kind);
    w->again_size = 0;
    w->again_flags = -1;
}

/* The objects of a context that its destruction freed: forgotten. */
static void forget_context(struct worker *w, struct hx_ctx *c)
{
    for (int i = 0; i < w->nheld;) {
        struct obj *o = &w->held[i];
        if (o->fn_ctx == c) {
            o->fn = NULL;
            o->fn_ctx = NULL;
        }
        if (o->ctx != c) {
            i++;
            continue;
        }
        if (o->kind == K_REGISTERED) {
            for (int k = 0; k < EVENTS; k++)
                if (o->ev[k])
                    atomic_fetch_sub(&program_events, 1); /* gone with the context */
            drop_events(o, false);
            hx_pages_set_canaries(&w->t, &w->reg, o->page, o->npages);
        }
        acct_release(o->acct, o->bytes);
        hx_note(&w->t, "  (%s %#lx freed with its context)", kinds[o->kind].alloc,
                (unsigned long)o->h);
        *o = w->held[--w->nheld];
    }
}

/* ---- kernels ------------------------------------------------------------------------ */

/* A stream of the current context for work: 0..STREAMS-1 the thread's own,
 * STREAMS the per-thread stream, STREAMS + 1 the legacy stream. */
static bool stream_capturing(struct worker *w, int which)
{
    const struct capture *cp = &w->cap;
    if (!cp->live || cp->ctx != cur(w))
        return false;
    if (which < STREAMS)
        return (cp->kind == CAP_STREAM || cp->kind == CAP_TO_GRAPH) && cp->stream == which;
    return which == STREAMS && (cp->kind == CAP_PER_THREAD || cp->kind == CAP_PTSZ ||
                                cp->kind == CAP_TO_GRAPH_PTSZ);
}

static CUstream stream_handle(struct worker *w, int which)
{
    if (which < STREAMS)
        return cur_streams(w)[which];
    return which == STREAMS ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
}

static const char *stream_name(int which)
{
    static const char *const names[] = {"stream 0", "stream 1", "per-thread", "legacy"};
    return names[which];
}

static void launch(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    int which = (int)hx_below(&w->t, STREAMS + 3);
    w->launches++;
    bool legacy = which == STREAMS + 1;
    if (legacy && !hx_legacy_enter(c))
        which = 0, legacy = false;
    if (w->cap.live && w->cap.invalidated &&
        stream_capturing(w, which == STREAMS + 2 ? STREAMS : which)) {
        if (legacy)
            hx_legacy_exit(c);
        return; /* work on an invalidated capture fails, as the program knows */
    }
    if (which == STREAMS + 2) { /* cuLaunchKernel_ptsz of a function it holds */
        for (int i = 0; i < w->nheld; i++) {
            struct obj *o = &w->held[i];
            if (o->fn && o->fn_ctx == c) {
                hx_begin(&w->t, "cuLaunchKernel_ptsz(%s function) in %s",
                         kinds[o->kind].alloc, c->name);
                CUresult rc = api.launch_kernel_ptsz(o->fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL,
                                                     NULL);
                hx_end(&w->t, rc);
                hx_expect(&w->t, "cuLaunchKernel_ptsz", rc, CUDA_SUCCESS);
                return;
            }
        }
        which = STREAMS;
    }
    CUstream s = stream_handle(w, which);
    bool captured = stream_capturing(w, which);
    /* The memory: a held object of this context, or none. */
    struct obj *o = NULL;
    int n = w->nheld ? (int)hx_below(&w->t, (unsigned)w->nheld + 2) : 0;
    if (n < w->nheld && kinds[w->held[n].kind].memory && w->held[n].ctx == c)
        o = &w->held[n];
    int slot = -1;
    /* Its writers are tracked in events: a registration's anywhere, other
     * memory's in the shared contexts (whose events last the run). */
    bool track = o && !captured && (o->kind == K_REGISTERED || c == &slot_primary ||
                                    c == &slot_user);
    if (track && (slot = hx_event_slot(o->ev, o->ev_stream, EVENTS, s)) < 0)
        o = NULL;
    unsigned usec = hx_below(&w->t, 16) ? 1 + hx_below(&w->t, 200) : 500 + hx_below(&w->t, 2500);
    enum testdrv_access access = o && o->read_only ? TESTDRV_READ : TESTDRV_WRITE;
    hx_begin(&w->t, "testdrv_launch(%s, %u us, %s %#lx) in %s%s", stream_name(which), usec,
             o ? kinds[o->kind].alloc : "nothing", o ? (unsigned long)o->h : 0ul, c->name,
             captured ? " (captured)" : "");
    CUresult rc = testdrv_launch(s, usec, o ? (CUdeviceptr)o->h : 0, o ? o->size : 0,
                                 o ? access : TESTDRV_NONE);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS);
    if (rc == CUDA_SUCCESS && slot >= 0)
        record_writer(w, o, slot, s, c);
    if (legacy)
        hx_legacy_exit(c);
}

/* A kernel of the other shared context writes memory this thread holds in
 * its home context (on a GPU: peer access, managed or portable memory).
 * The driver's own releases wait for their own context only, so this runs
 * with cudefer alone (not RACE_DRIVER_ALONE): its fences cover every
 * context, and neither a release nor a reuse may let the kernel write a
 * block the program got back. Only without captures (across_on): what is
 * released while a capture is live is unfenced, and a flush during the
 * capture releases it with the driver's own call (README, limits). */
static void launch_across(struct worker *w)
{
    struct hx_ctx *home = w->home, *other = home == &slot_primary ? &slot_user : &slot_primary;
    struct obj *o = NULL;
    for (int tries = 0; tries < 3 && !o && w->nheld; tries++) {
        struct obj *p = &w->held[hx_below(&w->t, (unsigned)w->nheld)];
        if (kinds[p->kind].memory && p->kind != K_REGISTERED && p->ctx == home)
            o = p;
    }
    if (!o) {
        launch(w);
        return;
    }
    if (!hx_expect(&w->t, "cuCtxSetCurrent", cuCtxSetCurrent(other->h), CUDA_SUCCESS))
        return;
    if (!w->across && !hx_expect(&w->t, "cuStreamCreate",
                                 cuStreamCreate(&w->across, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS))
        w->across = NULL;
    int slot = w->across ? hx_event_slot(o->ev, o->ev_stream, EVENTS, w->across) : -1;
    if (slot >= 0) {
        w->launches++;
        /* Now and then a long one: the other context's ring of records
         * then fills with the releases made meanwhile (fence.h). */
        unsigned r = hx_below(&w->t, 16);
        unsigned usec = r < 12 ? 1 + hx_below(&w->t, 300)
                        : r < 15 ? 1 + hx_below(&w->t, 3000) : 20000 + hx_below(&w->t, 20000);
        hx_begin(&w->t, "testdrv_launch(across, %u us, %s %#lx of %s) in %s", usec,
                 kinds[o->kind].alloc, (unsigned long)o->h, home->name, other->name);
        CUresult rc = testdrv_launch(w->across, usec, (CUdeviceptr)o->h, o->size, TESTDRV_WRITE);
        hx_end(&w->t, rc);
        if (hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS))
            record_writer(w, o, slot, w->across, other);
    }
    hx_expect(&w->t, "cuCtxSetCurrent", cuCtxSetCurrent(home->h), CUDA_SUCCESS);
}

/* The other shared context's stream of launch_across goes (at the end). */
static void destroy_across(struct worker *w)
{
    if (!w->across)
        return;
    struct hx_ctx *other = w->home == &slot_primary ? &slot_user : &slot_primary;
    if (hx_expect(&w->t, "cuCtxSetCurrent", cuCtxSetCurrent(other->h), CUDA_SUCCESS))
        hx_expect(&w->t, "cuStreamDestroy", cuStreamDestroy(w->across), CUDA_SUCCESS);
    w->across = NULL;
    hx_expect(&w->t, "cuCtxSetCurrent", cuCtxSetCurrent(w->home->h), CUDA_SUCCESS);
}

/* ---- synchronisation ----------------------------------------------------------------- */

static void synchronize(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    int which = (int)hx_below(&w->t, STREAMS + 2);
    unsigned how = hx_below(&w->t, 6);
    w->syncs++;
    CUresult rc;
    if (how == 0) {
        hx_begin(&w->t, "cuCtxSynchronize in %s", c->name);
        uint64_t foreign = testdrv_thread_foreign_syncs();
        rc = cuCtxSynchronize();
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuCtxSynchronize", rc, CUDA_SUCCESS);
        /* The program never makes a stream wait for another context's
         * work: neither may the engine's fences. */
        if (testdrv_thread_foreign_syncs() != foreign)
            hx_fail(&w->t, "sync-foreign", "cuCtxSynchronize in %s waited for unfinished work "
                    "of another context", c->name);
        return;
    }
    if (stream_capturing(w, which))
        return; /* syncing a capturing stream would invalidate its capture */
    bool legacy = which == STREAMS + 1;
    if (legacy && !hx_legacy_enter(c))
        return;
    CUstream s = stream_handle(w, which);
    if (how == 1 || how == 2) {
        hx_begin(&w->t, "cuStreamSynchronize%s(%s) in %s", how == 2 ? "_ptsz" : "",
                 stream_name(which), c->name);
        rc = how == 2 && which == STREAMS ? api.stream_sync_ptsz(NULL) : cuStreamSynchronize(s);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuStreamSynchronize", rc, CUDA_SUCCESS);
    } else if (how == 3) {
        hx_begin(&w->t, "cuStreamQuery(%s) in %s", stream_name(which), c->name);
        rc = cuStreamQuery(s);
        hx_end(&w->t, rc);
        if (rc != CUDA_ERROR_NOT_READY)
            hx_expect(&w->t, "cuStreamQuery", rc, CUDA_SUCCESS);
    } else {
        CUevent ev;
        hx_begin(&w->t, "cuEventRecord + cuEventSynchronize(%s) in %s", stream_name(which),
                 c->name);
        rc = cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
        if (rc == CUDA_SUCCESS) {
            rc = cuEventRecord(ev, s);
            if (rc == CUDA_SUCCESS)
                rc = cuEventSynchronize(ev);
            CUresult drc = cuEventDestroy(ev);
            if (rc == CUDA_SUCCESS)
                rc = drc;
        }
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuEventRecord/cuEventSynchronize", rc, CUDA_SUCCESS);
    }
    if (legacy)
        hx_legacy_exit(c);
}

static void flush(struct worker *w)
{
    if (driver_alone)
        return;
    w->flushes++;
    hx_begin(&w->t, "cudefer_flush");
    int r = hx_flush();
    hx_end(&w->t, r == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    if (r != 0)
        hx_fail(&w->t, "result", "cudefer_flush returned %d", r);
}

/* ---- streams ----------------------------------------------------------------------------- */

static CUresult create_stream(struct worker *w, CUstream *s)
{
    struct hx_ctx *c = cur(w);
    unsigned flags = hx_below(&w->t, 3) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    CUresult rc;
    if (w->span == SPAN_GREEN && hx_below(&w->t, 2)) {
        hx_begin(&w->t, "cuGreenCtxStreamCreate in %s", c->name);
        rc = hx_green_stream(s, c->green);
    } else if (hx_below(&w->t, 2)) {
        hx_begin(&w->t, "cuStreamCreate(%#x) in %s", flags, c->name);
        rc = cuStreamCreate(s, flags);
    } else {
        int prio = -(int)hx_below(&w->t, 6);
        hx_begin(&w->t, "cuStreamCreateWithPriority(%#x, %d) in %s", flags, prio, c->name);
        rc = cuStreamCreateWithPriority(s, flags, prio);
    }
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuStreamCreate", rc, CUDA_SUCCESS);
    return rc;
}

static void end_capture(struct worker *w);

/* Destroys stream i of the current context; a capture on it ends there
 * (the program invalidates it on purpose). */
static void destroy_stream(struct worker *w, int i)
{
    CUstream *streams = cur_streams(w);
    bool mid_capture = stream_capturing(w, i);
    bool v1 = hx_below(&w->t, 2);
    hx_begin(&w->t, "cuStreamDestroy%s(stream %d) in %s%s", v1 ? "" : "_v2", i, cur(w)->name,
             mid_capture ? " (in the middle of its capture)" : "");
    CUresult rc = v1 ? api.stream_destroy_v1(streams[i]) : cuStreamDestroy(streams[i]);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuStreamDestroy", rc, CUDA_SUCCESS);
    streams[i] = NULL;
    if (mid_capture) {
        if (!w->cap.invalidated)
            atomic_fetch_add(&expected_invalidations, 1);
        if (w->cap.blocking)
            hx_blocking_capture_exit(w->cap.ctx);
        w->cap.live = false;
        w->invalidations++;
    }
}

static void swap_stream(struct worker *w)
{
    int i = (int)hx_below(&w->t, STREAMS);
    w->swaps++;
    destroy_stream(w, i);
    create_stream(w, &cur_streams(w)[i]);
}

/* Is stream i of the current context a blocking one? */
static bool stream_blocking(struct worker *w, int i)
{
    unsigned flags = 0;
    CUresult rc = cuStreamGetFlags(cur_streams(w)[i], &flags);
    hx_expect(&w->t, "cuStreamGetFlags", rc, CUDA_SUCCESS);
    return !(flags & CU_STREAM_NON_BLOCKING);
}

/* ---- captures ---------------------------------------------------------------------------- */

static const char *const cap_names[CAP_KINDS] = {
    "a created stream", "CU_STREAM_PER_THREAD", "stream 0 through _ptsz",
    "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
};

static void begin_capture(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    enum capkind kind = (enum capkind)hx_below(&w->t, CAP_KINDS);
    if ((kind == CAP_TO_GRAPH || kind == CAP_TO_GRAPH_PTSZ) && !w->graph)
        kind = CAP_STREAM;
    int i = (int)hx_below(&w->t, STREAMS);
    bool blocking = kind == CAP_STREAM || kind == CAP_TO_GRAPH ? stream_blocking(w, i) : true;
    if (blocking && !hx_blocking_capture_enter(c))
        return;
    CUstream s = cur_streams(w)[i];
    CUresult rc;
    const CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    hx_begin(&w->t, "begin a capture of %s (stream %d) in %s", cap_names[kind], i, c->name);
    switch (kind) {
    case CAP_STREAM: rc = cuStreamBeginCapture(s, relaxed); break;
    case CAP_PER_THREAD: rc = cuStreamBeginCapture(CU_STREAM_PER_THREAD, relaxed); break;
    case CAP_PTSZ: rc = api.begin_capture_v2_ptsz(NULL, relaxed); break;
    case CAP_TO_GRAPH: rc = cuStreamBeginCaptureToGraph(s, w->graph, NULL, NULL, 0, relaxed); break;
    default: rc = api.to_graph_ptsz(NULL, w->graph, NULL, NULL, 0, relaxed); break;
    }
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuStreamBeginCapture", rc, CUDA_SUCCESS)) {
        if (blocking)
            hx_blocking_capture_exit(c);
        return;
    }
    w->cap = (struct capture){.live = true, .kind = kind, .stream = i, .ctx = c,
                              .blocking = blocking};
    w->captures[kind]++;
}

static void end_capture(struct worker *w)
{
    struct capture *cp = &w->cap;
    bool per_thread = cp->kind == CAP_PER_THREAD;
    bool ptsz = cp->kind == CAP_PTSZ || cp->kind == CAP_TO_GRAPH_PTSZ;
    CUgraph g = NULL;
    hx_begin(&w->t, "end the capture of %s in %s%s", cap_names[cp->kind], cp->ctx->name,
             cp->invalidated ? " (invalidated)" : "");
    CUresult rc = ptsz ? api.end_capture_ptsz(NULL, &g)
                       : cuStreamEndCapture(per_thread ? CU_STREAM_PER_THREAD
                                                       : cur_streams(w)[cp->stream], &g);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuStreamEndCapture", rc,
              cp->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS);
    if (rc == CUDA_SUCCESS && g && g != w->graph) {
        if (w->graph)
            cuGraphDestroy(w->graph);
        w->graph = g;
    }
    if (cp->blocking)
        hx_blocking_capture_exit(cp->ctx);
    cp->live = false;
}

/* The program invalidates its own capture: a query of the capturing stream. */
static void invalidate_capture(struct worker *w)
{
    struct capture *cp = &w->cap;
    CUstream s = cp->kind == CAP_STREAM || cp->kind == CAP_TO_GRAPH ? cur_streams(w)[cp->stream]
                                                                    : CU_STREAM_PER_THREAD;
    hx_begin(&w->t, "cuStreamQuery of the capturing %s (invalidates it)", cap_names[cp->kind]);
    CUresult rc = cuStreamQuery(s);
    hx_end(&w->t, rc);
    atomic_fetch_add(&expected_invalidations, 1);
    w->invalidations++;
    cp->invalidated = true;
    hx_expect(&w->t, "cuStreamQuery of a capturing stream", rc,
              CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

/* A GLOBAL or THREAD_LOCAL capture of a few launches, begun and ended here:
 * the thread makes no unsafe call meanwhile. */
static void strict_capture(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    int i = (int)hx_below(&w->t, STREAMS);
    bool blocking = stream_blocking(w, i);
    if (blocking && !hx_blocking_capture_enter(c))
        return;
    CUstream s = cur_streams(w)[i];
    unsigned how = hx_below(&w->t, 3);
    hx_begin(&w->t, "begin a %s capture of stream %d in %s",
             how == 0 ? "GLOBAL (cuStreamBeginCapture)" : how == 1 ? "GLOBAL" : "THREAD_LOCAL",
             i, c->name);
    CUstreamCaptureMode mode = how == 1 ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                        : CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    CUresult rc = how == 0 ? api.begin_capture_v1(s) : cuStreamBeginCapture(s, mode);
    hx_end(&w->t, rc);
    if (hx_expect(&w->t, "cuStreamBeginCapture", rc, CUDA_SUCCESS)) {
        for (unsigned k = 1 + hx_below(&w->t, 3); k; k--) {
            hx_begin(&w->t, "testdrv_launch(stream %d, captured)", i);
            rc = testdrv_launch(s, 10, 0, 0, TESTDRV_NONE);
            hx_end(&w->t, rc);
            hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS);
        }
        CUgraph g = NULL;
        hx_begin(&w->t, "cuStreamEndCapture(stream %d)", i);
        rc = cuStreamEndCapture(s, &g);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuStreamEndCapture", rc, CUDA_SUCCESS);
        if (rc == CUDA_SUCCESS && g)
            cuGraphDestroy(g);
    }
    if (blocking)
        hx_blocking_capture_exit(c);
}

/* While its per-thread capture is live, the thread makes a context of its
 * own, captures that context's per-thread stream (each context has its
 * own), ends the capture and destroys the context: the first capture is
 * still live, and must end as it began. */
static void per_thread_capture_beside(struct worker *w)
{
    CUcontext h = NULL, popped = NULL;
    CUgraph g = NULL;
    int dev = cur(w)->dev;
    hx_begin(&w->t, "cuCtxCreate on device %d beside the live capture", dev);
    CUresult rc = hx_ctx_create(4, &h, dev);
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuCtxCreate", rc, CUDA_SUCCESS))
        return;
    hx_expect(&w->t, "cuCtxPushCurrent", cuCtxPushCurrent(h), CUDA_SUCCESS);
    bool ptsz = hx_below(&w->t, 2);
    hx_begin(&w->t, "begin a capture of %s in a context of its own",
             cap_names[ptsz ? CAP_PTSZ : CAP_PER_THREAD]);
    rc = ptsz ? api.begin_capture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED)
              : cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED);
    hx_end(&w->t, rc);
    if (hx_expect(&w->t, "cuStreamBeginCapture", rc, CUDA_SUCCESS)) {
        hx_expect(&w->t, "testdrv_launch (captured)",
                  testdrv_launch(CU_STREAM_PER_THREAD, 10, 0, 0, TESTDRV_NONE), CUDA_SUCCESS);
        hx_begin(&w->t, "end that capture");
        rc = ptsz ? api.end_capture_ptsz(NULL, &g) : cuStreamEndCapture(CU_STREAM_PER_THREAD, &g);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuStreamEndCapture", rc, CUDA_SUCCESS);
        if (rc == CUDA_SUCCESS && g)
            cuGraphDestroy(g);
    }
    hx_expect(&w->t, "cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    hx_begin(&w->t, "cuCtxDestroy of that context");
    rc = cuCtxDestroy(h);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuCtxDestroy", rc, CUDA_SUCCESS);
    w->captures_beside++;
}

static void capture_op(struct worker *w)
{
    if (!w->cap.live) {
        if (hx_below(&w->t, 4) == 0)
            strict_capture(w);
        else
            begin_capture(w);
        return;
    }
    unsigned pick = hx_below(&w->t, 8);
    bool on_created = w->cap.kind == CAP_STREAM || w->cap.kind == CAP_TO_GRAPH;
    if (pick == 0 && !w->cap.invalidated)
        invalidate_capture(w);
    else if (pick == 1 && on_created)
        swap_stream(w); /* may destroy the capturing stream */
    else if (pick == 2 && !on_created)
        per_thread_capture_beside(w);
    else
        end_capture(w);
}

/* ---- spans in other contexts ----------------------------------------------------------- */

static void make_span_streams(struct worker *w)
{
    for (int i = 0; i < STREAMS; i++)
        if (create_stream(w, &w->span_streams[i]) != CUDA_SUCCESS)
            w->span_streams[i] = NULL;
}

static void begin_own(struct worker *w)
{
    int dev = (int)hx_below(&w->t, 2);
    unsigned version = 1 + hx_below(&w->t, 4);
    CUcontext h = NULL;
    hx_begin(&w->t, "cuCtxCreate%s on device %d", version == 1 ? "" : version == 2 ? "_v2"
                                                  : version == 3 ? "_v3" : "_v4", dev);
    CUresult rc = hx_ctx_create(version, &h, dev);
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuCtxCreate", rc, CUDA_SUCCESS))
        return;
    w->own = (struct hx_ctx){.name = "own", .h = h, .dev = dev};
    w->span = SPAN_OWN;
    make_span_streams(w);
}

/* Frees the buffer of pages for registrations, a new one taken first (so
 * that it does not land on the freed pages). */
static void swap_pages(struct worker *w)
{
    struct hx_pages next = w->reg;
    if (!hx_pages_map(&next))
        return;
    hx_begin(&w->t, "free the pages for registrations (a new buffer taken)");
    bool unmapped = hx_pages_unmap(&w->t, &w->reg);
    hx_end(&w->t, CUDA_SUCCESS);
    if (unmapped) {
        w->reg.base = next.base;
        w->renewals++;
    } else {
        munmap(next.base, (size_t)HX_REG_PAGES * HX_PAGE);
    }
}

static void end_own(struct worker *w)
{
    /* Release some of its objects (queued in cudefer); the others go with it. */
    bool unregistered = false;
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &w->own && hx_below(&w->t, 2))
            unregistered |= release(w, i) == K_REGISTERED;
    /* Now and then the destruction waits for a kernel, and the pages of a
     * registration released just now are freed before it: the destruction
     * undoes the registration only when it returns, and meanwhile another
     * thread's pinned or managed allocation, or its new buffer of pages,
     * may land there (without cudefer the pages were unregistered at the
     * release). */
    if (w->span_streams[0] && hx_below(&w->t, 2)) {
        unsigned usec = 1000 + hx_below(&w->t, 2000);
        hx_begin(&w->t, "testdrv_launch(stream 0, %u us, nothing 0) in own", usec);
        CUresult rc = testdrv_launch(w->span_streams[0], usec, 0, 0, TESTDRV_NONE);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS);
        if (unregistered)
            swap_pages(w);
    }
    for (int i = 0; i < STREAMS; i++)
        if (w->span_streams[i] && hx_below(&w->t, 2))
            destroy_stream(w, i);
    bool v1 = hx_below(&w->t, 2);
    hx_begin(&w->t, "cuCtxDestroy%s(own context)", v1 ? "" : "_v2");
    CUresult rc = v1 ? api.ctx_destroy_v1(w->own.h) : api.ctx_destroy_v2(w->own.h);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuCtxDestroy", rc, CUDA_SUCCESS);
    forget_context(w, &w->own);
    w->span = SPAN_NONE;
}

static CUresult role_retain(struct worker *w, CUcontext *h)
{
    pthread_mutex_lock(&role_calls);
    hx_begin(&w->t, "cuDevicePrimaryCtxRetain(1)");
    CUresult rc = cuDevicePrimaryCtxRetain(h, 1);
    hx_end(&w->t, rc);
    pthread_mutex_unlock(&role_calls);
    return rc;
}

static void role_release(struct worker *w)
{
    bool v1 = hx_below(&w->t, 2);
    pthread_mutex_lock(&role_calls);
    hx_begin(&w->t, "cuDevicePrimaryCtxRelease%s(1)", v1 ? "" : "_v2");
    CUresult rc = v1 ? api.primary_release_v1(1) : api.primary_release_v2(1);
    hx_end(&w->t, rc);
    pthread_mutex_unlock(&role_calls);
    hx_expect(&w->t, "cuDevicePrimaryCtxRelease", rc, CUDA_SUCCESS);
}

/* primary(1)'s handle, learnt by main before the workers start: a
 * primary context keeps its handle across its releases and resets, so
 * the workers only write it if it ever changed (and not, racing, the same
 * value from several threads). */
static void set_role_handle(CUcontext h)
{
    if (slot_role.h != h)
        slot_role.h = h;
}

static void begin_role(struct worker *w)
{
    if (pthread_rwlock_tryrdlock(&role_rw) != 0)
        return;
    CUcontext h = NULL;
    CUresult rc = role_retain(w, &h);
    if (!hx_expect(&w->t, "cuDevicePrimaryCtxRetain", rc, CUDA_SUCCESS)) {
        pthread_rwlock_unlock(&role_rw);
        return;
    }
    w->retains = 1;
    if (hx_below(&w->t, 3) == 0 && role_retain(w, &h) == CUDA_SUCCESS)
        w->retains++;
    hx_begin(&w->t, "cuCtxPushCurrent(primary(1))");
    rc = cuCtxPushCurrent(h);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuCtxPushCurrent", rc, CUDA_SUCCESS);
    set_role_handle(h);
    w->span = SPAN_ROLE;
    make_span_streams(w);
}

static void pop_current(struct worker *w)
{
    CUcontext popped;
    hx_begin(&w->t, "cuCtxPopCurrent");
    CUresult rc = cuCtxPopCurrent(&popped);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuCtxPopCurrent", rc, CUDA_SUCCESS);
}

static void end_role(struct worker *w)
{
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &slot_role)
            release(w, i);
    for (int i = 0; i < STREAMS; i++)
        if (w->span_streams[i])
            destroy_stream(w, i);
    for (int i = 0; i < w->nheld; i++)
        if (w->held[i].fn_ctx == &slot_role) {
            w->held[i].fn = NULL; /* it may go with the context's teardown */
            w->held[i].fn_ctx = NULL;
        }
    pop_current(w);
    while (w->retains) {
        role_release(w);
        w->retains--;
    }
    w->span = SPAN_NONE;
    pthread_rwlock_unlock(&role_rw);
}

/* A reset of the primary context of device 1, by a thread that is its only
 * user: it retains it, allocates, writes, releases some, and resets it with
 * the rest live and its retain outstanding (or releases that retain, the
 * last one). */
static void reset_op(struct worker *w)
{
    if (pthread_rwlock_trywrlock(&role_rw) != 0)
        return;
    CUcontext h = NULL;
    if (!hx_expect(&w->t, "cuDevicePrimaryCtxRetain", role_retain(w, &h), CUDA_SUCCESS)) {
        pthread_rwlock_unlock(&role_rw);
        return;
    }
    set_role_handle(h);
    hx_begin(&w->t, "cuCtxPushCurrent(primary(1))");
    CUresult rc = cuCtxPushCurrent(h);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuCtxPushCurrent", rc, CUDA_SUCCESS);
    w->span = SPAN_ROLE;
    make_span_streams(w);
    static const enum okind some[] = {K_DEVICE, K_HOST, K_MANAGED, K_REGISTERED, K_ARRAY,
                                      K_HOSTALLOC};
    for (unsigned k = 1 + hx_below(&w->t, 4); k && w->nheld < HELD; k--)
        allocate(w, some[hx_below(&w->t, 6)]);
    for (unsigned k = hx_below(&w->t, 4); k; k--)
        launch(w);
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &slot_role && hx_below(&w->t, 2))
            release(w, i);
    for (int i = 0; i < w->nheld; i++)
        if (w->held[i].fn_ctx == &slot_role) {
            w->held[i].fn = NULL;
            w->held[i].fn_ctx = NULL;
        }
    bool reset = hx_below(&w->t, 3) != 0;
    if (reset) {
        bool v1 = hx_below(&w->t, 2);
        pthread_mutex_lock(&role_calls);
        hx_begin(&w->t, "cuDevicePrimaryCtxReset%s(1) with objects live", v1 ? "" : "_v2");
        rc = v1 ? api.primary_reset_v1(1) : api.primary_reset_v2(1);
        hx_end(&w->t, rc);
        pthread_mutex_unlock(&role_calls);
        hx_expect(&w->t, "cuDevicePrimaryCtxReset", rc, CUDA_SUCCESS);
    } else {
        role_release(w);
    }
    forget_context(w, &slot_role);
    pop_current(w);
    w->span = SPAN_NONE;
    w->resets++;
    pthread_rwlock_unlock(&role_rw);
}

static void begin_green(struct worker *w)
{
    CUgreenCtx g = NULL;
    CUcontext h = NULL;
    unsigned sms = 8u << hx_below(&w->t, 3);
    hx_begin(&w->t, "cuGreenCtxCreate(%u SMs) on device 0", sms);
    CUresult rc = hx_green_create(0, sms, &g, &h);
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuGreenCtxCreate", rc, CUDA_SUCCESS))
        return;
    hx_begin(&w->t, "cuCtxPushCurrent(green)");
    rc = cuCtxPushCurrent(h);
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuCtxPushCurrent", rc, CUDA_SUCCESS)) {
        hx_green_destroy(g);
        return;
    }
    w->own = (struct hx_ctx){.name = "green(0)", .h = h, .green = g, .dev = 0};
    w->span = SPAN_GREEN;
    make_span_streams(w);
}

/* What a green context made belongs to the primary context of its device
 * (testdriver.h), which main holds for the whole run: its objects stay. */
static void end_green(struct worker *w)
{
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &w->own && hx_below(&w->t, 2))
            release(w, i);
    for (int i = 0; i < STREAMS; i++)
        if (w->span_streams[i] && hx_below(&w->t, 4))
            destroy_stream(w, i);
    for (int i = 0; i < w->nheld; i++) {
        struct obj *o = &w->held[i];
        if (o->ctx == &w->own) {
            /* Kernels of it now run on the primary's streams; its events
             * (recorded on green streams) still tell when those finish. */
            o->ctx = &slot_primary;
        }
        if (o->fn_ctx == &w->own) {
            o->fn = NULL;
            o->fn_ctx = NULL;
        }
    }
    pop_current(w);
    hx_begin(&w->t, "cuGreenCtxDestroy");
    CUresult rc = hx_green_destroy(w->own.green);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "cuGreenCtxDestroy", rc, CUDA_SUCCESS);
    w->span = SPAN_NONE;
}

static void begin_span(struct worker *w)
{
    if (w->cap.live)
        end_capture(w);
    unsigned pick = hx_below(&w->t, 10);
    if (pick < 4 && !skip_own)
        begin_own(w);
    else if (pick >= 4 && (pick < 7 || !have_green || skip_green) && !skip_role)
        begin_role(w);
    else if (pick >= 7 && have_green && !skip_green)
        begin_green(w);
    if (w->span != SPAN_NONE) {
        w->span_left = 10 + (int)hx_below(&w->t, 50);
        w->spans[w->span]++;
    }
}

static void end_span(struct worker *w)
{
    if (w->cap.live)
        end_capture(w);
    switch (w->span) {
    case SPAN_OWN: end_own(w); break;
    case SPAN_ROLE: end_role(w); break;
    case SPAN_GREEN: end_green(w); break;
    case SPAN_NONE: break;
    }
}

/* ---- the operations ------------------------------------------------------------------ */

/* What a program asks of free memory (frameworks size their caches by it):
 * the driver's answer, to which cudefer adds what it holds for the current
 * context's device, walking every context while other threads create,
 * reset and destroy them. Its value is checked by the engine suite
 * (meminfo); here, that the call answers and stays within the capacity. */
static void meminfo(struct worker *w)
{
    size_t free = 0, total = 0;
    hx_begin(&w->t, "cuMemGetInfo_v2 in %s", cur(w)->name);
    CUresult rc = cuMemGetInfo_v2(&free, &total);
    hx_end(&w->t, rc);
    if (hx_expect(&w->t, "cuMemGetInfo_v2", rc, CUDA_SUCCESS) &&
        (free > total || total != capacity[ACCT_DEVICE + cur(w)->dev]))
        hx_fail(&w->t, "meminfo",
                "cuMemGetInfo_v2 in %s said %zu bytes free of %zu (device %d's capacity %zu)",
                cur(w)->name, free, total, cur(w)->dev, capacity[ACCT_DEVICE + cur(w)->dev]);
}

static void one_operation(void *arg)
{
    struct worker *w = arg;
    if (w->span != SPAN_NONE && --w->span_left <= 0) {
        end_span(w);
        return;
    }
    unsigned pick = hx_below(&w->t, 1000);
    if (pick < 240) {
        if (w->nheld == HELD)
            release(w, (int)hx_below(&w->t, HELD));
        else
            allocate(w, (enum okind)hx_below(&w->t, K_COUNT));
    } else if (pick < 440) {
        if (w->nheld == 0)
            allocate(w, (enum okind)hx_below(&w->t, K_COUNT));
        else if (release(w, (int)hx_below(&w->t, (unsigned)w->nheld)) == K_REGISTERED &&
                 hx_below(&w->t, 2) == 0)
            renew_pages(w);
    } else if (pick < 640) {
        launch(w);
    } else if (pick < 700) {
        synchronize(w);
    } else if (pick < 730) {
        swap_stream(w);
    } else if (pick < 840) {
        if (!skip_capture)
            capture_op(w);
    } else if (pick < 850) {
        if (!skip_flush)
            flush(w);
    } else if (pick < 875 && w->span == SPAN_NONE) {
        begin_span(w);
    } else if (pick < 879 && w->span == SPAN_NONE && !w->cap.live && !skip_reset) {
        reset_op(w);
    } else if (pick >= 880 && pick < 890) {
        meminfo(w);
    } else if (pick >= 940 && w->span == SPAN_NONE && across_on) {
        launch_across(w);
    } else if (pick >= 900 && w->nheld < HELD) {
        again(w);
    } else {
        launch(w);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    hx_worker_enter(&w->t, w->home);
    for (int i = 0; i < STREAMS; i++)
        create_stream(w, &w->home_streams[i]);
    hx_worker_ops(&w->t, one_operation, w);
    if (w->span != SPAN_NONE)
        end_span(w);
    if (w->cap.live)
        end_capture(w);
    while (w->nheld)
        release(w, w->nheld - 1);
    for (int i = 0; i < STREAMS; i++)
        destroy_stream(w, i);
    destroy_across(w);
    if (w->graph)
        cuGraphDestroy(w->graph);
    hx_worker_leave(&w->t, &w->reg);
    return NULL;
}

/* ---- main ------------------------------------------------------------------------------ */

static const struct {
    enum testdrv_kind kind;
    const char *name;
} live_kinds[] = {
    {TESTDRV_DEVICE, "device"}, {TESTDRV_HOST, "pinned host"}, {TESTDRV_MANAGED, "managed"},
    {TESTDRV_REGISTERED, "registered"}, {TESTDRV_ARRAY, "array"}, {TESTDRV_MODULE, "module"},
    {TESTDRV_LIBRARY, "library"}, {TESTDRV_VMM, "VMM"}, {TESTDRV_STREAM, "stream"},
    {TESTDRV_EVENT, "event"}, {TESTDRV_CONTEXT, "context"},
};
#define NLIVE (sizeof live_kinds / sizeof live_kinds[0])

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'k' || *end == 'K')
        v <<= 10;
    else if (*end == 'm' || *end == 'M')
        v <<= 20;
    return (size_t)v;
}

/* A few calls of every kind in a shared context before the baseline, so
 * that what cudefer sets up once per context is there already. */
static void warm_up(struct hx_ctx *c)
{
    CUdeviceptr d = 0;
    void *h = NULL;
    CUstream s = NULL;
    if (cuCtxSetCurrent(c->h) || cuMemAlloc(&d, 4096) || cuMemAllocHost(&h, 4096) ||
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) ||
        testdrv_launch(s, 10, d, 4096, TESTDRV_WRITE) || cuMemFree(d) || cuMemFreeHost(h) ||
        cuStreamDestroy(s) || cuCtxSynchronize()) {
        fprintf(stderr, "race: the warm-up in %s failed\n", c->name);
        exit(2);
    }
}

static bool settled(const size_t *base)
{
    return program_live(TESTDRV_DEVICE) <= base[0] && program_live(TESTDRV_MANAGED) <= base[2] &&
           testdrv_pending_free_bytes() == 0;
}

int main(int argc, char **argv)
{
    hx.stall_s = DEFAULT_STALL_S;
    hx_parse(argc, argv, "race", "RACE", DEFAULT_OPS, DEFAULT_THREADS, 500);
    hx_released_destroy_with(destroy_event);
    const char *env = getenv("RACE_CAPACITY");
    size_t cap = env && *env ? parse_size(env) : (size_t)2 << 20;
    if ((env = getenv("RACE_SKIP"))) {
        skip_green = strstr(env, "green"), skip_own = strstr(env, "own");
        skip_role = strstr(env, "role"), skip_reset = strstr(env, "reset");
        skip_capture = strstr(env, "capture"), skip_flush = strstr(env, "flush");
        skip_register = strstr(env, "register");
    }
    setenv("TESTDRIVER_DEVICES", "2", 0);
    setenv("CUDEFER_DEVICE_CACHE", hx.seed % 2 ? "64k" : "256M", 0);
    setenv("CUDEFER_DEVICE_CACHE_PEAK", hx.seed % 4 == 3 ? "0" : hx.seed % 4 == 2 ? "100" : "200",
           0);
    const char *savings = hx_savings_by_seed();
    const char *reuse = hx_word_by_seed();
    hx_watchdog_start();

    CUdevice dev0 = 0, dev1 = 1;
    CUcontext popped;
    if (cuInit(0) || cuDeviceGet(&dev0, 0) || cuDeviceGet(&dev1, 1) ||
        cuDevicePrimaryCtxRetain(&slot_primary.h, dev0) ||
        cuDevicePrimaryCtxRetain(&slot_role.h, dev1) || cuDevicePrimaryCtxRelease(dev1) ||
        cuCtxCreate(&slot_user.h, NULL, 0, dev1) || cuCtxPopCurrent(&popped)) {
        fprintf(stderr, "race: no contexts (are there 2 devices?)\n");
        return 2;
    }
    driver_alone = (env = getenv("RACE_DRIVER_ALONE")) && strcmp(env, "0") != 0;
    across_on = skip_capture && !driver_alone;
    if (!hx_shim_loaded() && !driver_alone) {
        fprintf(stderr, "race: cudefer_flush is not there: is the shim preloaded?\n");
        return 2;
    }
    find_entry_points();
    have_green = hx_green_available();
    warm_up(&slot_primary);
    warm_up(&slot_user);
    if ((!driver_alone && hx_flush() != 0) || cuCtxSetCurrent(NULL)) {
        fprintf(stderr, "race: the warm-up failed\n");
        return 2;
    }
    for (int i = 0; i < 5000 && testdrv_pending_free_bytes(); i++)
        usleep(1000);
    size_t base[NLIVE];
    for (size_t k = 0; k < NLIVE; k++)
        base[k] = program_live(live_kinds[k].kind);
    for (int i = 0; i < ACCT_COUNT; i++)
        capacity[i] = cap;
    testdrv_set_device_capacity(cap);
    testdrv_set_host_capacity(cap);

    printf("race: %llu operations, %d threads, seed %llu, capacity %zu, CUDEFER_DEVICE_CACHE=%s, "
           "CUDEFER_DEVICE_CACHE_PEAK=%s, savings %s, reuse %s, green contexts %s%s%s\n", hx.ops,
           hx.threads, (unsigned long long)hx.seed, cap, getenv("CUDEFER_DEVICE_CACHE"),
           getenv("CUDEFER_DEVICE_CACHE_PEAK"), savings, reuse, have_green ? "yes" : "no (skipped)",
           getenv("RACE_SKIP") ? ", RACE_SKIP=" : "",
           getenv("RACE_SKIP") ? getenv("RACE_SKIP") : "");
    fflush(stdout);

    hx_watchdog_phase("workers running");
    uint64_t t0 = hx_now_ns();
    pthread_t tid[HX_MAX_THREADS];
    for (int i = 0; i < hx.threads; i++) {
        struct worker *w = &workers[i];
        hx_thread_init(&w->t, i);
        unsigned long long n = (unsigned long long)hx.threads;
        w->t.ops = hx.ops / n + ((unsigned long long)i < hx.ops % n);
        w->home = i % 2 ? &slot_user : &slot_primary;
        w->again_flags = -1;
        if (!hx_pages_map(&w->reg))
            return 2;
    }
    for (int i = 0; i < hx.threads; i++)
        pthread_create(&tid[i], NULL, worker_main, &workers[i]);
    for (int i = 0; i < hx.threads; i++)
        pthread_join(tid[i], NULL);
    double work_s = (double)(hx_now_ns() - t0) / 1e9;
    hx_released_clear();

    /* Everything is released: after a synchronisation and a flush, nothing
     * may be left. */
    hx_watchdog_phase("final flush");
    struct hx_ctx *shared[] = {&slot_primary, &slot_user};
    for (int i = 0; i < 2; i++) {
        if (cuCtxSetCurrent(shared[i]->h) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS)
            hx_fail(NULL, "result", "cuCtxSynchronize of %s failed at the end", shared[i]->name);
    }
    if (!driver_alone && hx_flush() != 0)
        hx_fail(NULL, "result", "the final cudefer_flush failed");
    for (int i = 0; i < 5000 && !settled(base); i++)
        usleep(1000);
    for (size_t k = 0; k < NLIVE; k++) {
        size_t now = program_live(live_kinds[k].kind);
        if (now != base[k])
            hx_fail(NULL, "leak",
                    "after every release, cuCtxSynchronize and cudefer_flush the driver holds "
                    "%zu live %s objects, %zu at the start%s", now, live_kinds[k].name, base[k],
                    live_kinds[k].kind != TESTDRV_EVENT ? ""
                    : atomic_load(&program_events) ? " (the program's own are not all gone)"
                                                   : " (the program destroyed all of its own)");
    }
    if (testdrv_pending_free_bytes())
        hx_fail(NULL, "leak", "%zu bytes of freed device memory are still not given back",
                testdrv_pending_free_bytes());
    hx_check_always(NULL);
    if (testdrv_invalidated_captures() != atomic_load(&expected_invalidations))
        hx_fail(NULL, "capture-invalidated",
                "%llu stream captures were invalidated, the program invalidated %llu",
                (unsigned long long)testdrv_invalidated_captures(),
                atomic_load(&expected_invalidations));
    hx_watchdog_stop();

    unsigned long long allocs = 0, ooms = 0, releases = 0, launches = 0, syncs = 0, swaps = 0,
                       caps[CAP_KINDS] = {0}, beside = 0, inval = 0, spans[4] = {0},
                       resets = 0, flushes = 0, renewals = 0;
    for (int i = 0; i < hx.threads; i++) {
        struct worker *w = &workers[i];
        allocs += w->allocs, ooms += w->ooms, releases += w->releases;
        launches += w->launches, syncs += w->syncs, swaps += w->swaps;
        inval += w->invalidations, resets += w->resets, flushes += w->flushes;
        for (int k = 0; k < CAP_KINDS; k++)
            caps[k] += w->captures[k];
        beside += w->captures_beside;
        renewals += w->renewals;
        for (int k = 0; k < 4; k++)
            spans[k] += w->spans[k];
    }
    printf("race: %llu operations in %.2f s: %llu allocations (%llu out of memory, all within "
           "the rule), %llu releases, %llu launches, %llu synchronisations, %llu stream swaps, "
           "%llu flushes; %llu buffers of registered pages freed and taken anew\n", hx.ops,
           work_s, allocs, ooms, releases, launches, syncs, swaps, flushes, renewals);
    printf("race: captures: %llu created stream, %llu per-thread, %llu _ptsz, %llu to graph, "
           "%llu to graph _ptsz; %llu invalidated or ended by the program; %llu per-thread "
           "captures in a second context beside a live one\n", caps[0], caps[1], caps[2],
           caps[3], caps[4], inval, beside);
    printf("race: spans: %llu own contexts, %llu primary(1), %llu green; %llu resets or last "
           "releases of primary(1)\n", spans[SPAN_OWN], spans[SPAN_ROLE], spans[SPAN_GREEN],
           resets);
    printf("race: %llu allocations returned memory released before with its writers "
           "tracked (reuse-early checked)\n", hx_released_checked());
    if (hx_failures()) {
        printf("race: FAILED: %u failures (%s)\n", hx_failures(), hx_failed_invariants());
        return 1;
    }
    printf("race: every invariant held\n");
    return 0;
}
