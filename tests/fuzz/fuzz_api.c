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
 * context create/destroy, current-context changes, primary context
 * retain/release/reset on two devices, stream create/destroy, simulated
 * kernels (testdrv_launch) on user, legacy and per-thread streams touching
 * live memory of any context, stream capture begin/end (relaxed mode),
 * cuCtxSynchronize[_v2], cudefer_flush, allocations of every kind the shim
 * tracks, and releases of every kind - of live objects, double releases,
 * pointers inside allocations, pointers of the wrong kind, bogus and NULL
 * pointers, objects of destroyed contexts.
 *
 * Checked after every operation:
 *  - no kernel touched memory that was not live (testdrv_faults() == 0) and
 *    no stream capture was invalidated;
 *  - every release answers what the driver itself would (the model below
 *    follows the test driver's rules: tests/driver/memory.c, arrays.c,
 *    modules.c), and so do cuCtxSynchronize and the allocations' context
 *    checks;
 *  - an allocation that fits in what the program holds live succeeds:
 *    what the shim holds back must never make it fail;
 *  - an address handed out is never one that is live already.
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
 * them, with or without cudefer); before driver 12.5
 * (TESTDRIVER_VERSION=12040) such kernels run on streams the program
 * created and no kernel that touches memory runs on a per-thread default
 * stream (the fallback fence does not cover those).
 */
#include <cuda.h>
#include <cudefer.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
    unsigned used_memory_of; /* contexts whose memory its kernels touched */
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
    if (got != want)
        FAIL("%s returned %d, the driver would return %d", what, (int)got, (int)want);
}

static size_t used_capacity(bool device)
{
    size_t sum = 0;
    for (int i = 0; i < nobjs; i++)
        if (objs[i].state == LIVE && on_device_capacity(objs[i].kind) == device)
            sum += objs[i].bytes; /* modules and libraries count 0 */
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
    objs[nobjs++] = (struct mobj){kind, key, bytes, ctx, LIVE, readonly};
    TRACE("  new %s %#lx bytes %zu ctx %d", kind_names[kind], (unsigned long)key, bytes, ctx);
    if (ctx >= 0)
        ctxs[ctx].known = true;
}

/* ---- invariants after every operation ----------------------------------- */

static void check_always(void)
{
    if (testdrv_faults())
        FAIL("a kernel touched memory that was not live (%llu faults)",
             (unsigned long long)testdrv_faults());
    if (testdrv_invalidated_captures())
        FAIL("a stream capture was invalidated (%llu)",
             (unsigned long long)testdrv_invalidated_captures());
}

/* ---- contexts ------------------------------------------------------------ */

static void end_capture(struct mstream *s)
{
    CUgraph g = NULL;
    expect_rc("cuStreamEndCapture", cuStreamEndCapture(s->h, &g), CUDA_SUCCESS);
    if (g)
        cuGraphDestroy(g);
    s->capturing = false;
}

/* Before context c goes: its captures end, and contexts whose kernels used
 * its memory finish them (the teardown frees that memory under them). */
static void before_teardown(int c)
{
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
    for (int i = 0; i < nobjs; i++) {
        if (objs[i].ctx != c || objs[i].kind == K_LIBRARY)
            continue;
        if (objs[i].state == LIVE)
            objs[i].state = TORN;
        else if (objs[i].state == RELEASED)
            objs[i].state = RELEASED_TORN;
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
    expect_rc("cuCtxCreate", cuCtxCreate(&h, NULL, 0, (CUdevice)dev), CUDA_SUCCESS);
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

static int pick_ctx(struct input *in)
{
    int c = (int)(u8(in) % (MAX_CTX + 1));
    return c < MAX_CTX && ctxs[c].exists ? c : -1;
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
        expect_rc("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&h, (CUdevice)dev),
                  CUDA_SUCCESS);
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
        if (prim_refs[dev] == 1)
            before_teardown(dev);
        expect_rc("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease((CUdevice)dev),
                  CUDA_SUCCESS);
        if (--prim_refs[dev] == 0)
            torn_down(dev);
        break;
    case 3: /* reset */
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

static void op_sync(struct input *in)
{
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
    expect_rc("cuStreamCreate", cuStreamCreate(&s, flags), want);
    if (want != CUDA_SUCCESS)
        return;
    ctxs[slot].known = true;
    int i = nstreams < MAX_STREAMS ? nstreams++ : -1;
    if (i < 0) {
        expect_rc("cuStreamDestroy", cuStreamDestroy(s), CUDA_SUCCESS);
        return;
    }
    streams[i] = (struct mstream){s, slot, true, flags == CU_STREAM_NON_BLOCKING, false};
}

static struct mstream *pick_stream(struct input *in)
{
    if (!nstreams)
        return NULL;
    struct mstream *s = &streams[u8(in) % nstreams];
    return s->alive ? s : NULL;
}

static void op_stream_destroy(struct input *in)
{
    struct mstream *s = pick_stream(in);
    if (!s)
        return;
    if (s->capturing)
        end_capture(s);
    expect_rc("cuStreamDestroy", cuStreamDestroy(s->h), CUDA_SUCCESS);
    s->alive = false;
}

static void op_capture(struct input *in)
{
    struct mstream *s = pick_stream(in);
    if (!s)
        return;
    if (s->capturing) {
        end_capture(s);
        return;
    }
    expect_rc("cuStreamBeginCapture_v2",
              cuStreamBeginCapture_v2(s->h, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    s->capturing = true;
}

static bool blocking_capture_in(int c)
{
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
    bool user = false, per_thread = false;
    if (nstreams && which % 4 != 3) {
        struct mstream *s = &streams[which / 4 % nstreams];
        if (!s->alive)
            return;
        h = s->h;
        sctx = s->ctx;
        user = true;
    } else {
        if (current(&sctx) != CUR_LIVE)
            return;
        per_thread = which & 0x80;
        if (!per_thread && blocking_capture_in(sctx))
            return; /* the legacy stream would invalidate that capture */
        h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    }
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
    }
    expect_rc("testdrv_launch", testdrv_launch(h, usec, ptr, bytes, access), CUDA_SUCCESS);
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
    size_t cap = on_device_capacity(kind) ? device_capacity : host_capacity;
    /* What the program holds live must be all that counts. */
    return used_capacity(on_device_capacity(kind)) + bytes <= cap ? CUDA_SUCCESS
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

static void op_alloc(struct input *in)
{
    unsigned k = u8(in) % 11;
    int slot;
    CUresult rc, want;
    switch (k) {
    case 0:
    case 1: {
        size_t n = pick_size(in);
        CUdeviceptr p = 0;
        want = alloc_front(K_DEVICE, &slot, n);
        rc = cuMemAlloc(&p, n);
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
        rc = cuMemAllocPitch(&p, &pitch, w, hgt, e);
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
        rc = cuMemAllocManaged(&p, n, flags);
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
        if (b & 1) {
            rc = cuMemAllocHost(&p, n);
        } else {
            unsigned flags = b >> 1 & (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                       CU_MEMHOSTALLOC_WRITECOMBINED);
            rc = cuMemHostAlloc(&p, n, flags);
        }
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
        rc = cuMemHostRegister((void *)lo, n, flags);
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
        if (k == 7) {
            CUDA_ARRAY_DESCRIPTOR desc = {.Width = w, .Height = hgt, .Format = formats[f],
                                          .NumChannels = ch};
            CUarray a = NULL;
            rc = cuArrayCreate(&a, &desc);
            expect_alloc("cuArrayCreate", K_ARRAY, rc, want);
            if (rc == CUDA_SUCCESS)
                add_obj(K_ARRAY, (uintptr_t)a, n, slot, false);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = w, .Height = hgt, .Depth = d,
                                            .Format = formats[f], .NumChannels = ch};
            if (mip) {
                CUmipmappedArray m = NULL;
                rc = cuMipmappedArrayCreate(&m, &desc, u8(in) % 4 + 1);
                expect_alloc("cuMipmappedArrayCreate", K_MIPMAP, rc, want);
                if (rc == CUDA_SUCCESS)
                    add_obj(K_MIPMAP, (uintptr_t)m, n, slot, false);
            } else {
                CUarray a = NULL;
                rc = cuArray3DCreate(&a, &desc);
                expect_alloc("cuArray3DCreate", K_ARRAY, rc, want);
                if (rc == CUDA_SUCCESS)
                    add_obj(K_ARRAY, (uintptr_t)a, n, slot, false);
            }
        }
        break;
    }
    case 9: {
        static const char image[] = "// any image loads in the test driver\n";
        CUmodule m = NULL;
        want = context_front(&slot);
        rc = cuModuleLoadData(&m, image);
        expect_rc("cuModuleLoadData", rc, want);
        if (rc == CUDA_SUCCESS)
            add_obj(K_MODULE, (uintptr_t)m, 0, slot, false);
        break;
    }
    case 10: {
        static const char image[] = "// any image loads in the test driver\n";
        CUlibrary lib = NULL;
        enum cur cur = current(&slot);
        if (cur == CUR_DEAD)
            touched_dead = true;
        rc = cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
        expect_rc("cuLibraryLoadData", rc, CUDA_SUCCESS);
        /* Loaded into the current context too, half of the time: its
         * unload then waits for that context. */
        if (cur == CUR_LIVE && (u8(in) & 1)) {
            CUkernel kern;
            CUfunction fn;
            expect_rc("cuLibraryGetKernel", cuLibraryGetKernel(&kern, lib, "k"), CUDA_SUCCESS);
            expect_rc("cuKernelGetFunction", cuKernelGetFunction(&fn, kern), CUDA_SUCCESS);
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
    struct mobj *before = any_at(key);
    enum ostate state = before ? before->state : LIVE;
    CUresult also;
    CUresult want = model_release(call, key, &also);
    CUresult got = do_release(call, key);
    TRACE("  %s(%#lx) -> %d (model %d)", rcall_names[call], (unsigned long)key, (int)got,
          (int)want);
    if (got == want || (also != CUDA_SUCCESS && got == also))
        return;
    FAIL("%s(%#lx) returned %d, the driver would return %d (object: %s, state %d)",
         rcall_names[call], (unsigned long)key, (int)got, (int)want,
         before ? kind_names[before->kind] : "none", before ? (int)state : -1);
}

static void expect_live_counts(const char *when);

/* cudefer_flush: after it, every release the program made is really done
 * (captures or not) and freed device memory is back with the driver. */
static void op_flush(struct input *in)
{
    (void)in;
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
        if (testdrv_live(tk) != want[tk])
            FAIL("%s: the driver holds %zu live objects of the %s kind, the program %zu",
                 when, testdrv_live(tk), kind_names[k], want[tk]);
    }
}

static void finish_input(void)
{
    op_name = "end";
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
        expect_rc(rcall_names[call], do_release(call, objs[i].key), CUDA_SUCCESS);
        objs[i].state = RELEASED;
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
        if (testdrv_live((enum testdrv_kind)k))
            FAIL("after every context was destroyed, %zu objects of test driver kind %d are "
                 "left", testdrv_live((enum testdrv_kind)k), k);
    if (!touched_dead && testdrv_dead_context_calls() != dead_calls_before)
        FAIL("the shim named a destroyed context (%llu calls) though the program did not",
             (unsigned long long)(testdrv_dead_context_calls() - dead_calls_before));
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
    /* Small limits, so that the over-the-limit flush and the eviction of
     * cached device blocks run too (scripts/fuzz.sh sets
     * CUDEFER_DEVICE_CACHE=0 for fuzz_api_pre125: no cache at all). */
    setenv("CUDEFER_MAX_DEFERRED_ENTRIES", "12", 0);
    setenv("CUDEFER_MAX_DEFERRED_BYTES", "2M", 0);
    setenv("CUDEFER_DEVICE_CACHE", "1M", 0);
    trace_path = getenv("FUZZ_API_TRACE");
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
        ops[b].fn(&in);
        check_always();
    }
    finish_input();
    return 0;
}
