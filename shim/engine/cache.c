/* cache.c - allocations: reuse of released blocks, tracking, and what an
 * allocation costs.
 *
 * A released block of device, managed or pinned memory may serve a later
 * allocation of the same kind, size and flags in the same context, once no
 * work submitted before its release can still use it: its fence has passed.
 * Then the block is the program's at once, host-visible memory included,
 * as after the driver's own allocation. Blocks exported through IPC are
 * never reused, and a 32-bit call gets only a block below 4 GiB.
 *
 * When the GPU still runs the work before the oldest such block, the
 * allocation either asks the driver for a new block or waits for that one.
 * It waits only when its bin already holds enough blocks to keep the GPU
 * busy (depth(): four small blocks, so that a loop keeps several iterations
 * in flight; one or two large ones, whose kernels outlast the host's turn
 * many times over, so that cudefer holds no more than a pool would), and
 * only for as long as an allocation of that kind and size was measured to
 * take in this process: waiting can cost at most what it saves, and a
 * kernel that waits for this thread only delays the allocation by that
 * much. CUDEFER_REUSE_WAIT=0 never waits.
 *
 * Managed memory is the exception to that bound: a new block costs little
 * to allocate, and much at its first use, when the GPU faults its pages in
 * (64 MiB written in full by a kernel: 8 ms for a new block, 20 us for one
 * used before, measured on an H200, bench/RESULTS.md). So an allocation of
 * managed memory may wait for the oldest block of its size that this same
 * thread released while the GPU still ran the work before the release (a
 * release that waited in the driver, for that work and more), until its
 * own context's part of the fence passes: the thread waits later, and no
 * longer, for what the driver's release would have made it wait for. Only
 * the same thread: another thread's release is a wait this one never had
 * to make, and the kernel it waits for may wait for this thread. Each such
 * release is waited for once at most (the reuse ends its debt).
 */
#include "engine.h"

#include "backends.h"
#include "books.h"
#include "capture.h"
#include "clock.h"
#include "contexts.h"
#include "driver.h"
#include "fence.h"
#include "log.h"
#include "nvtx.h"
#include "options.h"
#include "registry.h"
#include "retire.h"
#include "stats.h"

#include <sched.h>
#include <time.h>

/* Blocks of one kind, size and flags kept in rotation before a reuse waits
 * for the oldest rather than allocating. */
static size_t depth(size_t bytes)
{
    if (bytes <= ((size_t)1 << 20))
        return 4;
    return bytes <= ((size_t)16 << 20) ? 2 : 1;
}

/* ---- what an allocation costs ---------------------------------------------- */

/* The measured duration of an allocation, per kind and power of two of its
 * size: an exponential average of the calls that succeeded at once. */
#define SIZE_CLASSES 48
static _Atomic uint64_t cost_ns[CD_KIND_COUNT][SIZE_CLASSES];

static int size_class(size_t bytes)
{
    int c = 0;
    while (bytes > 1 && c < SIZE_CLASSES - 1) {
        bytes >>= 1;
        c++;
    }
    return c;
}

static void note_cost(enum cd_kind kind, size_t bytes, uint64_t ns)
{
    _Atomic uint64_t *slot = &cost_ns[kind][size_class(bytes)];
    uint64_t old = atomic_load_explicit(slot, memory_order_relaxed);
    uint64_t avg = old ? old - old / 8 + ns / 8 : ns;
    atomic_store_explicit(slot, avg, memory_order_relaxed);
}

static uint64_t expected_cost(enum cd_kind kind, size_t bytes)
{
    return atomic_load_explicit(&cost_ns[kind][size_class(bytes)], memory_order_relaxed);
}

/* ---- allocations -------------------------------------------------------------- */

uint64_t cd_thread_token(void)
{
    static _Atomic uint64_t next = 1;
    static _Thread_local uint64_t token;
    if (!token)
        token = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
    return token;
}

void cd_alloc_start(struct cd_alloc *a, const char *call, enum cd_kind kind, size_t bytes,
                    unsigned flags, bool narrow)
{
    a->kind = kind;
    a->bytes = bytes;
    a->flags = flags;
    a->max_key = narrow ? (uintptr_t)1 << 32 : UINTPTR_MAX;
    a->start_ns = cd_now_ns();
    a->level = 0;
    a->rechecks = 0;
    a->held_ns = 0;
    a->seen = cd_registry_returned();
    a->call = call;
}

/* Polls r's fence until it passes or the deadline: both its parts
 * (fence.h); or, with own, first its own context's part until the
 * deadline, then both parts for at most `then` ns more (the driver's
 * release waits for its own context only); in the relaxed capture mode, so
 * that a capture another thread starts meanwhile stays valid. MAY WAIT,
 * until the deadline (and `then`). */
static bool wait_fence(struct cd_ctx *c, struct cd_record *r, uint64_t deadline, bool own,
                       uint64_t then)
{
    struct cd_scope sc;
    cd_scope_enter(&sc, NULL, true);
    cd_range_push("cudefer: allocation waits for a released block");
    bool passed = false;
    uint64_t start = cd_now_ns();
    for (;;) {
        CUresult q = own ? cd_driver_ops()->event_query(r->done)
                         : cd_fence_query(c, r->done, r->far);
        uint64_t now = cd_now_ns();
        if (own && q == CUDA_SUCCESS) {
            own = false;
            deadline = now + then;
            continue;
        }
        if (q != CUDA_ERROR_NOT_READY) {
            passed = q == CUDA_SUCCESS;
            break;
        }
        if (now >= deadline)
            break;
        /* Kernels of small blocks end within microseconds: yield for the
         * first 100 us, then nap a quarter of what is left, 50 us at most. */
        if (now - start < 100000) {
            sched_yield();
            continue;
        }
        uint64_t left = (deadline - now) / 4;
        struct timespec nap = {0, (long)(left < 50000 ? left : 50000)};
        nanosleep(&nap, NULL);
    }
    cd_range_pop();
    cd_scope_leave(&sc);
    return passed;
}

/* The longest a wait for a managed block this thread released may last:
 * the driver's release would have waited as long, but a kernel that never
 * ends should not keep the allocation from a new block forever. */
#define DEBT_WAIT_MAX_NS (10ull * 1000000000ull)

/* Whether a bounded wait for r is allowed, and for how long; *own: only
 * r's own context's part of the fence is waited for (a debt, above). */
static uint64_t wait_bound(const struct cd_alloc *a, const struct cd_record *r, size_t held,
                           bool *own)
{
    *own = false;
    if (held < depth(a->bytes) || !cd_option_bool(CD_OPT_REUSE_WAIT))
        return 0;
    if (a->kind == CD_MANAGED && r->debtor == cd_thread_token()) {
        *own = true;
        return DEBT_WAIT_MAX_NS;
    }
    return expected_cost(a->kind, a->bytes);
}

/* Claims the oldest block that may serve a and, inside the capture gate
 * (an event query from a thread in the global capture mode would invalidate
 * a live capture), asks whether its fence has passed: CUDA_SUCCESS,
 * CUDA_ERROR_NOT_READY, or another code when there is none. */
static CUresult claim(struct cd_ctx *c, const struct cd_alloc *a, struct cd_record **r,
                      size_t *held)
{
    *r = NULL;
    if (!cd_gate_enter())
        return CUDA_ERROR_NOT_FOUND;
    CUresult q = CUDA_ERROR_NOT_FOUND;
    *r = cd_books_claim(c, a->kind, a->bytes, a->flags, a->max_key, held);
    if (*r)
        q = cd_fence_query(c, (*r)->done, (*r)->far);
    cd_gate_exit();
    return q;
}

bool cd_alloc_reuse(struct cd_alloc *a, uintptr_t *key)
{
    if (!a->bytes || !cd_backend(a->kind)->reusable || !cd_engine_on() ||
        !cd_backend_on(a->kind))
        return false;
    struct cd_ctx *c = cd_ctx_current();
    unsigned gen;
    if (!c || !cd_ctx_enter_any(c, &gen))
        return false;
    size_t held = 0;
    struct cd_record *r;
    CUresult q = claim(c, a, &r, &held);
    bool ready = q == CUDA_SUCCESS, own = false;
    uint64_t bound = q == CUDA_ERROR_NOT_READY ? wait_bound(a, r, held, &own) : 0;
    if (bound) {
        uint64_t t0 = cd_now_ns();
        ready = wait_fence(c, r, t0 + bound, own, expected_cost(a->kind, a->bytes));
        if (own)
            atomic_fetch_add(&cd_stats.debt_waits, 1);
        atomic_fetch_add(&cd_stats.reuse_waits, 1);
        atomic_fetch_add(&cd_stats.reuse_wait_ns, cd_now_ns() - t0);
    }
    if (r && !ready)
        cd_books_unclaim(c, r);
    if (ready) {
        r->debtor = 0;
        cd_books_take(c, r);
        cd_retire_drop_event(c, r);
        cd_registry_unretire(r);
        if (r->kind == CD_DEVICE)
            cd_books_live(c, r->bytes, 1);
        atomic_fetch_add(&cd_stats.reused[a->kind], 1);
        cd_log(CD_LOG_DEBUG, "%s %#lx reused", cd_kind_name(a->kind), (unsigned long)r->key);
        *key = r->key;
    }
    cd_ctx_exit(c);
    return ready;
}

void cd_alloc_done(struct cd_alloc *a, CUresult rc, uintptr_t key)
{
    if (rc != CUDA_SUCCESS || !key || !cd_engine_on())
        return;
    if (a->level == 0 && a->bytes)
        note_cost(a->kind, a->bytes, cd_now_ns() - a->start_ns);
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    struct cd_ctx *c = NULL;
    if (ops->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx)
        c = cd_ctx_get(ctx);
    struct cd_record *r = c ? cd_record_new(a->kind, key, a->bytes, a->flags) : NULL;
    if (!r) {
        /* Not tracked (no context, or one that is closing): its release
         * passes through, and a stale record or tomb of the same address
         * or handle goes. */
        struct cd_forgotten was;
        cd_books_forgotten(cd_registry_forget(cd_kind_class(a->kind), key, &was), &was);
        return;
    }
    r->ctx = c;
    r->gen = atomic_load(&c->gen);
    /* Counted before another thread can release it (and count it out). */
    if (a->kind == CD_DEVICE)
        cd_books_live(c, a->bytes, 1);
    cd_registry_insert(r);
    if (a->kind == CD_DEVICE)
        cd_retire_grown(c);
}
