/* fuzz_api.c - libFuzzer target: random sequences of CUDA driver calls made
 * through the shim, over the test driver, checked against a shadow model.
 *
 * Built by scripts/fuzz.sh. The binary is linked against a libcudefer.so
 * built from the sources of shim/ (instrumented for coverage), placed before
 * the test driver's libcuda.so.1 in the link order: the shim's exported cu* symbols
 * come first in the lookup scope, exactly as with LD_PRELOAD, and the shim
 * finds the test driver with its own dlopen("libcuda.so.1").
 *
 * An input is a sequence of operations (one byte each, then argument bytes):
 * context create (every cuCtxCreate version)/destroy, current-context
 * changes, primary context retain/release/reset on two devices, green
 * contexts (when the driver has them), stream create/destroy (also in the
 * middle of a capture), simulated kernels (testdrv_launch) on user, legacy
 * and per-thread streams touching live memory of any context, stream
 * captures of every kind of stream handle (created streams, the per-thread
 * stream by CU_STREAM_PER_THREAD and through the _ptsz entry points, to a
 * graph, GLOBAL ones around a launch) and captures the program invalidates,
 * cuCtxSynchronize[_v2], cudefer_flush, cuMemGetInfo[_v2] (never above the
 * current device's capacity less what the program holds live there),
 * advice, prefetches, stream attachment and SYNC_MEMOPS set on live
 * blocks, inside them and on pointers that name none, device memory the
 * driver maps (unseen by the shim) where a destroyed context had a block,
 * allocations of every kind the shim tracks, and releases of every kind -
 * of live objects, double releases, pointers inside allocations, pointers
 * of the wrong kind, bogus and NULL pointers, objects of destroyed contexts.
 *
 * Checked after every operation:
 *  - no kernel touched memory that was not live (testdrv_faults() == 0),
 *    no synchronisation waited for another context's unfinished work
 *    (testdrv_foreign_syncs: the program makes no stream wait across
 *    contexts), and the stream captures invalidated are those the program
 *    invalidated;
 *  - while a kernel that waits for the host runs in every context, no call
 *    that cudefer promises never waits waited (the table of
 *    tests/property.c; see "kernels that wait for the host" below);
 *  - when cuMemHostUnregister returns, no kernel submitted before it still
 *    writes the pages, and nothing writes them afterwards (a canary);
 *  - every release answers what the driver itself would (the model below
 *    follows the test driver's rules: tests/driver/memory.c, arrays.c,
 *    modules.c), and so do cuCtxSynchronize and the allocations' context
 *    checks;
 *  - an allocation that fits in its capacity beside what the program holds
 *    live of that capacity succeeds: what the shim holds back must never
 *    make it fail. As in the test driver, pinned host memory is one
 *    capacity and each device's memory another: an object counts against
 *    the device of the context it was allocated in;
 *  - an address handed out is never one that is live already, and a new
 *    device, pinned or managed block carries nothing the program set on a
 *    block it released (SYNC_MEMOPS, advice, a prefetch location), and no
 *    block the program exported as a dma-buf is handed out again.
 * Checked at the end of every input:
 *  - after cudefer_flush, the driver's live count of every kind is what
 *    the program holds live (so every release was really done), and no
 *    freed device memory is pending;
 *  - after everything is released and every context destroyed, nothing of
 *    any kind is left, and the shim named no destroyed context when the
 *    program did not.
 *
 * The harness stays inside what cudefer promises (README): stream captures
 * use the relaxed mode and end before their stream or context goes; a
 * kernel that touches another context's memory runs in a context the shim
 * knows (created or retained through it, or one it allocated or made a
 * stream in); before a context is torn down, the other contexts whose
 * kernels used its memory are synchronised (the driver would free it under
 * them, with or without cudefer); while a capture is live, no memory that
 * a kernel of another context used is released (such a release is not
 * fenced, and a flush point during the capture makes the driver's own
 * release, which waits for its own context only); before driver 12.5
 * (TESTDRIVER_VERSION=12040) such kernels run on streams the program
 * created and no kernel that touches memory runs on a per-thread default
 * stream (the fallback fence does not cover those).
 */
#include <cuda.h>
#include <cudefer.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "own.h"
#include "testdriver.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- input ------------------------------------------------------------- */

struct input {
    const uint8_t *p;
    size_t n;
};

static unsigned u8(struct input *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static unsigned u16(struct input *in)
{
    unsigned lo = u8(in);
    return lo | u8(in) << 8;
}

/* ---- failures ---------------------------------------------------------- */

static int op_index;
static const char *op_name = "";

#define FAIL(...)                                                                  \
    do {                                                                           \
        fprintf(stderr, "fuzz_api: op %d (%s): ", op_index, op_name);              \
        fprintf(stderr, __VA_ARGS__);                                              \
        fprintf(stderr, "\n");                                                     \
        abort();                                                                   \
    } while (0)

/* FUZZ_API_TRACE=FILE: each input's operations, written to FILE (rewritten
 * for every input), to see what led to a failure that needs the state of
 * earlier inputs to show. */
static FILE *trace;
static const char *trace_path;
#define TRACE(...)                                                                 \
    do {                                                                           \
        if (trace) {                                                               \
            fprintf(trace, __VA_ARGS__);                                           \
            fputc('\n', trace);                                                   \
            fflush(trace);                                                         \
        }                                                                          \
    } while (0)

/* ---- the model --------------------------------------------------------- */

enum mkind { K_DEVICE, K_MANAGED, K_HOST, K_REGISTERED, K_ARRAY, K_MIPMAP, K_MODULE,
             K_LIBRARY, K_COUNT };
static const char *const kind_names[K_COUNT] = {"device", "managed", "host", "registered",
                                                "array", "mipmapped", "module", "library"};
static const enum testdrv_kind td_kind[K_COUNT] = {
    TESTDRV_DEVICE, TESTDRV_MANAGED, TESTDRV_HOST, TESTDRV_REGISTERED,
    TESTDRV_ARRAY, TESTDRV_ARRAY, TESTDRV_MODULE, TESTDRV_LIBRARY,
};
static bool on_device_capacity(enum mkind k)
{
    return k == K_DEVICE || k == K_MANAGED || k == K_ARRAY || k == K_MIPMAP;
}
static bool is_memory(enum mkind k)
{
    return k <= K_REGISTERED;
}

enum ostate {
    LIVE,          /* allocated, not released */
    RELEASED,      /* released by the program */
    TORN,          /* freed by its context's teardown while live */
    RELEASED_TORN, /* released, then its context was torn down */
    FORGOTTEN,     /* its address was handed out again: no longer modelled */
};

#define MAX_OBJS 128
struct mobj {
    enum mkind kind;
    uintptr_t key;
    size_t bytes; /* counted against capacity */
    int ctx;      /* model context slot; -1: none (a library loaded without one) */
    enum ostate state;
    bool readonly;
    bool loaded;  /* a library loaded into a context (cuKernelGetFunction) that lives */
    bool unseen;  /* allocated by a call cudefer does not see: its release is the
                     driver's own, which waits (README, limits) */
    /* registered memory: an event recorded after each kernel that wrote
     * it, per stream (the context the event belongs to: ev_ctx) */
    CUevent ev[4];
    CUstream ev_stream[4];
    int ev_ctx[4];
};
static struct mobj objs[MAX_OBJS];
static int nobjs;

/* Contexts: slots 0 and 1 are the primary contexts of devices 0 and 1. */
#define NDEV 2
#define MAX_CTX 8
struct mctx {
    CUcontext h;
    int dev;
    bool primary;
    bool exists;   /* has a handle */
    bool alive;
    bool known;    /* the shim has set it up (allocation or stream made there) */
    bool green;    /* a green context's CUcontext (made and destroyed in op_green) */
    unsigned used_memory_of; /* contexts whose memory its kernels touched */
    /* a RELAXED capture of its per-thread stream (CU_STREAM_PER_THREAD or
     * stream 0 through a _ptsz entry point) */
    bool pt_capturing, pt_invalidated;
};
static struct mctx ctxs[MAX_CTX];
static int prim_refs[NDEV];

#define MAX_STREAMS 24
struct mstream {
    CUstream h;
    int ctx;
    bool alive;
    bool nonblocking;
    bool capturing;
    bool invalidated; /* its capture, by the program (a query of the stream) */
};
static struct mstream streams[MAX_STREAMS];
static int nstreams;

/* Host memory the program registers: one mapping for the whole process. (A
 * fresh one per input would let the kernel hand the range out again to the
 * test driver's pinned memory, which the driver's record of ranges freed by
 * context teardowns would then count as a destroyed context's.) */
#define REG_PAGES 32
#define PAGE 4096
static uint8_t *reg_arena;

static size_t device_capacity, host_capacity;
static bool pre125;          /* TESTDRIVER_VERSION below 12050 */
static bool touched_dead;    /* the program itself named a destroyed context */
static uint64_t dead_calls_before;
static uint64_t invalidated_before, invalidated_expected; /* captures the program invalidated */
static uint64_t foreign_before; /* testdrv_foreign_syncs at the input's start */
static CUgraph kept_graph;   /* from a capture, for cuStreamBeginCaptureToGraph */

enum cur { CUR_NONE, CUR_LIVE, CUR_DEAD };

/* The calling thread's current context, as the driver sees it. */
static enum cur current(int *slot)
{
    CUcontext h = NULL;
    if (cuCtxGetCurrent(&h) != CUDA_SUCCESS)
        FAIL("cuCtxGetCurrent failed");
    *slot = -1;
    if (!h)
        return CUR_NONE;
    for (int i = 0; i < MAX_CTX; i++)
        if (ctxs[i].exists && ctxs[i].h == h) {
            *slot = i;
            return ctxs[i].alive ? CUR_LIVE : CUR_DEAD;
        }
    FAIL("current context %p is not one of the model's", (void *)h);
}

static void expect_rc(const char *what, CUresult got, CUresult want)
{
    TRACE("  %s -> %d", what, (int)got);
    if (got != want)
        FAIL("%s returned %d, the driver would return %d", what, (int)got, (int)want);
}

/* Capacities, as the test driver counts them: -1 is pinned host memory,
 * shared by every device; 0..NDEV-1 are the devices' memories, each
 * device_capacity bytes. */
static size_t capacity_bytes(int cap)
{
    return cap < 0 ? host_capacity : device_capacity;
}

/* The capacity an allocation of kind k made in context slot counts
 * against: the host's, or for device-side kinds the device of that context
 * (a green context's slot holds its primary's device). slot must be a
 * context's for device-side kinds. */
static int alloc_capacity(enum mkind k, int slot)
{
    return on_device_capacity(k) ? ctxs[slot].dev : -1;
}

/* What the program holds live of capacity cap; its managed blocks only with
 * managed (a device moves managed pages out for its other allocations:
 * tests/driver/core.c, td_cap_take). An object's context is the one current
 * at its allocation (op_green records its block under the primary context,
 * of the same device). */
static size_t used_capacity(int cap, bool managed)
{
    size_t sum = 0;
    for (int i = 0; i < nobjs; i++)
        if (objs[i].state == LIVE && alloc_capacity(objs[i].kind, objs[i].ctx) == cap &&
            (managed || objs[i].kind != K_MANAGED))
            sum += objs[i].bytes; /* modules and libraries count 0 */
    /* cudefer's own pinned words (own.h) take room too. */
    if (cap < 0)
        sum += CUDEFER_WORD_BYTES * testdrv_live_sized(TESTDRV_HOST, CUDEFER_WORD_BYTES);
    return sum;
}

static struct mobj *live_at(uintptr_t key)
{
    for (int i = 0; i < nobjs; i++)
        if (objs[i].state == LIVE && objs[i].key == key)
            return &objs[i];
    return NULL;
}

static struct mobj *any_at(uintptr_t key)
{
    struct mobj *found = NULL;
    for (int i = 0; i < nobjs; i++)
        if (objs[i].key == key && objs[i].state != FORGOTTEN)
            found = &objs[i]; /* the newest */
    return found;
}

/* Is key inside [o->key, o->key + o->bytes) of a memory object in state st? */
static bool inside(uintptr_t key, enum ostate st)
{
    for (int i = 0; i < nobjs; i++)
        if (objs[i].state == st && is_memory(objs[i].kind) && key >= objs[i].key &&
            key - objs[i].key < objs[i].bytes)
            return true;
    return false;
}

static void add_obj(enum mkind kind, uintptr_t key, size_t bytes, int ctx, bool readonly)
{
    if (!key)
        FAIL("%s allocation returned a NULL address", kind_names[kind]);
    struct mobj *old = live_at(key);
    if (old)
        FAIL("%s allocation returned %#lx, which is live already (%s)", kind_names[kind],
             (unsigned long)key, kind_names[old->kind]);
    /* An address handed out again (the shim reuses released host and managed
     * blocks once their fence has passed): the old object is gone. */
    for (int i = 0; i < nobjs; i++)
        if (objs[i].key == key)
            objs[i].state = FORGOTTEN;
    if (nobjs == MAX_OBJS)
        FAIL("harness: too many objects");
    objs[nobjs++] = (struct mobj){.kind = kind, .key = key, .bytes = bytes, .ctx = ctx,
                                  .state = LIVE, .readonly = readonly};
    TRACE("  new %s %#lx bytes %zu ctx %d", kind_names[kind], (unsigned long)key, bytes, ctx);
    if (ctx >= 0)
        ctxs[ctx].known = true;
    if (kind != K_DEVICE && kind != K_MANAGED && kind != K_HOST)
        return;
    /* Nothing the program set on a block it released comes with a new one
     * (op_alter sets it; the shim's reuse must not hand it on). */
    unsigned sync = 9;
    CUresult rc = cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)key);
    if (rc != CUDA_SUCCESS || sync)
        FAIL("new %s block %#lx answers SYNC_MEMOPS %u (%d), not 0", kind_names[kind],
             (unsigned long)key, sync, (int)rc);
    if (testdrv_dmabuf_exported((CUdeviceptr)key))
        FAIL("new %s block %#lx was exported as a dma-buf before", kind_names[kind],
             (unsigned long)key);
    static const CUmem_range_attribute attrs[] = {CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY,
                                                  CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                                                  CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION};
    for (size_t i = 0; kind == K_MANAGED && i < sizeof attrs / sizeof attrs[0]; i++) {
        int v = 7, want = i == 0 ? 0 : CU_DEVICE_INVALID;
        rc = cuMemRangeGetAttribute(&v, sizeof v, attrs[i], (CUdeviceptr)key, bytes);
        if (rc != CUDA_SUCCESS || v != want)
            FAIL("new managed block %#lx answers range attribute %d = %d (%d), not %d",
                 (unsigned long)key, (int)attrs[i], v, (int)rc, want);
    }
}

/* ---- invariants after every operation ----------------------------------- */

static void check_always(void)
{
    if (testdrv_faults())
        FAIL("a kernel touched memory that was not live (%llu faults)",
             (unsigned long long)testdrv_faults());
    /* The program makes no stream wait for another context's work. */
    if (testdrv_foreign_syncs() != foreign_before)
        FAIL("a synchronisation waited for unfinished work of another context");
    uint64_t invalidated = testdrv_invalidated_captures() - invalidated_before;
    if (invalidated != invalidated_expected)
        FAIL("%llu stream captures were invalidated, the program invalidated %llu",
             (unsigned long long)invalidated, (unsigned long long)invalidated_expected);
}

/* ---- kernels that wait for the host; the no-wait table ------------------ */

/* Before every operation each live context gets a kernel that spins until
 * the host sets a flag (testdrv_launch_spin, on a stream of the harness's
 * own). A call that cudefer promises never waits is then measured:
 * testdrv_thread_wait_calls and testdrv_thread_blocked_ns around it. A
 * call allowed to wait (synchronisations, cudefer_flush, context
 * teardowns, an allocation that cannot fit without what cudefer gives back,
 * a registration over a range whose unregister may be pending, module
 * loads, which wait in the driver too, cuMemHostUnregister, which may wait
 * for the work submitted before it) first sets the flag (spin_stop). A
 * helper thread sets the flag of a call stuck for a second, which then
 * fails its check instead of hanging. */
#define SPIN_FLAGS 4096
#define NO_WAIT_BLOCKED_NS 2000000u
#define RECLAIM_SLACK ((size_t)64 << 10) /* cudefer's own small allocations */
static volatile int spin_flags[SPIN_FLAGS];
static unsigned spin_gen;             /* the flag of the kernels running now */
static unsigned spin_of[MAX_CTX];     /* spin_gen + 1 of a context's kernel; 0: none */
static CUstream spin_stream[MAX_CTX]; /* the harness's stream in a context */
static _Atomic uint64_t op_started_ns; /* the operation under way, for the helper */
static _Atomic bool helper_fired;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void spin_stop(void)
{
    unsigned g = __atomic_load_n(&spin_gen, __ATOMIC_RELAXED);
    __atomic_store_n(&spin_flags[g % SPIN_FLAGS], 1, __ATOMIC_RELAXED);
    __atomic_store_n(&spin_flags[(g + 1) % SPIN_FLAGS], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&spin_gen, g + 1, __ATOMIC_RELAXED);
}

static bool judged_call(const char *what);

/* The flags of kernels that wait for the caller of one call, in the other
 * contexts (others_wait_for_me): a new one for each call, since such a
 * kernel may start only after the call has returned and set its flag. */
#define MINE_FLAGS 4096
static volatile int mine_flags[MINE_FLAGS];
static unsigned mine_gen;

static void *spin_helper(void *arg)
{
    (void)arg;
    for (;;) {
        usleep(50000);
        uint64_t t = atomic_load(&op_started_ns);
        if (t && now_ns() - t > 1000000000u) {
            unsigned g = __atomic_load_n(&spin_gen, __ATOMIC_RELAXED);
            __atomic_store_n(&spin_flags[g % SPIN_FLAGS], 1, __ATOMIC_RELAXED);
            unsigned m = __atomic_load_n(&mine_gen, __ATOMIC_RELAXED);
            __atomic_store_n(&mine_flags[m % MINE_FLAGS], 1, __ATOMIC_RELAXED);
            atomic_store(&helper_fired, true);
        }
    }
    return NULL;
}

/* Before a call that may wait for its own context's work only (the driver
 * would wait for nothing else): the kernels that wait for the host are
 * released, and each other live context (but green ones, whose work is
 * their primary context's) gets one that waits for this thread, which
 * ends it once the call has returned (others_done). A call that waits for
 * them is stuck until the helper lets them go after a second: the driver
 * alone would have returned. Found by hand first: cuMemHostUnregister
 * waited for ever for a kernel of another context that waited for its
 * caller (bench/RESULTS.md, run 94). With dev not -1, only the contexts of
 * the other devices get one (a call that may wait for its device's work). */
static void others_wait_for_me(int own, int dev)
{
    /* A green context's memory is its primary context's (slot = device). */
    int owner = own >= 0 && ctxs[own].green ? ctxs[own].dev : own;
    spin_stop();
    unsigned g = mine_gen + 1;
    __atomic_store_n(&mine_flags[g % MINE_FLAGS], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&mine_gen, g, __ATOMIC_RELAXED);
    for (int c = 0; c < MAX_CTX; c++)
        if (c != own && c != owner && ctxs[c].alive && !ctxs[c].green && spin_stream[c] &&
            (dev < 0 || ctxs[c].dev != dev)) {
            TRACE("  a kernel of context %d (%p; own %d %p) waits for this thread", c,
                  (void *)ctxs[c].h, own, own >= 0 ? (void *)ctxs[own].h : NULL);
            expect_rc("testdrv_launch_spin (waits for this thread)",
                      testdrv_launch_spin(spin_stream[c], &mine_flags[g % MINE_FLAGS]),
                      CUDA_SUCCESS);
        }
    atomic_store(&helper_fired, false);
    /* The helper's second counts from the call. */
    atomic_store(&op_started_ns, now_ns());
}

static void others_done(const char *what)
{
    uint64_t took = now_ns() - atomic_load(&op_started_ns);
    bool fired = atomic_load(&helper_fired);
    __atomic_store_n(&mine_flags[mine_gen % MINE_FLAGS], 1, __ATOMIC_RELAXED);
    if (fired && judged_call(what))
        FAIL("%s waited for a kernel of another context that waited for its caller (the "
             "helper let it go after a second; the call took %.1f ms)", what, (double)took / 1e6);
}

static void spin_start(void)
{
    for (int c = 0; c < MAX_CTX; c++) {
        if (!ctxs[c].alive || ctxs[c].green || spin_of[c] == spin_gen + 1)
            continue;
        if (!spin_stream[c]) {
            CUcontext popped;
            expect_rc("cuCtxPushCurrent", cuCtxPushCurrent(ctxs[c].h), CUDA_SUCCESS);
            expect_rc("cuStreamCreate (the harness's)",
                      cuStreamCreate(&spin_stream[c], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
            expect_rc("cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
            ctxs[c].known = true;
        }
        expect_rc("testdrv_launch_spin",
                  testdrv_launch_spin(spin_stream[c], &spin_flags[spin_gen % SPIN_FLAGS]),
                  CUDA_SUCCESS);
        spin_of[c] = spin_gen + 1;
    }
}

struct nowait {
    const char *what;
    uint64_t wait_calls, blocked_ns;
    bool others; /* kernels of other devices wait for the call (alloc_begin) */
};

/* FUZZ_API_UNJUDGED: names of calls (as the failure messages write them,
 * comma-separated) not to judge, to look past a known finding;
 * FUZZ_API_SKIP: operations (as the failure messages name them:
 * "green", "capture", ...) left out, to the same end ("pages" leaves out
 * the checks of registered pages). */
static const char *unjudged, *skipped;

static bool judged_call(const char *what)
{
    size_t n = strcspn(what, " (");
    for (const char *p = unjudged; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] != 0)) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, what, n) == 0)
            return false;
    }
    return true;
}

static void nowait_begin(struct nowait *m, const char *what)
{
    m->what = what;
    atomic_store(&helper_fired, false);
    m->wait_calls = testdrv_thread_wait_calls();
    m->blocked_ns = testdrv_thread_blocked_ns();
}

/* valid: the driver accepts the call (the model's answer is CUDA_SUCCESS):
 * then no call that may wait reaches the driver at all. An invalid one may
 * reach it (the driver rejects it at once) but must not block. */
static void nowait_end(const struct nowait *m, bool valid)
{
    uint64_t dwait = testdrv_thread_wait_calls() - m->wait_calls;
    uint64_t dblocked = testdrv_thread_blocked_ns() - m->blocked_ns;
    if (!judged_call(m->what))
        return;
    if ((valid && dwait) || dblocked >= NO_WAIT_BLOCKED_NS || atomic_load(&helper_fired))
        FAIL("%s must not wait, yet it made %llu "
             "calls that may wait and was blocked %.2f ms in the driver%s", m->what,
             (unsigned long long)dwait, (double)dblocked / 1e6,
             atomic_load(&helper_fired) ? " (stuck: the helper released the kernels)" : "");
}

/* Would an allocation of bytes of kind k, with context slot current, fail
 * without what cudefer gives back (what the driver holds of its capacity,
 * pending frees included)? Without a current context (slot -1) a
 * device-side allocation fails at the context check, before any reclaim. */
static bool needs_reclaim(enum mkind k, int slot, size_t bytes)
{
    if (on_device_capacity(k) && slot < 0)
        return false;
    int cap = alloc_capacity(k, slot);
    size_t used = testdrv_capacity_used(cap);
    if (cap >= 0 && k != K_MANAGED) {
        /* The driver moves up to bytes of resident managed memory out. */
        size_t out = testdrv_managed_resident(cap);
        used -= out < bytes ? out : bytes;
    }
    return used + bytes + RECLAIM_SLACK > capacity_bytes(cap);
}

/* ---- registered pages: kernels that wrote them, canaries --------------- */

static bool page_canary[REG_PAGES];

static unsigned char canary_byte(int page, size_t i)
{
    unsigned char a = (unsigned char)(0xA1 + page * 3);
    return i % 2 ? a : (unsigned char)(a ^ 0x3C);
}

/* After the registration of [key, key + bytes) ended (its unregister or its
 * context's teardown returned): nothing may write the pages any more. */
static void canary_fill(uintptr_t key, size_t bytes)
{
    for (uintptr_t p = key; p < key + bytes; p += PAGE) {
        int page = (int)((p - (uintptr_t)reg_arena) / PAGE);
        for (size_t i = 0; i < PAGE; i++)
            reg_arena[(size_t)page * PAGE + i] = canary_byte(page, i);
        page_canary[page] = true;
    }
}

static void canary_check(int first, int count)
{
    if (skipped && strstr(skipped, "pages"))
        return;
    for (int page = first; page < first + count; page++) {
        if (!page_canary[page])
            continue;
        for (size_t i = 0; i < PAGE; i++)
            if (reg_arena[(size_t)page * PAGE + i] != canary_byte(page, i))
                FAIL("arena page %d was written after its registration ended (byte %zu: %#x)",
                     page, i, reg_arena[(size_t)page * PAGE + i]);
        page_canary[page] = false;
    }
}

/* The program waits for the kernels of other contexts that use o's
 * registered pages before it unregisters them, as it must without cudefer:
 * the driver's unregister does not wait for them, cudefer's for 5 ms at
 * most (README, limits), and under load 5 ms pass. Readers have no events
 * (writers do), so the contexts whose kernels touched memory of o's
 * context, the writers' among them, are synchronised (found at the end of
 * an input: a reader of another context faulted on pages unregistered
 * there). */
static void wait_foreign_users(struct mobj *o)
{
    for (int i = 0; o->ctx >= 0 && i < MAX_CTX; i++)
        if (i != o->ctx && ctxs[i].alive && (ctxs[i].used_memory_of & 1u << o->ctx))
            expect_rc("cuCtxSynchronize_v2", cuCtxSynchronize_v2(ctxs[i].h), CUDA_SUCCESS);
}

static void drop_events(struct mobj *o, int only_ctx, bool destroy)
{
    for (int k = 0; k < 4; k++) {
        if (!o->ev[k] || (only_ctx >= 0 && o->ev_ctx[k] != only_ctx))
            continue;
        if (destroy)
            cuEventDestroy(o->ev[k]);
        o->ev[k] = NULL;
        o->ev_stream[k] = NULL;
    }
}

/* ---- contexts ------------------------------------------------------------ */

/* A graph a capture returned: kept (the first) for cuStreamBeginCaptureToGraph,
 * or destroyed. */
static void got_graph(CUgraph g)
{
    if (!g || g == kept_graph)
        return;
    if (!kept_graph)
        kept_graph = g;
    else
        cuGraphDestroy(g);
}

static void end_capture(struct mstream *s)
{
    CUgraph g = NULL;
    struct nowait m = {0};
    nowait_begin(&m, "cuStreamEndCapture");
    CUresult rc = cuStreamEndCapture(s->h, &g);
    nowait_end(&m, true);
    expect_rc("cuStreamEndCapture", rc,
              s->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS);
    got_graph(g);
    s->capturing = s->invalidated = false;
}

/* Ends the capture of context c's per-thread stream (made current for it). */
static void end_pt_capture(int c, bool ptsz)
{
    CUcontext popped;
    CUgraph g = NULL;
    struct nowait m = {0};
    expect_rc("cuCtxPushCurrent", cuCtxPushCurrent(ctxs[c].h), CUDA_SUCCESS);
    CUresult (*end_ptsz)(CUstream, CUgraph *) =
        (CUresult(*)(CUstream, CUgraph *))dlsym(RTLD_DEFAULT, "cuStreamEndCapture_ptsz");
    nowait_begin(&m, ptsz ? "cuStreamEndCapture_ptsz(0)"
                          : "cuStreamEndCapture(CU_STREAM_PER_THREAD)");
    CUresult rc = ptsz ? end_ptsz(NULL, &g) : cuStreamEndCapture(CU_STREAM_PER_THREAD, &g);
    nowait_end(&m, true);
    expect_rc("cuStreamEndCapture of the per-thread stream", rc,
              ctxs[c].pt_invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS);
    expect_rc("cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    got_graph(g);
    ctxs[c].pt_capturing = ctxs[c].pt_invalidated = false;
}

/* Before context c goes: its captures end, and contexts whose kernels used
 * its memory finish them (the teardown frees that memory under them). */
static void before_teardown(int c)
{
    spin_stop(); /* a teardown may wait (and so may the synchronisations below) */
    if (ctxs[c].pt_capturing)
        end_pt_capture(c, false);
    for (int i = 0; i < nstreams; i++)
        if (streams[i].alive && streams[i].ctx == c && streams[i].capturing)
            end_capture(&streams[i]);
    for (int i = 0; i < MAX_CTX; i++)
        if (i != c && ctxs[i].alive && (ctxs[i].used_memory_of & 1u << c))
            expect_rc("cuCtxSynchronize_v2", cuCtxSynchronize_v2(ctxs[i].h), CUDA_SUCCESS);
}

/* The model's side of a context teardown. */
static void torn_down(int c)
{
    TRACE("  context %d torn down", c);
    ctxs[c].alive = false;
    ctxs[c].known = false;
    ctxs[c].used_memory_of = 0;
    for (int i = 0; i < MAX_CTX; i++)
        ctxs[i].used_memory_of &= ~(1u << c);
    for (int i = 0; i < nstreams; i++)
        if (streams[i].ctx == c)
            streams[i].alive = false;
    spin_stream[c] = NULL;
    spin_of[c] = 0;
    ctxs[c].pt_capturing = ctxs[c].pt_invalidated = false;
    for (int i = 0; i < nobjs; i++) {
        drop_events(&objs[i], c, false); /* the events of its streams went with it */
        if (objs[i].ctx == c && objs[i].kind == K_LIBRARY)
            objs[i].loaded = false; /* its load into c went with c: nothing to wait for */
        if (objs[i].ctx != c || objs[i].kind == K_LIBRARY)
            continue;
        if (objs[i].state == LIVE) {
            objs[i].state = TORN;
            if (objs[i].kind == K_REGISTERED) /* the teardown undid it */
                canary_fill(objs[i].key, objs[i].bytes);
        } else if (objs[i].state == RELEASED) {
            objs[i].state = RELEASED_TORN;
        }
    }
}

static void op_ctx_create(struct input *in)
{
    int dev = (int)(u8(in) % NDEV);
    int slot = -1;
    for (int i = NDEV; i < MAX_CTX; i++)
        if (!ctxs[i].exists) {
            slot = i;
            break;
        }
    if (slot < 0)
        return;
    CUcontext h;
    static const char *const names[] = {"cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3",
                                        "cuCtxCreate_v4"};
    unsigned version = u8(in) % 4;
    void *fn = dlsym(RTLD_DEFAULT, names[version]);
    struct nowait m = {0};
    CUresult rc;
    nowait_begin(&m, names[version]);
    if (version < 2)
        rc = ((CUresult(*)(CUcontext *, unsigned, CUdevice))fn)(&h, 0, (CUdevice)dev);
    else if (version == 2)
        rc = ((CUresult(*)(CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice))fn)(
            &h, NULL, 0, 0, (CUdevice)dev);
    else
        rc = cuCtxCreate(&h, NULL, 0, (CUdevice)dev);
    nowait_end(&m, true);
    expect_rc(names[version], rc, CUDA_SUCCESS);
    /* The shim sets a context up when it is created (or retained). */
    ctxs[slot] = (struct mctx){.h = h, .dev = dev, .exists = true, .alive = true, .known = true};
}

static void op_ctx_destroy(struct input *in)
{
    int c = NDEV + (int)(u8(in) % (MAX_CTX - NDEV));
    if (!ctxs[c].exists)
        return;
    if (!ctxs[c].alive) {
        touched_dead = true;
        expect_rc("cuCtxDestroy of a destroyed context", cuCtxDestroy(ctxs[c].h),
                  CUDA_ERROR_INVALID_CONTEXT);
        return;
    }
    before_teardown(c);
    expect_rc("cuCtxDestroy", cuCtxDestroy(ctxs[c].h), CUDA_SUCCESS);
    torn_down(c);
}

/* A context the program may make current (not a green context's, which
 * op_green uses on its own). */
static int pick_ctx(struct input *in)
{
    int c = (int)(u8(in) % (MAX_CTX + 1));
    return c < MAX_CTX && ctxs[c].exists && !ctxs[c].green ? c : -1;
}

static void op_ctx_set(struct input *in)
{
    int c = pick_ctx(in);
    if (c < 0) {
        expect_rc("cuCtxSetCurrent(NULL)", cuCtxSetCurrent(NULL), CUDA_SUCCESS);
        return;
    }
    /* A destroyed user context is refused; an inactive primary one is
     * accepted (and calls then fail with CONTEXT_IS_DESTROYED). */
    CUresult want = !ctxs[c].alive && !ctxs[c].primary ? CUDA_ERROR_INVALID_CONTEXT
                                                       : CUDA_SUCCESS;
    if (!ctxs[c].alive)
        touched_dead = true;
    expect_rc("cuCtxSetCurrent", cuCtxSetCurrent(ctxs[c].h), want);
}

static void op_ctx_push_pop(struct input *in)
{
    int c = pick_ctx(in);
    if (c < 0) {
        CUcontext popped;
        cuCtxPopCurrent(&popped); /* fails on an empty stack; either is fine */
        return;
    }
    if (!ctxs[c].alive)
        touched_dead = true;
    CUresult want = !ctxs[c].alive && !ctxs[c].primary ? CUDA_ERROR_INVALID_CONTEXT
                                                       : CUDA_SUCCESS;
    expect_rc("cuCtxPushCurrent", cuCtxPushCurrent(ctxs[c].h), want);
}

static void op_primary(struct input *in)
{
    unsigned b = u8(in);
    int dev = (int)(b % NDEV);
    struct mctx *c = &ctxs[dev];
    switch (b / NDEV % 4) {
    case 0:
    case 1: { /* retain (and make current half of the time) */
        CUcontext h;
        struct nowait m = {0};
        nowait_begin(&m, "cuDevicePrimaryCtxRetain");
        CUresult rc = cuDevicePrimaryCtxRetain(&h, (CUdevice)dev);
        nowait_end(&m, true);
        expect_rc("cuDevicePrimaryCtxRetain", rc, CUDA_SUCCESS);
        if (c->exists && c->h != h)
            FAIL("the primary context of device %d changed handle", dev);
        if (!c->alive)
            *c = (struct mctx){.h = h, .dev = dev, .primary = true, .exists = true,
                               .alive = true, .known = true};
        prim_refs[dev]++;
        if (b & 0x80)
            expect_rc("cuCtxSetCurrent", cuCtxSetCurrent(h), CUDA_SUCCESS);
        break;
    }
    case 2: /* release */
        if (!prim_refs[dev]) {
            expect_rc("cuDevicePrimaryCtxRelease of an inactive context",
                      cuDevicePrimaryCtxRelease((CUdevice)dev), CUDA_ERROR_INVALID_CONTEXT);
            break;
        }
        if (prim_refs[dev] == 1) {
            before_teardown(dev); /* the last release: allowed to wait */
            expect_rc("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease((CUdevice)dev),
                      CUDA_SUCCESS);
        } else {
            struct nowait m = {0};
            nowait_begin(&m, "cuDevicePrimaryCtxRelease (not the last)");
            CUresult rc = cuDevicePrimaryCtxRelease((CUdevice)dev);
            nowait_end(&m, true);
            expect_rc("cuDevicePrimaryCtxRelease", rc, CUDA_SUCCESS);
        }
        if (--prim_refs[dev] == 0)
            torn_down(dev);
        break;
    case 3: /* reset */
        spin_stop();
        if (c->alive)
            before_teardown(dev);
        expect_rc("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset((CUdevice)dev),
                  CUDA_SUCCESS);
        if (c->alive)
            torn_down(dev);
        prim_refs[dev] = 0;
        break;
    }
}

/* What the driver answers a call that needs a usable current context. */
static CUresult context_front(int *slot)
{
    switch (current(slot)) {
    case CUR_NONE: return CUDA_ERROR_INVALID_CONTEXT;
    case CUR_DEAD: touched_dead = true; return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    case CUR_LIVE: break;
    }
    return CUDA_SUCCESS;
}

/* cuMemGetInfo or its 32-bit twin: the driver's answer for the current
 * context (its error where there is no usable one), which never waits.
 * cudefer adds only memory the program released, so the free figure is
 * never above the capacity less what the program holds live. */
static void op_meminfo(struct input *in)
{
    typedef CUresult (*info32_fn)(unsigned *, unsigned *);
    static info32_fn info32;
    if (!info32)
        info32 = (info32_fn)dlsym(RTLD_DEFAULT, "cuMemGetInfo");
    int slot;
    CUresult want = context_front(&slot), rc;
    size_t free = 0, total = 0;
    struct nowait m = {0};
    if (u8(in) & 1) {
        nowait_begin(&m, "cuMemGetInfo_v2");
        rc = cuMemGetInfo_v2(&free, &total);
        nowait_end(&m, true);
    } else {
        unsigned f = 0, t = 0;
        nowait_begin(&m, "cuMemGetInfo");
        rc = info32(&f, &t);
        nowait_end(&m, true);
        free = f;
        total = t;
    }
    expect_rc("cuMemGetInfo", rc, want);
    if (rc != CUDA_SUCCESS)
        return;
    /* The answer is for the current context's device; managed pages may
     * have moved out of it. */
    int dev = ctxs[slot].dev;
    size_t live = used_capacity(dev, false);
    if (total != device_capacity || free > total - live)
        FAIL("cuMemGetInfo said %zu bytes free of %zu; device %d's capacity is %zu and the "
             "program holds %zu live there", free, total, dev, device_capacity, live);
}

static void op_sync(struct input *in)
{
    spin_stop(); /* allowed to wait */
    if (u8(in) & 1) {
        int c = pick_ctx(in);
        if (c < 0 || !ctxs[c].alive)
            return;
        expect_rc("cuCtxSynchronize_v2", cuCtxSynchronize_v2(ctxs[c].h), CUDA_SUCCESS);
        return;
    }
    int slot;
    expect_rc("cuCtxSynchronize", cuCtxSynchronize(), context_front(&slot));
}

/* ---- streams, kernels, captures ------------------------------------------ */

static void op_stream_create(struct input *in)
{
    unsigned flags = u8(in) & 1 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    int slot;
    CUresult want = context_front(&slot);
    CUstream s = NULL;
    struct nowait m = {0};
    nowait_begin(&m, "cuStreamCreate");
    CUresult rc = cuStreamCreate(&s, flags);
    nowait_end(&m, want == CUDA_SUCCESS);
    expect_rc("cuStreamCreate", rc, want);
    if (want != CUDA_SUCCESS)
        return;
    ctxs[slot].known = true;
    int i = nstreams < MAX_STREAMS ? nstreams++ : -1;
    if (i < 0) {
        expect_rc("cuStreamDestroy", cuStreamDestroy(s), CUDA_SUCCESS);
        return;
    }
    streams[i] = (struct mstream){.h = s, .ctx = slot, .alive = true,
                                  .nonblocking = flags == CU_STREAM_NON_BLOCKING};
}

static struct mstream *pick_stream(struct input *in)
{
    if (!nstreams)
        return NULL;
    struct mstream *s = &streams[u8(in) % nstreams];
    return s->alive ? s : NULL;
}

/* Destroys a stream; one that captures is destroyed in the middle of its
 * capture half of the time (the capture is then invalidated and ends). */
static void op_stream_destroy(struct input *in)
{
    struct mstream *s = pick_stream(in);
    bool mid_capture = u8(in) & 1;
    if (!s)
        return;
    if (s->capturing && !mid_capture)
        end_capture(s);
    struct nowait m = {0};
    nowait_begin(&m, s->capturing ? "cuStreamDestroy (in the middle of a capture)"
                                   : "cuStreamDestroy");
    CUresult rc = cuStreamDestroy(s->h);
    nowait_end(&m, true);
    expect_rc("cuStreamDestroy", rc, CUDA_SUCCESS);
    if (s->capturing && !s->invalidated)
        invalidated_expected++;
    s->alive = s->capturing = s->invalidated = false;
}

typedef CUresult (*capture_fn)(CUstream);
typedef CUresult (*capture_v2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*to_graph_fn)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                                size_t, CUstreamCaptureMode);

/* Begins a RELAXED capture: of a created stream (cuStreamBeginCapture_v2,
 * or cuStreamBeginCaptureToGraph), or of the current context's per-thread
 * stream (CU_STREAM_PER_THREAD, or stream 0 through cuStreamBeginCapture_v2_ptsz
 * or cuStreamBeginCaptureToGraph_ptsz); ends one (through either name);
 * invalidates one (a query of its stream: the program's doing); or makes a
 * GLOBAL capture of a launch (cuStreamBeginCapture, cuStreamBeginCapture_ptsz)
 * that ends at once. */
static void op_capture(struct input *in)
{
    unsigned how = u8(in), b = u8(in);
    const CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    struct nowait m = {0};
    CUresult rc;
    int slot;
    if (how % 4 == 0 || how % 4 == 1) { /* a created stream */
        struct mstream *s = pick_stream(in);
        if (!s)
            return;
        if (s->capturing && !s->invalidated && b % 4 == 0) {
            expect_rc("cuStreamQuery of a capturing stream", cuStreamQuery(s->h),
                      CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            s->invalidated = true;
            invalidated_expected++;
        } else if (s->capturing) {
            end_capture(s);
        } else if (how % 4 == 1 && kept_graph) {
            nowait_begin(&m, "cuStreamBeginCaptureToGraph");
            rc = cuStreamBeginCaptureToGraph(s->h, kept_graph, NULL, NULL, 0, relaxed);
            nowait_end(&m, true);
            expect_rc("cuStreamBeginCaptureToGraph", rc, CUDA_SUCCESS);
            s->capturing = true;
        } else {
            nowait_begin(&m, "cuStreamBeginCapture_v2");
            rc = cuStreamBeginCapture_v2(s->h, relaxed);
            nowait_end(&m, true);
            expect_rc("cuStreamBeginCapture_v2", rc, CUDA_SUCCESS);
            s->capturing = true;
        }
        return;
    }
    if (current(&slot) != CUR_LIVE)
        return;
    struct mctx *c = &ctxs[slot];
    if (how % 4 == 2) { /* the per-thread stream */
        if (c->pt_capturing && !c->pt_invalidated && b % 4 == 0) {
            expect_rc("cuStreamQuery of the capturing per-thread stream",
                      cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            c->pt_invalidated = true;
            invalidated_expected++;
        } else if (c->pt_capturing) {
            end_pt_capture(slot, b & 1);
        } else {
            const char *name = b & 2 ? kept_graph ? "cuStreamBeginCaptureToGraph_ptsz"
                                                  : "cuStreamBeginCapture_v2_ptsz"
                                     : "cuStreamBeginCapture_v2(CU_STREAM_PER_THREAD)";
            void *fn = dlsym(RTLD_DEFAULT, b & 2 ? kept_graph ? "cuStreamBeginCaptureToGraph_ptsz"
                                                              : "cuStreamBeginCapture_v2_ptsz"
                                                 : "cuStreamBeginCapture_v2");
            nowait_begin(&m, name);
            if (!(b & 2))
                rc = ((capture_v2_fn)fn)(CU_STREAM_PER_THREAD, relaxed);
            else if (kept_graph)
                rc = ((to_graph_fn)fn)(NULL, kept_graph, NULL, NULL, 0, relaxed);
            else
                rc = ((capture_v2_fn)fn)(NULL, relaxed);
            nowait_end(&m, true);
            expect_rc(name, rc, CUDA_SUCCESS);
            c->pt_capturing = true;
        }
        return;
    }
    /* A GLOBAL capture of one launch: the thread makes no other call
     * meanwhile. */
    struct mstream *s = b & 1 ? pick_stream(in) : NULL;
    if ((b & 1) && (!s || s->capturing || s->ctx != slot))
        return;
    if (!(b & 1) && c->pt_capturing)
        return;
    CUstream h = s ? s->h : NULL;
    capture_fn begin = (capture_fn)dlsym(RTLD_DEFAULT, s ? "cuStreamBeginCapture"
                                                         : "cuStreamBeginCapture_ptsz");
    nowait_begin(&m, s ? "cuStreamBeginCapture (GLOBAL)" : "cuStreamBeginCapture_ptsz (GLOBAL)");
    rc = begin(h);
    nowait_end(&m, true);
    expect_rc("cuStreamBeginCapture (GLOBAL)", rc, CUDA_SUCCESS);
    expect_rc("testdrv_launch (captured)", testdrv_launch(s ? h : CU_STREAM_PER_THREAD, 10, 0, 0,
                                                          TESTDRV_NONE), CUDA_SUCCESS);
    CUgraph g = NULL;
    CUresult (*end_ptsz)(CUstream, CUgraph *) =
        (CUresult(*)(CUstream, CUgraph *))dlsym(RTLD_DEFAULT, "cuStreamEndCapture_ptsz");
    nowait_begin(&m, "cuStreamEndCapture (GLOBAL)");
    rc = s ? cuStreamEndCapture(h, &g) : end_ptsz(NULL, &g);
    nowait_end(&m, true);
    expect_rc("cuStreamEndCapture (GLOBAL)", rc, CUDA_SUCCESS);
    got_graph(g);
}

static bool blocking_capture_in(int c)
{
    if (ctxs[c].pt_capturing)
        return true; /* a per-thread stream is a blocking one */
    for (int i = 0; i < nstreams; i++)
        if (streams[i].alive && streams[i].ctx == c && streams[i].capturing &&
            !streams[i].nonblocking)
            return true;
    return false;
}

static void op_launch(struct input *in)
{
    unsigned which = u8(in), what = u8(in), how = u8(in);
    unsigned usec = u8(in) * 8;
    /* The stream: a user stream, or the current context's legacy or
     * per-thread default stream. */
    CUstream h;
    int sctx;
    bool user = false, per_thread = false, captured;
    if (nstreams && which % 4 != 3) {
        struct mstream *s = &streams[which / 4 % nstreams];
        if (!s->alive || s->invalidated)
            return; /* work on an invalidated capture fails, as the program knows */
        h = s->h;
        sctx = s->ctx;
        user = true;
        captured = s->capturing;
    } else {
        if (current(&sctx) != CUR_LIVE)
            return;
        per_thread = which & 0x80;
        if (!per_thread && blocking_capture_in(sctx))
            return; /* the legacy stream would invalidate that capture */
        if (per_thread && ctxs[sctx].pt_invalidated)
            return;
        h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
        captured = per_thread && ctxs[sctx].pt_capturing;
    }
    struct mobj *writes_registered = NULL;
    /* The memory: a live object, or none. */
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    enum testdrv_access access = TESTDRV_NONE;
    int n = 0;
    for (int i = 0; i < nobjs; i++)
        n += objs[i].state == LIVE && is_memory(objs[i].kind);
    if (n && what % 8 != 0) {
        int k = (int)(what / 8 % (unsigned)n);
        struct mobj *o = NULL;
        for (int i = 0; i < nobjs; i++)
            if (objs[i].state == LIVE && is_memory(objs[i].kind) && k-- == 0) {
                o = &objs[i];
                break;
            }
        size_t off = o->bytes > 1 ? how % o->bytes : 0;
        bool cross = o->ctx != sctx;
        if (cross && (!ctxs[sctx].known || (pre125 && !user)))
            return; /* outside what the shim promises (see the file comment) */
        if (pre125 && per_thread)
            return;
        ptr = (CUdeviceptr)(o->key + off);
        bytes = o->bytes - off;
        access = o->readonly || (how & 0x80) ? TESTDRV_READ : TESTDRV_WRITE;
        if (cross)
            ctxs[sctx].used_memory_of |= 1u << o->ctx;
        if (o->kind == K_REGISTERED && access == TESTDRV_WRITE && !captured)
            writes_registered = o;
    }
    /* A kernel that writes registered pages: an event after it (in the
     * stream's context) tells, at the unregister, whether it has finished. */
    int slot = -1;
    if (writes_registered) {
        struct mobj *o = writes_registered;
        for (int k = 0; k < 4 && slot < 0; k++)
            if (o->ev[k] && o->ev_stream[k] == h && o->ev_ctx[k] == sctx)
                slot = k;
        for (int k = 0; k < 4 && slot < 0; k++)
            if (!o->ev[k])
                slot = k;
        if (slot < 0)
            access = TESTDRV_READ; /* no event left: this one only reads */
    }
    expect_rc("testdrv_launch", testdrv_launch(h, usec, ptr, bytes, access), CUDA_SUCCESS);
    if (slot >= 0) {
        struct mobj *o = writes_registered;
        CUcontext popped;
        if (!o->ev[slot]) {
            expect_rc("cuCtxPushCurrent", cuCtxPushCurrent(ctxs[sctx].h), CUDA_SUCCESS);
            expect_rc("cuEventCreate", cuEventCreate(&o->ev[slot], CU_EVENT_DISABLE_TIMING),
                      CUDA_SUCCESS);
            expect_rc("cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
        }
        o->ev_stream[slot] = h;
        o->ev_ctx[slot] = sctx;
        expect_rc("cuEventRecord", cuEventRecord(o->ev[slot], h), CUDA_SUCCESS);
    }
}

/* ---- allocations --------------------------------------------------------- */

static size_t pick_size(struct input *in)
{
    static const size_t sizes[] = {1, 100, 4096, 4096, 65536, 1 << 20, 3 << 20, 4097};
    unsigned b = u8(in);
    return b < 192 ? sizes[b % 8] : (size_t)u16(in) * 64 + 1;
}

static CUresult alloc_front(enum mkind kind, int *slot, size_t bytes)
{
    CUresult rc = context_front(slot);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* What the program holds live of the allocation's capacity must be all
     * that counts: memory held on another device, or of the other kind,
     * cannot serve it. */
    int cap = alloc_capacity(kind, *slot);
    bool managed_stays = cap < 0 || kind == K_MANAGED;
    return used_capacity(cap, managed_stays) + bytes <= capacity_bytes(cap)
               ? CUDA_SUCCESS
               : CUDA_ERROR_OUT_OF_MEMORY;
}

/* An out-of-memory answer where the model says it cannot fit is right; so is
 * a success of a kind the shim reuses released blocks for. */
static void expect_alloc(const char *what, enum mkind kind, CUresult got, CUresult want)
{
    if (want == CUDA_ERROR_OUT_OF_MEMORY && got == CUDA_SUCCESS &&
        (kind == K_HOST || kind == K_MANAGED))
        return;
    expect_rc(what, got, want);
}

/* Before an allocating call: one that cannot fit without what cudefer gives
 * back is allowed to wait (the kernels that wait for the host are released
 * first, and it is not judged); true when it is judged. */
static bool alloc_begin(struct nowait *m, const char *what, enum mkind k, int slot,
                        size_t bytes)
{
    m->what = what;
    m->others = false;
    if (needs_reclaim(k, slot, bytes)) {
        /* Another device's memory cannot serve a device allocation (nor
         * managed memory, which the device moves out itself): the kernels
         * of the other device's contexts wait for this call, which must
         * not wait for them (they may be a collective waiting for this
         * thread's next launch). */
        if (on_device_capacity(k) && k != K_MANAGED && slot >= 0) {
            others_wait_for_me(slot, ctxs[slot].dev);
            m->others = true;
        } else {
            spin_stop();
        }
        return false;
    }
    nowait_begin(m, what);
    return true;
}

static void alloc_end(const struct nowait *m, bool judged, CUresult want)
{
    if (m->others)
        others_done(m->what);
    if (judged)
        nowait_end(m, want == CUDA_SUCCESS);
}

/* Does [lo, lo + n) overlap a registration the program released, whose
 * unregister cudefer may still hold? */
static bool overlaps_released_registration(uintptr_t lo, size_t n)
{
    for (int i = 0; i < nobjs; i++)
        if (objs[i].kind == K_REGISTERED && objs[i].state == RELEASED && objs[i].key < lo + n &&
            lo < objs[i].key + objs[i].bytes)
            return true;
    return false;
}

static void op_alloc(struct input *in)
{
    unsigned k = u8(in) % 11;
    int slot;
    CUresult rc, want;
    struct nowait m = {0};
    bool judged;
    switch (k) {
    case 0:
    case 1: {
        size_t n = pick_size(in);
        CUdeviceptr p = 0;
        want = alloc_front(K_DEVICE, &slot, n);
        judged = alloc_begin(&m, "cuMemAlloc", K_DEVICE, slot, n);
        rc = cuMemAlloc(&p, n);
        alloc_end(&m, judged, want);
        expect_alloc("cuMemAlloc", K_DEVICE, rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_DEVICE, (uintptr_t)p, n, slot, false);
        break;
    }
    case 2: {
        static const unsigned elems[] = {4, 8, 16};
        size_t w = u8(in) * 16 + 1, hgt = u8(in) % 64 + 1, pitch = 0;
        unsigned e = elems[u8(in) % 3];
        size_t n = (w + 511) / 512 * 512 * hgt;
        CUdeviceptr p = 0;
        want = alloc_front(K_DEVICE, &slot, n);
        judged = alloc_begin(&m, "cuMemAllocPitch", K_DEVICE, slot, n);
        rc = cuMemAllocPitch(&p, &pitch, w, hgt, e);
        alloc_end(&m, judged, want);
        expect_alloc("cuMemAllocPitch", K_DEVICE, rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_DEVICE, (uintptr_t)p, pitch * hgt, slot, false);
        break;
    }
    case 3: {
        size_t n = pick_size(in);
        unsigned flags = u8(in) & 1 ? CU_MEM_ATTACH_HOST : CU_MEM_ATTACH_GLOBAL;
        CUdeviceptr p = 0;
        want = alloc_front(K_MANAGED, &slot, n);
        judged = alloc_begin(&m, "cuMemAllocManaged", K_MANAGED, slot, n);
        rc = cuMemAllocManaged(&p, n, flags);
        alloc_end(&m, judged, want);
        expect_alloc("cuMemAllocManaged", K_MANAGED, rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_MANAGED, (uintptr_t)p, n, slot, false);
        break;
    }
    case 4:
    case 5: {
        size_t n = pick_size(in);
        unsigned b = u8(in);
        void *p = NULL;
        want = alloc_front(K_HOST, &slot, n);
        judged = alloc_begin(&m, b & 1 ? "cuMemAllocHost" : "cuMemHostAlloc", K_HOST, slot, n);
        if (b & 1) {
            rc = cuMemAllocHost(&p, n);
        } else {
            unsigned flags = b >> 1 & (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                       CU_MEMHOSTALLOC_WRITECOMBINED);
            rc = cuMemHostAlloc(&p, n, flags);
        }
        alloc_end(&m, judged, want);
        expect_alloc("cuMemAllocHost/cuMemHostAlloc", K_HOST, rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_HOST, (uintptr_t)p, n, slot, false);
        break;
    }
    case 6: {
        unsigned first = u8(in) % REG_PAGES, count = u8(in) % 4 + 1, flags = u8(in) & 0x0f;
        if (first + count > REG_PAGES)
            count = REG_PAGES - first;
        uintptr_t lo = (uintptr_t)reg_arena + (uintptr_t)first * PAGE;
        size_t n = (size_t)count * PAGE;
        want = alloc_front(K_REGISTERED, &slot, n);
        /* A live registration overlapping the range refuses it; a released
         * one must not (the shim undoes queued unregisters first). */
        for (int i = 0; i < nobjs && want != CUDA_ERROR_INVALID_CONTEXT &&
                        want != CUDA_ERROR_CONTEXT_IS_DESTROYED; i++)
            if (objs[i].state == LIVE && objs[i].kind == K_REGISTERED &&
                objs[i].key < lo + n && lo < objs[i].key + objs[i].bytes)
                want = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        canary_check(first, (int)count);
        /* Over a range whose unregister cudefer may still hold: allowed to
         * wait (the unregister is done first). */
        if (overlaps_released_registration(lo, n)) {
            spin_stop();
            judged = false;
        } else {
            judged = alloc_begin(&m, "cuMemHostRegister", K_REGISTERED, slot, n);
        }
        rc = cuMemHostRegister((void *)lo, n, flags);
        alloc_end(&m, judged, want);
        expect_rc("cuMemHostRegister", rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_REGISTERED, lo, n, slot, flags & CU_MEMHOSTREGISTER_READ_ONLY);
        break;
    }
    case 7:
    case 8: {
        static const CUarray_format formats[] = {CU_AD_FORMAT_UNSIGNED_INT8,
                                                 CU_AD_FORMAT_FLOAT};
        static const size_t fbytes[] = {1, 4};
        unsigned f = u8(in) % 2, ch = 1u << (u8(in) % 3);
        size_t w = u8(in) + 1, hgt = u8(in) % 64, d = k == 8 ? u8(in) % 4 : 0;
        size_t n = w * (hgt ? hgt : 1) * (d ? d : 1) * ch * fbytes[f];
        bool mip = k == 8 && (u8(in) & 1);
        want = alloc_front(K_ARRAY, &slot, n);
        judged = alloc_begin(&m, k == 7 ? "cuArrayCreate" : mip ? "cuMipmappedArrayCreate"
                                                               : "cuArray3DCreate",
                             K_ARRAY, slot, n);
        if (k == 7) {
            CUDA_ARRAY_DESCRIPTOR desc = {.Width = w, .Height = hgt, .Format = formats[f],
                                          .NumChannels = ch};
            CUarray a = NULL;
            rc = cuArrayCreate(&a, &desc);
            alloc_end(&m, judged, want);
            expect_alloc("cuArrayCreate", K_ARRAY, rc, want);
            if (rc == CUDA_SUCCESS)
                add_obj(K_ARRAY, (uintptr_t)a, n, slot, false);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = w, .Height = hgt, .Depth = d,
                                            .Format = formats[f], .NumChannels = ch};
            if (mip) {
                CUmipmappedArray mm = NULL;
                rc = cuMipmappedArrayCreate(&mm, &desc, u8(in) % 4 + 1);
                alloc_end(&m, judged, want);
                expect_alloc("cuMipmappedArrayCreate", K_MIPMAP, rc, want);
                if (rc == CUDA_SUCCESS)
                    add_obj(K_MIPMAP, (uintptr_t)mm, n, slot, false);
            } else {
                CUarray a = NULL;
                rc = cuArray3DCreate(&a, &desc);
                alloc_end(&m, judged, want);
                expect_alloc("cuArray3DCreate", K_ARRAY, rc, want);
                if (rc == CUDA_SUCCESS)
                    add_obj(K_ARRAY, (uintptr_t)a, n, slot, false);
            }
        }
        break;
    }
    case 9: {
        static const char image[] = "// any image loads in the test driver\n";
        CUmodule mod = NULL;
        want = context_front(&slot);
        spin_stop(); /* a load waits for the GPU in the driver too */
        rc = cuModuleLoadData(&mod, image);
        expect_rc("cuModuleLoadData", rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_MODULE, (uintptr_t)mod, 0, slot, false);
        break;
    }
    case 10: {
        static const char image[] = "// any image loads in the test driver\n";
        CUlibrary lib = NULL;
        enum cur cur = current(&slot);
        if (cur == CUR_DEAD)
            touched_dead = true;
        judged = alloc_begin(&m, "cuLibraryLoadData", K_LIBRARY, slot, 0);
        rc = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
        alloc_end(&m, judged, CUDA_SUCCESS);
        expect_rc("cuLibraryLoadData", rc, CUDA_SUCCESS);
        /* Loaded into the current context too, half of the time: its
         * unload then waits for that context. */
        if (cur == CUR_LIVE && (u8(in) & 1)) {
            CUkernel kern;
            CUfunction fn;
            expect_rc("cuLibraryGetKernel", cuLibraryGetKernel(&kern, lib, "k"), CUDA_SUCCESS);
            nowait_begin(&m, "cuKernelGetFunction");
            rc = cuKernelGetFunction(&fn, kern);
            nowait_end(&m, true);
            expect_rc("cuKernelGetFunction", rc, CUDA_SUCCESS);
            add_obj(K_LIBRARY, (uintptr_t)lib, 0, slot, false);
            objs[nobjs - 1].loaded = true;
            break;
        }
        add_obj(K_LIBRARY, (uintptr_t)lib, 0, cur == CUR_LIVE ? slot : -1, false);
        break;
    }
    }
}

/* ---- releases ------------------------------------------------------------ */

enum rcall { R_FREE, R_FREE_HOST, R_UNREGISTER, R_ARRAY, R_MIPMAP, R_MODULE, R_LIBRARY,
             R_COUNT };
static const char *const rcall_names[R_COUNT] = {
    "cuMemFree", "cuMemFreeHost", "cuMemHostUnregister", "cuArrayDestroy",
    "cuMipmappedArrayDestroy", "cuModuleUnload", "cuLibraryUnload",
};
static const enum rcall right_call[K_COUNT] = {R_FREE, R_FREE, R_FREE_HOST, R_UNREGISTER,
                                               R_ARRAY, R_MIPMAP, R_MODULE, R_LIBRARY};
static const enum mkind call_kind[R_COUNT] = {K_DEVICE, K_HOST, K_REGISTERED, K_ARRAY,
                                              K_MIPMAP, K_MODULE, K_LIBRARY};

static CUresult do_release(enum rcall call, uintptr_t key)
{
    switch (call) {
    case R_FREE: return cuMemFree((CUdeviceptr)key);
    case R_FREE_HOST: return cuMemFreeHost((void *)key);
    case R_UNREGISTER: return cuMemHostUnregister((void *)key);
    case R_ARRAY: return cuArrayDestroy((CUarray)key);
    case R_MIPMAP: return cuMipmappedArrayDestroy((CUmipmappedArray)key);
    case R_MODULE: return cuModuleUnload((CUmodule)key);
    case R_LIBRARY: return cuLibraryUnload((CUlibrary)key);
    case R_COUNT: break;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* Does call release an object of kind k? */
static bool call_fits(enum rcall call, enum mkind k)
{
    return right_call[k] == call;
}

/* The driver's answer to call(key), from the model; marks what it releases.
 * Where the real driver crashes (a second release of an array, mipmapped
 * array or library), the shim's answer; *also, when not 0, is a second
 * answer as good. */
static CUresult model_release(enum rcall call, uintptr_t key, CUresult *also)
{
    *also = CUDA_SUCCESS;
    int slot;
    enum cur cur = current(&slot);
    struct mobj *live = live_at(key), *any = any_at(key);
    if (any && (any->state == TORN || any->state == RELEASED_TORN))
        touched_dead = true;
    /* The context check of the driver's release: a destroyed current
     * context fails every release but cuLibraryUnload's (a library names
     * no context); none current is fine, the object names its context
     * (measured on the H200, tests/test_conformance.c). */
    if (cur == CUR_DEAD && call != R_LIBRARY) {
        touched_dead = true;
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    switch (call) {
    case R_FREE:
    case R_FREE_HOST:
    case R_UNREGISTER: {
        /* NULL: free(NULL) semantics for the frees; an invalid value for
         * an unregister (measured, tests/driver/memory.c). */
        if (!key)
            return call == R_UNREGISTER ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        if (live && (call == R_FREE ? live->kind == K_DEVICE || live->kind == K_MANAGED
                                    : call_fits(call, live->kind))) {
            live->state = RELEASED;
            return CUDA_SUCCESS;
        }
        if (call != R_UNREGISTER)
            return CUDA_ERROR_INVALID_VALUE;
        /* An unregister of an address the driver knows that is not a
         * registration's base is an invalid value; of one it does not know,
         * not registered (measured on the H200, tests/driver/memory.c). */
        if (inside(key, LIVE))
            return CUDA_ERROR_INVALID_VALUE;
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    default: {
        enum mkind want = call_kind[call];
        if (live && live->kind == want) {
            live->state = RELEASED;
            return CUDA_SUCCESS;
        }
        /* Destroyed with its context: an array answers CONTEXT_IS_DESTROYED,
         * a module INVALID_HANDLE (measured on the H200). Released before
         * that, the real driver crashes on the array; the shim answers
         * CONTEXT_IS_DESTROYED where it still held the release when the
         * context went, and the driver's answer for a handle released
         * already (INVALID_HANDLE) where the release was done. */
        bool array = want == K_ARRAY || want == K_MIPMAP;
        if (any && any->kind == want && any->state == TORN && array)
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        if (any && any->kind == want && any->state == RELEASED_TORN && array)
            *also = CUDA_ERROR_CONTEXT_IS_DESTROYED;
        return CUDA_ERROR_INVALID_HANDLE;
    }
    }
}

/* Whether the program has a capture live (GLOBAL ones begin and end
 * within one operation). */
static bool capture_live(void)
{
    for (int i = 0; i < nstreams; i++)
        if (streams[i].alive && streams[i].capturing)
            return true;
    for (int i = 0; i < MAX_CTX; i++)
        if (ctxs[i].alive && ctxs[i].pt_capturing)
            return true;
    return false;
}

static void op_release(struct input *in)
{
    unsigned t = u8(in), v = u8(in), c = u8(in);
    struct mobj *target = nobjs ? &objs[t % nobjs] : NULL;
    uintptr_t key;
    switch (v % 16) {
    case 12: key = target ? target->key + 1 + v / 16 : 1; break;   /* inside */
    case 13: key = 0; break;                                       /* NULL */
    case 14: key = (uintptr_t)0x10000 + t * 64 + 8; break;        /* bogus */
    case 15: key = (uintptr_t)&objs[t % MAX_OBJS]; break;          /* a host address */
    default: key = target ? target->key : 0; break;
    }
    enum rcall call = target && c % 8 != 7 && key == target->key ? right_call[target->kind]
                                                                 : (enum rcall)(c / 8 % R_COUNT);
    /* A pointer inside an object of a destroyed context, or into the
     * registration arena (which teardowns of earlier inputs also saw), is
     * one the driver may count as naming a destroyed context. */
    if (target && key != target->key && key - target->key < 4096 &&
        (target->state == TORN || target->state == RELEASED_TORN))
        touched_dead = true;
    if (key - (uintptr_t)reg_arena < REG_PAGES * PAGE)
        touched_dead = true;
    struct mobj *before = any_at(key), *live = live_at(key);
    /* README, limits: a release made while a capture is live is not fenced,
     * and a flush point during the capture releases it with the driver's
     * own call, which waits for its own context's work only, as without
     * cudefer. So the program makes no such release of memory that a
     * kernel of another context has used (found at 300 s: a kernel of
     * another context, queued behind a kernel that waits for the host,
     * wrote a pinned block after a cudefer_flush during the capture). */
    if (live && live->ctx >= 0 && capture_live())
        for (int i = 0; i < MAX_CTX; i++)
            if (i != live->ctx && ctxs[i].alive && (ctxs[i].used_memory_of & 1u << live->ctx)) {
                TRACE("  skipped: a capture is live, and kernels of context %d used memory of "
                      "context %d", i, live->ctx);
                return;
            }
    enum ostate state = before ? before->state : LIVE;
    CUresult also;
    CUresult want = model_release(call, key, &also);
    CUresult got;
    struct nowait m = {0};
    if (call == R_UNREGISTER) {
        /* May wait for the work submitted before it in its context: the
         * kernels that wait for the host are released first, and the other
         * contexts get kernels that wait for this call to return. The
         * program waits itself for the kernels of other contexts that write
         * the pages, as it must without cudefer (the driver's unregister
         * does not wait for them, cudefer's for 5 ms at most: README,
         * limits). */
        spin_stop();
        if (live && live->kind == K_REGISTERED)
            wait_foreign_users(live);
        others_wait_for_me(live && live->kind == K_REGISTERED ? live->ctx : -1, -1);
        got = do_release(call, key);
        others_done(rcall_names[call]);
    } else if (live && live->unseen && key == live->key) {
        /* Memory cudefer never saw allocated: the driver's own release,
         * which waits for its context's work, as without cudefer. */
        spin_stop();
        got = do_release(call, key);
    } else {
        /* The release of a live object must not reach a waiting call of the
         * driver; anything else (NULL, errors, the unload of a library not
         * loaded into a live context, which the driver does at once) may, if
         * it does not block. */
        bool may_reach = !live || (live->kind == K_LIBRARY && !live->loaded);
        nowait_begin(&m, rcall_names[call]);
        got = do_release(call, key);
        nowait_end(&m, want == CUDA_SUCCESS && !may_reach);
    }
    TRACE("  %s(%#lx) -> %d (model %d)", rcall_names[call], (unsigned long)key, (int)got,
          (int)want);
    if (call == R_UNREGISTER && got == CUDA_SUCCESS && live && live->kind == K_REGISTERED) {
        /* Returned: no kernel submitted before it still writes the pages. */
        for (int k = 0; k < 4 && !(skipped && strstr(skipped, "pages")); k++)
            if (live->ev[k] && cuEventQuery(live->ev[k]) == CUDA_ERROR_NOT_READY)
                FAIL("cuMemHostUnregister(%#lx) returned while a kernel that writes its pages "
                     "(submitted before it) still ran", (unsigned long)key);
        drop_events(live, -1, true);
        canary_fill(live->key, live->bytes);
    }
    if (got == want || (also != CUDA_SUCCESS && got == also))
        return;
    FAIL("%s(%#lx) returned %d, the driver would return %d (object: %s, state %d)",
         rcall_names[call], (unsigned long)key, (int)got, (int)want,
         before ? kind_names[before->kind] : "none", before ? (int)state : -1);
}

/* ---- state set on blocks ------------------------------------------------------ */

/* Advice, a prefetch, a stream attachment, SYNC_MEMOPS or a dma-buf export
 * of a live block, inside one, or of a pointer that names none (NULL,
 * bogus, freed). The driver answers bad input; none of the calls may wait.
 * A live block's SYNC_MEMOPS must be set; what was set must not reach a
 * later allocation (add_obj). */
static void op_alter(struct input *in)
{
    unsigned t = u8(in), v = u8(in), how = u8(in) % 6;
    struct mobj *target = nobjs ? &objs[t % nobjs] : NULL;
    uintptr_t key = v % 8 == 5 ? (target ? target->key + 16 : 16)
                    : v % 8 == 6 ? (uintptr_t)0x10000 + t * 64
                    : v % 8 == 7 ? 0
                                 : (target ? target->key : 0);
    size_t bytes = target && key == target->key ? target->bytes : 64;
    struct mobj *live = live_at(key);
    if (key && (!live || live->ctx < 0 || !ctxs[live->ctx].alive))
        touched_dead = true; /* the driver may count it as naming a dead context */
    CUmemLocation dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    static const char *const names[6] = {"cuPointerSetAttribute", "cuMemAdvise",
                                         "cuMemPrefetchAsync", "cuStreamAttachMemAsync",
                                         "cuMemPrefetchBatchAsync",
                                         "cuMemGetHandleForAddressRange"};
    /* Stream-ordered ones on a stream of the program's that is not
     * capturing, else not at all. */
    CUstream s = NULL;
    for (int i = 0; i < nstreams && !s; i++)
        if (streams[i].alive && !streams[i].capturing && streams[i].ctx >= 0 &&
            ctxs[streams[i].ctx].alive)
            s = streams[i].h;
    if ((how == 2 || how == 3 || how == 4) && !s)
        how = 0;
    const int one = 1;
    CUdeviceptr d = (CUdeviceptr)key;
    size_t idx = 0;
    struct nowait m = {0};
    nowait_begin(&m, names[how]);
    CUresult rc;
    switch (how) {
    case 0: rc = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d); break;
    case 1: rc = cuMemAdvise(d, bytes, CU_MEM_ADVISE_SET_READ_MOSTLY, dev); break;
    case 2: rc = cuMemPrefetchAsync(d, bytes, dev, 0, s); break;
    case 3: rc = cuStreamAttachMemAsync(s, d, 0, CU_MEM_ATTACH_HOST); break;
    case 4: rc = cuMemPrefetchBatchAsync(&d, &bytes, 1, &dev, &idx, 1, 0, s); break;
    default: {
        int fd = -1;
        rc = cuMemGetHandleForAddressRange(&fd, d, bytes / 4096 * 4096 ? bytes / 4096 * 4096 : 4096,
                                           CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (fd >= 0)
            close(fd);
        break;
    }
    }
    nowait_end(&m, true);
    TRACE("  %s(%#lx, %zu) -> %d", names[how], (unsigned long)key, bytes, (int)rc);
    if (how == 0 && live && (live->kind == K_DEVICE || live->kind == K_MANAGED ||
                             live->kind == K_HOST) && rc != CUDA_SUCCESS)
        FAIL("cuPointerSetAttribute(SYNC_MEMOPS) of live %s block %#lx returned %d",
             kind_names[live->kind], (unsigned long)key, (int)rc);
}

/* The driver hands out again, through a call the shim does not see (as
 * cuExternalMemoryGetMappedBuffer or cuMemPoolImportPointer would), the
 * address of a device block that its context's teardown freed, in the
 * current context: a live object of the program's, which op_release frees
 * with cuMemFree like any (the shim's tomb there must not answer for it);
 * that release is the driver's own and may wait (memory the shim did not
 * see allocated: README, limits). */
static void op_unseen(struct input *in)
{
    unsigned t = u8(in);
    int slot;
    if (!nobjs || current(&slot) != CUR_LIVE)
        return;
    struct mobj *o = &objs[t % nobjs];
    if (o->kind != K_DEVICE || (o->state != TORN && o->state != RELEASED_TORN) || live_at(o->key))
        return;
    uintptr_t key = o->key;
    size_t bytes = o->bytes ? o->bytes : 1;
    touched_dead = true; /* the address was a destroyed context's */
    CUresult rc = testdrv_map_device_at((CUdeviceptr)key, bytes);
    TRACE("  testdrv_map_device_at(%#lx, %zu) -> %d", (unsigned long)key, bytes, (int)rc);
    if (rc == CUDA_SUCCESS) {
        add_obj(K_DEVICE, key, bytes, slot, false);
        objs[nobjs - 1].unseen = true;
    }
}

/* ---- green contexts -------------------------------------------------------- */

typedef CUresult (*get_resource_fn)(CUdevice, CUdevResource *, CUdevResourceType);
typedef CUresult (*split_fn)(CUdevResource *, unsigned *, const CUdevResource *,
                             CUdevResource *, unsigned, unsigned);
typedef CUresult (*gen_desc_fn)(CUdevResourceDesc *, CUdevResource *, unsigned);
typedef CUresult (*green_create_fn)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
typedef CUresult (*green_fn)(CUgreenCtx);
typedef CUresult (*ctx_from_green_fn)(CUcontext *, CUgreenCtx);
typedef CUresult (*green_stream_fn)(CUstream *, CUgreenCtx, unsigned, int);

/* A green context of a device whose primary context the program holds
 * (testdriver.h: what is made while it is current belongs to that primary
 * context and outlives it): made current, a stream of it, a block
 * allocated, written by a kernel on the green stream and released, then
 * the green context destroyed (its stream's work runs on). Skipped when the
 * driver has no green contexts. */
static void op_green(struct input *in)
{
    static bool looked, have;
    static get_resource_fn get_resource;
    static split_fn split;
    static gen_desc_fn gen_desc;
    static green_create_fn create;
    static green_fn destroy;
    static ctx_from_green_fn ctx_from;
    static green_stream_fn green_stream;
    if (!looked) {
        looked = true;
        get_resource = (get_resource_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetDevResource");
        split = (split_fn)dlsym(RTLD_DEFAULT, "cuDevSmResourceSplitByCount");
        gen_desc = (gen_desc_fn)dlsym(RTLD_DEFAULT, "cuDevResourceGenerateDesc");
        create = (green_create_fn)dlsym(RTLD_DEFAULT, "cuGreenCtxCreate");
        destroy = (green_fn)dlsym(RTLD_DEFAULT, "cuGreenCtxDestroy");
        ctx_from = (ctx_from_green_fn)dlsym(RTLD_DEFAULT, "cuCtxFromGreenCtx");
        green_stream = (green_stream_fn)dlsym(RTLD_DEFAULT, "cuGreenCtxStreamCreate");
        have = get_resource && split && gen_desc && create && destroy && ctx_from &&
               green_stream;
    }
    int dev = (int)(u8(in) % NDEV), slot = -1;
    unsigned usec = u8(in) * 8;
    if (!have || !ctxs[dev].alive || !prim_refs[dev] || nstreams == MAX_STREAMS)
        return;
    for (int i = NDEV; i < MAX_CTX && slot < 0; i++)
        if (!ctxs[i].exists)
            slot = i;
    if (slot < 0)
        return;
    CUdevResource all, group, rest;
    CUdevResourceDesc desc;
    CUgreenCtx g = NULL;
    unsigned n = 1;
    CUresult rc = get_resource((CUdevice)dev, &all, CU_DEV_RESOURCE_TYPE_SM);
    if (rc == CUDA_SUCCESS)
        rc = split(&group, &n, &all, &rest, 0, 16);
    if (rc == CUDA_SUCCESS)
        rc = gen_desc(&desc, &group, 1);
    if (rc == CUDA_ERROR_NOT_SUPPORTED)
        return; /* a driver version without green contexts */
    expect_rc("cuDevResourceGenerateDesc", rc, CUDA_SUCCESS);
    expect_rc("cuGreenCtxCreate", create(&g, desc, (CUdevice)dev, CU_GREEN_CTX_DEFAULT_STREAM),
              CUDA_SUCCESS);
    CUcontext h = NULL;
    struct nowait m = {0};
    nowait_begin(&m, "cuCtxFromGreenCtx");
    rc = ctx_from(&h, g);
    nowait_end(&m, true);
    expect_rc("cuCtxFromGreenCtx", rc, CUDA_SUCCESS);
    ctxs[slot] = (struct mctx){.h = h, .dev = dev, .exists = true, .alive = true, .known = true,
                               .green = true};
    TRACE("  green context %d on device %d", slot, dev);
    expect_rc("cuCtxPushCurrent", cuCtxPushCurrent(h), CUDA_SUCCESS);
    CUstream s = NULL;
    nowait_begin(&m, "cuGreenCtxStreamCreate");
    rc = green_stream(&s, g, CU_STREAM_NON_BLOCKING, 0);
    nowait_end(&m, rc != CUDA_ERROR_NOT_SUPPORTED);
    if (rc == CUDA_ERROR_NOT_SUPPORTED) /* before 12.5: a stream made while it is current */
        rc = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    expect_rc("cuGreenCtxStreamCreate", rc, CUDA_SUCCESS);
    streams[nstreams++] = (struct mstream){.h = s, .ctx = slot, .alive = true, .nonblocking = true};
    /* A block of the primary context, written on the green stream, and
     * released while the kernel may still run. */
    int owner;
    CUresult want = alloc_front(K_DEVICE, &owner, 4096);
    CUdeviceptr p = 0;
    bool judged = alloc_begin(&m, "cuMemAlloc/green (with a green context current)", K_DEVICE,
                              owner, 4096);
    rc = cuMemAlloc(&p, 4096);
    alloc_end(&m, judged, want);
    expect_alloc("cuMemAlloc (green context current)", K_DEVICE, rc, want);
    if (rc == CUDA_SUCCESS) {
        add_obj(K_DEVICE, (uintptr_t)p, 4096, dev, false);
        expect_rc("testdrv_launch (green stream)",
                  testdrv_launch(s, usec, p, 4096, TESTDRV_WRITE), CUDA_SUCCESS);
        CUresult also;
        want = model_release(R_FREE, (uintptr_t)p, &also);
        nowait_begin(&m, "cuMemFree (of a block a green stream writes)");
        rc = cuMemFree(p);
        nowait_end(&m, true);
        expect_rc("cuMemFree", rc, want);
    }
    CUcontext popped;
    expect_rc("cuCtxPopCurrent", cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    nowait_begin(&m, "cuGreenCtxDestroy");
    rc = destroy(g);
    nowait_end(&m, true);
    expect_rc("cuGreenCtxDestroy", rc, CUDA_SUCCESS);
    ctxs[slot].alive = false;
    for (int i = 0; i < nstreams; i++)
        if (streams[i].ctx == slot)
            streams[i].alive = false;
}

static void expect_live_counts(const char *when);

/* cudefer_flush: after it, every release the program made is really done
 * (captures or not) and freed device memory is back with the driver. */
static void op_flush(struct input *in)
{
    (void)in;
    spin_stop(); /* allowed to wait */
    if (cudefer_flush() != 0)
        FAIL("cudefer_flush did not return 0");
    expect_live_counts("after cudefer_flush");
    if (testdrv_pending_free_bytes())
        FAIL("after cudefer_flush %zu bytes of freed device memory are still pending",
             testdrv_pending_free_bytes());
}

/* ---- the end of an input ------------------------------------------------- */

static void expect_live_counts(const char *when)
{
    size_t want[TESTDRV_KIND_COUNT] = {0};
    for (int i = 0; i < nobjs; i++)
        if (objs[i].state == LIVE)
            want[td_kind[objs[i].kind]]++;
    for (int k = 0; k < K_COUNT; k++) {
        enum testdrv_kind tk = td_kind[k];
        if (program_live(tk) != want[tk])
            FAIL("%s: the driver holds %zu live objects of the %s kind, the program %zu",
                 when, program_live(tk), kind_names[k], want[tk]);
    }
}

static void finish_input(void)
{
    op_name = "end";
    spin_stop();
    for (int c = 0; c < MAX_CTX; c++)
        if (ctxs[c].alive && ctxs[c].pt_capturing)
            end_pt_capture(c, false);
    for (int i = 0; i < nstreams; i++)
        if (streams[i].alive && streams[i].capturing)
            end_capture(&streams[i]);
    /* Every release was really done; freed device memory is back. */
    op_flush(NULL);
    check_always();

    /* Release what is left, from a live context if there is one. */
    int any = -1;
    for (int i = 0; i < MAX_CTX; i++)
        if (ctxs[i].alive)
            any = i;
    expect_rc("cuCtxSetCurrent", cuCtxSetCurrent(any >= 0 ? ctxs[any].h : NULL), CUDA_SUCCESS);
    for (int i = 0; i < nobjs; i++) {
        if (objs[i].state != LIVE)
            continue;
        if (any < 0 && objs[i].kind != K_LIBRARY && !is_memory(objs[i].kind))
            continue; /* unreachable: its context is gone, so it is TORN */
        enum rcall call = right_call[objs[i].kind];
        if (objs[i].kind == K_REGISTERED)
            wait_foreign_users(&objs[i]);
        expect_rc(rcall_names[call], do_release(call, objs[i].key), CUDA_SUCCESS);
        objs[i].state = RELEASED;
        if (objs[i].kind == K_REGISTERED) {
            drop_events(&objs[i], -1, true);
            canary_fill(objs[i].key, objs[i].bytes);
        }
    }
    op_flush(NULL);
    check_always();

    /* Every context goes; nothing of any kind is left. */
    for (int i = NDEV; i < MAX_CTX; i++)
        if (ctxs[i].alive) {
            before_teardown(i);
            expect_rc("cuCtxDestroy", cuCtxDestroy(ctxs[i].h), CUDA_SUCCESS);
            torn_down(i);
        }
    for (int d = 0; d < NDEV; d++) {
        if (ctxs[d].alive)
            before_teardown(d);
        expect_rc("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset((CUdevice)d), CUDA_SUCCESS);
        if (ctxs[d].alive)
            torn_down(d);
        prim_refs[d] = 0;
    }
    check_always();
    for (int k = 0; k < TESTDRV_KIND_COUNT; k++)
        if (program_live((enum testdrv_kind)k))
            FAIL("after every context was destroyed, %zu objects of test driver kind %d are "
                 "left", program_live((enum testdrv_kind)k), k);
    if (!touched_dead && testdrv_dead_context_calls() != dead_calls_before)
        FAIL("the shim named a destroyed context (%llu calls) though the program did not",
             (unsigned long long)(testdrv_dead_context_calls() - dead_calls_before));
    canary_check(0, REG_PAGES);
    /* Leave no current context behind. */
    CUcontext popped;
    while (cuCtxPopCurrent(&popped) == CUDA_SUCCESS)
        ;
}

/* ---- libFuzzer ------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("TESTDRIVER_DEVICES", "2", 0);
    setenv("CUDEFER_LOG", "off", 0);
    /* Small limits, so that releases past them (soft: they must not wait
     * either) and the eviction of cached device blocks run too
     * (scripts/fuzz.sh sets CUDEFER_DEVICE_CACHE=0 for fuzz_api_pre125: no
     * cache at all). */
    setenv("CUDEFER_MAX_DEFERRED_ENTRIES", "12", 0);
    setenv("CUDEFER_MAX_DEFERRED_BYTES", "2M", 0);
    setenv("CUDEFER_DEVICE_CACHE", "1M", 0);
    /* The fences' word (off by default): its asks are driver calls a
     * reuse makes, judged like the others. */
    setenv("CUDEFER_FENCE_WORD", "1", 0);
    trace_path = getenv("FUZZ_API_TRACE");
    unjudged = getenv("FUZZ_API_UNJUDGED");
    skipped = getenv("FUZZ_API_SKIP");
    if (cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "fuzz_api: cuInit failed\n");
        exit(2);
    }
    int version = 0;
    cuDriverGetVersion(&version);
    pre125 = version < 12050;
    reg_arena = mmap(NULL, REG_PAGES * PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (reg_arena == MAP_FAILED) {
        fprintf(stderr, "fuzz_api: mmap failed\n");
        exit(2);
    }
    /* The driver's one-time set-up of cuMemFreeAsync (10 ms, counted as
     * time blocked), paid here: cudefer's waiter pays it once the first
     * context is set up, and a synchronisation (a flush point) waits for
     * that. */
    CUcontext first;
    if (cuCtxCreate(&first, NULL, 0, 0) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS ||
        cuCtxDestroy(first) != CUDA_SUCCESS) {
        fprintf(stderr, "fuzz_api: no context\n");
        exit(2);
    }
    pthread_t helper;
    if (pthread_create(&helper, NULL, spin_helper, NULL) != 0) {
        fprintf(stderr, "fuzz_api: no helper thread\n");
        exit(2);
    }
    pthread_detach(helper);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    memset(objs, 0, sizeof objs);
    memset(streams, 0, sizeof streams);
    nobjs = nstreams = 0;
    for (int i = 0; i < MAX_CTX; i++) {
        /* Primary contexts keep their handle across inputs. */
        bool keep = i < NDEV && ctxs[i].exists;
        CUcontext h = ctxs[i].h;
        ctxs[i] = (struct mctx){0};
        if (keep)
            ctxs[i] = (struct mctx){.h = h, .dev = i, .primary = true, .exists = true};
    }
    touched_dead = false;
    dead_calls_before = testdrv_dead_context_calls();
    invalidated_before = testdrv_invalidated_captures();
    foreign_before = testdrv_foreign_syncs();
    invalidated_expected = 0;
    memset(spin_of, 0, sizeof spin_of);
    memset(spin_stream, 0, sizeof spin_stream);
    if (trace_path) {
        if (trace)
            fclose(trace);
        trace = fopen(trace_path, "w");
    }
    device_capacity = (size_t)(u8(&in) % 32 + 1) << 20;
    host_capacity = (size_t)(u8(&in) % 32 + 1) << 20;
    testdrv_set_device_capacity(device_capacity);
    testdrv_set_host_capacity(host_capacity);

    /* Start in a fresh user context, as most programs do. */
    op_index = -1;
    op_name = "start";
    {
        struct input none = {NULL, 0};
        op_ctx_create(&none);
    }
    static const struct {
        const char *name;
        void (*fn)(struct input *);
    } ops[] = {
        {"alloc", op_alloc},         {"alloc", op_alloc},
        {"alloc", op_alloc},         {"release", op_release},
        {"release", op_release},     {"release", op_release},
        {"launch", op_launch},       {"launch", op_launch},
        {"stream create", op_stream_create}, {"stream destroy", op_stream_destroy},
        {"capture", op_capture},     {"synchronize", op_sync},
        {"cudefer_flush", op_flush}, {"context create", op_ctx_create},
        {"context destroy", op_ctx_destroy}, {"set current", op_ctx_set},
        {"push/pop", op_ctx_push_pop}, {"primary", op_primary},
        {"capture", op_capture},     {"green", op_green},
        {"cuMemGetInfo", op_meminfo}, {"set state", op_alter},
        {"unseen allocation", op_unseen},
    };
    for (op_index = 0; in.n && op_index < 64; op_index++) {
        unsigned b = u8(&in) % (sizeof ops / sizeof ops[0]);
        op_name = ops[b].name;
        {
            int cur_slot;
            enum cur cur = current(&cur_slot);
            TRACE("op %d %s (current: %d%s)", op_index, op_name, cur_slot,
                  cur == CUR_DEAD ? " dead" : "");
            /* Any call made meanwhile may name it: the shim asks the driver
             * whether the current context lives before it answers. */
            if (cur == CUR_DEAD)
                touched_dead = true;
        }
        if (skipped && strstr(skipped, op_name))
            continue;
        spin_start();
        atomic_store(&op_started_ns, now_ns());
        ops[b].fn(&in);
        atomic_store(&op_started_ns, 0);
        check_always();
    }
    finish_input();
    return 0;
}
