/* waiter.c - the waiter thread. */
#include "waiter.h"

#include "clock.h"
#include "driver.h"
#include "fence.h"
#include "capture.h"
#include "log.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond;
static bool work_posted;
static _Atomic bool stopping;
static _Atomic bool running;
static pthread_t thread;
/* Frees issued and watches made, not yet settled or seen through. */
static _Atomic long long pending;
static bool (*_Atomic on_visit)(struct cd_ctx *c);
/* Set by a context whose visit left work (cd_waiter_poke, or the pass that
 * made it), cleared when a pass begins. */
static _Atomic bool visit_again;

/* Set while the waiter sleeps for want of work: only then does new work
 * post to wake it (a napping waiter finds it within a millisecond). The
 * work is counted before asleep is read, and asleep is set before the count
 * is read again: one of the two sees the other. */
static _Atomic bool asleep;

static void post(void)
{
    pthread_mutex_lock(&wake_lock);
    work_posted = true;
    pthread_cond_signal(&wake_cond);
    pthread_mutex_unlock(&wake_lock);
}

static void wake(void)
{
    if (atomic_load(&asleep))
        post();
}

/* Sleeps until work is posted or, when usec is not 0, usec have passed. */
static void sleep_for(unsigned usec)
{
    pthread_mutex_lock(&wake_lock);
    if (usec) {
        struct timespec ts = cd_monotonic_in((uint64_t)usec * 1000u);
        while (!work_posted && !atomic_load(&stopping) &&
               pthread_cond_timedwait(&wake_cond, &wake_lock, &ts) != ETIMEDOUT)
            ;
    } else {
        atomic_store(&asleep, true);
        while (!work_posted && !atomic_load(&stopping) && atomic_load(&pending) == 0 &&
               !atomic_load(&visit_again))
            pthread_cond_wait(&wake_cond, &wake_lock);
        atomic_store(&asleep, false);
    }
    work_posted = false;
    pthread_mutex_unlock(&wake_lock);
}

void cd_waiter_on_visit(bool (*fn)(struct cd_ctx *c))
{
    atomic_store(&on_visit, fn);
}

void cd_waiter_poke(void)
{
    atomic_store(&visit_again, true);
    wake();
}

void cd_waiter_see_marks(void)
{
    if (cd_fence_marked())
        cd_waiter_poke();
}

void cd_waiter_add(struct cd_ctx *c, struct cd_link *list, long long n)
{
    if (!n)
        return;
    atomic_fetch_add(&pending, n);
    pthread_mutex_lock(&c->lock);
    cd_list_splice(&c->inflight, list);
    pthread_mutex_unlock(&c->lock);
    wake();
}

/* Releases one watch stands for at most: its sums stay far from overflow
 * (2^16 releases times three days in ns fit in 64 bits). */
#define WATCH_JOINS 65536
/* A context begins a watch at most this often. A release that finds the
 * newest watch's work ended and another begun less than this ago adds
 * nothing to the figure (it stays a lower bound): in a tight loop whose
 * work ends within microseconds, a watch, its event and a wake of the
 * waiter per release cost more than the release itself (measured on an
 * H200). */
#define WATCH_EVERY_NS 1000000

static uint32_t releases_of(const struct cd_watch *w)
{
    uint32_t n = 0;
    for (int k = 0; k < CD_KIND_COUNT; k++)
        n += w->count[k];
    return n;
}

/* Adds a release of kind made at now to the newest watch of c, if that
 * watch's work still runs. Under c->lock, so that the waiter cannot free
 * it meanwhile. */
static bool join_newest(struct cd_ctx *c, enum cd_kind kind, uint64_t now,
                        const struct cd_driver_ops *ops)
{
    bool joined = false;
    pthread_mutex_lock(&c->lock);
    if (!cd_list_empty(&c->watches)) {
        struct cd_watch *w = CD_CONTAINER(c->watches.prev, struct cd_watch, link);
        if (!w->ended && releases_of(w) < WATCH_JOINS && now >= w->since_ns) {
            if (ops->event_query(w->event) == CUDA_ERROR_NOT_READY) {
                w->count[kind]++;
                w->after_sum[kind] += now - w->since_ns;
                joined = true;
            } else {
                w->ended = true;
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    return joined;
}

void cd_waiter_watch(struct cd_ctx *c, enum cd_kind kind)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    uint64_t now = cd_now_ns();
    if (join_newest(c, kind, now, ops))
        return;
    uint64_t last = atomic_load(&c->watch_ns);
    if ((last && now < last + WATCH_EVERY_NS) ||
        !atomic_compare_exchange_strong(&c->watch_ns, &last, now))
        return;
    struct cd_watch *w = calloc(1, sizeof *w);
    if (!w)
        return;
    w->since_ns = now;
    w->count[kind] = 1;
    /* A fence of its own: it completes when the work before the release
     * has finished, as the release's does. */
    if (cd_fence(c, &w->event, NULL, NULL) != CUDA_SUCCESS) {
        free(w);
        return;
    }
    atomic_fetch_add(&pending, 1);
    pthread_mutex_lock(&c->lock);
    cd_list_append(&c->watches, &w->link);
    pthread_mutex_unlock(&c->lock);
    wake();
}

/* Ends the records of a settled batch. */
static size_t end_records(struct cd_link *records, CUresult q)
{
    size_t n = 0;
    while (!cd_list_empty(records)) {
        struct cd_record *r = CD_CONTAINER(records->next, struct cd_record, age);
        cd_list_remove(&r->age);
        if (q != CUDA_SUCCESS) {
            cd_log(CD_LOG_ERROR, "device free of %#lx: the driver reported error %d",
                   (unsigned long)r->key, (int)q);
            atomic_fetch_add(&cd_stats.errors[r->kind], 1);
        } else {
            atomic_fetch_add(&cd_stats.released[r->kind], 1);
        }
        cd_registry_end(r, CD_GONE);
        n++;
    }
    atomic_fetch_sub(&pending, (long long)n);
    return n;
}

/* Puts the frees issued since the last pass behind a marker; under
 * drain_lock. */
static void open_batch(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    struct cd_link fresh;
    cd_list_init(&fresh);
    pthread_mutex_lock(&c->lock);
    cd_list_splice(&fresh, &c->inflight);
    pthread_mutex_unlock(&c->lock);
    if (cd_list_empty(&fresh))
        return;
    struct cd_batch *b = calloc(1, sizeof *b);
    if (!b) {
        /* Settled at once: the registry forgets them early, which is
         * harmless (the driver hands their addresses out only once the
         * frees are done). */
        end_records(&fresh, CUDA_SUCCESS);
        return;
    }
    cd_list_init(&b->records);
    cd_list_splice(&b->records, &fresh);
    if (cd_ctx_event_get(c, &b->marker) == CUDA_SUCCESS &&
        ops->event_record(b->marker, c->priv) != CUDA_SUCCESS) {
        cd_ctx_event_put(c, b->marker);
        b->marker = NULL;
    }
    struct cd_batch **tail = &c->batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
}

/* Watches whose work has ended, in order (the private stream runs in
 * order).  drain_lock makes one thread the reader of the list's head:
 * the head is queried without c->lock held, and a second reader could
 * otherwise free it under the first. */
static void see_watches(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    pthread_mutex_lock(&c->drain_lock);
    for (;;) {
        pthread_mutex_lock(&c->lock);
        struct cd_watch *w = cd_list_empty(&c->watches)
                                 ? NULL
                                 : CD_CONTAINER(c->watches.next, struct cd_watch, link);
        pthread_mutex_unlock(&c->lock);
        if (!w || ops->event_query(w->event) == CUDA_ERROR_NOT_READY)
            break;
        pthread_mutex_lock(&c->lock);
        cd_list_remove(&w->link);
        pthread_mutex_unlock(&c->lock);
        /* Each release waited, at least, from its time to the end. */
        uint64_t ran = cd_now_ns() - w->since_ns;
        for (int k = 0; k < CD_KIND_COUNT; k++)
            if (w->count[k])
                cd_stats_add_avoided((enum cd_kind)k, w->count[k] * ran - w->after_sum[k], ran);
        cd_ctx_event_put(c, w->event);
        free(w);
        atomic_fetch_sub(&pending, 1);
    }
    pthread_mutex_unlock(&c->drain_lock);
}

size_t cd_waiter_settle(struct cd_ctx *c, bool wait)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    if (wait)
        ops->stream_synchronize(c->priv);
    size_t n = 0;
    pthread_mutex_lock(&c->drain_lock);
    open_batch(c, ops);
    while (c->batches) {
        struct cd_batch *b = c->batches;
        CUresult q = b->marker ? ops->event_query(b->marker) : CUDA_SUCCESS;
        if (q == CUDA_ERROR_NOT_READY)
            break;
        /* Completed: the synchronisation returns at once and gives the
         * memory back to the driver's allocator. */
        if (q == CUDA_SUCCESS && b->marker)
            q = ops->event_synchronize(b->marker);
        c->batches = b->next;
        cd_ctx_event_put(c, b->marker);
        n += end_records(&b->records, q);
        free(b);
    }
    pthread_mutex_unlock(&c->drain_lock);
    if (wait)
        see_watches(c, ops);
    cd_scope_leave(&sc);
    return n;
}

void cd_waiter_see(struct cd_ctx *c)
{
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    see_watches(c, cd_driver_ops());
    cd_scope_leave(&sc);
}

bool cd_waiter_pending(struct cd_ctx *c)
{
    pthread_mutex_lock(&c->drain_lock);
    bool busy = c->batches != NULL;
    pthread_mutex_unlock(&c->drain_lock);
    pthread_mutex_lock(&c->lock);
    busy = busy || !cd_list_empty(&c->inflight);
    pthread_mutex_unlock(&c->lock);
    return busy;
}

void cd_waiter_forget(struct cd_ctx *c, bool alive)
{
    struct cd_link fresh;
    cd_list_init(&fresh);
    pthread_mutex_lock(&c->drain_lock);
    pthread_mutex_lock(&c->lock);
    cd_list_splice(&fresh, &c->inflight);
    pthread_mutex_unlock(&c->lock);
    end_records(&fresh, CUDA_SUCCESS);
    while (c->batches) {
        struct cd_batch *b = c->batches;
        c->batches = b->next;
        if (alive)
            cd_ctx_event_put(c, b->marker);
        end_records(&b->records, CUDA_SUCCESS);
        free(b);
    }
    pthread_mutex_unlock(&c->drain_lock);
    pthread_mutex_lock(&c->lock);
    while (!cd_list_empty(&c->watches)) {
        struct cd_watch *w = CD_CONTAINER(c->watches.next, struct cd_watch, link);
        cd_list_remove(&w->link);
        if (alive)
            cd_ctx_event_put(c, w->event);
        free(w);
        atomic_fetch_sub(&pending, 1);
    }
    pthread_mutex_unlock(&c->lock);
}

struct pass {
    const struct cd_driver_ops *ops;
    size_t done;
    bool again;
};

/* Whether a capture in ctx shuts the gate for a record of c's work: it is
 * c's (a green context's counts as its primary's), or one cudefer does not
 * know. */
static bool capture_in(CUcontext ctx, void *arg)
{
    struct cd_ctx *of = cd_ctx_find(ctx);
    return !of || of == arg;
}

/* Makes the records marked for other contexts' fences while c kept walks
 * out; true when some are still to be made. Only while no capture is live
 * in c: a record of c's work would invalidate it, and leaves the others
 * intact when made in the relaxed mode (DESIGN.md §1.3). A fence waits for
 * those records, so a capture elsewhere must not hold them back. */
static bool fill_marked(struct cd_ctx *c)
{
    if (!cd_gate_enter_beside(capture_in, c)) {
        cd_fence_fill_held(c);
        return true;
    }
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), true);
    bool again = cd_fence_fill(c);
    cd_scope_leave(&sc);
    cd_gate_exit();
    return again;
}

static void visit(struct cd_ctx *c, void *arg)
{
    struct pass *p = arg;
    cd_ctx_warm_up(c);
    p->done += cd_waiter_settle(c, false);
    see_watches(c, p->ops);
    cd_fence_prune(c);
    /* Records marked for other contexts' fences while c kept walks out. */
    if (cd_fence_marked() && fill_marked(c))
        p->again = true;
    bool (*fn)(struct cd_ctx *) = atomic_load(&on_visit);
    if (fn && fn(c))
        p->again = true;
}

static void *waiter_main(void *arg)
{
    (void)arg;
    const struct cd_driver_ops *ops = cd_driver_ops();
    /* Queries from this thread must never invalidate a capture. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ops->exchange_capture_mode(&mode);
    unsigned nap = 0, captures = 0;
    while (!atomic_load(&stopping)) {
        atomic_store(&visit_again, false);
        struct pass p = {ops, 0, false};
        cd_ctx_each(visit, &p);
        if (p.again)
            atomic_store(&visit_again, true);
        /* Now and then, captures that ended where cudefer did not see. */
        if (cd_capture_live() && ++captures % 64 == 0)
            cd_capture_check();
        /* Until a context is ready for the driver's one-time set-up, the
         * waiter looks again every millisecond. */
        if (!cd_ctx_warmed()) {
            sleep_for(1000);
            continue;
        }
        if (atomic_load(&pending) == 0 && !cd_capture_live() && !atomic_load(&visit_again) &&
            !cd_fence_marked()) {
            nap = 0;
            sleep_for(0);
            continue;
        }
        /* Work arriving while the GPU is busy is batched: the waiter looks
         * again after a nap that grows to 1 ms while nothing completes. */
        nap = p.done ? 50 : (nap ? (nap * 2 > 1000 ? 1000 : nap * 2) : 50);
        sleep_for(nap);
    }
    return NULL;
}

__attribute__((constructor)) static void waiter_init(void)
{
    cd_cond_init_monotonic(&wake_cond);
}

void cd_waiter_start(void)
{
    if (atomic_exchange(&running, true))
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&thread, NULL, waiter_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        cd_log(CD_LOG_ERROR, "cannot start the waiter thread (error %d): device frees are "
               "settled at flush points only", err);
        atomic_store(&running, false);
    }
}

void cd_waiter_stop(void)
{
    atomic_store(&stopping, true);
    post();
    if (atomic_exchange(&running, false))
        pthread_join(thread, NULL);
}

void cd_waiter_reset(void)
{
    pthread_mutex_init(&wake_lock, NULL);
    cd_cond_init_monotonic(&wake_cond);
    work_posted = false;
    atomic_store(&pending, 0);
    atomic_store(&visit_again, false);
    atomic_store(&asleep, false);
    atomic_store(&running, false);
    atomic_store(&stopping, false);
}
