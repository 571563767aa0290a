/* reclaim.c - where deferred releases are really made, and out-of-memory.
 *
 * Flush points are moments where waiting is what the program does anyway
 * or must: cuCtxSynchronize, cudefer_flush(), an allocation that failed for
 * lack of memory, a registration that overlaps a pending unregister, and a
 * context's teardown (teardown.c). A flush takes entries off the books and
 * holds no lock while the driver waits, so other threads' releases,
 * allocations and launches carry on. The engine's calls during a flush are
 * made in the relaxed capture mode: a capture that another thread starts
 * meanwhile is not invalidated.
 *
 * An allocation that failed for lack of memory first takes back what needs
 * no waiting for unfinished GPU work: device blocks whose fence has passed
 * (freed on the context's idle stream, which returns at once) and frees in
 * flight that have completed. Only if the retry fails again does it wait:
 * for every context's entries, for the frees in flight, and for what other
 * threads' flushes hold at that moment, then retries once more.
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
#include "reclaim.h"
#include "registry.h"
#include "retire.h"
#include "stats.h"
#include "waiter.h"

#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

/* A context whose teardown has begun holds what the program released in
 * it until the driver's destruction returns: counted like a flush. */
void cd_reclaim_ending(int dev, int delta)
{
    cd_books_transit(dev, delta);
    if (delta < 0)
        cd_registry_note_returned();
}

/* Really releases one entry, after its fence (its other contexts' records
 * have passed: flush_context). MAY WAIT. */
static void release_one(struct cd_ctx *c, struct cd_record *r)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    /* The driver's release waits for its own context only; the fence also
     * covers kernels of other contexts (peer access). */
    if (r->done)
        ops->event_synchronize(r->done);
    CUresult rc = cd_backend((enum cd_kind)r->kind)->release(r);
    if (rc == CUDA_SUCCESS) {
        atomic_fetch_add(&cd_stats.released[r->kind], 1);
    } else {
        atomic_fetch_add(&cd_stats.errors[r->kind], 1);
        if (rc != CUDA_ERROR_DEINITIALIZED)
            cd_log(CD_LOG_ERROR, "deferred release of %s %#lx failed with error %d",
                   cd_kind_name((enum cd_kind)r->kind), (unsigned long)r->key, (int)rc);
    }
    cd_retire_drop_event(c, r);
    cd_books_unregistered(r);
    cd_registry_end(r, CD_GONE);
}

static bool fence_passed(struct cd_record *r)
{
    return cd_fence_query(r->ctx, r->done, r->far) == CUDA_SUCCESS;
}

/* Frees the device blocks of list, whose fences have passed, on c's idle
 * stream and waits for those frees: nothing else runs there (only frees
 * of passed blocks, from here and the context's warm-up), so the wait
 * ends as soon as the driver has done them, and the host synchronisation
 * gives the memory back to the driver's allocator and to cuMemGetInfo
 * (DESIGN §1). A block whose free fails goes back on the books. Called in
 * c's scope. Returns how many were freed. WAITS for the frees only, never
 * for the program's work. */
static size_t free_settled(struct cd_ctx *c, struct cd_link *list)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_link freed;
    cd_list_init(&freed);
    while (!cd_list_empty(list)) {
        struct cd_record *r = CD_CONTAINER(list->next, struct cd_record, age);
        cd_list_remove(&r->age);
        /* No wait for the passed fence: behind one, the free costs less
         * in the call and more in the synchronisation (2,504 against 1,383
         * ns a block for both, run 81). */
        if (ops->mem_free_async((CUdeviceptr)r->key, c->spare) == CUDA_SUCCESS)
            cd_list_append(&freed, &r->age);
        else
            cd_books_defer(c, r);
    }
    if (cd_list_empty(&freed))
        return 0;
    ops->stream_synchronize(c->spare);
    size_t n = 0;
    while (!cd_list_empty(&freed)) {
        struct cd_record *r = CD_CONTAINER(freed.next, struct cd_record, age);
        cd_list_remove(&r->age);
        atomic_fetch_add(&cd_stats.released[r->kind], 1);
        cd_retire_drop_event(c, r);
        cd_registry_end(r, CD_GONE);
        n++;
    }
    return n;
}

/* Moves the entries of from for which pick holds to the end of to, in
 * their order. Does not wait (pick does not). */
static void move_where(struct cd_link *from, struct cd_link *to,
                       bool (*pick)(struct cd_record *r))
{
    for (struct cd_link *e = from->next, *next; e != from; e = next) {
        next = e->next;
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, age);
        if (pick(r)) {
            cd_list_remove(&r->age);
            cd_list_append(to, &r->age);
        }
    }
}

static bool fenced_device(struct cd_record *r)
{
    return r->kind == CD_DEVICE && r->done;
}

/* The greatest number of the other contexts' records (fence.h) among list's
 * entries. */
static uint64_t far_of(struct cd_link *list)
{
    uint64_t far = 0;
    for (struct cd_link *e = list->next; e != list; e = e->next) {
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, age);
        far = r->far > far ? r->far : far;
    }
    return far;
}

/* Puts the entries of list whose other contexts' records have not passed
 * back on c's books. */
static void requeue_unpassed(struct cd_ctx *c, struct cd_link *list)
{
    for (struct cd_link *e = list->next, *next; e != list; e = next) {
        next = e->next;
        struct cd_record *r = CD_CONTAINER(e, struct cd_record, age);
        if (!cd_fence_far_passed(c, r->far)) {
            cd_list_remove(&r->age);
            cd_books_defer(c, r);
        }
    }
}

/* The number up to which the other contexts' records of c's fences have
 * passed, asked in the relaxed capture mode. Does not wait. */
static uint64_t far_floor(struct cd_ctx *c)
{
    struct cd_scope sc;
    cd_scope_enter(&sc, NULL, true);
    uint64_t far = cd_fence_far_floor(c);
    cd_scope_leave(&sc);
    return far;
}

/* What an allocation short of memory may take back (cd_alloc_failed): the
 * kinds in here in the contexts of device dev (of every device when dev is
 * negative), and the kinds in everywhere in every context. Memory of
 * another device cannot serve it, and a wait for that device's work is
 * one the driver never made: the kernel waited for may be a collective
 * that waits for this very thread's next launch on its own device. */
struct reach {
    int dev;
    unsigned here, everywhere;
};

/* Kinds that hold a device's memory. */
#define DEVICE_SIDE                                                                         \
    ((1u << CD_DEVICE) | (1u << CD_ARRAY) | (1u << CD_MIPMAPPED) | (1u << CD_MODULE) |     \
     (1u << CD_LIBRARY))
/* Kinds that hold pinned host memory. */
#define HOST_SIDE ((1u << CD_HOST) | (1u << CD_REGISTERED))

/* Whether dev moves managed pages out of its memory when a device
 * allocation needs the room: on an H200 (driver 580.159.04, bench/RESULTS.md
 * run 99) a cuMemAlloc of 71 GB beside 107 GB of managed memory resident on
 * the device succeeded, the managed pages moved to the host with their
 * contents. Devices without concurrent managed access (before Pascal, or
 * without the full unified memory driver) keep managed memory on the device:
 * there it takes device memory that only its release gives back. Does not
 * wait. */
static bool managed_moves_out(int dev)
{
    int concurrent = 0;
    return cd_driver_ops()->device_get_attribute(
               &concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, (CUdevice)dev) ==
               CUDA_SUCCESS &&
           concurrent;
}

/* What may serve an allocation of mem (engine.h, CD_MEM_*; CD_MEM_CURRENT
 * resolved). Managed memory may live in any device's memory or the host's,
 * whichever context released it; a device that moves managed pages out
 * makes room for its allocations itself, without their release. Does not
 * wait. */
static struct reach reach_of(int mem)
{
    if (mem == CD_MEM_HOST)
        return (struct reach){.dev = -1, .everywhere = HOST_SIDE | (1u << CD_MANAGED)};
    if (mem < 0)
        return (struct reach){.dev = -1, .everywhere = CD_ALL_KINDS};
    return (struct reach){.dev = mem, .here = DEVICE_SIDE,
                          .everywhere = managed_moves_out(mem) ? 0 : 1u << CD_MANAGED};
}

/* Whose entries in transit an allocation of reach r waits for: its
 * device's when r takes nothing from other devices, else all of them. */
static int transit_of_reach(const struct reach *r)
{
    return r && r->dev >= 0 && !r->everywhere ? r->dev : CD_TRANSIT_ALL;
}

/* The kinds r takes in c (all of them without r). Does not wait. */
static unsigned reach_mask(const struct reach *r, const struct cd_ctx *c)
{
    if (!r)
        return CD_ALL_KINDS;
    return r->everywhere | (r->dev < 0 || c->device == r->dev ? r->here : 0);
}

/* Whether r takes c's device blocks, and so its frees in flight. */
static bool reach_takes_device(const struct reach *r, const struct cd_ctx *c)
{
    return reach_mask(r, c) & (1u << CD_DEVICE);
}

/* A flush: why, what it takes in each context, whether it settles the
 * frees in flight, until when it waits for the other contexts' records of
 * the fences (far_deadline, cd_now_ns; 0: for as long as they take; past
 * it, or where captures keep them from being made, the entries go after
 * their own context's work), and what it found. */
struct flush {
    enum cd_flush_reason why;
    struct cd_take take;
    const struct reach *reach; /* NULL: take.mask in every context */
    bool settle;
    uint64_t far_deadline;
    bool any;  /* there was something to do */
    bool held; /* ending contexts held entries back */
};

/* Other contexts' kernels can use the memory a context released (they
 * write its registered pages, its pinned and its device memory:
 * bench/RESULTS.md, run 95), so a flush that may wait waits for their
 * records of the fences. The driver's own releases did not wait for other
 * contexts, and a kernel of another context may wait for the very thread
 * that waits: a round of an allocation short of memory waits for those
 * records OOM_FAR_NS at most, a registration over a pending unregister
 * CD_FAR_GIVE_UP_NS; past that, the entries are released after their own
 * context's work, as the driver's release did. */
#define OOM_FAR_NS 100000000ull

/* Releases the entries of c that f->take picks, of the kinds f->reach
 * takes there: device blocks through cuMemFreeAsync behind their fence,
 * the others with the driver's release.
 * A synchronisation (why CD_FLUSH_SYNC) leaves the entries whose other
 * contexts' records have not passed: the program waited for its context
 * only. Other flushes WAIT for those records (until f->far_deadline). With
 * f->settle, WAITS until c's frees in flight have given the memory back.
 * Notes in f whether there was anything to do. MAY WAIT. */
static void flush_context(struct cd_ctx *c, struct flush *f)
{
    enum cd_flush_reason why = f->why;
    struct cd_link list, device;
    cd_list_init(&list);
    cd_list_init(&device);
    struct cd_take take = f->take;
    take.mask &= reach_mask(f->reach, c);
    /* Frees in flight are device blocks. */
    bool settle = f->settle && (take.mask & (1u << CD_DEVICE));
    take.far = why == CD_FLUSH_SYNC ? far_floor(c) : UINT64_MAX;
    /* A context with a sticky error keeps its entries for its destruction:
     * every release in it would fail. */
    /* Counted before the entries leave the books: an out-of-memory answer
     * in another thread sees either the entries or this flush. */
    int dev = (int)c->device;
    cd_books_transit(dev, 1);
    long long kept = 0;
    /* Entries deferred while a capture is live have no fence yet: the
     * driver's own release waits for their context's work (README, limits:
     * not for other contexts'). */
    size_t n = atomic_load(&c->sticky)
                   ? 0
                   : cd_books_take_all(c, &take, &kept, &list);
    bool frees = settle && cd_waiter_pending(c);
    cd_books_transit(dev, (long long)n);
    if (!n && !frees) {
        cd_books_transit(dev, -1);
        return;
    }
    f->any = true;
    atomic_fetch_add(&cd_stats.flushes[why], 1);
    cd_range_push(why == CD_FLUSH_OOM ? "cudefer: flush (out of memory)" : "cudefer: flush");
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    /* The other contexts' records of the fences, on the host: nothing of
     * this context's work waits for them on the GPU. A context that is
     * ending may itself wait for this flush to end (its slot drains the
     * uses under way): after a few milliseconds, what it holds back goes
     * back on the books for a later flush. */
    uint64_t need = far_of(&list);
    enum cd_far_wait far_rc =
        need ? cd_fence_far_wait(c, need, f->far_deadline) : CD_FAR_PASSED;
    if (f->far_deadline && (far_rc == CD_FAR_CAPTURED || far_rc == CD_FAR_LATE)) {
        /* Records that live captures keep from being made, or other
         * contexts' work still running: the thread that captures, or a
         * kernel of another context, may be waiting for this very thread
         * (tests/race.c: stalls of 6-54 s; a kernel that waits for the
         * host, tests/test_scenarios.c). The entries are released after
         * their own context's work, as the driver's own release would have
         * waited for; other contexts' kernels that still use them are not
         * waited for, as without cudefer. A registration over a pending
         * unregister would otherwise answer
         * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED for pages the program
         * unregistered. */
        if (why == CD_FLUSH_OOM)
            atomic_fetch_add(&cd_stats.far_skipped, 1);
        cd_log(CD_LOG_INFO, "%s: entries of context %p released without waiting for other "
               "contexts' work (%s)",
               why == CD_FLUSH_OOM ? "out of memory" : "a registration over a pending unregister",
               (void *)atomic_load(&c->handle),
               far_rc == CD_FAR_LATE ? "it still ran" : "a capture keeps its record from being made");
    } else if (far_rc != CD_FAR_PASSED) {
        requeue_unpassed(c, &list);
        f->held = true;
    }
    int released = 0;
    /* Device blocks first: their frees do not wait, and their memory is
     * back soonest. */
    move_where(&list, &device, fenced_device);
    if (!cd_list_empty(&device)) {
        /* Stream-ordered frees on the private stream, behind each fence.
         * A synchronisation makes them only outside captures (the gate);
         * then they wait on the books for the next flush. A flush that may
         * wait (out of memory, cudefer_flush) makes them during captures
         * too: a capture may stay live for as long as the program likes,
         * and from a thread in the relaxed mode, frees and records on the
         * engine's own non-blocking stream leave every capture intact
         * (measured, DESIGN §1.3). Before driver 12.5 the private stream is
         * a blocking one, not measured: there the driver's cuMemFree
         * releases them after their fence, like the other kinds. */
        bool gate = cd_gate_enter();
        /* A synchronisation settles the blocks whose fences have passed
         * (all those released before the program's own wait) on the idle
         * stream before it returns, outside the gate (a capture that
         * begins meanwhile waits for the gate's holders): a cuMemGetInfo
         * right after it counts them free, as after the driver's own
         * releases; small blocks move it byte for byte as large ones do
         * (run 81). That costs the synchronisation about 2.6 us a block on
         * an H200, 0.8 when the waiter settled them. A block released
         * since, in another thread, goes the waiter's way: a wait for it
         * could reach work launched after the program's synchronisation. */
        struct cd_link passed;
        cd_list_init(&passed);
        if (gate && why == CD_FLUSH_SYNC)
            move_where(&device, &passed, fence_passed);
        if (gate || (why != CD_FLUSH_SYNC && c->ctx_record))
            cd_retire_free(c, c->priv, &device);
        else if (why != CD_FLUSH_SYNC)
            cd_list_splice(&list, &device);
        if (gate)
            cd_gate_exit();
        released += (int)free_settled(c, &passed);
        while (!cd_list_empty(&device)) {
            struct cd_record *r = CD_CONTAINER(device.next, struct cd_record, age);
            cd_list_remove(&r->age);
            cd_books_defer(c, r);
        }
    }
    while (!cd_list_empty(&list)) {
        struct cd_record *r = CD_CONTAINER(list.next, struct cd_record, age);
        cd_list_remove(&r->age);
        release_one(c, r);
        released++;
    }
    cd_ctx_event_trim(c, why != CD_FLUSH_SYNC);
    cd_scope_leave(&sc);
    cd_books_transit(dev, -(long long)n - 1);
    if (settle)
        cd_waiter_settle(c, true);
    cd_range_pop();
    cd_log(CD_LOG_INFO, "flush (%s) of context %p: %zu entries, %d released with the driver's "
           "calls, %lld bytes kept for reuse", cd_flush_reason_name(why),
           (void *)atomic_load(&c->handle), n, released, kept);
}

static void flush_each(struct cd_ctx *c, void *arg)
{
    struct flush *f = arg;
    if (!(reach_mask(f->reach, c) & f->take.mask))
        return;
    cd_ctx_warm_up(c);
    flush_context(c, f);
}

/* Makes f in every context. MAY WAIT. */
static void flush_all(struct flush *f)
{
    cd_ctx_each(flush_each, f);
}

/* After a flush of everything: frees in flight settled, spare events
 * beyond the first few destroyed. MAY WAIT. */
static void settle_and_trim(struct cd_ctx *c, void *arg)
{
    (void)arg;
    cd_waiter_settle(c, true);
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    cd_ctx_event_trim(c, true);
    cd_fence_trim(c);
    cd_scope_leave(&sc);
}

int cd_flush_all(void)
{
    if (!cd_engine_on())
        return 0;
    struct flush f = {.why = CD_FLUSH_EXPLICIT, .take = CD_TAKE_ALL(CD_ALL_KINDS), .settle = true};
    flush_all(&f);
    /* What other threads took off the books meanwhile (their flushes, the
     * waiter's evictions) is released or in flight once they are done. */
    if (!cd_books_transit_wait(CD_TRANSIT_ALL, 60))
        cd_log(CD_LOG_ERROR, "cudefer_flush: another thread has held released memory for a "
               "minute; returning without it");
    cd_ctx_each(settle_and_trim, NULL);
    return 0;
}

void cd_context_synchronized(CUcontext ctx)
{
    if (!cd_engine_on())
        return;
    struct cd_ctx *c = ctx ? cd_ctx_find(ctx) : cd_ctx_current();
    unsigned gen;
    if (!c || !cd_ctx_enter_any(c, &gen))
        return;
    /* Everything but the blocks CUDEFER_KEEP leaves for reuse: device
     * blocks through cuMemFreeAsync (the waiter settles them), the rest
     * with the driver's releases. */
    cd_ctx_warm_up(c);
    struct flush f = {.why = CD_FLUSH_SYNC, .take = CD_TAKE_ALL(CD_ALL_KINDS)};
    f.take.keep = cd_option_int(CD_OPT_KEEP);
    flush_context(c, &f);
    cd_waiter_see(c);
    cd_ctx_exit(c);
}

/* ---- out of memory ------------------------------------------------------------ */

/* A look or a round of an allocation short of memory: what may serve it,
 * and what the look found. */
struct oom_walk {
    const struct reach *reach;
    bool found;
};

/* Frees c's device blocks whose fence has passed on its idle stream and
 * settles them there and then; settles the completed frees in flight; in
 * the contexts whose device blocks may serve the walk's allocation. Does
 * not wait for unfinished GPU work. */
static void reclaim_ready(struct cd_ctx *c, void *arg)
{
    struct oom_walk *w = arg;
    if (!reach_takes_device(w->reach, c))
        return;
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    struct cd_link list;
    cd_list_init(&list);
    /* In transit until the memory is back with the driver or the entries
     * on the books (holds_anything). */
    cd_books_transit(c->device, 1);
    if (cd_books_take_passed(c, fence_passed, &list) && free_settled(c, &list))
        w->found = true;
    cd_books_transit(c->device, -1);
    cd_scope_leave(&sc);
    if (cd_waiter_settle(c, false))
        w->found = true;
}

static void note_held(struct cd_ctx *c, void *arg)
{
    struct oom_walk *w = arg;
    if (cd_books_holds(c, reach_mask(w->reach, c)) || cd_books_claims(c) ||
        (reach_takes_device(w->reach, c) && cd_waiter_pending(c)))
        w->found = true;
}

/* Whether the engine holds anything the program released: on the books of
 * a context, in a free in flight, or in transit (books.h) at any moment of
 * the look. An entry leaves the books only once it is counted in transit,
 * and goes back before it stops being counted: a look that found nothing
 * in transit before and after, with no change between, missed none.
 * Without that order, a flush that took the entries after the first read
 * of transit and put some back after the look at its context, or held
 * them past it, left an allocation thinking that nothing was held while
 * the driver lacked what the engine held. Does not wait. */
static bool holds_anything(const struct reach *reach)
{
    unsigned long long before, after;
    int dev = transit_of_reach(reach);
    if (cd_books_in_transit(dev, &before) > 0)
        return true;
    struct oom_walk w = {.reach = reach};
    cd_ctx_each(note_held, &w);
    return w.found || cd_books_in_transit(dev, &after) > 0 || after != before;
}

/* Waits for what reuses claim (each for at most an allocation's cost). */
static void claims_wait(struct cd_ctx *c, void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000 && cd_books_claims(c) > 0; i++) {
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

/* Settles c's frees in flight where device blocks may serve the walk's
 * allocation. WAITS for their fences. */
static void settle_each(struct cd_ctx *c, void *arg)
{
    if (reach_takes_device(arg, c))
        cd_waiter_settle(c, true);
}

/* Everything the engine holds that reach takes goes back to the driver,
 * but what ending contexts hold back (*held_back). WAITS for the GPU. */
static bool reclaim_waiting(const char *call, const struct reach *reach, bool *held_back)
{
    if (!holds_anything(reach))
        return false;
    cd_log(CD_LOG_INFO, "%s ran out of memory: waiting for the GPU to give back what "
           "cudefer holds, then retrying", call);
    cd_range_push("cudefer: out of memory, waiting for released memory");
    cd_ctx_each(claims_wait, NULL);
    struct flush f = {.why = CD_FLUSH_OOM, .take = CD_TAKE_ALL(CD_ALL_KINDS), .reach = reach,
                      .settle = true, .far_deadline = cd_now_ns() + OOM_FAR_NS};
    flush_all(&f);
    *held_back = f.held;
    /* Entries another thread's flush holds at this moment come back when
     * its releases end; then their frees are settled too. Another device's
     * are not waited for: they cannot serve this allocation, and the flush
     * that holds them may be waiting for that device's work. */
    if (!cd_books_transit_wait(transit_of_reach(reach), 60))
        cd_log(CD_LOG_ERROR, "%s: another thread's flush has held released memory for a "
               "minute; retrying without it", call);
    cd_ctx_each(settle_each, (void *)reach);
    cd_range_pop();
    return true;
}

/* Rounds of waiting reclaims an allocation makes at least before it may
 * give up while the engine still holds memory: other threads may release,
 * and take, memory meanwhile. */
#define WAITING_ROUNDS 8
/* Past WAITING_ROUNDS, rounds go on while the engine holds memory, until
 * this long after the allocation began. Many threads that release and
 * allocate at once take what a round gives back before its thread asks
 * again, and release more into the engine: a fixed count of rounds failed
 * allocations that the driver alone would have served (tests/race.c,
 * invariant oom-while-held). A program that really lacks the memory gets
 * its answer that much later, and only while other threads release. */
#define PERSIST_NS 1000000000ull
/* Rounds in which ending contexts held released memory back do not count,
 * for this long: a context's end takes milliseconds, and between rounds
 * the allocation holds no context that an end would wait for. */
#define HELD_BACK_NS 10000000000ull
/* Retries an allocation makes at most because memory went back while it
 * asked (each one asks the driver only). */
#define RECHECKS 64

/* Whether memory went back since a's last ask (cd_registry_returned); notes
 * the count for the next one. A failure after which the count moved is
 * retried before anything else: the memory the driver lacked may be back,
 * and what cudefer holds may be nothing by now. */
static bool returned_since(struct cd_alloc *a)
{
    unsigned long long now = cd_registry_returned();
    bool moved = now != a->seen;
    a->seen = now;
    return moved;
}

/* Whether a asks the driver again at once because memory went back since
 * its last ask (at most RECHECKS times). */
static bool recheck(struct cd_alloc *a)
{
    if (!returned_since(a) || a->rechecks >= RECHECKS)
        return false;
    a->rechecks++;
    return true;
}

static bool release_unmapped(struct cd_alloc *a, CUresult rc);

bool cd_alloc_failed(struct cd_alloc *a, CUresult rc)
{
    if (release_unmapped(a, rc))
        return true;
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || !cd_engine_on())
        return false;
    if (a->level > WAITING_ROUNDS && cd_now_ns() - a->start_ns >= PERSIST_NS)
        return false;
    if (recheck(a))
        return true;
    if (a->mem == CD_MEM_CURRENT) {
        struct cd_ctx *cur = cd_ctx_current();
        a->mem = cur ? (int)cur->device : CD_MEM_ANY;
    }
    struct reach reach = reach_of(a->mem);
    if (a->level == 0) {
        a->level = 1;
        struct oom_walk w = {.reach = &reach};
        cd_range_push("cudefer: out of memory, taking back released memory");
        cd_ctx_each(reclaim_ready, &w);
        cd_range_pop();
        if (w.found) {
            atomic_fetch_add(&cd_stats.reclaims, 1);
            cd_log(CD_LOG_DEBUG, "%s ran out of memory: took back what needed no waiting, "
                   "retrying", a->call);
            return true;
        }
    }
    /* Then, while cudefer holds anything: whatever other threads released
     * before the retry is taken back too. */
    a->level++;
    bool held = false;
    if (!reclaim_waiting(a->call, &reach, &held)) {
        /* Nothing held now; what another thread settled since the ask is
         * back with the driver. */
        return recheck(a);
    }
    if (held) {
        uint64_t now = cd_now_ns();
        if (!a->held_ns)
            a->held_ns = now;
        if (now - a->held_ns < HELD_BACK_NS)
            a->level--;
    }
    atomic_fetch_add(&cd_stats.reclaims_waited, 1);
    return true;
}

/* ---- registrations ------------------------------------------------------------- */

/* Makes the queued unregisters that take picks, in every context;
 * *held: ending contexts held some back. Returns whether there was
 * anything to do. MAY WAIT (for other contexts' work CD_FAR_GIVE_UP_NS at
 * most). */
static bool flush_registered(struct cd_take take, bool *held)
{
    struct flush f = {.why = CD_FLUSH_REGISTER, .take = take,
                      .far_deadline = cd_now_ns() + CD_FAR_GIVE_UP_NS};
    flush_all(&f);
    *held = f.held;
    return f.any;
}

/* Releases the queued unregisters overlapping [lo, hi), and those alone:
 * another range's pending unregister may wait for its own context's work
 * (the driver's unregister waits for all of it), which this registration
 * would not have waited for without cudefer. One may be off the books for
 * a moment in another thread's flush, whose driver unregister is under
 * way: then this waits for that range to be done. MAY WAIT for those
 * unregisters. Gives up after ten rounds (a round waits at most 1 s for
 * another thread's unregister, or 5 ms for an ending context's record);
 * a round cut short because a range may have come within reach (a slot
 * open again, an entry back on the books) does not count, within ten
 * seconds. */
#define RELEASE_OVERLAPPING_NS (10ull * 1000000000ull)

static bool release_overlapping(uintptr_t lo, uintptr_t hi)
{
    struct cd_take only = {.mask = 1u << CD_REGISTERED, .far = UINT64_MAX, .lo = lo, .hi = hi};
    bool any = false;
    uint64_t until = cd_now_ns() + RELEASE_OVERLAPPING_NS;
    for (int round = 0; cd_books_registered_overlap(lo, hi) && round < 10; round++) {
        unsigned long long gen = cd_books_registered_gen();
        bool held = false;
        any |= flush_registered(only, &held);
        /* Entries an ending context held back are on the books again:
         * the next round takes them (the flush gave them 5 ms). One no
         * flush may take (a context with a sticky error keeps its entries
         * for its destruction) stays while nothing is in transit. */
        if (held)
            continue;
        if (cd_books_in_transit(CD_TRANSIT_ALL, NULL) == 0 ||
            cd_books_registered_wait(lo, hi, 1000, gen))
            break;
        /* Woken because one may be within reach now (a slot open again,
         * an entry back on the books): not a round of waiting, within the
         * rounds' time. */
        if (cd_books_registered_gen() != gen && cd_now_ns() < until)
            round--;
    }
    if (cd_books_registered_overlap(lo, hi))
        cd_log(CD_LOG_ERROR, "a pending unregister of %#lx stays out of reach", (unsigned long)lo);
    return any;
}

/* Whether every page of [lo, hi) is mapped in the process (msync answers
 * ENOMEM for a range with a hole; MS_ASYNC writes nothing back). */
static bool mapped(uintptr_t lo, uintptr_t hi)
{
    uintptr_t start = lo & ~(uintptr_t)4095;
    return msync((void *)start, hi - start, MS_ASYNC) == 0 || errno != ENOMEM;
}

#define UNMAPPED_LOOK 256

/* The driver refuses to map new pinned or managed memory over a
 * registration it still holds (cuMemAllocHost and cuMemHostAlloc answer
 * ALREADY_MAPPED, cuMemAllocManaged INVALID_VALUE; each then succeeds at
 * the same address once the registration is undone: measured on the H200,
 * tests/gpu/facts.c unmapped). A pending unregister is such a registration
 * once the program has unmapped its pages (free after cuMemHostUnregister),
 * which the driver's own unregister would have undone at the program's
 * call. While any registration is pending (or one was undone since the
 * call was asked), makes the pending unregisters whose pages are no longer
 * all mapped (up to UNMAPPED_LOOK of them; one another thread's flush holds
 * is waited for) and has the caller ask again, at most eight times: the
 * program may have mapped new pages over the hole meanwhile, and the next
 * try then lands elsewhere. MAY WAIT for those unregisters. */
static bool release_unmapped(struct cd_alloc *a, CUresult rc)
{
    bool refused = (a->kind == CD_HOST && rc == CUDA_ERROR_ALREADY_MAPPED) ||
                   (a->kind == CD_MANAGED && rc == CUDA_ERROR_INVALID_VALUE);
    if (!refused || a->remaps >= 8 || !cd_engine_on())
        return false;
    if (cd_books_registered_pending() == 0 && cd_books_unregisters_done() == a->unregistered)
        return false; /* no registration of cudefer's can be what the driver refused */
    uintptr_t ranges[UNMAPPED_LOOK][2];
    size_t n = cd_books_registered_ranges(ranges, UNMAPPED_LOOK), ngone = 0;
    for (size_t i = 0; i < n; i++)
        if (!mapped(ranges[i][0], ranges[i][1])) {
            release_overlapping(ranges[i][0], ranges[i][1]);
            ngone++;
        }
    a->unregistered = cd_books_unregisters_done();
    a->remaps++;
    cd_log(CD_LOG_DEBUG, "%s: the driver refused to map memory (%d) while registrations were "
           "pending; made the unregisters of %zu whose pages the program unmapped, retrying",
           a->call, (int)rc, ngone);
    return true;
}

void cd_register_start(void *ptr, size_t bytes)
{
    if (!cd_engine_on() || cd_books_registered_pending() == 0)
        return;
    release_overlapping((uintptr_t)ptr, (uintptr_t)ptr + bytes);
}

bool cd_register_failed(CUresult rc, void *ptr, size_t bytes)
{
    if (rc != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || !cd_engine_on() ||
        cd_books_registered_pending() == 0)
        return false;
    /* The range may differ from the queued one only in its pages. */
    uintptr_t lo = (uintptr_t)ptr & ~(uintptr_t)4095, hi = (uintptr_t)ptr + bytes + 4095;
    bool any = release_overlapping(lo, hi & ~(uintptr_t)4095);
    /* Any other overlap is with a registration the program holds: the
     * driver's answer stands, at once, as it would without cudefer (a flush
     * here would wait for the GPU). Only a pending unregister whose range
     * could not be noted may be the one in the way: then they all go. */
    bool held = false;
    if (cd_books_registered_unnoted())
        any |= flush_registered(CD_TAKE_ALL(1u << CD_REGISTERED), &held);
    return any;
}
