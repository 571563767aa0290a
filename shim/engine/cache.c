/* cache.c - allocations: reuse of released blocks, tracking, and what an
 * allocation costs.
 *
 * A released block of device, managed or pinned memory may serve a later
 * allocation of the same kind, size and flags in the same context, once no
 * work submitted before its release can still use it: its fence has passed.
 * Then the block is the program's at once, host-visible memory included,
 * as after the driver's own allocation. Blocks exported (through IPC or as
 * a dma-buf), and blocks on which the program set something a new
 * allocation would not carry (cd_block_altered), are never reused, and a
 * 32-bit call gets only a block below 4 GiB.
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
 * release is waited for once at most (the reuse ends its debt). In a loop
 * over a small size whose bin grows (may_grow, below), a new block serves
 * instead of that wait.
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

/* While the fences' word trails the GPU (fence.h: a write is asked for
 * once four numbers wait and the one before has landed, and lands only
 * after the work submitted before the asking), a look at the oldest small
 * block of a loop that keeps three or four blocks in rotation finds the
 * word behind it about half the time (three quarters in the light loop),
 * and its event query, with the GPU running behind, costs a quarter of a
 * 4 KiB iteration (bench/RESULTS.md, runs 58, 117 and 118; the pinned
 * 4 KiB loop: 753 queries in 1,004 looks, 1.27x the pool over seven
 * rounds, run 122; the managed 4 KiB loop: a third of its looks, 1.24x).
 * So when the word does not answer in a small bin of a loop (a release
 * refilled it before each of its last GROW_AFTER allocations; a second
 * look of one allocation, after a nap, counts nothing), holding fewer
 * than GROW_BLOCKS blocks (GROW_BYTES in all), the allocation takes a new
 * block from the driver instead of querying the event (or waiting for the
 * block, next_nap): the rotation grows until its oldest block is older
 * than the word's lag (every look asks for the next write once four
 * numbers wait; five or six blocks held in run 120's loops, again after
 * each synchronisation, which gives the blocks back). Each new block costs
 * an allocation (40 us at 4 KiB behind a loop's kernels; on an idle GPU
 * 2.5 us of device memory, 9.4 us of pinned, run 121), and a managed one
 * its first use on the GPU, which faults its pages in; each query it
 * spares 0.3 to 1.6 us. Measured with managed bins growing and not, in
 * turn (run 125, five pairs of processes): the managed 4 KiB loop 1.04x
 * the pool against 1.24x (light touch), 1.01x against 1.21x (full), with
 * six new blocks a process. The 1 MiB a bin bounds what first uses cost.
 * A short loop, as a training step between two synchronisations, a run of
 * allocations, a bin that has grown that far, or one of larger blocks,
 * asks the event as before. */
#define GROW_AFTER 16
#define GROW_BLOCKS 16
#define GROW_BYTES ((size_t)1 << 20)

/* For every kind a reuse serves (device, pinned and managed memory). */
static bool may_grow(const struct cd_alloc *a, size_t held, unsigned streak)
{
    return streak >= GROW_AFTER && held < GROW_BLOCKS && (held + 1) * a->bytes <= GROW_BYTES;
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
    a->remaps = 0;
    a->unregistered = cd_books_unregisters_done();
    a->held_ns = 0;
    a->seen = cd_registry_returned();
    a->mem = kind == CD_HOST || kind == CD_REGISTERED ? CD_MEM_HOST
             : kind == CD_MANAGED                     ? CD_MEM_ANY
                                                      : CD_MEM_CURRENT;
    a->call = call;
}

/* The longest a wait for a managed block this thread released may last:
 * the driver's release would have waited as long, but a kernel that never
 * ends should not keep the allocation from a new block forever. */
#define DEBT_WAIT_MAX_NS (10ull * 1000000000ull)

/* Whether r's own context's part of its fence has passed: CUDA_SUCCESS,
 * CUDA_ERROR_NOT_READY, or the event's error. The word answers without a
 * driver call when it is there; else, when grow (and r has a number in the
 * word), NOT_READY and *lags (a new block serves, above); else the event
 * is queried. Either way the word's next write is asked for, for the looks
 * to come (fence.h: once four numbers wait). Inside the capture gate. */
static CUresult own_part(struct cd_ctx *c, const struct cd_record *r, bool grow, bool *lags)
{
    if (!r->done)
        return CUDA_SUCCESS;
    bool passed = cd_fence_word_passed(c, r->word);
    /* Asked by any look, not only by those the word misses, so that the
     * write has landed by the time the looks reach its numbers; after the
     * word was read (a write that lands at once does not answer this look,
     * whatever the timing). */
    cd_fence_word_ask(c);
    if (passed) {
        atomic_fetch_add_explicit(&cd_stats.word_answers, 1, memory_order_relaxed);
        return CUDA_SUCCESS;
    }
    if (grow && r->word && c->word) {
        atomic_fetch_add_explicit(&cd_stats.word_lags, 1, memory_order_relaxed);
        *lags = true;
        return CUDA_ERROR_NOT_READY;
    }
    atomic_fetch_add_explicit(&cd_stats.fence_queries, 1, memory_order_relaxed);
    return cd_driver_ops()->event_query(r->done);
}

/* Claims the oldest block that may serve a (again: a later look of the
 * same allocation) and, inside the capture gate (an event query from a
 * thread in the global capture mode would invalidate a live capture), asks
 * whether its fence has passed: CUDA_SUCCESS, CUDA_ERROR_NOT_READY, or
 * another code when there is none; *own: the same for its own context's
 * part alone; *lags: NOT_READY because the word trails and a new block
 * should serve (own_part). */
static CUresult claim(struct cd_ctx *c, const struct cd_alloc *a, bool again,
                      struct cd_record **r, size_t *held, CUresult *own, bool *lags)
{
    *r = NULL;
    *own = CUDA_ERROR_NOT_FOUND;
    *lags = false;
    if (!cd_gate_enter())
        return CUDA_ERROR_NOT_FOUND;
    CUresult q = CUDA_ERROR_NOT_FOUND;
    unsigned streak;
    *r = cd_books_claim(c, a->kind, a->bytes, a->flags, a->max_key, again, held, &streak);
    if (*r) {
        *own = own_part(c, *r, may_grow(a, *held, streak), lags);
        q = *own == CUDA_SUCCESS ? cd_fence_query(c, NULL, (*r)->far) : *own;
    }
    cd_gate_exit();
    return q;
}

/* An allocation's wait for a released block, across the naps between its
 * looks. */
struct reuse_wait {
    uint64_t start;      /* the first look that found the block not ready; 0 before */
    uint64_t own_passed; /* when a debt block's own part was first seen passed */
    bool debt;           /* a look waited for a block this thread released */
};

/* After a look that found r (claimed) not ready, with own its own
 * context's part: how long to nap before the next look, or 0 to stop
 * waiting. The bound (CUDEFER_REUSE_WAIT): the measured cost of an
 * allocation of that kind and size, from the first look; for a managed
 * block this thread released while the GPU used it (a debt, above), until
 * its own context's part passes (10 s at most), then that cost for the
 * other contexts' part. Only when the bin holds depth() blocks. */
static uint64_t next_nap(const struct cd_alloc *a, const struct cd_record *r, size_t held,
                         CUresult own, struct reuse_wait *w)
{
    if (held < depth(a->bytes) || !cd_option_bool(CD_OPT_REUSE_WAIT))
        return 0;
    uint64_t now = cd_now_ns(), cost = expected_cost(a->kind, a->bytes), deadline;
    uint64_t start = w->start ? w->start : now;
    bool debt = a->kind == CD_MANAGED && r->debtor == cd_thread_token();
    if (debt) {
        if (own == CUDA_SUCCESS) {
            if (!w->own_passed)
                w->own_passed = now;
            deadline = w->own_passed + cost;
        } else if (own == CUDA_ERROR_NOT_READY) {
            deadline = start + DEBT_WAIT_MAX_NS;
        } else {
            return 0;
        }
    } else {
        deadline = start + cost;
    }
    if (now >= deadline)
        return 0;
    w->start = start;
    w->debt |= debt;
    /* Kernels of small blocks end within microseconds: yield for the first
     * 100 us, then nap a quarter of what is left, 50 us at most. */
    if (now - start < 100000)
        return 1;
    uint64_t left = (deadline - now) / 4;
    return left < 50000 ? (left ? left : 1) : 50000;
}

static void nap(uint64_t ns)
{
    if (ns <= 1) {
        sched_yield();
        return;
    }
    struct timespec t = {0, (long)ns};
    nanosleep(&t, NULL);
}

/* Between its looks the allocation holds neither the block nor the
 * context: an out-of-memory reclaim in another thread may take the block
 * (and then, for want of it, this allocation asks the driver), and a
 * teardown of the context is not held up. */
bool cd_alloc_reuse(struct cd_alloc *a, uintptr_t *key)
{
    if (!a->bytes || !cd_backend(a->kind)->reusable || !cd_engine_on() ||
        !cd_backend_on(a->kind))
        return false;
    struct cd_ctx *c = cd_ctx_current();
    if (!c)
        return false;
    struct reuse_wait w = {0};
    bool ready = false, ranged = false;
    unsigned gen = 0;
    for (bool first = true;; first = false) {
        /* The later looks only in the context of the first: the slot may
         * serve another one once that is destroyed. */
        if (first ? !cd_ctx_enter_any(c, &gen) : !cd_ctx_enter_own(c, gen))
            break;
        size_t held = 0;
        struct cd_record *r;
        CUresult own;
        bool lags;
        CUresult q = claim(c, a, !first, &r, &held, &own, &lags);
        /* Barred since the claim (the program set state on the block it
         * had released): not handed out. */
        if (q == CUDA_SUCCESS && atomic_load(&r->no_reuse))
            q = CUDA_ERROR_NOT_FOUND;
        if (q == CUDA_SUCCESS) {
            r->debtor = 0;
            cd_books_take(c, r);
            cd_retire_drop_event(c, r);
            cd_registry_unretire(r);
            if (r->kind == CD_DEVICE)
                cd_books_live(c, r->bytes, 1);
            atomic_fetch_add(&cd_stats.reused[a->kind], 1);
            cd_log(CD_LOG_DEBUG, "%s %#lx reused", cd_kind_name(a->kind),
                   (unsigned long)r->key);
            *key = r->key;
            ready = true;
            cd_ctx_exit(c);
            break;
        }
        uint64_t ns = q == CUDA_ERROR_NOT_READY && !lags ? next_nap(a, r, held, own, &w) : 0;
        if (r)
            cd_books_unclaim(c, r);
        cd_ctx_exit(c);
        if (!ns)
            break;
        if (!ranged)
            cd_range_push("cudefer: allocation waits for a released block");
        ranged = true;
        nap(ns);
    }
    if (ranged)
        cd_range_pop();
    if (w.start) {
        atomic_fetch_add(&cd_stats.reuse_waits, 1);
        atomic_fetch_add(&cd_stats.reuse_wait_ns, cd_now_ns() - w.start);
        if (w.debt)
            atomic_fetch_add(&cd_stats.debt_waits, 1);
    }
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
        cd_books_forget(cd_kind_class(a->kind), key);
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

/* ---- what cuMemGetInfo says ---------------------------------------------------- */

struct on_device {
    CUdevice device;
    long long bytes;
};

static void add_device_bytes(struct cd_ctx *c, void *arg)
{
    struct on_device *d = arg;
    if (c->device == d->device)
        d->bytes += cd_books_device_bytes(c);
}

void cd_mem_info(size_t *free, size_t total)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct on_device d = {0, 0};
    if (!cd_engine_on() || !ops->ctx_get_device || ops->ctx_get_device(&d.device) != CUDA_SUCCESS)
        return;
    cd_ctx_each(add_device_bytes, &d);
    if (d.bytes <= 0)
        return;
    size_t room = total > *free ? total - *free : 0;
    *free += (size_t)d.bytes < room ? (size_t)d.bytes : room;
}
