/* property.c - the no-wait property: several threads make random sequences
 * of every call the shim wraps, through the preloaded shim over the test
 * driver, while kernels that wait for the host run in every context, and no
 * thread waits inside a call that must not wait. Plain C (no Criterion), so
 * that it also runs under ThreadSanitizer.
 *
 * usage: test_property [OPS [THREADS [SEED]]]
 *   OPS      operations over all threads (default $PROP_OPS, else 6000)
 *   THREADS  worker threads (default $PROP_THREADS, else 6)
 *   SEED     (default $PROP_SEED, else 1): each thread's choices follow from
 *            it (the interleaving differs from run to run)
 * environment: PROP_EPOCH_MS (default 50; see below), PROP_CAPACITY (each
 * device's and the pinned-host capacity, default 64M), PROP_KEEP_GOING=1 (report every
 * failure), PROP_TIMEOUT (seconds), PROP_STALL_S (seconds, default 10, 0:
 * none: one call under way for longer fails the run, 'stall'), PROP_WRAPPED (the list of wrapped names;
 * default: the shim's one list, shim/doors/wrapped.h), PROP_DRIVER_ALONE=1 (run without the shim,
 * to see the driver's own waits: every release then fails the property),
 * PROP_ONE_CONTEXT=1 (the primary context of device 0 alone, no spans and
 * no resets: the engine then knows one context, and its fences take the
 * one-context path of fence.h).
 * Unless set, CUDEFER_MAX_DEFERRED_ENTRIES is 32 and CUDEFER_MAX_DEFERRED_BYTES
 * 2M, so that the queues of the contexts go past their limits (soft: the
 * releases past them must not wait either). Even seeds gather what cudefer
 * saved (hx_savings_by_seed). Seeds 3, 6, 9... reuse without the fences'
 * words (hx_word_by_seed).
 *
 * Kernels that wait for the host. Time runs in epochs of PROP_EPOCH_MS. At
 * the start of epoch e, main launches testdrv_launch_spin kernels on flag e
 * in the two shared contexts (the primary context of device 0 and a context
 * of device 1), and a thread that starts a span in a context of its own
 * (cuCtxCreate*, the primary context of device 1, a green context) launches
 * one there; at its end main sets flag e. Every context thus always has a
 * kernel that waits for the host, which only main ends. A call that waits
 * for the GPU therefore waits until the end of the epoch (and a thread that
 * waits inside a call that must not wait is caught either way: the test
 * driver counts the call).
 *
 * Each call is measured with testdrv_thread_wait_calls() and
 * testdrv_thread_blocked_ns() around it, on the calling thread, and judged
 * by the rule of its name (the table `rules` below; every name of the list
 * of wrapped names must have a row, or the run fails):
 *  - must not wait: no call that may wait reached the driver (wait_calls
 *    delta 0), the thread was blocked in the driver less than 2 ms, and it
 *    did not wait for the epoch's kernels by polling (a call of 15 ms or
 *    more that returned within 3 ms of the flag of an epoch whose kernels
 *    ran when it began: judge_wall; not judged when the machine may
 *    account for the time: its thread waited for a CPU, or a stall of the
 *    test driver's own lock overlapped it, testdrv_lock_stall_end_ns):
 *    cuMemFree*, cuMemFreeHost, cuArrayDestroy, cuMipmappedArrayDestroy,
 *    cuModuleUnload, cuLibraryUnload, every allocation (cuMemAlloc*,
 *    cuMemAllocPitch*, cuMemAllocManaged, cuMemAllocHost*, cuMemHostAlloc,
 *    cuArrayCreate*, cuArray3DCreate*, cuMipmappedArrayCreate,
 *    cuLibraryLoad*, cuMemAllocAsync*, cuMemAllocFromPoolAsync*,
 *    cuMemCreate) unless it would otherwise fail for lack of memory (below),
 *    and cudefer's reuse of released blocks (allocations of the sizes just
 *    released: the churn operation), except a cuMemAllocManaged of a size
 *    this thread released in that context in the same epoch, which may
 *    wait for that block (cudefer waits for a managed block the same thread
 *    released while the GPU used it, as the driver's release would have),
 *    cuMemHostRegister* of a range that overlaps no registration
 *    whose unregister is pending, cuStreamCreate*, cuGreenCtxStreamCreate,
 *    cuStreamDestroy*, cuStreamBeginCapture*, cuStreamEndCapture*,
 *    cuCtxCreate*, cuCtxFromGreenCtx, cuGreenCtxDestroy (the driver alone
 *    returns at once: the primary context it references stays retained),
 *    cuDevicePrimaryCtxRetain, a cuDevicePrimaryCtxRelease* that is not the
 *    last, cuMemFreeAsync*, cuGetProcAddress*, cuModuleGetFunction,
 *    cuKernelGetFunction, and the calls that set state on a block
 *    (cuMemAdvise*, cuMemPrefetchAsync*, cuMemPrefetchBatchAsync*,
 *    cuMemDiscardAndPrefetchBatchAsync*, cuStreamAttachMemAsync*,
 *    cuPointerSetAttribute, and the dma-buf export
 *    cuMemGetHandleForAddressRange: the alter operation); a primary release
 *    and a green destruction wait for the engine's walks of the primary context, among them another
 *    thread's flush, which may wait for the GPU (DESIGN.md, section 3):
 *    they are not judged for polling while another thread's call that may
 *    flush runs (drains_flush);
 *  - may wait, bounded: cuMemHostUnregister returns once the work submitted
 *    before it has finished, and is not delayed by work submitted after it
 *    by other threads. Measured: (1) when it returns, every kernel that
 *    wrote the pages before the call has finished (events recorded after
 *    them are complete) and nothing writes the pages afterwards (a canary,
 *    checked when the pages are registered again and at the end); (2) it
 *    does not return after the spin kernels of an epoch that main launched
 *    after the call began have been released by their flag: those kernels
 *    are work submitted after it, which it must not wait for, and an
 *    unregister that waited for them would return only after their flag
 *    (judged when no call allowed to wait, primary context release or
 *    green context destruction overlapped it, see stalls_fences, and the
 *    machine did not hold it back: held_back);
 *  - allowed to wait: cuCtxSynchronize* (for its own context's work only:
 *    the test driver counts a synchronisation that had to wait for
 *    unfinished work of another context, testdrv_thread_foreign_syncs, and
 *    the program never makes one context's streams wait for another's),
 *    cudefer_flush, cuCtxDestroy*, the
 *    last cuDevicePrimaryCtxRelease*, cuDevicePrimaryCtxReset*, an
 *    allocation that would otherwise fail for lack of memory (it fails with
 *    CUDA_ERROR_OUT_OF_MEMORY, or, at some moment while it ran, the memory
 *    the driver held of its capacity - live bytes, those cudefer keeps
 *    deferred among them, pending frees and pools' reserves, as
 *    testdrv_capacity_used counts them, less cudefer's own pinned words -
 *    plus the requests of the allocations under way against the same
 *    capacity exceeded it; the capacity is, as on a real machine, the
 *    pinned host memory for pinned and registered memory, else the memory
 *    of the device of the context it is made in, a green context's being
 *    its primary's: memory given back on another device cannot serve it),
 *    and a cuMemHostRegister* overlapping a range whose unregister is
 *    pending (the driver still knows the range, asked with
 *    cuPointerGetAttribute);
 *  - not judged: cuModuleLoad* (the test driver's loads wait for the GPU as
 *    the real driver's do; they are made only in a thread's own context)
 *    and cuLaunchKernel* (the driver stalls a launch only while a waiting
 *    release of another thread holds the context, which only a call allowed
 *    to wait can make).
 * Also, after every operation: no kernel touched memory that was not live
 * (testdrv_faults), no call named a destroyed context, and every call
 * answered CUDA_SUCCESS (or CUDA_ERROR_OUT_OF_MEMORY for an allocation).
 * Whose memory an allocation hands back: a new device, pinned or managed
 * block answers every query as the driver's new allocation does, whatever
 * the program set on blocks it released ('fresh': SYNC_MEMOPS 0, no
 * advice, no prefetch location, attached globally, no dma-buf exported;
 * check_fresh).
 *
 * The program is correct, as in tests/race.c: it never uses an object after
 * releasing it; every thread uses the RELAXED capture mode and ends a
 * GLOBAL capture (cuStreamBeginCapture, cuStreamBeginCapture_ptsz) within
 * the operation that began it; no legacy-stream work meets a capture of a
 * blocking stream of its context; the retains and releases of the primary
 * context of device 1 are not concurrent, and it is reset only when no
 * other thread uses it.
 *
 * A failure prints the invariant, the seed, the replay command and the last
 * operations of the thread (fewer of the others), and ends the run with
 * status 1 (with PROP_KEEP_GOING=1 the run goes on). At the end, per rule,
 * how many calls were judged, and which wrapped names were never called.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "own.h"
#include "testdriver.h"

#define STREAMS 2
#define HELD 8
#define EVENTS 6
#define DEBTS 64
#define NEPOCH 1024            /* epochs remembered */
#define NO_WAIT_BLOCKED_NS 2000000u
#define OOM_SLACK ((size_t)64 << 10) /* cudefer's own small allocations */
#define DEFAULT_OPS 6000
#define DEFAULT_THREADS 6

#ifndef WRAPPED_LISTS
#define WRAPPED_LISTS "shim/doors/wrapped.h"
#endif

/* ---- rules ------------------------------------------------------------------ */

enum rule {
    R_NO_WAIT,    /* must not wait */
    R_ALLOC,      /* must not wait unless it would otherwise fail for lack of memory */
    R_REGISTER,   /* as R_ALLOC, and unless it overlaps a pending unregister */
    R_RELEASE_PRIMARY, /* must not wait unless it is the last release */
    R_BOUNDED,    /* cuMemHostUnregister */
    R_ALLOWED,    /* may wait */
    R_UNJUDGED,   /* waits in the driver alone, or only behind another thread's wait */
    R_COUNT
};
static const char *const rule_names[R_COUNT] = {
    "must not wait", "allocation", "registration", "primary release", "bounded",
    "allowed to wait", "not judged",
};

static const struct rule_row {
    const char *name;
    enum rule rule;
} rules[] = {
    {"cuArray3DCreate", R_ALLOC}, {"cuArray3DCreate_v2", R_ALLOC},
    {"cuArrayCreate", R_ALLOC}, {"cuArrayCreate_v2", R_ALLOC},
    {"cuArrayDestroy", R_NO_WAIT},
    {"cuCtxCreate", R_NO_WAIT}, {"cuCtxCreate_v2", R_NO_WAIT},
    {"cuCtxCreate_v3", R_NO_WAIT}, {"cuCtxCreate_v4", R_NO_WAIT},
    {"cuCtxDestroy", R_ALLOWED}, {"cuCtxDestroy_v2", R_ALLOWED},
    {"cuCtxFromGreenCtx", R_NO_WAIT},
    {"cuCtxSynchronize", R_ALLOWED}, {"cuCtxSynchronize_v2", R_ALLOWED},
    {"cuDevicePrimaryCtxRelease", R_RELEASE_PRIMARY},
    {"cuDevicePrimaryCtxRelease_v2", R_RELEASE_PRIMARY},
    {"cuDevicePrimaryCtxReset", R_ALLOWED}, {"cuDevicePrimaryCtxReset_v2", R_ALLOWED},
    {"cuDevicePrimaryCtxRetain", R_NO_WAIT},
    {"cuGetProcAddress", R_NO_WAIT}, {"cuGetProcAddress_v2", R_NO_WAIT},
    {"cuGreenCtxDestroy", R_NO_WAIT}, {"cuGreenCtxStreamCreate", R_NO_WAIT},
    {"cuKernelGetFunction", R_NO_WAIT},
    {"cuLaunchKernel", R_UNJUDGED}, {"cuLaunchKernel_ptsz", R_UNJUDGED},
    {"cuLaunchKernelEx", R_UNJUDGED}, {"cuLaunchKernelEx_ptsz", R_UNJUDGED},
    {"cuLaunchCooperativeKernel", R_UNJUDGED}, {"cuLaunchCooperativeKernel_ptsz", R_UNJUDGED},
    {"cuGraphInstantiateWithFlags", R_UNJUDGED},
    {"cuIpcGetMemHandle", R_NO_WAIT}, {"cuIpcOpenMemHandle", R_UNJUDGED},
    {"cuIpcOpenMemHandle_v2", R_UNJUDGED},
    {"cuLibraryLoadData", R_ALLOC}, {"cuLibraryLoadFromFile", R_ALLOC},
    {"cuLibraryUnload", R_NO_WAIT},
    {"cuMemAlloc", R_ALLOC}, {"cuMemAllocAsync", R_ALLOC}, {"cuMemAllocAsync_ptsz", R_ALLOC},
    {"cuMemAllocFromPoolAsync", R_ALLOC}, {"cuMemAllocFromPoolAsync_ptsz", R_ALLOC},
    {"cuMemAdvise", R_NO_WAIT}, {"cuMemAdvise_v2", R_NO_WAIT},
    {"cuMemAllocHost", R_ALLOC}, {"cuMemAllocHost_v2", R_ALLOC},
    {"cuMemAllocManaged", R_ALLOC}, {"cuMemAllocPitch", R_ALLOC},
    {"cuMemAllocPitch_v2", R_ALLOC}, {"cuMemAlloc_v2", R_ALLOC}, {"cuMemCreate", R_ALLOC},
    {"cuMemDiscardAndPrefetchBatchAsync", R_NO_WAIT},
    {"cuMemDiscardAndPrefetchBatchAsync_ptsz", R_NO_WAIT},
    {"cuMemFree", R_NO_WAIT}, {"cuMemFreeAsync", R_NO_WAIT}, {"cuMemFreeAsync_ptsz", R_NO_WAIT},
    {"cuMemFreeHost", R_NO_WAIT}, {"cuMemFree_v2", R_NO_WAIT},
    {"cuMemGetHandleForAddressRange", R_NO_WAIT},
    {"cuMemGetInfo", R_NO_WAIT}, {"cuMemGetInfo_v2", R_NO_WAIT},
    {"cuMemHostAlloc", R_ALLOC},
    {"cuMemHostRegister", R_REGISTER}, {"cuMemHostRegister_v2", R_REGISTER},
    {"cuMemHostUnregister", R_BOUNDED},
    {"cuMemPrefetchAsync", R_NO_WAIT}, {"cuMemPrefetchAsync_ptsz", R_NO_WAIT},
    {"cuMemPrefetchAsync_v2", R_NO_WAIT}, {"cuMemPrefetchAsync_v2_ptsz", R_NO_WAIT},
    {"cuMemPrefetchBatchAsync", R_NO_WAIT}, {"cuMemPrefetchBatchAsync_ptsz", R_NO_WAIT},
    {"cuMipmappedArrayCreate", R_ALLOC}, {"cuMipmappedArrayDestroy", R_NO_WAIT},
    {"cuModuleGetFunction", R_NO_WAIT},
    {"cuModuleLoad", R_UNJUDGED}, {"cuModuleLoadData", R_UNJUDGED},
    {"cuModuleLoadDataEx", R_UNJUDGED}, {"cuModuleLoadFatBinary", R_UNJUDGED},
    {"cuModuleUnload", R_NO_WAIT},
    {"cuPointerSetAttribute", R_NO_WAIT},
    {"cuStreamAttachMemAsync", R_NO_WAIT}, {"cuStreamAttachMemAsync_ptsz", R_NO_WAIT},
    {"cuStreamBeginCapture", R_NO_WAIT}, {"cuStreamBeginCaptureToGraph", R_NO_WAIT},
    {"cuStreamBeginCaptureToGraph_ptsz", R_NO_WAIT}, {"cuStreamBeginCapture_ptsz", R_NO_WAIT},
    {"cuStreamBeginCapture_v2", R_NO_WAIT}, {"cuStreamBeginCapture_v2_ptsz", R_NO_WAIT},
    {"cuStreamCreate", R_NO_WAIT}, {"cuStreamCreateWithPriority", R_NO_WAIT},
    {"cuStreamDestroy", R_NO_WAIT}, {"cuStreamDestroy_v2", R_NO_WAIT},
    {"cuStreamEndCapture", R_NO_WAIT}, {"cuStreamEndCapture_ptsz", R_NO_WAIT},
    {"cudefer_flush", R_ALLOWED},
};
#define NRULES (sizeof rules / sizeof rules[0])

/* Per name: calls judged, and those that waited (allowed or not). */
static _Atomic unsigned long long calls_of[NRULES], waits_of[NRULES];
static _Atomic unsigned long long calls_by_rule[R_COUNT], waits_by_rule[R_COUNT];

static int rule_index(const char *name)
{
    for (size_t i = 0; i < NRULES; i++)
        if (strcmp(rules[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* The wrapped names, from the list the build names (one name a line, or
 * one NAME(name...) a line). */
#define MAX_WRAPPED 256
static char wrapped[MAX_WRAPPED][64];
static int nwrapped;
static char wrapped_path[512];

static bool parse_line(const char *line, char *out, size_t n)
{
    while (*line == ' ' || *line == '\t')
        line++;
    if (line[0] == '/' || line[0] == '*' || line[0] == '#' || line[0] == '\n' || !line[0])
        return false;
    const char *open = strchr(line, '(');
    const char *p = open ? open + 1 : line;
    size_t k = 0;
    while (p[k] && (p[k] == '_' || (p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') ||
                    (p[k] >= '0' && p[k] <= '9')))
        k++;
    if (k < 3 || k >= n || strncmp(p, "cu", 2) != 0)
        return false;
    memcpy(out, p, k);
    out[k] = 0;
    return true;
}

static void load_wrapped(void)
{
    char lists[1024];
    const char *env = getenv("PROP_WRAPPED");
    snprintf(lists, sizeof lists, "%s", env && *env ? env : WRAPPED_LISTS);
    /* The shim's own list first: it is what the library being tested wraps. */
    char *paths[8];
    int npaths = 0;
    for (char *tok = strtok(lists, ":"); tok && npaths < 8; tok = strtok(NULL, ":"))
        paths[npaths++] = tok;
    for (int pass = 0; pass < 2 && !nwrapped; pass++)
        for (int i = 0; i < npaths && !nwrapped; i++) {
            bool shim_list = strstr(paths[i], "shim/") != NULL;
            if (shim_list != (pass == 0))
                continue;
            FILE *f = fopen(paths[i], "r");
            if (!f)
                continue;
            char line[256];
            while (nwrapped < MAX_WRAPPED && fgets(line, sizeof line, f))
                if (parse_line(line, wrapped[nwrapped], sizeof wrapped[0]))
                    nwrapped++;
            fclose(f);
            snprintf(wrapped_path, sizeof wrapped_path, "%s", paths[i]);
        }
    if (nwrapped < 10) {
        fprintf(stderr, "property: no list of wrapped names (tried %s)\n",
                env && *env ? env : WRAPPED_LISTS);
        exit(2);
    }
}

/* ---- epochs and the kernels that wait for the host ----------------------------- */

static volatile int flags[NEPOCH];
static _Atomic long epoch_now = -1;
static _Atomic uint64_t epoch_launch_ns[NEPOCH], epoch_flag_ns[NEPOCH];
static _Atomic bool workers_done;
static unsigned epoch_ms = 50;

static const volatile int *current_flag(void)
{
    long e = atomic_load(&epoch_now);
    return &flags[(e < 0 ? 0 : e) % NEPOCH];
}

/* ---- contexts ----------------------------------------------------------------- */

static struct hx_ctx slot_primary = {.name = "primary(0)", .dev = 0};
static struct hx_ctx slot_user = {.name = "user(1)", .dev = 1};
static struct hx_ctx slot_role = {.name = "primary(1)", .dev = 1};
static CUstream spin_streams[2];
static int nshared = 2; /* 1 with PROP_ONE_CONTEXT */

/* The primary context of device 1: users hold role_rw for reading, a reset
 * takes it for writing; role_calls serialises its retains and releases and
 * counts the retains, so that a release knows whether it is the last. */
static pthread_rwlock_t role_rw = PTHREAD_RWLOCK_INITIALIZER;
static pthread_mutex_t role_calls = PTHREAD_MUTEX_INITIALIZER;
static int role_refs;

/* ---- entry points by name -------------------------------------------------------- */

typedef CUresult (*alloc32_fn)(unsigned *, unsigned);
typedef CUresult (*pitch32_fn)(unsigned *, unsigned *, unsigned, unsigned, unsigned);
typedef CUresult (*host32_fn)(void **, unsigned);
typedef CUresult (*free32_fn)(unsigned);
typedef CUresult (*register_fn)(void *, size_t, unsigned);
typedef struct {
    unsigned Width, Height;
    CUarray_format Format;
    unsigned NumChannels;
} array_desc_v1;
typedef struct {
    unsigned Width, Height, Depth;
    CUarray_format Format;
    unsigned NumChannels, Flags;
} array3d_desc_v1;
typedef CUresult (*array_v1_fn)(CUarray *, const array_desc_v1 *);
typedef CUresult (*array3d_v1_fn)(CUarray *, const array3d_desc_v1 *);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*dev_fn)(CUdevice);
typedef CUresult (*ctx_fn)(CUcontext);
typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*capture_v2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);
typedef CUresult (*to_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                                size_t, CUstreamCaptureMode);
typedef CUresult (*launch_kernel_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*proc_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*info32_fn)(unsigned *, unsigned *);
typedef CUresult (*advise_v1_fn)(CUdeviceptr, size_t, CUmem_advise, CUdevice);
typedef CUresult (*prefetch_v1_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
typedef CUresult (*prefetch_v2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
typedef CUresult (*prefetch_batch_fn)(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *,
                                      size_t, unsigned long long, CUstream);
typedef CUresult (*attach_fn)(CUstream, CUdeviceptr, size_t, unsigned);

static struct {
    alloc32_fn mem_alloc_v1;
    pitch32_fn pitch_v1;
    host32_fn host_v1;
    free32_fn free_v1;
    register_fn register_v1;
    array_v1_fn array_v1;
    array3d_v1_fn array3d_v1;
    async_fn async_ptsz;
    pool_fn pool_ptsz;
    free_async_fn free_async_ptsz;
    dev_fn primary_release_v1, primary_release_v2, primary_reset_v1, primary_reset_v2;
    ctx_fn ctx_destroy_v1, ctx_destroy_v2, ctx_sync_v2;
    stream_fn stream_destroy_v1, begin_capture_v1, begin_capture_ptsz;
    capture_v2_fn begin_capture_v2_ptsz;
    end_capture_fn end_capture_ptsz;
    to_graph_fn to_graph_ptsz;
    launch_kernel_fn launch_kernel_ptsz;
    proc_v1_fn proc_v1;
    info32_fn info_v1;
    advise_v1_fn advise_v1;
    prefetch_v1_fn prefetch_v1, prefetch_v1_ptsz;
    prefetch_v2_fn prefetch_v2_ptsz;
    prefetch_batch_fn batch[4]; /* prefetch, its _ptsz; discard and prefetch, its _ptsz */
    attach_fn attach_ptsz;
} api;

static void find_entry_points(void)
{
    api.mem_alloc_v1 = (alloc32_fn)hx_sym("cuMemAlloc");
    api.pitch_v1 = (pitch32_fn)hx_sym("cuMemAllocPitch");
    api.host_v1 = (host32_fn)hx_sym("cuMemAllocHost");
    api.free_v1 = (free32_fn)hx_sym("cuMemFree");
    api.register_v1 = (register_fn)hx_sym("cuMemHostRegister");
    api.array_v1 = (array_v1_fn)hx_sym("cuArrayCreate");
    api.array3d_v1 = (array3d_v1_fn)hx_sym("cuArray3DCreate");
    api.async_ptsz = (async_fn)hx_sym("cuMemAllocAsync_ptsz");
    api.pool_ptsz = (pool_fn)hx_sym("cuMemAllocFromPoolAsync_ptsz");
    api.free_async_ptsz = (free_async_fn)hx_sym("cuMemFreeAsync_ptsz");
    api.primary_release_v1 = (dev_fn)hx_sym("cuDevicePrimaryCtxRelease");
    api.primary_release_v2 = (dev_fn)hx_sym("cuDevicePrimaryCtxRelease_v2");
    api.primary_reset_v1 = (dev_fn)hx_sym("cuDevicePrimaryCtxReset");
    api.primary_reset_v2 = (dev_fn)hx_sym("cuDevicePrimaryCtxReset_v2");
    api.ctx_destroy_v1 = (ctx_fn)hx_sym("cuCtxDestroy");
    api.ctx_destroy_v2 = (ctx_fn)hx_sym("cuCtxDestroy_v2");
    api.ctx_sync_v2 = (ctx_fn)hx_sym("cuCtxSynchronize_v2");
    api.stream_destroy_v1 = (stream_fn)hx_sym("cuStreamDestroy");
    api.begin_capture_v1 = (stream_fn)hx_sym("cuStreamBeginCapture");
    api.begin_capture_ptsz = (stream_fn)hx_sym("cuStreamBeginCapture_ptsz");
    api.begin_capture_v2_ptsz = (capture_v2_fn)hx_sym("cuStreamBeginCapture_v2_ptsz");
    api.end_capture_ptsz = (end_capture_fn)hx_sym("cuStreamEndCapture_ptsz");
    api.to_graph_ptsz = (to_graph_fn)hx_sym("cuStreamBeginCaptureToGraph_ptsz");
    api.launch_kernel_ptsz = (launch_kernel_fn)hx_sym("cuLaunchKernel_ptsz");
    api.proc_v1 = (proc_v1_fn)hx_sym("cuGetProcAddress");
    api.info_v1 = (info32_fn)hx_sym("cuMemGetInfo");
    api.advise_v1 = (advise_v1_fn)hx_sym("cuMemAdvise");
    api.prefetch_v1 = (prefetch_v1_fn)hx_sym("cuMemPrefetchAsync");
    api.prefetch_v1_ptsz = (prefetch_v1_fn)hx_sym("cuMemPrefetchAsync_ptsz");
    api.prefetch_v2_ptsz = (prefetch_v2_fn)hx_sym("cuMemPrefetchAsync_v2_ptsz");
    api.batch[0] = (prefetch_batch_fn)hx_sym("cuMemPrefetchBatchAsync");
    api.batch[1] = (prefetch_batch_fn)hx_sym("cuMemPrefetchBatchAsync_ptsz");
    api.batch[2] = (prefetch_batch_fn)hx_sym("cuMemDiscardAndPrefetchBatchAsync");
    api.batch[3] = (prefetch_batch_fn)hx_sym("cuMemDiscardAndPrefetchBatchAsync_ptsz");
    api.attach_ptsz = (attach_fn)hx_sym("cuStreamAttachMemAsync_ptsz");
}

/* ---- objects ---------------------------------------------------------------------- */

enum okind { K_DEV32, K_DEVICE, K_PITCH32, K_PITCH, K_MANAGED, K_HOST32, K_HOST, K_HOSTALLOC,
             K_REGISTERED, K_ARRAY, K_MIPMAP, K_MODULE, K_LIBRARY, K_ASYNC, K_VMM, K_COUNT };
enum cls { CLS_DEVICE, CLS_HOST, CLS_NONE };

static const struct {
    const char *name;
    enum cls cls;
    bool memory; /* kernels may write it */
} kinds[K_COUNT] = {
    [K_DEV32] = {"device (32-bit)", CLS_DEVICE, true},
    [K_DEVICE] = {"device", CLS_DEVICE, true},
    [K_PITCH32] = {"pitched (32-bit)", CLS_DEVICE, true},
    [K_PITCH] = {"pitched", CLS_DEVICE, true},
    [K_MANAGED] = {"managed", CLS_DEVICE, true},
    [K_HOST32] = {"pinned (32-bit size)", CLS_HOST, true},
    [K_HOST] = {"pinned", CLS_HOST, true},
    [K_HOSTALLOC] = {"pinned (cuMemHostAlloc)", CLS_HOST, true},
    [K_REGISTERED] = {"registered", CLS_HOST, true},
    [K_ARRAY] = {"array", CLS_DEVICE, false},
    [K_MIPMAP] = {"mipmapped array", CLS_DEVICE, false},
    [K_MODULE] = {"module", CLS_NONE, false},
    [K_LIBRARY] = {"library", CLS_NONE, false},
    [K_ASYNC] = {"stream-ordered", CLS_DEVICE, true},
    [K_VMM] = {"VMM handle", CLS_DEVICE, false},
};

struct obj {
    enum okind kind;
    uintptr_t h;
    size_t bytes, size;
    struct hx_ctx *ctx;
    int page, npages;
    CUstream ev_stream[EVENTS];
    CUevent ev[EVENTS];
    CUfunction fn;
    struct hx_ctx *fn_ctx;
    bool loaded; /* a library loaded into a context (cuKernelGetFunction) */
};

/* The capacities of the test driver, as on a real machine: slot 0 is the
 * pinned host memory, shared by every device; slot 1 + d is the memory of
 * device d (the program uses devices 0 and 1). */
#define NSLOTS 3
static size_t capacity[NSLOTS];
static pthread_mutex_t acct_lock = PTHREAD_MUTEX_INITIALIZER;

struct inflight {
    bool active;
    int slot;
    size_t req, peak;
};
static struct inflight inflight[HX_MAX_THREADS];

/* The capacity an allocation of class c made in context ctx counts
 * against: pinned host memory, or the device of ctx (a green context's is
 * its primary's: hx_ctx.dev says it). */
static int acct_slot(enum cls c, const struct hx_ctx *ctx)
{
    return c == CLS_HOST ? 0 : 1 + ctx->dev;
}

/* What the driver holds of the capacity of a slot now, as it counts it:
 * live bytes (the blocks cudefer keeps deferred among them), pending frees
 * and pools' reserves; of the host capacity, less cudefer's own pinned
 * words (own.h). */
static size_t driver_used(int slot)
{
    size_t used = testdrv_capacity_used(slot - 1);
    if (slot == 0) {
        /* Read apart from used: a context may come or go in between. */
        size_t words = CUDEFER_WORD_BYTES * testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES);
        used = used > words ? used - words : 0;
    }
    return used;
}

static void acct_begin(int thread, enum cls c, const struct hx_ctx *ctx, size_t req)
{
    if (c == CLS_NONE)
        return;
    int slot = acct_slot(c, ctx);
    size_t used = driver_used(slot);
    pthread_mutex_lock(&acct_lock);
    inflight[thread] = (struct inflight){true, slot, req, 0};
    size_t total = used;
    for (int i = 0; i < hx.threads; i++)
        if (inflight[i].active && inflight[i].slot == slot)
            total += inflight[i].req;
    for (int i = 0; i < hx.threads; i++)
        if (inflight[i].active && inflight[i].slot == slot && inflight[i].peak < total)
            inflight[i].peak = total;
    pthread_mutex_unlock(&acct_lock);
}

/* Would the allocation have failed for lack of memory of its capacity
 * without what cudefer gave back? (The rule of R_ALLOC.) */
static bool acct_end(int thread, enum cls c, CUresult rc)
{
    if (c == CLS_NONE)
        return rc == CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&acct_lock);
    size_t peak = inflight[thread].peak;
    int slot = inflight[thread].slot;
    inflight[thread].active = false;
    pthread_mutex_unlock(&acct_lock);
    return rc == CUDA_ERROR_OUT_OF_MEMORY || peak + OOM_SLACK > capacity[slot];
}

/* ---- workers -------------------------------------------------------------------------- */

enum span { SPAN_NONE, SPAN_OWN, SPAN_ROLE, SPAN_GREEN };

struct worker {
    struct hx_thread t;
    struct hx_ctx *home;
    CUstream home_streams[STREAMS];
    enum span span;
    int span_left;
    struct hx_ctx own;
    CUstream span_streams[STREAMS];
    struct obj held[HELD];
    int nheld;
    struct hx_pages reg;
    bool page_pending[HX_REG_PAGES]; /* unregistered by the program: maybe pending */
    struct hx_ctx *page_ctx[HX_REG_PAGES]; /* the context of that pending unregister */
    bool capturing;               /* a RELAXED capture of span_or_home stream 0 is live */
    CUgraph graph;
    unsigned long long oom_waits, overlap_waits, last_releases;
    /* When this thread's call under way began, if that call may flush
     * (an allocation, a registration, a call allowed to wait); 0 when
     * there is none: see drains_flush. */
    _Atomic uint64_t may_flush_since;
    /* When this thread's last call that may flush and ran DRAIN_SLACK_NS
     * or more ended (drains_flush). */
    _Atomic uint64_t long_flush_end;
    /* The newest managed blocks this thread released: an allocation of
     * the size of one of them in its context may have waited for it (the
     * rule of R_ALLOC). */
    struct debt {
        CUdeviceptr d;
        size_t bytes;
        struct hx_ctx *ctx; /* owner_of its context */
        long epoch; /* when it was released */
    } debts[DEBTS];
    int ndebts;
};

static struct worker workers[HX_MAX_THREADS];
static bool driver_alone, have_green;

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

/* ---- measuring a call -------------------------------------------------------------------- */

struct probe {
    const char *name;
    bool blocked_only; /* the driver does this call at once: only blocking counts */
    char what[2 * HX_TEXT];
    int row;
    uint64_t wait_calls, blocked_ns, foreign_syncs, t0;
    uint64_t run_delay_ns; /* hx_thread_run_delay_ns at the beginning */
    long epoch;
    unsigned long long waits_begun; /* waits_started at the beginning */
    bool waits_under_way;           /* a call allowed to wait ran at the beginning */
    bool debt;                      /* an allocation of managed memory of a size
                                       this thread released: it may have waited */
};

/* Calls that wait for the engine's walks of a primary context, a flush's
 * among them: a primary context's release and a green context's
 * destruction (it may drop the primary context's last reference), DESIGN
 * section 3. */
static bool drains_walks(const char *name, enum rule rule)
{
    return rule == R_RELEASE_PRIMARY || strcmp(name, "cuGreenCtxDestroy") == 0;
}

/* Calls allowed to wait (a flush, a context's end, an allocation short of
 * memory...) hold the context in the driver while they wait, and stall
 * every other thread's calls in it: an unregister whose fence is stalled
 * so is fenced behind work submitted meanwhile. So do a primary context's
 * release and a green context's destruction, for the primary context:
 * while they run, cudefer cannot record its work (the release may end it),
 * and a fence made meanwhile waits for that context's work recorded once
 * they have returned. Its bound is judged only when no such call
 * overlapped it. */
static bool stalls_fences(const char *name, enum rule rule)
{
    return rule == R_ALLOWED || drains_walks(name, rule);
}

/* Calls that may flush the engine's queues, which waits for the GPU: an
 * allocation short of memory, a registration over a pending unregister,
 * and the calls allowed to wait. */
static bool may_flush(enum rule rule)
{
    return rule == R_ALLOC || rule == R_REGISTER || rule == R_ALLOWED;
}

/* A flush in another thread that overlapped a call that drains the walks
 * (from t0 to t1) may be what it waited for: a call that may flush and ran
 * DRAIN_SLACK_NS or more (such calls take microseconds unless they wait),
 * still under way at t1 or ended after t0 (waits_ended_ns sees only the
 * calls that the test driver counted as waiting). */
#define DRAIN_SLACK_NS 2000000ull

static bool drains_flush(const struct worker *w, uint64_t t0, uint64_t t1)
{
    for (int i = 0; i < hx.threads; i++) {
        if (&workers[i] == w)
            continue;
        uint64_t since = atomic_load(&workers[i].may_flush_since);
        if ((since && since + DRAIN_SLACK_NS <= t1) ||
            atomic_load(&workers[i].long_flush_end) > t0)
            return true;
    }
    return false;
}

/* How long after an unregister began its fence may still be made. */
#define FENCE_SLACK_NS 1000000ull

static _Atomic int waits_inflight;
static _Atomic unsigned long long waits_started, waits_ended_ns, bounded_exempt;

static void probe_begin(struct worker *w, struct probe *p, const char *name, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));

static void probe_begin(struct worker *w, struct probe *p, const char *name, const char *fmt,
                        ...)
{
    char text[HX_TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(p->what, sizeof p->what, "%s%s%s", name, text[0] ? " " : "", text);
    hx_begin(&w->t, "%s", p->what);
    p->name = name;
    p->blocked_only = false;
    p->debt = false;
    p->row = rule_index(name);
    p->waits_under_way = atomic_load(&waits_inflight) > 0; /* this call's own not yet counted */
    if (p->row >= 0 && stalls_fences(name, rules[p->row].rule)) {
        atomic_fetch_add(&waits_inflight, 1);
        atomic_fetch_add(&waits_started, 1);
    }
    p->waits_begun = atomic_load(&waits_started);
    p->epoch = atomic_load(&epoch_now);
    p->wait_calls = testdrv_thread_wait_calls();
    p->blocked_ns = testdrv_thread_blocked_ns();
    p->foreign_syncs = testdrv_thread_foreign_syncs();
    p->run_delay_ns = hx_thread_run_delay_ns();
    p->t0 = hx_now_ns();
    if (p->row >= 0 && may_flush(rules[p->row].rule))
        atomic_store(&w->may_flush_since, p->t0);
}

/* A wait for the GPU that the test driver cannot count: cudefer polling a
 * fence (an allocation waiting for a released block). The work in every
 * fence here is the epochs' kernels, which wait for the host: a call that
 * waits for them returns just after main sets an epoch's flag, having
 * begun well before it. A call that takes WALL_WAIT_NS and returns within
 * WALL_AFTER_FLAG_NS after the flag of an epoch whose kernels ran when it
 * began waited for them. Calls that overlapped a call allowed to wait are
 * not judged (that one may hold the context, and release it at the flag). */
#define WALL_WAIT_NS 15000000ull
#define WALL_AFTER_FLAG_NS 3000000ull

/* Calls not judged for their time because the machine held them back
 * (held_back). */
static _Atomic unsigned long long wall_exempt;
/* Releases of a primary context and destructions of a green context not
 * judged for their time because another thread's flush was under way
 * (drains_flush). */
static _Atomic unsigned long long drain_exempt;

/* Whether the machine, not the GPU, may account for a call's time from
 * p->t0 to t1 beyond slack_ns: its thread waited that long for a CPU, or
 * some call waited 1 ms or more for the test driver's own lock meanwhile
 * (a holder descheduled; every call waits, on no GPU work, and the real
 * driver has no such lock). Both seen on an overloaded machine under the
 * sanitizers: lock waits of 20-78 ms, most at a run's start, and an 18 ms
 * call of which the CPU was the cause. */
static bool held_back(const struct probe *p, uint64_t slack_ns)
{
    return testdrv_lock_stall_end_ns() > p->t0 ||
           hx_thread_run_delay_ns() - p->run_delay_ns >= slack_ns;
}

static void judge_wall(struct worker *w, const struct probe *p, uint64_t t1)
{
    if (t1 - p->t0 < WALL_WAIT_NS || p->waits_under_way ||
        p->waits_begun != atomic_load(&waits_started) || atomic_load(&waits_ended_ns) > p->t0)
        return;
    /* Judged when the call would still have taken WALL_WAIT_NS. */
    if (held_back(p, t1 - p->t0 - WALL_WAIT_NS + 1)) {
        atomic_fetch_add(&wall_exempt, 1);
        return;
    }
    if (drains_walks(p->name, rules[p->row].rule) && drains_flush(w, p->t0, t1)) {
        atomic_fetch_add(&drain_exempt, 1);
        return;
    }
    long now = atomic_load(&epoch_now);
    for (long e = p->epoch < 0 ? 0 : p->epoch; e <= now; e++) {
        uint64_t launched = atomic_load(&epoch_launch_ns[e % NEPOCH]);
        uint64_t released = atomic_load(&epoch_flag_ns[e % NEPOCH]);
        if (!released || launched >= p->t0 || released <= p->t0 || released > t1)
            continue;
        if (t1 - released <= WALL_AFTER_FLAG_NS)
            hx_fail(&w->t, "no-wait-polled",
                    "%s must not wait, yet it took %.2f ms and returned %.2f ms after the "
                    "kernels of epoch %ld (running when it began) were let go: it waited for "
                    "them: %s", p->name, (double)(t1 - p->t0) / 1e6,
                    (double)(t1 - released) / 1e6, e, p->what);
        return;
    }
}

/* Ends the measure of a call and judges it by its rule; allowed: the
 * exception of its rule applies (an allocation short of memory, an
 * overlapping registration, the last release). */
static void probe_end(struct worker *w, struct probe *p, CUresult rc, bool allowed)
{
    uint64_t t1 = hx_now_ns();
    if (atomic_load(&w->may_flush_since) && t1 - p->t0 >= DRAIN_SLACK_NS)
        atomic_store(&w->long_flush_end, t1);
    atomic_store(&w->may_flush_since, 0);
    uint64_t dwait = testdrv_thread_wait_calls() - p->wait_calls;
    uint64_t dblocked = testdrv_thread_blocked_ns() - p->blocked_ns;
    uint64_t dforeign = testdrv_thread_foreign_syncs() - p->foreign_syncs;
    hx_end(&w->t, rc);
    /* The program never makes a stream of one context wait for another's
     * work: a synchronisation of a context waits for that context's work
     * alone, as the driver's own does. */
    if (dforeign)
        hx_fail(&w->t, "sync-foreign",
                "%s waited for unfinished work of another context (the releases' fences in "
                "it must not make its streams wait for other contexts): %s", p->name, p->what);
    if (p->row < 0) {
        hx_fail(&w->t, "table", "property.c has no rule for %s", p->name);
        return;
    }
    enum rule rule = rules[p->row].rule;
    bool waited = (dwait && !p->blocked_only) || dblocked >= NO_WAIT_BLOCKED_NS;
    if (stalls_fences(p->name, rule))
        atomic_fetch_sub(&waits_inflight, 1);
    if ((rule == R_ALLOWED || allowed) && waited)
        atomic_store(&waits_ended_ns, t1);
    atomic_fetch_add(&calls_of[p->row], 1);
    atomic_fetch_add(&calls_by_rule[rule], 1);
    if (waited) {
        atomic_fetch_add(&waits_of[p->row], 1);
        atomic_fetch_add(&waits_by_rule[rule], 1);
    }
    bool judged = rule == R_NO_WAIT ||
                  ((rule == R_ALLOC || rule == R_REGISTER || rule == R_RELEASE_PRIMARY) &&
                   !allowed);
    if (judged && !waited && !p->debt)
        judge_wall(w, p, t1);
    if (judged && waited)
        hx_fail(&w->t, "no-wait",
                "%s must not wait%s, yet it made %llu calls that wait for the GPU and was "
                "blocked %.2f ms in the driver (the call took %.2f ms): %s", p->name,
                rule == R_ALLOC ? " (it had the memory it needed)"
                : rule == R_REGISTER ? " (no pending unregister overlaps it)"
                : rule == R_RELEASE_PRIMARY ? " (it is not the last release)" : "",
                (unsigned long long)dwait, (double)dblocked / 1e6, (double)(t1 - p->t0) / 1e6,
                p->what);
    if (rule == R_BOUNDED &&
        (p->waits_under_way || p->waits_begun != atomic_load(&waits_started) ||
         atomic_load(&waits_ended_ns) > p->t0)) {
        atomic_fetch_add(&bounded_exempt, 1);
    } else if (rule == R_BOUNDED) {
        /* Work submitted after the call began: the spin kernels of the
         * first epoch main launched after t0. It must not have waited for
         * them, i.e. returned after their flag was set. The fence is made
         * inside the call, after records of every context under one lock
         * that other threads' fences also take: kernels launched in its
         * first FENCE_SLACK_NS may be covered by it. */
        long now = atomic_load(&epoch_now);
        for (long e = p->epoch < 0 ? 0 : p->epoch; e <= now; e++) {
            uint64_t launched = atomic_load(&epoch_launch_ns[e % NEPOCH]);
            if (launched <= p->t0 + FENCE_SLACK_NS)
                continue;
            uint64_t released = atomic_load(&epoch_flag_ns[e % NEPOCH]);
            if (!released || released >= t1)
                break;
            if (held_back(p, t1 - released))
                atomic_fetch_add(&bounded_exempt, 1);
            else
                hx_fail(&w->t, "unregister-delayed",
                        "%s returned %.2f ms after the release of kernels submitted %.2f ms "
                        "after it began: it waited for work submitted after it", p->name,
                        (double)(t1 - released) / 1e6, (double)(launched - p->t0) / 1e6);
            break;
        }
    }
}

/* ---- registered pages -------------------------------------------------------------------- */

/* After the registration's end (unregister or teardown) returned; pending:
 * the unregister may still be pending in cudefer. */
static void set_canaries(struct worker *w, const struct obj *o, bool pending)
{
    hx_pages_set_canaries(&w->t, &w->reg, o->page, o->npages);
    for (int p = o->page; p < o->page + o->npages; p++) {
        w->page_pending[p] = pending;
        w->page_ctx[p] = o->ctx;
    }
}

static void drop_events(struct obj *o, bool alive)
{
    for (int i = 0; i < EVENTS; i++) {
        if (o->ev[i] && alive)
            cuEventDestroy(o->ev[i]);
        o->ev[i] = NULL;
        o->ev_stream[i] = NULL;
    }
}

/* Does a page of [first, first + n) still have a registration the driver
 * knows, after the program unregistered it (pending in cudefer)? */
static bool overlaps_pending(struct worker *w, int first, int n)
{
    for (int p = first; p < first + n; p++) {
        if (!w->page_pending[p])
            continue;
        unsigned type = 0;
        if (cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  (CUdeviceptr)(uintptr_t)hx_page_at(&w->reg, p)) == CUDA_SUCCESS)
            return true;
        w->page_pending[p] = false;
    }
    return false;
}

/* ---- allocations ---------------------------------------------------------------------------- */

enum alloc_call { A_DEV32, A_DEVICE, A_PITCH32, A_PITCH, A_MANAGED, A_HOST32, A_HOST,
                  A_HOSTALLOC, A_REGISTER32, A_REGISTER, A_ARRAY32, A_ARRAY, A_ARRAY3D32,
                  A_ARRAY3D, A_MIPMAP, A_LIBRARY_DATA, A_LIBRARY_FILE, A_ASYNC, A_ASYNC_PTSZ,
                  A_POOL, A_POOL_PTSZ, A_VMM, A_MODULE, A_MODULE_DATA, A_MODULE_DATA_EX,
                  A_MODULE_FATBIN, A_CALLS };
static const char *const alloc_names[A_CALLS] = {
    "cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocPitch", "cuMemAllocPitch_v2",
    "cuMemAllocManaged", "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemHostAlloc",
    "cuMemHostRegister", "cuMemHostRegister_v2", "cuArrayCreate", "cuArrayCreate_v2",
    "cuArray3DCreate", "cuArray3DCreate_v2", "cuMipmappedArrayCreate", "cuLibraryLoadData",
    "cuLibraryLoadFromFile", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", "cuMemCreate", "cuModuleLoad",
    "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
};

static size_t pick_size(struct worker *w)
{
    static const size_t sizes[] = {4096, 4096, 16384, 65536, 65536, 262144};
    return sizes[hx_below(&w->t, 6)];
}

/* Whose blocks serve an allocation in c: a green context's memory is its
 * primary context's (testdriver.h), so a block released there may serve an
 * allocation in the green context, and the other way round. */
static struct hx_ctx *owner_of(struct hx_ctx *c)
{
    return c->green ? &slot_primary : c;
}

static void note_managed_release(struct worker *w, const struct obj *o)
{
    w->debts[w->ndebts++ % DEBTS] =
        (struct debt){(CUdeviceptr)o->h, o->size, owner_of(o->ctx), atomic_load(&epoch_now)};
}

/* Whether this thread released a managed block of n bytes in c that it has
 * not got back, in epoch `since` or later. The allocation, begun in epoch
 * `since`, may then have waited for it: for its context's part of its
 * fence (whose kernels are the ones running at the release: those of an
 * earlier epoch had ended when this one began), and cudefer may still
 * have given a new block when the other contexts' part had not passed.
 * The debt that goes is the block's at d if this thread released it (in
 * any epoch: a reuse of an older block is no wait, and leaves the newer
 * debts for the allocations that may wait for them: taking a newer one
 * there left a later allocation of the size, which may wait for that
 * block, unexcused), else the oldest that counts. */
static bool managed_debt(struct worker *w, struct hx_ctx *c, size_t n, CUdeviceptr d, long since)
{
    int count = w->ndebts < DEBTS ? w->ndebts : DEBTS, mine = -1, oldest = -1;
    for (int k = 0; k < count; k++) {
        int i = (w->ndebts - count + k) % DEBTS; /* oldest first */
        struct debt *b = &w->debts[i];
        if (!b->d || b->ctx != owner_of(c) || b->bytes != n)
            continue;
        if (b->d == d && mine < 0)
            mine = i;
        if (b->epoch >= since && oldest < 0)
            oldest = i;
    }
    int gone = mine >= 0 ? mine : oldest;
    if (gone >= 0)
        w->debts[gone].d = 0;
    return oldest >= 0;
}

static const char image[] = "// any image loads in the test driver\n";

/* ---- state a program sets on its blocks ------------------------------------------- */

/* Whether the program may set advice, prefetches, attachment or
 * SYNC_MEMOPS on a block of this kind, and must find none of it on a new
 * one: every plain allocation (not pool memory, registrations or handles). */
static bool settable(enum okind k)
{
    return k == K_DEV32 || k == K_DEVICE || k == K_PITCH32 || k == K_PITCH || k == K_MANAGED ||
           k == K_HOST32 || k == K_HOST || k == K_HOSTALLOC;
}

/* A new block must answer every query as the driver's new allocation does,
 * whatever the program set on blocks it released (cudefer's reuse hands a
 * released block out again: what was set on it must not come with it). */
static void check_fresh(struct worker *w, const struct obj *o)
{
    unsigned sync = 9;
    CUresult rc = cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)o->h);
    if (rc != CUDA_SUCCESS || sync != 0)
        hx_fail(&w->t, "fresh", "new %s block %#lx: SYNC_MEMOPS %u (%d), not 0",
                kinds[o->kind].name, (unsigned long)o->h, sync, (int)rc);
    if (testdrv_dmabuf_exported((CUdeviceptr)o->h))
        hx_fail(&w->t, "fresh", "new %s block %#lx: a dma-buf of it was exported before",
                kinds[o->kind].name, (unsigned long)o->h);
    if (o->kind != K_MANAGED)
        return;
    static const CUmem_range_attribute attrs[] = {
        CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
        CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int v = 7, want = i == 0 ? 0 : CU_DEVICE_INVALID;
        rc = cuMemRangeGetAttribute(&v, sizeof v, attrs[i], (CUdeviceptr)o->h, o->bytes);
        if (rc != CUDA_SUCCESS || v != want)
            hx_fail(&w->t, "fresh", "new managed block %#lx: range attribute %d is %d (%d), not %d",
                    (unsigned long)o->h, (int)attrs[i], v, (int)rc, want);
    }
    int attach = testdrv_managed_attachment((CUdeviceptr)o->h);
    if (attach != CU_MEM_ATTACH_GLOBAL)
        hx_fail(&w->t, "fresh", "new managed block %#lx: attached %d, not globally",
                (unsigned long)o->h, attach);
}

/* Sets something on a block this thread holds in the current context: one
 * of the calls that set state a reuse could hand on (or export a dma-buf of
 * it, which another device may map). None may wait. */
static void alter(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    struct obj *o = w->nheld ? &w->held[hx_below(&w->t, (unsigned)w->nheld)] : NULL;
    if (!o || !settable(o->kind) || o->ctx != c)
        return;
    CUdeviceptr d = (CUdeviceptr)o->h;
    CUstream s = cur_streams(w)[1]; /* never the one a capture of this thread holds */
    CUmemLocation dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->dev};
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    size_t idx = 0, bytes = o->bytes, pages = o->bytes / 4096 * 4096;
    unsigned how = o->kind == K_MANAGED ? hx_below(&w->t, 12)
                   : pages && o->h % 4096 == 0 && hx_below(&w->t, 2) ? 12
                                                                    : 0;
    static const char *const names[13] = {
        "cuPointerSetAttribute", "cuMemAdvise", "cuMemAdvise_v2", "cuMemAdvise_v2",
        "cuMemPrefetchAsync", "cuMemPrefetchAsync_ptsz", "cuMemPrefetchAsync_v2",
        "cuMemPrefetchAsync_v2_ptsz", "cuMemPrefetchBatchAsync",
        "cuMemDiscardAndPrefetchBatchAsync", "cuStreamAttachMemAsync",
        "cuStreamAttachMemAsync_ptsz", "cuMemGetHandleForAddressRange"};
    static const char *const batch_names[4] = {
        "cuMemPrefetchBatchAsync", "cuMemPrefetchBatchAsync_ptsz",
        "cuMemDiscardAndPrefetchBatchAsync", "cuMemDiscardAndPrefetchBatchAsync_ptsz"};
    unsigned batch = how == 8 ? hx_below(&w->t, 2) : 2 + hx_below(&w->t, 2);
    const char *name = how == 8 || how == 9 ? batch_names[batch] : names[how];
    static const CUmem_advise advice[3] = {CU_MEM_ADVISE_SET_READ_MOSTLY,
                                           CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                           CU_MEM_ADVISE_SET_ACCESSED_BY};
    const int one = 1;
    struct probe p;
    probe_begin(w, &p, name, "(%s %#lx)", kinds[o->kind].name, (unsigned long)d);
    CUresult rc;
    switch (how) {
    case 0:
        rc = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d);
        break;
    case 1:
        rc = api.advise_v1(d, bytes, advice[hx_below(&w->t, 3)], c->dev);
        break;
    case 2:
    case 3:
        rc = cuMemAdvise(d, bytes, advice[how == 2 ? 0 : 1 + hx_below(&w->t, 2)],
                         how == 3 && hx_below(&w->t, 2) ? host : dev);
        break;
    case 4:
        rc = api.prefetch_v1(d, bytes, hx_below(&w->t, 2) ? c->dev : CU_DEVICE_CPU, s);
        break;
    case 5:
        rc = api.prefetch_v1_ptsz(d, bytes, c->dev, s);
        break;
    case 6:
        rc = cuMemPrefetchAsync(d, bytes, hx_below(&w->t, 2) ? dev : host, 0, s);
        break;
    case 7:
        rc = api.prefetch_v2_ptsz(d, bytes, dev, 0, s);
        break;
    case 8:
    case 9:
        rc = api.batch[batch](&d, &bytes, 1, &dev, &idx, 1, 0, s);
        break;
    case 10:
        rc = cuStreamAttachMemAsync(s, d, 0, CU_MEM_ATTACH_HOST);
        break;
    case 11:
        rc = api.attach_ptsz(s, d, 0, CU_MEM_ATTACH_SINGLE);
        break;
    default: {
        int fd = -1;
        rc = cuMemGetHandleForAddressRange(&fd, d, pages, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (fd >= 0)
            close(fd);
        break;
    }
    }
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, name, rc, CUDA_SUCCESS);
}

/* One allocation with call a, of n bytes where the call takes a size; the
 * object joins w->held (room for it is the caller's). */
static void allocate_with(struct worker *w, enum alloc_call a, size_t n)
{
    struct hx_ctx *c = cur(w);
    const char *name = alloc_names[a];
    struct obj o = {.ctx = c, .page = -1};
    CUresult rc = CUDA_SUCCESS;
    struct probe p;
    bool overlap = false;
    switch (a) {
    case A_DEV32:
    case A_PITCH32:
    case A_HOST32: {
        unsigned p32 = 0, pitch = 0;
        void *hp = NULL;
        o.kind = a == A_DEV32 ? K_DEV32 : a == A_PITCH32 ? K_PITCH32 : K_HOST32;
        o.bytes = o.size = a == A_PITCH32 ? 512 * 8 : 4096;
        acct_begin(w->t.index, kinds[o.kind].cls, c, o.bytes);
        probe_begin(w, &p, name, "(%zu) in %s", o.bytes, c->name);
        rc = a == A_DEV32 ? api.mem_alloc_v1(&p32, 4096)
             : a == A_PITCH32 ? api.pitch_v1(&p32, &pitch, 100, 8, 4)
                              : api.host_v1(&hp, 4096);
        o.h = a == A_HOST32 ? (uintptr_t)hp : (uintptr_t)p32;
        break;
    }
    case A_DEVICE:
    case A_MANAGED: {
        CUdeviceptr d = 0;
        o.kind = a == A_DEVICE ? K_DEVICE : K_MANAGED;
        o.bytes = o.size = n;
        acct_begin(w->t.index, CLS_DEVICE, c, n);
        probe_begin(w, &p, name, "(%zu) in %s", n, c->name);
        rc = a == A_DEVICE ? cuMemAlloc(&d, n) : cuMemAllocManaged(&d, n, CU_MEM_ATTACH_GLOBAL);
        /* It may have waited for a block this thread released while the
         * GPU still ran (a release the driver would have made wait). */
        p.debt = a == A_MANAGED && rc == CUDA_SUCCESS && managed_debt(w, c, n, d, p.epoch);
        o.h = (uintptr_t)d;
        break;
    }
    case A_PITCH: {
        CUdeviceptr d = 0;
        size_t pitch = 0, width = 1 + hx_below(&w->t, 2048), height = 1 + hx_below(&w->t, 32);
        o.kind = K_PITCH;
        o.bytes = (width + 511) / 512 * 512 * height;
        acct_begin(w->t.index, CLS_DEVICE, c, o.bytes);
        probe_begin(w, &p, name, "(%zu x %zu) in %s", width, height, c->name);
        rc = cuMemAllocPitch(&d, &pitch, width, height, 4);
        o.h = (uintptr_t)d;
        o.size = pitch * height;
        break;
    }
    case A_HOST:
    case A_HOSTALLOC: {
        void *hp = NULL;
        unsigned fl = hx_below(&w->t, 8);
        o.kind = a == A_HOST ? K_HOST : K_HOSTALLOC;
        o.bytes = o.size = n;
        acct_begin(w->t.index, CLS_HOST, c, n);
        probe_begin(w, &p, name, "(%zu) in %s", n, c->name);
        rc = a == A_HOST ? cuMemAllocHost(&hp, n) : cuMemHostAlloc(&hp, n, fl);
        o.h = (uintptr_t)hp;
        break;
    }
    case A_REGISTER32:
    case A_REGISTER: {
        int np = 1 + (int)hx_below(&w->t, 3), first = hx_pages_free(&w->t, &w->reg, np);
        /* Registrations only where their context outlives them for sure. */
        if (first < 0 || w->span == SPAN_ROLE || w->span == SPAN_GREEN)
            return;
        for (int k = first; k < first + np; k++)
            hx_page_check(&w->t, &w->reg, k);
        overlap = overlaps_pending(w, first, np);
        o.kind = K_REGISTERED;
        o.page = first;
        o.npages = np;
        o.bytes = o.size = (size_t)np * HX_PAGE;
        o.h = (uintptr_t)hx_page_at(&w->reg, first);
        acct_begin(w->t.index, CLS_HOST, c, o.bytes);
        probe_begin(w, &p, name, "(pages %d..%d%s) in %s", first, first + np - 1,
                    overlap ? ", over a pending unregister" : "", c->name);
        rc = a == A_REGISTER ? cuMemHostRegister((void *)o.h, o.bytes, 0)
                             : api.register_v1((void *)o.h, o.bytes, 0);
        break;
    }
    case A_ARRAY32:
    case A_ARRAY:
    case A_ARRAY3D32:
    case A_ARRAY3D:
    case A_MIPMAP: {
        unsigned width = 32 + hx_below(&w->t, 480), height = 1 + hx_below(&w->t, 32);
        o.kind = a == A_MIPMAP ? K_MIPMAP : K_ARRAY;
        o.bytes = (size_t)width * height * 4;
        acct_begin(w->t.index, CLS_DEVICE, c, o.bytes);
        probe_begin(w, &p, name, "(%u x %u) in %s", width, height, c->name);
        CUarray arr = NULL;
        CUmipmappedArray mip = NULL;
        if (a == A_ARRAY32) {
            array_desc_v1 d = {width, height, CU_AD_FORMAT_FLOAT, 1};
            rc = api.array_v1(&arr, &d);
        } else if (a == A_ARRAY) {
            CUDA_ARRAY_DESCRIPTOR d = {.Width = width, .Height = height,
                                       .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = cuArrayCreate(&arr, &d);
        } else if (a == A_ARRAY3D32) {
            array3d_desc_v1 d = {width, height, 0, CU_AD_FORMAT_FLOAT, 1, 0};
            rc = api.array3d_v1(&arr, &d);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = width, .Height = height,
                                         .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = a == A_ARRAY3D ? cuArray3DCreate(&arr, &d) : cuMipmappedArrayCreate(&mip, &d, 2);
        }
        o.h = a == A_MIPMAP ? (uintptr_t)mip : (uintptr_t)arr;
        break;
    }
    case A_LIBRARY_DATA:
    case A_LIBRARY_FILE: {
        CUlibrary lib = NULL;
        o.kind = K_LIBRARY;
        o.ctx = NULL;
        acct_begin(w->t.index, CLS_NONE, c, 0);
        probe_begin(w, &p, name, "%s", "");
        rc = a == A_LIBRARY_DATA
                 ? cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0)
                 : cuLibraryLoadFromFile(&lib, "any.cubin", NULL, NULL, 0, NULL, NULL, 0);
        o.h = (uintptr_t)lib;
        break;
    }
    case A_ASYNC:
    case A_ASYNC_PTSZ:
    case A_POOL:
    case A_POOL_PTSZ: {
        CUdeviceptr d = 0;
        CUmemoryPool pool = NULL;
        bool ptsz = a == A_ASYNC_PTSZ || a == A_POOL_PTSZ;
        /* Stream-ordered memory lives on stream 0 of its context: allocated,
         * written and freed there (the _ptsz twins get it explicitly), as a
         * correct program orders a stream-ordered free after its uses. */
        CUstream s = cur_streams(w)[0];
        if ((a == A_POOL || a == A_POOL_PTSZ) &&
            !hx_expect(&w->t, "cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool(&pool, c->dev),
                       CUDA_SUCCESS))
            return;
        o.kind = K_ASYNC;
        o.bytes = o.size = n;
        acct_begin(w->t.index, CLS_DEVICE, c, n);
        probe_begin(w, &p, name, "(%zu) on stream 0 in %s", n, c->name);
        if (a == A_ASYNC)
            rc = cuMemAllocAsync(&d, n, s);
        else if (a == A_ASYNC_PTSZ)
            rc = api.async_ptsz(&d, n, s);
        else if (a == A_POOL)
            rc = cuMemAllocFromPoolAsync(&d, n, pool, s);
        else
            rc = api.pool_ptsz(&d, n, pool, s);
        (void)ptsz;
        o.h = (uintptr_t)d;
        break;
    }
    case A_VMM: {
        CUmemGenericAllocationHandle h = 0;
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE,
                                                 .id = c->dev}};
        o.kind = K_VMM;
        o.bytes = (size_t)2 << 20;
        acct_begin(w->t.index, CLS_DEVICE, c, o.bytes);
        probe_begin(w, &p, name, "(2 MiB) on device %d", c->dev);
        rc = cuMemCreate(&h, o.bytes, &prop, 0);
        o.h = (uintptr_t)h;
        break;
    }
    default: {
        CUmodule m = NULL;
        o.kind = K_MODULE;
        acct_begin(w->t.index, CLS_NONE, c, 0);
        probe_begin(w, &p, name, "in %s", c->name);
        if (a == A_MODULE)
            rc = cuModuleLoad(&m, "any.cubin");
        else if (a == A_MODULE_DATA)
            rc = cuModuleLoadData(&m, image);
        else if (a == A_MODULE_DATA_EX)
            rc = cuModuleLoadDataEx(&m, image, 0, NULL, NULL);
        else
            rc = cuModuleLoadFatBinary(&m, image);
        o.h = (uintptr_t)m;
        break;
    }
    }
    bool short_of_memory = acct_end(w->t.index, kinds[o.kind].cls, rc);
    probe_end(w, &p, rc, short_of_memory || overlap);
    if (short_of_memory)
        w->oom_waits++;
    if (overlap)
        w->overlap_waits++;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && kinds[o.kind].cls != CLS_NONE)
        return;
    if (!hx_expect(&w->t, name, rc, CUDA_SUCCESS))
        return;
    if (settable(o.kind))
        check_fresh(w, &o);
    if (o.kind == K_REGISTERED)
        for (int k = o.page; k < o.page + o.npages; k++) {
            w->reg.state[k] = HX_PAGE_REGISTERED;
            w->page_pending[k] = false;
        }
    /* A function of it, for cuLaunchKernel*: cuModuleGetFunction, or
     * cuLibraryGetKernel + cuKernelGetFunction (which loads the library
     * into the current context). */
    if (o.kind == K_MODULE || (o.kind == K_LIBRARY && hx_below(&w->t, 2))) {
        CUkernel kern = NULL;
        const char *fname = o.kind == K_MODULE ? "cuModuleGetFunction" : "cuKernelGetFunction";
        if (o.kind == K_LIBRARY)
            hx_expect(&w->t, "cuLibraryGetKernel", cuLibraryGetKernel(&kern, (CUlibrary)o.h, "k"),
                      CUDA_SUCCESS);
        probe_begin(w, &p, fname, "in %s", c->name);
        rc = o.kind == K_MODULE ? cuModuleGetFunction(&o.fn, (CUmodule)o.h, "k")
                                : cuKernelGetFunction(&o.fn, kern);
        probe_end(w, &p, rc, false);
        if (hx_expect(&w->t, fname, rc, CUDA_SUCCESS))
            o.fn_ctx = c, o.loaded = true;
    }
    w->held[w->nheld++] = o;
}

static void allocate(struct worker *w)
{
    enum alloc_call a = (enum alloc_call)hx_below(&w->t, A_CALLS);
    /* The test driver's loads wait for the GPU (as the real driver's do):
     * only in a context of the thread's own, and rarely. */
    if (a >= A_MODULE && (w->span != SPAN_OWN || hx_below(&w->t, 3)))
        a = A_DEVICE;
    /* Stream-ordered allocations go on a stream that does not capture. */
    if ((a >= A_ASYNC && a <= A_POOL_PTSZ) && w->capturing)
        a = A_MANAGED;
    allocate_with(w, a, pick_size(w));
}

static void release(struct worker *w, int i);

/* A program's loop: CHURN blocks of one kind and size allocated and
 * released (fill), then allocated again (drain), or only one of the two,
 * while the epoch's kernels run. A drain after fills, this thread's or
 * another's, finds its bin full of blocks whose fences have not passed
 * (the case where cudefer may wait for one): it must not wait, except a
 * managed allocation for a block this thread released. */
#define CHURN 5

static void churn(struct worker *w)
{
    static const enum alloc_call calls[] = {A_DEVICE, A_MANAGED, A_HOST};
    enum alloc_call a = calls[hx_below(&w->t, 3)];
    size_t n = hx_below(&w->t, 2) ? 16384 : 65536;
    unsigned mode = hx_below(&w->t, 3); /* 0: fill, 1: fill and drain, 2: drain */
    hx_note(&w->t, "-- %d %s of %zu bytes: %s", CHURN, alloc_names[a], n,
            mode == 0 ? "fill" : mode == 1 ? "fill and drain" : "drain");
    while (w->nheld > HELD - CHURN)
        release(w, (int)hx_below(&w->t, (unsigned)w->nheld));
    int first = w->nheld;
    for (int k = 0; k < CHURN; k++)
        allocate_with(w, a, n);
    if (mode == 2)
        return;
    while (w->nheld > first)
        release(w, w->nheld - 1);
    if (mode == 1)
        for (int k = 0; k < CHURN; k++)
            allocate_with(w, a, n);
}

/* ---- releases --------------------------------------------------------------------------- */

static void end_capture(struct worker *w);

static void release(struct worker *w, int i)
{
    struct obj o = w->held[i];
    w->held[i] = w->held[--w->nheld];
    struct probe p;
    CUresult rc;
    const char *name;
    switch (o.kind) {
    case K_DEV32:
    case K_PITCH32:
        name = "cuMemFree";
        probe_begin(w, &p, name, "(%#lx)", (unsigned long)o.h);
        rc = api.free_v1((unsigned)o.h);
        break;
    case K_DEVICE:
    case K_PITCH:
    case K_MANAGED:
        name = "cuMemFree_v2";
        probe_begin(w, &p, name, "(%s %#lx)", kinds[o.kind].name, (unsigned long)o.h);
        rc = cuMemFree((CUdeviceptr)o.h);
        if (o.kind == K_MANAGED && rc == CUDA_SUCCESS)
            note_managed_release(w, &o);
        break;
    case K_HOST32:
    case K_HOST:
    case K_HOSTALLOC:
        name = "cuMemFreeHost";
        probe_begin(w, &p, name, "(%#lx)", (unsigned long)o.h);
        rc = cuMemFreeHost((void *)o.h);
        break;
    case K_REGISTERED:
        name = "cuMemHostUnregister";
        probe_begin(w, &p, name, "(%#lx) of %s", (unsigned long)o.h, o.ctx->name);
        rc = cuMemHostUnregister((void *)o.h);
        break;
    case K_ARRAY:
        name = "cuArrayDestroy";
        probe_begin(w, &p, name, "(%#lx)", (unsigned long)o.h);
        rc = cuArrayDestroy((CUarray)o.h);
        break;
    case K_MIPMAP:
        name = "cuMipmappedArrayDestroy";
        probe_begin(w, &p, name, "(%#lx)", (unsigned long)o.h);
        rc = cuMipmappedArrayDestroy((CUmipmappedArray)o.h);
        break;
    case K_MODULE:
        name = "cuModuleUnload";
        probe_begin(w, &p, name, "(%#lx)", (unsigned long)o.h);
        rc = cuModuleUnload((CUmodule)o.h);
        break;
    case K_LIBRARY:
        name = "cuLibraryUnload";
        probe_begin(w, &p, name, "(%#lx, %s)", (unsigned long)o.h,
                    o.loaded ? "loaded into a context" : "never loaded into a context");
        /* The driver unloads a library never loaded into a context at once
         * (testdriver.h): cudefer may let it through. */
        p.blocked_only = !o.loaded;
        rc = cuLibraryUnload((CUlibrary)o.h);
        break;
    case K_ASYNC: {
        /* On stream 0 of its context (see allocate), not while it captures. */
        if (w->capturing && o.ctx == cur(w))
            end_capture(w);
        bool ptsz = hx_below(&w->t, 2);
        CUstream s = o.ctx == w->home ? w->home_streams[0] : w->span_streams[0];
        name = ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync";
        probe_begin(w, &p, name, "(%#lx) on stream 0 of %s", (unsigned long)o.h, o.ctx->name);
        rc = ptsz ? api.free_async_ptsz((CUdeviceptr)o.h, s) : cuMemFreeAsync((CUdeviceptr)o.h, s);
        break;
    }
    case K_VMM:
        hx_begin(&w->t, "cuMemRelease(%#lx)", (unsigned long)o.h);
        rc = cuMemRelease((CUmemGenericAllocationHandle)o.h);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "cuMemRelease", rc, CUDA_SUCCESS);
        return;
    default:
        return;
    }
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, name, rc, CUDA_SUCCESS);
    if (o.kind == K_REGISTERED) {
        for (int k = 0; k < EVENTS; k++) {
            if (!o.ev[k])
                continue;
            CUresult q = cuEventQuery(o.ev[k]);
            if (q == CUDA_ERROR_NOT_READY)
                hx_fail(&w->t, "unregister-early",
                        "cuMemHostUnregister(%p) returned while a kernel that writes its pages "
                        "(queued before the call) still ran", (void *)o.h);
            else
                hx_expect(&w->t, "cuEventQuery", q, CUDA_SUCCESS);
        }
        drop_events(&o, true);
        set_canaries(w, &o, true);
    }
}

/* Objects that a context's destruction freed (the registrations it undid
 * are not pending). */
static void forget_context(struct worker *w, struct hx_ctx *c)
{
    for (int i = 0; i < w->nheld;) {
        struct obj *o = &w->held[i];
        if (o->fn_ctx == c)
            o->fn = NULL, o->fn_ctx = NULL;
        if (o->ctx != c || o->kind == K_LIBRARY || o->kind == K_VMM) {
            i++;
            continue;
        }
        if (o->kind == K_REGISTERED) {
            drop_events(o, false);
            set_canaries(w, o, false);
        }
        *o = w->held[--w->nheld];
    }
    /* The destruction undid the registrations pending in c only. */
    for (int p = 0; p < HX_REG_PAGES; p++)
        if (w->page_ctx[p] == c)
            w->page_pending[p] = false;
}

/* ---- kernels --------------------------------------------------------------------------- */

static void launch(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    int which = (int)hx_below(&w->t, STREAMS + 2); /* STREAMS: per-thread; +1: legacy */
    bool legacy = which == STREAMS + 1;
    if (legacy && !hx_legacy_enter(c))
        which = 1, legacy = false;
    if (w->capturing && which == 0)
        which = 1;
    CUstream s = which < STREAMS ? cur_streams(w)[which]
                 : which == STREAMS ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    struct obj *o = NULL;
    int n = w->nheld ? (int)hx_below(&w->t, (unsigned)w->nheld + 2) : 0;
    if (n < w->nheld && kinds[w->held[n].kind].memory && w->held[n].ctx == c)
        o = &w->held[n];
    if (o && o->kind == K_ASYNC && which != 0)
        o = NULL; /* stream-ordered memory is used on its stream only */
    int slot = -1;
    if (o && o->kind == K_REGISTERED && (slot = hx_event_slot(o->ev, o->ev_stream, EVENTS, s)) < 0)
        o = NULL;
    unsigned usec = 1 + hx_below(&w->t, 300);
    hx_begin(&w->t, "testdrv_launch(%s, %u us, %s %#lx) in %s",
             which < STREAMS ? "a stream" : which == STREAMS ? "per-thread" : "legacy", usec,
             o ? kinds[o->kind].name : "nothing", o ? (unsigned long)o->h : 0ul, c->name);
    CUresult rc = testdrv_launch(s, usec, o ? (CUdeviceptr)o->h : 0, o ? o->size : 0,
                                 o ? TESTDRV_WRITE : TESTDRV_NONE);
    hx_end(&w->t, rc);
    hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS);
    if (rc == CUDA_SUCCESS && slot >= 0) {
        if (!o->ev[slot])
            hx_expect(&w->t, "cuEventCreate", cuEventCreate(&o->ev[slot], CU_EVENT_DISABLE_TIMING),
                      CUDA_SUCCESS);
        o->ev_stream[slot] = s;
        hx_expect(&w->t, "cuEventRecord", cuEventRecord(o->ev[slot], s), CUDA_SUCCESS);
    }
    if (legacy)
        hx_legacy_exit(c);
}

/* cuLaunchKernel or cuLaunchKernel_ptsz of a function the thread holds. */
static void launch_function(struct worker *w)
{
    struct hx_ctx *c = cur(w);
    for (int i = 0; i < w->nheld; i++) {
        struct obj *o = &w->held[i];
        if (!o->fn || o->fn_ctx != c)
            continue;
        bool ptsz = hx_below(&w->t, 2);
        struct probe p;
        probe_begin(w, &p, ptsz ? "cuLaunchKernel_ptsz" : "cuLaunchKernel", "in %s", c->name);
        CUresult rc = ptsz ? api.launch_kernel_ptsz(o->fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)
                           : cuLaunchKernel(o->fn, 1, 1, 1, 32, 1, 1, 0, cur_streams(w)[1],
                                            NULL, NULL);
        probe_end(w, &p, rc, false);
        hx_expect(&w->t, "cuLaunchKernel", rc, CUDA_SUCCESS);
        return;
    }
}

/* ---- streams and captures ------------------------------------------------------------- */

static void create_stream(struct worker *w, CUstream *s)
{
    struct hx_ctx *c = cur(w);
    struct probe p;
    CUresult rc;
    unsigned how = hx_below(&w->t, 3);
    if (w->span == SPAN_GREEN && how == 2) {
        probe_begin(w, &p, "cuGreenCtxStreamCreate", "in %s", c->name);
        rc = hx_green_stream(s, c->green);
    } else if (how == 1) {
        probe_begin(w, &p, "cuStreamCreateWithPriority", "in %s", c->name);
        rc = cuStreamCreateWithPriority(s, CU_STREAM_NON_BLOCKING, -(int)hx_below(&w->t, 6));
    } else {
        probe_begin(w, &p, "cuStreamCreate", "in %s", c->name);
        rc = cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
    }
    probe_end(w, &p, rc, false);
    if (!hx_expect(&w->t, "cuStreamCreate", rc, CUDA_SUCCESS))
        *s = NULL;
}

static void destroy_stream(struct worker *w, CUstream *s)
{
    if (!*s)
        return;
    bool v1 = hx_below(&w->t, 2);
    struct probe p;
    probe_begin(w, &p, v1 ? "cuStreamDestroy" : "cuStreamDestroy_v2", "in %s", cur(w)->name);
    CUresult rc = v1 ? api.stream_destroy_v1(*s) : cuStreamDestroy(*s);
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuStreamDestroy", rc, CUDA_SUCCESS);
    *s = NULL;
}

/* Stream 0 may capture: stream 1 is swapped. */
static void swap_stream(struct worker *w)
{
    destroy_stream(w, &cur_streams(w)[1]);
    create_stream(w, &cur_streams(w)[1]);
}

static void end_capture_on(struct worker *w, CUstream s, bool ptsz)
{
    CUgraph g = NULL;
    struct probe p;
    probe_begin(w, &p, ptsz ? "cuStreamEndCapture_ptsz" : "cuStreamEndCapture", "in %s",
                cur(w)->name);
    CUresult rc = ptsz ? api.end_capture_ptsz(NULL, &g) : cuStreamEndCapture(s, &g);
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuStreamEndCapture", rc, CUDA_SUCCESS);
    if (rc == CUDA_SUCCESS && g && g != w->graph) {
        if (w->graph)
            cuGraphDestroy(w->graph);
        w->graph = g;
    }
}

static void end_capture(struct worker *w)
{
    end_capture_on(w, cur_streams(w)[0], false);
    w->capturing = false;
}

/* Begins a RELAXED capture of stream 0 (left live), or makes a capture of
 * the per-thread stream (RELAXED or GLOBAL) within this operation. */
static void capture_op(struct worker *w)
{
    if (w->capturing) {
        end_capture(w);
        return;
    }
    struct hx_ctx *c = cur(w);
    const CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    struct probe p;
    CUresult rc;
    unsigned how = hx_below(&w->t, 8);
    if (how < 3) { /* a capture of stream 0 that stays live */
        CUstream s = cur_streams(w)[0];
        const char *name = how == 0 ? "cuStreamBeginCapture_v2"
                           : how == 1 && w->graph ? "cuStreamBeginCaptureToGraph"
                                                  : "cuStreamBeginCapture_v2";
        probe_begin(w, &p, name, "(stream 0, relaxed) in %s", c->name);
        rc = name[20] == 'T' ? cuStreamBeginCaptureToGraph(s, w->graph, NULL, NULL, 0, relaxed)
                             : cuStreamBeginCapture(s, relaxed);
        probe_end(w, &p, rc, false);
        w->capturing = hx_expect(&w->t, name, rc, CUDA_SUCCESS);
        return;
    }
    /* The per-thread stream (a blocking one), or stream 1 in GLOBAL mode,
     * begun and ended here. */
    bool per_thread = how != 7;
    if (per_thread && !hx_blocking_capture_enter(c))
        return;
    CUstream s = per_thread ? CU_STREAM_PER_THREAD : cur_streams(w)[1];
    bool ptsz = false;
    const char *name;
    switch (how) {
    case 3: name = "cuStreamBeginCapture_v2"; break;
    case 4: name = "cuStreamBeginCapture_v2_ptsz"; ptsz = true; break;
    case 5: name = "cuStreamBeginCapture_ptsz"; ptsz = true; break;
    case 6: name = w->graph ? "cuStreamBeginCaptureToGraph_ptsz" : "cuStreamBeginCapture_v2_ptsz";
        ptsz = true; break;
    default: name = "cuStreamBeginCapture"; break;
    }
    probe_begin(w, &p, name, "(%s) in %s", per_thread ? "per-thread stream" : "stream 1",
                c->name);
    if (how == 3)
        rc = cuStreamBeginCapture(s, relaxed);
    else if (how == 5)
        rc = api.begin_capture_ptsz(NULL);
    else if (how == 7)
        rc = api.begin_capture_v1(s);
    else if (name[20] == 'T')
        rc = api.to_graph_ptsz(NULL, w->graph, NULL, NULL, 0, relaxed);
    else
        rc = api.begin_capture_v2_ptsz(NULL, relaxed);
    probe_end(w, &p, rc, false);
    if (hx_expect(&w->t, name, rc, CUDA_SUCCESS)) {
        hx_begin(&w->t, "testdrv_launch (captured)");
        rc = testdrv_launch(s, 10, 0, 0, TESTDRV_NONE);
        hx_end(&w->t, rc);
        hx_expect(&w->t, "testdrv_launch", rc, CUDA_SUCCESS);
        end_capture_on(w, s, ptsz);
    }
    if (per_thread)
        hx_blocking_capture_exit(c);
}

/* ---- contexts and spans ----------------------------------------------------------------- */

static void spin_here(struct worker *w)
{
    if (!w->span_streams[0])
        return;
    hx_begin(&w->t, "testdrv_launch_spin in %s", cur(w)->name);
    CUresult rc = testdrv_launch_spin(w->span_streams[0], current_flag());
    hx_end(&w->t, rc);
    hx_expect(&w->t, "testdrv_launch_spin", rc, CUDA_SUCCESS);
}

static void pop_current(struct worker *w)
{
    CUcontext popped;
    hx_expect(&w->t, "cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
}

static void begin_own(struct worker *w)
{
    unsigned version = 1 + hx_below(&w->t, 4);
    static const char *const names[] = {"", "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3",
                                        "cuCtxCreate_v4"};
    int dev = (int)hx_below(&w->t, 2);
    CUcontext h = NULL;
    struct probe p;
    probe_begin(w, &p, names[version], "on device %d", dev);
    CUresult rc = hx_ctx_create(version, &h, dev);
    probe_end(w, &p, rc, false);
    if (!hx_expect(&w->t, names[version], rc, CUDA_SUCCESS))
        return;
    w->own = (struct hx_ctx){.name = "own", .h = h, .dev = dev};
    w->span = SPAN_OWN;
}

static void end_own(struct worker *w)
{
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &w->own && hx_below(&w->t, 2))
            release(w, i);
    bool v1 = hx_below(&w->t, 2);
    struct probe p;
    probe_begin(w, &p, v1 ? "cuCtxDestroy" : "cuCtxDestroy_v2", "(own context)");
    CUresult rc = v1 ? api.ctx_destroy_v1(w->own.h) : api.ctx_destroy_v2(w->own.h);
    probe_end(w, &p, rc, true);
    hx_expect(&w->t, "cuCtxDestroy", rc, CUDA_SUCCESS);
    forget_context(w, &w->own);
}

/* Retain (or release) of a primary context, under role_calls for device 1. */
static CUresult primary_retain(struct worker *w, int dev, CUcontext *h)
{
    struct probe p;
    if (dev == 1)
        pthread_mutex_lock(&role_calls);
    probe_begin(w, &p, "cuDevicePrimaryCtxRetain", "(%d)", dev);
    CUresult rc = cuDevicePrimaryCtxRetain(h, dev);
    probe_end(w, &p, rc, false);
    if (dev == 1) {
        role_refs += rc == CUDA_SUCCESS;
        pthread_mutex_unlock(&role_calls);
    }
    hx_expect(&w->t, "cuDevicePrimaryCtxRetain", rc, CUDA_SUCCESS);
    return rc;
}

static void primary_release(struct worker *w, int dev)
{
    bool v1 = hx_below(&w->t, 2);
    struct probe p;
    if (dev == 1)
        pthread_mutex_lock(&role_calls);
    bool last = dev == 1 && role_refs == 1;
    probe_begin(w, &p, v1 ? "cuDevicePrimaryCtxRelease" : "cuDevicePrimaryCtxRelease_v2",
                "(%d)%s", dev, last ? " (the last)" : "");
    CUresult rc = v1 ? api.primary_release_v1(dev) : api.primary_release_v2(dev);
    probe_end(w, &p, rc, last);
    if (dev == 1) {
        role_refs -= rc == CUDA_SUCCESS;
        pthread_mutex_unlock(&role_calls);
    }
    w->last_releases += last;
    hx_expect(&w->t, "cuDevicePrimaryCtxRelease", rc, CUDA_SUCCESS);
}

static void begin_role(struct worker *w)
{
    if (pthread_rwlock_tryrdlock(&role_rw) != 0)
        return;
    CUcontext h = NULL;
    if (primary_retain(w, 1, &h) != CUDA_SUCCESS) {
        pthread_rwlock_unlock(&role_rw);
        return;
    }
    hx_expect(&w->t, "cuCtxPushCurrent", cuCtxPushCurrent(h), CUDA_SUCCESS);
    /* main learnt the handle: a primary context keeps it across its
     * releases, so this writes only if it ever changed. */
    if (slot_role.h != h)
        slot_role.h = h;
    w->span = SPAN_ROLE;
}

static void end_role(struct worker *w)
{
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].ctx == &slot_role)
            release(w, i);
    for (int i = 0; i < w->nheld; i++)
        if (w->held[i].fn_ctx == &slot_role)
            w->held[i].fn = NULL, w->held[i].fn_ctx = NULL;
    pop_current(w);
    primary_release(w, 1);
    pthread_rwlock_unlock(&role_rw);
}

/* A reset of the primary context of device 1 by its only user, with a
 * kernel that waits for the host in it. */
static void reset_op(struct worker *w)
{
    if (pthread_rwlock_trywrlock(&role_rw) != 0)
        return;
    CUcontext h = NULL;
    if (primary_retain(w, 1, &h) == CUDA_SUCCESS) {
        CUstream s = NULL;
        hx_expect(&w->t, "cuCtxPushCurrent", cuCtxPushCurrent(h), CUDA_SUCCESS);
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS)
            hx_expect(&w->t, "testdrv_launch_spin", testdrv_launch_spin(s, current_flag()),
                      CUDA_SUCCESS);
        bool v1 = hx_below(&w->t, 2);
        struct probe p;
        pthread_mutex_lock(&role_calls);
        probe_begin(w, &p, v1 ? "cuDevicePrimaryCtxReset" : "cuDevicePrimaryCtxReset_v2", "(1)");
        CUresult rc = v1 ? api.primary_reset_v1(1) : api.primary_reset_v2(1);
        probe_end(w, &p, rc, true);
        role_refs = 0;
        pthread_mutex_unlock(&role_calls);
        hx_expect(&w->t, "cuDevicePrimaryCtxReset", rc, CUDA_SUCCESS);
        pop_current(w);
    }
    pthread_rwlock_unlock(&role_rw);
}

static void begin_green(struct worker *w)
{
    CUgreenCtx g = NULL;
    CUcontext h = NULL;
    struct probe p;
    hx_begin(&w->t, "cuGreenCtxCreate on device 0");
    CUresult rc = hx_green_create(0, 16, &g, &h); /* its cuCtxFromGreenCtx is measured below */
    hx_end(&w->t, rc);
    if (!hx_expect(&w->t, "cuGreenCtxCreate", rc, CUDA_SUCCESS))
        return;
    CUcontext again = NULL;
    probe_begin(w, &p, "cuCtxFromGreenCtx", "%s", "");
    rc = ((CUresult(*)(CUcontext *, CUgreenCtx))hx_sym("cuCtxFromGreenCtx"))(&again, g);
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuCtxFromGreenCtx", rc, CUDA_SUCCESS);
    hx_expect(&w->t, "cuCtxPushCurrent", cuCtxPushCurrent(h), CUDA_SUCCESS);
    w->own = (struct hx_ctx){.name = "green(0)", .h = h, .green = g, .dev = 0};
    w->span = SPAN_GREEN;
}

/* What a green context made belongs to the primary context of device 0
 * (testdriver.h), which main holds: its objects stay live. */
static void end_green(struct worker *w)
{
    for (int i = w->nheld - 1; i >= 0; i--) {
        struct obj *o = &w->held[i];
        if (o->fn_ctx == &w->own)
            o->fn = NULL, o->fn_ctx = NULL;
        if (o->ctx == &w->own)
            o->ctx = &slot_primary;
    }
    pop_current(w);
    struct probe p;
    probe_begin(w, &p, "cuGreenCtxDestroy", "%s", "");
    CUresult rc = hx_green_destroy(w->own.green);
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuGreenCtxDestroy", rc, CUDA_SUCCESS);
}

static void begin_span(struct worker *w)
{
    if (w->capturing)
        end_capture(w);
    unsigned pick = hx_below(&w->t, 10);
    if (pick < 4)
        begin_own(w);
    else if (pick < 7 || !have_green)
        begin_role(w);
    else
        begin_green(w);
    if (w->span == SPAN_NONE)
        return;
    for (int i = 0; i < STREAMS; i++)
        create_stream(w, &w->span_streams[i]);
    spin_here(w);
    w->span_left = 10 + (int)hx_below(&w->t, 40);
}

static void end_span(struct worker *w)
{
    if (w->capturing)
        end_capture(w);
    for (int i = w->nheld - 1; i >= 0; i--)
        if (w->held[i].kind == K_ASYNC && w->held[i].ctx == cur(w))
            release(w, i); /* on its stream, which goes now */
    for (int i = 0; i < STREAMS; i++)
        destroy_stream(w, &w->span_streams[i]);
    switch (w->span) {
    case SPAN_OWN: end_own(w); break;
    case SPAN_ROLE: end_role(w); break;
    case SPAN_GREEN: end_green(w); break;
    case SPAN_NONE: break;
    }
    w->span = SPAN_NONE;
}

/* ---- the operations ---------------------------------------------------------------------- */

static void allowed_call(struct worker *w)
{
    struct probe p;
    CUresult rc;
    unsigned how = hx_below(&w->t, 4);
    if (how == 0 && !driver_alone) {
        probe_begin(w, &p, "cudefer_flush", "%s", "");
        int r = hx_flush();
        probe_end(w, &p, r == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, true);
        if (r != 0)
            hx_fail(&w->t, "result", "cudefer_flush returned %d", r);
        return;
    }
    bool v2 = how == 2;
    probe_begin(w, &p, v2 ? "cuCtxSynchronize_v2" : "cuCtxSynchronize", "in %s", cur(w)->name);
    rc = v2 ? api.ctx_sync_v2(cur(w)->h) : cuCtxSynchronize();
    probe_end(w, &p, rc, true);
    hx_expect(&w->t, "cuCtxSynchronize", rc, CUDA_SUCCESS);
}

static void lookup(struct worker *w)
{
    static const char *const names[] = {"cuMemFree", "cuMemAlloc", "cuStreamCreate",
                                        "cuCtxSynchronize", "cuMemHostUnregister"};
    const char *sym = names[hx_below(&w->t, 5)];
    void *fn = NULL;
    struct probe p;
    bool v2 = hx_below(&w->t, 2);
    probe_begin(w, &p, v2 ? "cuGetProcAddress_v2" : "cuGetProcAddress", "(%s)", sym);
    CUresult rc = v2 ? cuGetProcAddress(sym, &fn, 12000, 0, NULL) : api.proc_v1(sym, &fn, 12000, 0);
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuGetProcAddress", rc, CUDA_SUCCESS);
}

/* What a program asks of free memory (cudefer adds what it holds for the
 * current context's device): never waits. */
static void meminfo(struct worker *w)
{
    struct probe p;
    CUresult rc;
    if (hx_below(&w->t, 2)) {
        size_t free = 0, total = 0;
        probe_begin(w, &p, "cuMemGetInfo_v2", "in %s", cur(w)->name);
        rc = cuMemGetInfo_v2(&free, &total);
    } else {
        unsigned free = 0, total = 0;
        probe_begin(w, &p, "cuMemGetInfo", "in %s", cur(w)->name);
        rc = api.info_v1(&free, &total);
    }
    probe_end(w, &p, rc, false);
    hx_expect(&w->t, "cuMemGetInfo", rc, CUDA_SUCCESS);
}

static void primary0_pair(struct worker *w)
{
    CUcontext h = NULL;
    if (primary_retain(w, 0, &h) == CUDA_SUCCESS)
        primary_release(w, 0); /* main holds one: never the last */
}

static void one_operation(void *arg)
{
    struct worker *w = arg;
    if (w->span != SPAN_NONE && --w->span_left <= 0) {
        end_span(w);
        return;
    }
    unsigned pick = hx_below(&w->t, 1000);
    if (pick < 300) {
        if (w->nheld == HELD)
            release(w, (int)hx_below(&w->t, HELD));
        else
            allocate(w);
    } else if (pick < 550) {
        if (w->nheld == 0)
            allocate(w);
        else
            release(w, (int)hx_below(&w->t, (unsigned)w->nheld));
    } else if (pick < 690) {
        launch(w);
    } else if (pick < 720) {
        churn(w);
    } else if (pick < 740) {
        launch_function(w);
    } else if (pick < 790) {
        swap_stream(w);
    } else if (pick < 870) {
        capture_op(w);
    } else if (pick < 890) {
        allowed_call(w);
    } else if (pick < 903) {
        lookup(w);
    } else if (pick < 910) {
        meminfo(w);
    } else if (pick < 930) {
        primary0_pair(w);
    } else if (pick < 955 && w->span == SPAN_NONE && nshared > 1) {
        begin_span(w);
    } else if (pick < 958 && w->span == SPAN_NONE && !w->capturing && nshared > 1) {
        reset_op(w);
    } else if (pick < 980) {
        alter(w);
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
    if (w->capturing)
        end_capture(w);
    while (w->nheld)
        release(w, w->nheld - 1);
    for (int i = 0; i < STREAMS; i++)
        destroy_stream(w, &w->home_streams[i]);
    if (w->graph)
        cuGraphDestroy(w->graph);
    hx_worker_leave(&w->t, &w->reg);
    return NULL;
}

/* ---- main: the epochs --------------------------------------------------------------------- */

static void *workers_join(void *arg)
{
    pthread_t *tid = arg;
    for (int i = 0; i < hx.threads; i++)
        pthread_join(tid[i], NULL);
    atomic_store(&workers_done, true);
    return NULL;
}

/* Launches the spin kernels of each epoch in the shared contexts, on its
 * flag. A thread of its own: a launch stalls while a waiting release holds
 * the context, and the thread that sets the flags must never stall (the
 * release may be waiting for the kernels of the next flag). A launch made
 * late spins on a flag already set, and ends at once. */
static void *spin_launcher(void *arg)
{
    (void)arg;
    long done = -1;
    while (!atomic_load(&workers_done)) {
        long e = atomic_load(&epoch_now);
        if (e == done) {
            usleep(200);
            continue;
        }
        for (int i = 0; i < nshared; i++)
            if (testdrv_launch_spin(spin_streams[i], &flags[e % NEPOCH]) != CUDA_SUCCESS)
                hx_fail(NULL, "result", "main's testdrv_launch_spin failed");
        done = e;
    }
    return NULL;
}

/* Runs epochs until the workers are done; each ends by setting its flag.
 * Makes no driver call (see spin_launcher). */
static unsigned long run_epochs(void)
{
    long e;
    for (e = 0; !atomic_load(&workers_done); e++) {
        hx_clear_flag(&flags[e % NEPOCH]);
        atomic_store(&epoch_flag_ns[e % NEPOCH], 0);
        atomic_store(&epoch_launch_ns[e % NEPOCH], hx_now_ns());
        atomic_store(&epoch_now, e);
        for (unsigned ms = 0; ms < epoch_ms && !atomic_load(&workers_done); ms++)
            usleep(1000);
        hx_set_flag(&flags[e % NEPOCH]);
        atomic_store(&epoch_flag_ns[e % NEPOCH], hx_now_ns());
    }
    /* Later kernels (a launch that stalled) find their flags set. */
    for (long k = 0; k < NEPOCH; k++)
        hx_set_flag(&flags[k]);
    return (unsigned long)e;
}

int main(int argc, char **argv)
{
    /* Its kernels wait for the host a few epochs at most. */
    hx.stall_s = 10;
    hx_parse(argc, argv, "property", "PROP", DEFAULT_OPS, DEFAULT_THREADS, 100);
    const char *env;
    if ((env = getenv("PROP_EPOCH_MS")) && atoi(env) > 0)
        epoch_ms = (unsigned)atoi(env);
    size_t cap = (size_t)64 << 20;
    if ((env = getenv("PROP_CAPACITY")) && *env)
        cap = (size_t)strtoull(env, NULL, 10) << ((strchr(env, 'M') || strchr(env, 'm')) ? 20 : 0);
    driver_alone = (env = getenv("PROP_DRIVER_ALONE")) && strcmp(env, "0") != 0;
    if ((env = getenv("PROP_ONE_CONTEXT")) && strcmp(env, "0") != 0)
        nshared = 1;
    setenv("TESTDRIVER_DEVICES", "2", 0);
    setenv("CUDEFER_MAX_DEFERRED_ENTRIES", "32", 0);
    setenv("CUDEFER_MAX_DEFERRED_BYTES", "2M", 0);
    const char *savings = hx_savings_by_seed();
    const char *reuse = hx_word_by_seed();
    load_wrapped();
    hx_watchdog_start();

    CUcontext popped;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&slot_primary.h, 0) ||
        (nshared > 1 && (cuDevicePrimaryCtxRetain(&slot_role.h, 1) ||
                         cuDevicePrimaryCtxRelease(1) ||
                         cuCtxCreate(&slot_user.h, NULL, 0, 1) || cuCtxPopCurrent(&popped)))) {
        fprintf(stderr, "property: no contexts (are there 2 devices?)\n");
        return 2;
    }
    if (!hx_shim_loaded() && !driver_alone) {
        fprintf(stderr, "property: cudefer_flush is not there: is the shim preloaded?\n");
        return 2;
    }
    find_entry_points();
    have_green = hx_green_available();
    /* Every wrapped name has a rule. */
    for (int i = 0; i < nwrapped; i++)
        if (rule_index(wrapped[i]) < 0)
            hx_fail(NULL, "table", "the shim wraps %s (%s), and property.c has no rule for it",
                    wrapped[i], wrapped_path);
    struct hx_ctx *shared[] = {&slot_primary, &slot_user};
    for (int i = 0; i < nshared; i++)
        if (cuCtxSetCurrent(shared[i]->h) ||
            cuStreamCreate(&spin_streams[i], CU_STREAM_NON_BLOCKING)) {
            fprintf(stderr, "property: no stream in %s\n", shared[i]->name);
            return 2;
        }
    /* The driver's one-time set-up of cuMemFreeAsync (10 ms) before the
     * measures. */
    CUdeviceptr d = 0;
    if (cuMemAlloc(&d, 4096) || cuMemFreeAsync(d, spin_streams[nshared - 1]) || cuCtxSynchronize() ||
        cuCtxSetCurrent(NULL)) {
        fprintf(stderr, "property: the warm-up failed\n");
        return 2;
    }
    for (int i = 0; i < NSLOTS; i++)
        capacity[i] = cap;
    testdrv_set_device_capacity(cap);
    testdrv_set_host_capacity(cap);
    printf("property: %llu operations, %d threads, seed %llu, epochs of %u ms, capacity %zu, "
           "%d wrapped names (%s), savings %s, reuse %s, green contexts %s\n", hx.ops, hx.threads,
           (unsigned long long)hx.seed, epoch_ms, cap, nwrapped, wrapped_path, savings, reuse,
           have_green ? "yes" : "no (skipped)");
    fflush(stdout);

    hx_watchdog_phase("workers running");
    static pthread_t tid[HX_MAX_THREADS];
    for (int i = 0; i < hx.threads; i++) {
        struct worker *w = &workers[i];
        hx_thread_init(&w->t, i);
        unsigned long long n = (unsigned long long)hx.threads;
        w->t.ops = hx.ops / n + ((unsigned long long)i < hx.ops % n);
        w->home = i % 2 && nshared > 1 ? &slot_user : &slot_primary;
        if (!hx_pages_map(&w->reg))
            return 2;
    }
    uint64_t t0 = hx_now_ns();
    for (int i = 0; i < hx.threads; i++)
        pthread_create(&tid[i], NULL, worker_main, &workers[i]);
    pthread_t joiner, launcher;
    pthread_create(&joiner, NULL, workers_join, tid);
    pthread_create(&launcher, NULL, spin_launcher, NULL);
    unsigned long epochs = run_epochs();
    pthread_join(joiner, NULL);
    pthread_join(launcher, NULL);
    double work_s = (double)(hx_now_ns() - t0) / 1e9;

    hx_watchdog_phase("the end");
    for (int i = 0; i < nshared; i++)
        if (cuCtxSetCurrent(shared[i]->h) || cuStreamDestroy(spin_streams[i]) ||
            cuCtxSynchronize())
            hx_fail(NULL, "result", "the end of %s failed", shared[i]->name);
    if (!driver_alone && hx_flush() != 0)
        hx_fail(NULL, "result", "the final cudefer_flush failed");
    hx_check_always(NULL);
    hx_watchdog_stop();

    unsigned long long oom = 0, overlap = 0, last = 0;
    for (int i = 0; i < hx.threads; i++) {
        oom += workers[i].oom_waits;
        overlap += workers[i].overlap_waits;
        last += workers[i].last_releases;
    }
    printf("property: %llu operations in %.2f s, %lu epochs\n", hx.ops, work_s, epochs);
    for (int r = 0; r < R_COUNT; r++)
        printf("property:   %-16s %8llu calls, %llu of them waited\n", rule_names[r],
               atomic_load(&calls_by_rule[r]), atomic_load(&waits_by_rule[r]));
    printf("property: exceptions that applied: %llu allocations short of memory, %llu "
           "registrations over a pending unregister, %llu last releases of primary(1)\n", oom,
           overlap, last);
    printf("property: %llu unregisters not judged for their bound (a call allowed to wait "
           "overlapped them, or the machine held them back)\n", atomic_load(&bounded_exempt));
    printf("property: %llu calls of 15 ms or more not judged for a wait by polling (the "
           "machine held them back: no CPU, or the test driver's lock)\n",
           atomic_load(&wall_exempt));
    printf("property: %llu primary releases and green destructions of 15 ms or more not "
           "judged for a wait by polling (another thread's call that may flush was under "
           "way)\n", atomic_load(&drain_exempt));
    char never[2048] = "";
    for (int i = 0; i < nwrapped; i++) {
        int r = rule_index(wrapped[i]);
        if (r >= 0 && !atomic_load(&calls_of[r]) &&
            strlen(never) + strlen(wrapped[i]) + 2 < sizeof never) {
            strcat(never, " ");
            strcat(never, wrapped[i]);
        }
    }
    if (never[0])
        printf("property: wrapped names never called in this run:%s\n", never);
    if (hx_failures()) {
        printf("property: FAILED: %u failures (%s)\n", hx_failures(), hx_failed_invariants());
        return 1;
    }
    printf("property: every invariant held\n");
    return 0;
}
