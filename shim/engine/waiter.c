/* waiter.c - the waiter thread, which finishes device frees in flight.
 *
 * It polls the completion event of each free and synchronises each
 * completed one: a host synchronisation is what returns freed memory to the
 * driver's allocator (a successful query is not enough). It polls rather
 * than blocks, so that it is never inside a long driver call when the
 * process exits, and it runs in the relaxed capture mode so that its
 * queries never invalidate a capture.
 */
#include "engine.h"
#include "lifecycle.h"

#include "backends.h"
#include "contexts.h"
#include "driver.h"
#include "log.h"
#include "options.h"
#include "queue.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

static sem_t work;
static _Atomic bool stopping;
static _Atomic bool waiter_running;
static pthread_t waiter;
static _Atomic long long frees_pending;

/* Set while the waiter sleeps for want of work: only then does a new free
 * post to wake it (a napping waiter finds it at its next pass). */
static _Atomic bool waiter_idle;

static void wake_waiter(void)
{
    sem_post(&work);
}

void cd_queue_inflight(struct cd_ctx *cs, struct cd_record *r)
{
    atomic_fetch_add(&frees_pending, 1);
    cd_push(&cs->inflight, r);
    if (atomic_exchange(&waiter_idle, false))
        wake_waiter();
}

long long cd_frees_pending(void)
{
    return atomic_load(&frees_pending);
}

void cd_frees_done(long long n)
{
    atomic_fetch_sub(&frees_pending, n);
}

/* Finishes the records of a batch whose marker gave q. */
static int finish_batch(struct cd_batch *b, CUresult q)
{
    int n = 0;
    for (struct cd_record *r = b->records, *next; r; r = next) {
        next = r->queue_next;
        if (q != CUDA_SUCCESS) {
            cd_log(CD_LOG_ERROR, "device free of %#lx: the driver reported error %d",
                   (unsigned long)r->key, (int)q);
            atomic_fetch_add(&cd_stats.errors[r->kind], 1);
        } else {
            atomic_fetch_add(&cd_stats.released[r->kind], 1);
        }
        cd_finish(r);
        n++;
    }
    return n;
}

/* Puts the frees just taken behind a marker event on the private stream. */
static void open_batch(struct cd_ctx *cs, const struct cd_driver_ops *ops,
                       struct cd_record *records)
{
    struct cd_batch *b = calloc(1, sizeof *b);
    if (!b) {
        /* Without a batch the records are finished at once: the registry
         * forgets them early, which is harmless, as the driver hands their
         * addresses out again only once the frees are done. */
        cd_log(CD_LOG_ERROR, "out of memory for a batch of device frees");
        struct cd_batch now = {.records = records};
        cd_frees_done(finish_batch(&now, CUDA_SUCCESS));
        return;
    }
    b->records = records;
    if (cd_ctx_event_get(cs, &b->marker) == CUDA_SUCCESS &&
        ops->event_record(b->marker, cs->priv) != CUDA_SUCCESS) {
        cd_ctx_event_put(cs, b->marker);
        b->marker = NULL;
    }
    struct cd_batch **tail = &cs->batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
}


/* One pass over a context's device frees in flight: new ones get a marker,
 * completed batches are synchronised (at once: their marker has completed)
 * and finished. Sets *pending when some are still running. */
static int drain_context(struct cd_ctx *cs, const struct cd_driver_ops *ops, bool *pending)
{
    struct cd_batch *done = NULL, **done_tail = &done;
    CUresult results[64];
    int ndone = 0;
    pthread_mutex_lock(&cs->lock);
    if (atomic_load(&cs->state) != CD_CTX_READY) {
        pthread_mutex_unlock(&cs->lock);
        return 0;
    }
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), false);
    struct cd_record *fresh = cd_take_all(&cs->inflight);
    if (fresh)
        open_batch(cs, ops, fresh);
    while (cs->batches && ndone < 64) {
        struct cd_batch *b = cs->batches;
        CUresult q = b->marker ? ops->event_query(b->marker) : CUDA_SUCCESS;
        if (q == CUDA_ERROR_NOT_READY) {
            *pending = true;
            break;
        }
        if (q == CUDA_SUCCESS && b->marker)
            q = ops->event_synchronize(b->marker);
        cs->batches = b->next;
        /* The pool goes with the context at teardown: give the marker back
         * while the context cannot be torn down. */
        cd_ctx_event_put(cs, b->marker);
        b->next = NULL;
        *done_tail = b;
        done_tail = &b->next;
        results[ndone++] = q;
    }
    if (cs->batches)
        *pending = true;
    if (!cs->ctx_record)
        cd_ctx_prune_finals(cs);
    cd_scope_leave(&sc);
    pthread_mutex_unlock(&cs->lock);

    int n = 0;
    for (int i = 0; done; i++) {
        struct cd_batch *next = done->next;
        n += finish_batch(done, results[i]);
        free(done);
        done = next;
    }
    cd_frees_done(n);
    return n;
}

static void sleep_or_wake(unsigned usec)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)usec * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (sem_timedwait(&work, &ts) != 0 && errno == EINTR)
        ;
}

static void *waiter_main(void *arg)
{
    (void)arg;
    const struct cd_driver_ops *ops = cd_driver_ops();
    /* Queries from this thread must never invalidate a capture. */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    ops->exchange_capture_mode(&mode);
    unsigned nap = 0;
    while (!atomic_load(&stopping)) {
        bool pending = false;
        int done = 0;
        for (int i = 0; i < CD_MAX_CONTEXTS; i++)
            if (atomic_load(&cd_contexts[i].state) == CD_CTX_READY)
                done += drain_context(&cd_contexts[i], ops, &pending);
        if (!pending && cd_frees_pending() == 0) {
            /* Idle is announced before the last look at the count, and a
             * free counts itself before it looks at idle: one of the two
             * sees the other. */
            atomic_store(&waiter_idle, true);
            if (cd_frees_pending() == 0 && !atomic_load(&stopping))
                while (sem_wait(&work) != 0 && errno == EINTR)
                    ;
            atomic_store(&waiter_idle, false);
            nap = 0;
            continue;
        }
        /* Frees arriving while the GPU is busy are batched: the waiter looks
         * again after a nap that grows to 1 ms while nothing completes. */
        nap = done ? 50 : (nap ? (nap * 2 > 1000 ? 1000 : nap * 2) : 50);
        sleep_or_wake(nap);
    }
    return NULL;
}

static _Atomic bool exit_registered;

static void at_exit(void)
{
    /* The driver may tear itself down after this: nothing is released from
     * here on, and the waiter stops touching it. */
    atomic_store(&stopping, true);
    if (atomic_exchange(&waiter_running, false)) {
        wake_waiter();
        pthread_join(waiter, NULL);
    }
    cd_stats_report();
}

void cd_lifecycle_start(void)
{
    if (atomic_exchange(&waiter_running, true))
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&waiter, NULL, waiter_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        cd_log(CD_LOG_ERROR, "cannot start the waiter thread (error %d): device frees "
               "are finished at flush points only", err);
        atomic_store(&waiter_running, false);
    }
    /* Registered after the CUDA runtime's own exit handler, so it runs
     * before the runtime and the driver tear down. */
    if (!atomic_exchange(&exit_registered, true))
        atexit(at_exit);
    cd_options_print();
}

void cd_waiter_reset(void)
{
    atomic_store(&frees_pending, 0);
    atomic_store(&waiter_idle, false);
    atomic_store(&waiter_running, false);
    atomic_store(&stopping, false);
    sem_init(&work, 0, 0);
}

__attribute__((constructor)) static void waiter_init(void)
{
    sem_init(&work, 0, 0);
}
