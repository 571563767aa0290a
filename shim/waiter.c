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

static void wake_waiter(void)
{
    sem_post(&work);
}

void cd_queue_inflight(struct cd_ctx *cs, struct cd_record *r)
{
    atomic_fetch_add(&frees_pending, 1);
    cd_push(&cs->inflight, r);
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

/* One pass over a context's device frees in flight. Returns how many
 * finished; sets *pending when some are still running. The driver calls
 * made here do not wait: a completed event's synchronise returns at once. */
static int drain_context(struct cd_ctx *cs, const struct cd_driver_ops *ops, bool *pending)
{
    struct cd_record *finished = NULL;
    pthread_mutex_lock(&cs->lock);
    if (atomic_load(&cs->state) != CD_CTX_READY) {
        pthread_mutex_unlock(&cs->lock);
        return 0;
    }
    struct cd_record **tail = &cs->waiting;
    while (*tail)
        tail = &(*tail)->queue_next;
    *tail = cd_take_all(&cs->inflight);

    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), false);
    struct cd_record **link = &cs->waiting;
    while (*link) {
        struct cd_record *r = *link;
        CUresult q = r->done ? ops->event_query(r->done) : CUDA_SUCCESS;
        if (q == CUDA_ERROR_NOT_READY) {
            *pending = true;
            link = &r->queue_next;
            continue;
        }
        if (q == CUDA_SUCCESS && r->done)
            q = ops->event_synchronize(r->done);
        if (q != CUDA_SUCCESS) {
            cd_log(CD_LOG_ERROR, "device free of %#lx: the driver reported error %d",
                   (unsigned long)r->key, (int)q);
            atomic_fetch_add(&cd_stats.errors[r->kind], 1);
        } else {
            atomic_fetch_add(&cd_stats.released[r->kind], 1);
        }
        *link = r->queue_next;
        /* The pool goes with the context at teardown: give the event back
         * while the context cannot be torn down. */
        cd_ctx_event_put(cs, r->done);
        r->done = NULL;
        r->queue_next = finished;
        finished = r;
    }
    if (!cs->ctx_record)
        cd_ctx_prune_finals(cs);
    cd_scope_leave(&sc);
    pthread_mutex_unlock(&cs->lock);

    int n = 0;
    while (finished) {
        struct cd_record *next = finished->queue_next;
        cd_finish(finished);
        finished = next;
        n++;
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
            while (sem_wait(&work) != 0 && errno == EINTR)
                ;
            nap = 0;
            continue;
        }
        /* Poll fast while frees complete, back off to 1 ms while the GPU is
         * busy; a new free wakes the waiter at once. */
        nap = done ? 20 : (nap ? (nap * 2 > 1000 ? 1000 : nap * 2) : 20);
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
    atomic_store(&waiter_running, false);
    atomic_store(&stopping, false);
    sem_init(&work, 0, 0);
}

__attribute__((constructor)) static void waiter_init(void)
{
    sem_init(&work, 0, 0);
}
