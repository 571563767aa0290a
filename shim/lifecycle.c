/* lifecycle.c - retiring, fencing, draining and reclaiming releases.
 *
 * A release is retired on the caller's thread: its record is found, fenced
 * behind all work already submitted in its context, and either handed to the
 * driver's stream-ordered free (device memory) or pushed on the context's
 * deferred queue. Nothing on that path may wait for the GPU.
 *
 * Device frees in flight are drained by one waiter thread, which polls their
 * completion events and synchronises each completed one (a host
 * synchronisation is what returns freed memory to the driver).
 *
 * Deferred entries are reclaimed at flush points, where waiting is what the
 * program is doing anyway: a failed allocation, cuCtxSynchronize,
 * cudefer_flush(), a queue over its limits at the next allocation, a
 * registration that overlaps a queued unregister, a context's teardown.
 * Flushes take the queue whole and hold no lock while the driver waits.
 */
#include "engine.h"
#include "lifecycle.h"

#include "backends.h"
#include "contexts.h"
#include "driver.h"
#include "log.h"
#include "options.h"
#include "registry.h"
#include "stats.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#define ALL_KINDS ((1u << CD_KIND_COUNT) - 1)

static bool enabled(void)
{
    return cd_option_bool(CD_OPT_ENABLE);
}

/* ---- lists ------------------------------------------------------------- */

static void push(_Atomic(struct cd_record *) *head, struct cd_record *r)
{
    struct cd_record *old = atomic_load_explicit(head, memory_order_relaxed);
    do
        r->queue_next = old;
    while (!atomic_compare_exchange_weak_explicit(head, &old, r, memory_order_release,
                                                  memory_order_relaxed));
}

static void push_all(_Atomic(struct cd_record *) *head, struct cd_record *list)
{
    while (list) {
        struct cd_record *next = list->queue_next;
        push(head, list);
        list = next;
    }
}

/* Takes the whole list, oldest entry first. */
static struct cd_record *take_all(_Atomic(struct cd_record *) *head)
{
    struct cd_record *r = atomic_exchange_explicit(head, NULL, memory_order_acquire);
    struct cd_record *fifo = NULL;
    while (r) {
        struct cd_record *next = r->queue_next;
        r->queue_next = fifo;
        fifo = r;
        r = next;
    }
    return fifo;
}

/* ---- capture gate ------------------------------------------------------ *
 * While any stream capture is live the engine records no event in a context
 * and queues releases unfenced. A fence announces itself in fences_active
 * before it looks at captures_live; a capture raises captures_live, then
 * waits for the fences already announced (each takes microseconds) before
 * the real cuStreamBeginCapture. Sequentially consistent atomics make the
 * two never miss each other. */

static _Atomic int captures_live;
static _Atomic int fences_active;
static pthread_mutex_t capturing_lock = PTHREAD_MUTEX_INITIALIZER;
#define MAX_CAPTURES 256
static CUstream capturing[MAX_CAPTURES];
static size_t ncapturing;
static _Atomic long long registered_pending;

static bool fence_enter(void)
{
    atomic_fetch_add(&fences_active, 1);
    if (atomic_load(&captures_live) == 0)
        return true;
    atomic_fetch_sub(&fences_active, 1);
    return false;
}

static void fence_exit(void)
{
    atomic_fetch_sub(&fences_active, 1);
}

/* ---- records ----------------------------------------------------------- */

static void account_deferred(struct cd_ctx *cs, struct cd_record *r, int sign)
{
    long long bytes = sign * (long long)r->bytes;
    atomic_fetch_add(&cs->deferred_bytes, bytes);
    atomic_fetch_add(&cs->deferred_entries, sign);
    cd_stats_add_deferred_bytes(bytes);
    if (r->kind == CD_REGISTERED)
        atomic_fetch_add(&registered_pending, sign);
}

/* Removes a finished record everywhere and frees it. The caller already
 * gave its event back. */
static void finish(struct cd_record *r)
{
    cd_registry_remove(r);
    free(r);
}

static void queue_deferred(struct cd_ctx *cs, struct cd_record *r)
{
    account_deferred(cs, r, +1);
    push(&cs->deferred, r);
    if (atomic_load(&cs->deferred_bytes) > cd_option_int(CD_OPT_MAX_DEFERRED_BYTES) ||
        atomic_load(&cs->deferred_entries) > cd_option_int(CD_OPT_MAX_DEFERRED_ENTRIES))
        atomic_store(&cs->over_limit, true);
}

/* Takes a deferred entry off the books after its real release or drop. */
static void finish_deferred(struct cd_ctx *cs, struct cd_record *r)
{
    account_deferred(cs, r, -1);
    cd_ctx_event_put(cs, r->done);
    finish(r);
}

/* ---- waiter ------------------------------------------------------------ */

static sem_t work;
static _Atomic bool stopping;
static _Atomic bool waiter_running;
static pthread_t waiter;
static _Atomic long long frees_pending;

static void wake_waiter(void)
{
    sem_post(&work);
}

static void queue_inflight(struct cd_ctx *cs, struct cd_record *r)
{
    atomic_fetch_add(&frees_pending, 1);
    push(&cs->inflight, r);
    wake_waiter();
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
    *tail = take_all(&cs->inflight);

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
        finish(finished);
        finished = next;
        n++;
    }
    atomic_fetch_sub(&frees_pending, n);
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
        if (!pending && atomic_load(&frees_pending) == 0) {
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

/* ---- fencing ----------------------------------------------------------- */

static bool is_sticky(CUresult rc)
{
    switch (rc) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return true;
    default:
        return false;
    }
}

/* The context has a sticky error: nothing queued can be released in it any
 * more, and its teardown frees it all. */
static void drop_queue(struct cd_ctx *cs, CUresult why)
{
    long long n = 0;
    for (struct cd_record *r = take_all(&cs->deferred), *next; r; r = next) {
        next = r->queue_next;
        atomic_fetch_add(&cd_stats.dropped[r->kind], 1);
        finish_deferred(cs, r);
        n++;
    }
    cd_log(CD_LOG_ERROR, "context %p has error %d: dropped %lld queued releases "
           "(the context's destruction frees them)", (void *)atomic_load(&cs->handle),
           (int)why, n);
}

/* Fences r behind all work submitted so far in its context; for device
 * memory also issues the stream-ordered free. *issued tells whether the free
 * was issued. Does not wait. */
static CUresult fence_record(struct cd_ctx *cs, struct cd_record *r, bool *issued)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    *issued = false;
    CUresult rc = cd_ctx_fence(cs, r->kind == CD_DEVICE ? NULL : &r->done);
    if (rc != CUDA_SUCCESS || r->kind != CD_DEVICE)
        return rc;
    rc = ops->mem_free_async((CUdeviceptr)r->key, cs->priv);
    if (rc != CUDA_SUCCESS)
        return rc;
    *issued = true;
    if (cd_ctx_event_get(cs, &r->done) != CUDA_SUCCESS)
        r->done = NULL;
    else if (ops->event_record(r->done, cs->priv) != CUDA_SUCCESS) {
        cd_ctx_event_put(cs, r->done);
        r->done = NULL;
    }
    return CUDA_SUCCESS;
}

/* Puts a fenced or unfenced record where it belongs. */
static void place(struct cd_ctx *cs, struct cd_record *r, bool issued)
{
    if (issued)
        queue_inflight(cs, r);
    else
        queue_deferred(cs, r);
}

/* Fences the entries queued while captures were live, once none is. */
static void fence_backlogs(void)
{
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        struct cd_ctx *cs = &cd_contexts[i];
        if (atomic_load(&cs->state) != CD_CTX_READY)
            continue;
        struct cd_record *list = take_all(&cs->deferred);
        if (!list)
            continue;
        struct cd_scope sc;
        cd_scope_enter(&sc, atomic_load(&cs->handle), false);
        bool open = fence_enter();
        for (struct cd_record *r = list, *next; r; r = next) {
            next = r->queue_next;
            bool issued = false;
            if (open && !r->done) {
                account_deferred(cs, r, -1);
                if (fence_record(cs, r, &issued) != CUDA_SUCCESS)
                    r->done = NULL;
                place(cs, r, issued);
            } else {
                push(&cs->deferred, r);
            }
        }
        if (open)
            fence_exit();
        cd_scope_leave(&sc);
    }
}

static void capture_done(void)
{
    if (atomic_fetch_sub(&captures_live, 1) == 1)
        fence_backlogs();
}

void cd_capture_begin(void)
{
    atomic_fetch_add(&captures_live, 1);
    while (atomic_load(&fences_active) != 0)
        sched_yield();
}

void cd_capture_begun(CUstream stream, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        capture_done();
        return;
    }
    pthread_mutex_lock(&capturing_lock);
    bool kept = ncapturing < MAX_CAPTURES;
    if (kept)
        capturing[ncapturing++] = stream;
    pthread_mutex_unlock(&capturing_lock);
    if (!kept)
        cd_log(CD_LOG_ERROR, "more than %d live captures: releases stay queued until a flush",
               MAX_CAPTURES);
}

void cd_capture_ended(CUstream stream, CUresult rc)
{
    (void)rc; /* an invalidated capture has ended too */
    bool found = false;
    pthread_mutex_lock(&capturing_lock);
    for (size_t i = 0; i < ncapturing && !found; i++) {
        if (capturing[i] == stream) {
            capturing[i] = capturing[--ncapturing];
            found = true;
        }
    }
    pthread_mutex_unlock(&capturing_lock);
    if (found)
        capture_done();
}

/* ---- releases ---------------------------------------------------------- */

/* The caller's path of every intercepted release. Never waits for the GPU:
 * registry and event-pool locks are held for a few instructions, and the
 * driver calls (cuCtxGetCurrent, cuCtxRecordEvent, cuStreamWaitEvent,
 * cuMemFreeAsync, cuEventRecord, cuEventCreate) return without waiting. */
static bool retire(enum cd_kind cls, uintptr_t key, CUresult *rc)
{
    if (!enabled())
        return false;
    /* No current context is needed: the record names the context, which
     * the scope below makes current (the driver, measured, frees memory
     * with no current context too). */
    if (!cd_driver_ops())
        return false;
    struct cd_record *r = NULL;
    switch (cd_registry_retire(cls, key, &r)) {
    case CD_NOT_FOUND:
        atomic_fetch_add(&cd_stats.passed[cls], 1);
        return false;
    case CD_ALREADY_RETIRED:
        cd_log(CD_LOG_DEBUG, "%s %#lx released twice", cd_backend(cls)->name, (unsigned long)key);
        *rc = cd_backend(cls)->double_release;
        return true;
    case CD_RETIRED_NOW:
        break;
    }
    struct cd_ctx *cs = r->ctx;
    if (!cd_option_bool(cd_backend(r->kind)->option) || !cd_ctx_enter(cs)) {
        /* The driver's own call releases it; the record goes with it. */
        atomic_fetch_add(&cd_stats.passed[r->kind], 1);
        finish(r);
        return false;
    }

    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), false);
    bool issued = false;
    CUresult frc = CUDA_SUCCESS;
    r->done = NULL;
    if (fence_enter()) {
        frc = fence_record(cs, r, &issued);
        fence_exit();
    }
    cd_scope_leave(&sc);

    if (frc != CUDA_SUCCESS && !issued) {
        if (is_sticky(frc)) {
            finish(r);
            drop_queue(cs, frc);
            cd_ctx_exit(cs);
            *rc = frc;
            return true;
        }
        cd_log(CD_LOG_ERROR, "cannot fence a %s release (error %d): the driver releases it",
               cd_backend(r->kind)->name, (int)frc);
        atomic_fetch_add(&cd_stats.passed[r->kind], 1);
        cd_ctx_event_put(cs, r->done);
        cd_ctx_exit(cs);
        finish(r);
        return false;
    }
    atomic_fetch_add(&cd_stats.deferred[r->kind], 1);
    cd_log(CD_LOG_DEBUG, "%s %#lx deferred%s", cd_backend(r->kind)->name, (unsigned long)r->key,
           r->done || issued ? "" : " (capture live: fenced when it ends)");
    place(cs, r, issued);
    cd_ctx_exit(cs);
    *rc = CUDA_SUCCESS;
    return true;
}

bool cd_release_device(CUdeviceptr ptr, CUresult *rc)
{
    return ptr && retire(CD_DEVICE, (uintptr_t)ptr, rc);
}

bool cd_release_host(void *ptr, CUresult *rc)
{
    return ptr && retire(CD_HOST, (uintptr_t)ptr, rc);
}

bool cd_release_registered(void *ptr, CUresult *rc)
{
    return ptr && retire(CD_REGISTERED, (uintptr_t)ptr, rc);
}

bool cd_release_array(CUarray array, CUresult *rc)
{
    return array && retire(CD_ARRAY, (uintptr_t)array, rc);
}

bool cd_release_mipmapped(CUmipmappedArray array, CUresult *rc)
{
    return array && retire(CD_MIPMAPPED, (uintptr_t)array, rc);
}

bool cd_release_module(CUmodule module, CUresult *rc)
{
    return module && retire(CD_MODULE, (uintptr_t)module, rc);
}

bool cd_release_library(CUlibrary library, CUresult *rc)
{
    return library && retire(CD_LIBRARY, (uintptr_t)library, rc);
}

/* ---- flushes ----------------------------------------------------------- */

/* Really releases the entries of cs's queue whose kind is in mask, oldest
 * first; with wait_frees, also waits until the device frees in flight are
 * done, so that their memory is back with the driver. MAY WAIT for the GPU.
 * Holds no lock meanwhile: the queue was taken whole, and other threads push
 * onto a new one. Returns whether there was anything to do. */
static bool flush_context(struct cd_ctx *cs, enum cd_flush_reason why, unsigned mask,
                          bool wait_frees)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_record *list = take_all(&cs->deferred);
    bool frees = wait_frees && atomic_load(&frees_pending) > 0;
    if (!list && !frees)
        return false;
    atomic_fetch_add(&cd_stats.flushes[why], 1);

    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), true);
    if (frees)
        ops->stream_synchronize(cs->priv);
    struct cd_record *keep = NULL;
    int released = 0, failed = 0;
    for (struct cd_record *r = list, *next; r; r = next) {
        next = r->queue_next;
        if (!(mask & (1u << r->kind))) {
            r->queue_next = keep;
            keep = r;
            continue;
        }
        CUresult rc = cd_backend(r->kind)->release(r);
        if (rc != CUDA_SUCCESS) {
            cd_log(CD_LOG_ERROR, "deferred release of %s %#lx failed with error %d",
                   cd_backend(r->kind)->name, (unsigned long)r->key, (int)rc);
            atomic_fetch_add(&cd_stats.errors[r->kind], 1);
            failed++;
        } else {
            atomic_fetch_add(&cd_stats.released[r->kind], 1);
            released++;
        }
        finish_deferred(cs, r);
    }
    cd_scope_leave(&sc);
    push_all(&cs->deferred, keep);
    cd_log(CD_LOG_INFO, "flush (%s) of context %p: %d released, %d failed",
           cd_flush_reason_name(why), (void *)atomic_load(&cs->handle), released, failed);
    return true;
}

static bool flush_all(enum cd_flush_reason why, unsigned mask, bool wait_frees)
{
    bool any = false;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load(&cd_contexts[i].state) == CD_CTX_READY)
            any |= flush_context(&cd_contexts[i], why, mask, wait_frees);
    return any;
}

int cd_flush_all(void)
{
    if (enabled() && cd_driver_ops())
        flush_all(CD_FLUSH_EXPLICIT, ALL_KINDS, true);
    return 0;
}

void cd_context_synchronized(CUcontext ctx)
{
    if (!enabled())
        return;
    struct cd_ctx *cs = ctx ? cd_ctx_find(ctx) : cd_ctx_current();
    if (cs)
        flush_context(cs, CD_FLUSH_SYNC, ALL_KINDS, false);
}

/* ---- allocations ------------------------------------------------------- */

void cd_alloc_begin(void)
{
    if (!enabled())
        return;
    struct cd_ctx *cs = cd_ctx_current();
    if (cs && atomic_exchange(&cs->over_limit, false))
        flush_context(cs, CD_FLUSH_LIMIT, ALL_KINDS, false);
}

bool cd_alloc_failed(CUresult rc, const char *call)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || !enabled() || !cd_driver_ops())
        return false;
    if (!flush_all(CD_FLUSH_OOM, ALL_KINDS, true))
        return false;
    atomic_fetch_add(&cd_stats.retries, 1);
    cd_log(CD_LOG_INFO, "%s ran out of memory: released the queue, retrying", call);
    return true;
}

void cd_track(enum cd_kind kind, uintptr_t key, size_t bytes, unsigned flags)
{
    if (!enabled() || !key)
        return;
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return;
    struct cd_ctx *cs = cd_ctx_get(ctx);
    struct cd_record *r = cs ? calloc(1, sizeof *r) : NULL;
    if (!r)
        return; /* its release passes through */
    r->kind = kind;
    r->key = key;
    r->bytes = bytes;
    r->flags = flags;
    r->ctx = cs;
    cd_registry_insert(r);
}

/* Candidates looked at per allocation: the queue is scanned newest first,
 * where a loop's last release is. */
#define REUSE_SCAN 64

static bool reusable(const struct cd_record *r, enum cd_kind kind, size_t bytes,
                     unsigned flags, const struct cd_driver_ops *ops)
{
    return r->kind == kind && r->bytes == bytes && r->flags == flags && r->done &&
           ops->event_query(r->done) == CUDA_SUCCESS;
}

bool cd_reuse(enum cd_kind kind, size_t bytes, unsigned flags, uintptr_t *key)
{
    if (!enabled() || !cd_backend(kind)->reusable || !cd_option_bool(cd_backend(kind)->option))
        return false;
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_ctx *cs = ops ? cd_ctx_current() : NULL;
    if (!cs || atomic_load(&cs->deferred_entries) == 0)
        return false;
    /* Taken whole, like a flush: a flush meanwhile finds the rest later. */
    struct cd_record *list = atomic_exchange_explicit(&cs->deferred, NULL, memory_order_acquire);
    struct cd_record **link = &list, *hit = NULL;
    for (int n = 0; *link && n < REUSE_SCAN; n++, link = &(*link)->queue_next) {
        if (reusable(*link, kind, bytes, flags, ops)) {
            hit = *link;
            *link = hit->queue_next;
            break;
        }
    }
    /* Back in the same order: list is newest first, and so is the stack. */
    struct cd_record *rev = NULL;
    while (list) {
        struct cd_record *next = list->queue_next;
        list->queue_next = rev;
        rev = list;
        list = next;
    }
    push_all(&cs->deferred, rev);
    if (!hit)
        return false;
    account_deferred(cs, hit, -1);
    cd_ctx_event_put(cs, hit->done);
    hit->done = NULL;
    cd_registry_unretire(hit);
    atomic_fetch_add(&cd_stats.reused[kind], 1);
    cd_log(CD_LOG_DEBUG, "%s %#lx reused", cd_backend(kind)->name, (unsigned long)hit->key);
    *key = hit->key;
    return true;
}

void cd_before_register(void *ptr, size_t bytes)
{
    if (!enabled() || atomic_load(&registered_pending) == 0)
        return;
    uintptr_t lo = (uintptr_t)ptr;
    if (cd_registry_retired_overlap(CD_REGISTERED, lo, lo + bytes))
        flush_all(CD_FLUSH_REGISTER, 1u << CD_REGISTERED, false);
}

bool cd_register_failed(CUresult rc)
{
    if (rc != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || !enabled() ||
        atomic_load(&registered_pending) == 0)
        return false;
    return flush_all(CD_FLUSH_REGISTER, 1u << CD_REGISTERED, false);
}

/* ---- streams ----------------------------------------------------------- */

static struct cd_ctx *context_of(CUstream stream, bool create)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->stream_get_ctx(stream, &ctx) != CUDA_SUCCESS)
        return NULL;
    return create ? cd_ctx_get(ctx) : cd_ctx_find(ctx);
}

void cd_stream_created(CUstream stream)
{
    struct cd_ctx *cs = enabled() ? context_of(stream, true) : NULL;
    if (cs)
        cd_ctx_stream_add(cs, stream);
}

void cd_stream_destroying(CUstream stream)
{
    struct cd_ctx *cs = enabled() ? context_of(stream, false) : NULL;
    if (cs)
        cd_ctx_stream_remove(cs, stream);
}

/* ---- teardown ---------------------------------------------------------- */

/* Device frees already handed to the driver: the context's destruction
 * completes them; their records go. */
static void forget_frees(struct cd_ctx *cs, struct cd_record *list)
{
    int n = 0;
    for (struct cd_record *r = list, *next; r; r = next) {
        next = r->queue_next;
        atomic_fetch_add(&cd_stats.released[r->kind], 1);
        cd_ctx_event_put(cs, r->done);
        finish(r);
        n++;
    }
    atomic_fetch_sub(&frees_pending, n);
}

/* Deferred entries: dropped where the teardown frees them, released for
 * real otherwise (registrations, libraries). May wait for the GPU. */
static void settle_queue(struct cd_ctx *cs)
{
    for (struct cd_record *r = take_all(&cs->deferred), *next; r; r = next) {
        next = r->queue_next;
        if (cd_backend(r->kind)->freed_by_context) {
            atomic_fetch_add(&cd_stats.dropped[r->kind], 1);
        } else {
            CUresult rc = cd_backend(r->kind)->release(r);
            atomic_fetch_add(rc == CUDA_SUCCESS ? &cd_stats.released[r->kind]
                                                : &cd_stats.errors[r->kind], 1);
            if (rc != CUDA_SUCCESS)
                cd_log(CD_LOG_ERROR, "release of %s %#lx before teardown failed with error %d",
                       cd_backend(r->kind)->name, (unsigned long)r->key, (int)rc);
        }
        finish_deferred(cs, r);
    }
}

void cd_context_teardown(CUcontext ctx)
{
    struct cd_ctx *cs = cd_ctx_find(ctx);
    if (!cs)
        return;
    /* From here on the waiter leaves this context alone, and so do the
     * releases and fences under way once they finish (microseconds). */
    pthread_mutex_lock(&cs->lock);
    atomic_store(&cs->state, CD_CTX_DEAD);
    struct cd_record *waiting = cs->waiting;
    cs->waiting = NULL;
    pthread_mutex_unlock(&cs->lock);
    while (atomic_load(&cs->users) != 0)
        sched_yield();
    atomic_fetch_add(&cd_stats.flushes[CD_FLUSH_TEARDOWN], 1);

    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, true);
    forget_frees(cs, waiting);
    forget_frees(cs, take_all(&cs->inflight));
    settle_queue(cs);
    cd_registry_drop_context(cs);
    cd_ctx_release_slot(cs);
    cd_scope_leave(&sc);
    cd_log(CD_LOG_INFO, "context %p torn down", (void *)ctx);
}

#define MAX_DEVICES 64
static struct {
    _Atomic int refs;
    _Atomic(CUcontext) ctx;
} primaries[MAX_DEVICES];

void cd_primary_retained(CUdevice dev, CUcontext ctx)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return;
    atomic_fetch_add(&primaries[dev].refs, 1);
    atomic_store(&primaries[dev].ctx, ctx);
}

void cd_primary_releasing(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEVICES || !enabled())
        return;
    /* A release the shim did not see retained counts as the last one:
     * tearing down early only costs a wait, never a leak. */
    if (atomic_fetch_sub(&primaries[dev].refs, 1) <= 1) {
        atomic_store(&primaries[dev].refs, 0);
        cd_context_teardown(atomic_load(&primaries[dev].ctx));
    }
}

void cd_primary_resetting(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEVICES || !enabled())
        return;
    atomic_store(&primaries[dev].refs, 0);
    cd_context_teardown(atomic_load(&primaries[dev].ctx));
}

/* ---- process ----------------------------------------------------------- */

/* A forked child has no CUDA context of its parent's and none of its
 * threads: it starts with empty queues and no waiter. */
static void in_child(void)
{
    cd_contexts_reset();
    cd_registry_reset();
    cd_stats_reset();
    pthread_mutex_init(&capturing_lock, NULL);
    ncapturing = 0;
    atomic_store(&captures_live, 0);
    atomic_store(&fences_active, 0);
    atomic_store(&registered_pending, 0);
    atomic_store(&frees_pending, 0);
    atomic_store(&waiter_running, false);
    atomic_store(&stopping, false);
    sem_init(&work, 0, 0);
    for (int i = 0; i < MAX_DEVICES; i++) {
        atomic_store(&primaries[i].refs, 0);
        atomic_store(&primaries[i].ctx, NULL);
    }
}

__attribute__((constructor)) static void lifecycle_init(void)
{
    sem_init(&work, 0, 0);
    pthread_atfork(NULL, NULL, in_child);
}

__attribute__((destructor)) static void lifecycle_fini(void)
{
    /* A program that never set up a context still reports. */
    cd_stats_report();
}
