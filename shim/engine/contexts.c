/* contexts.c - per-context state: slots, private stream, fences, events. */
#include "contexts.h"

#include "driver.h"
#include "lifecycle.h"
#include "log.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

struct cd_ctx cd_contexts[CD_MAX_CONTEXTS];
static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;

/* Spare events made when a context is first seen, so that releases rarely
 * create one. */
#define PREFILL_EVENTS 16

struct cd_ctx *cd_ctx_find(CUcontext ctx)
{
    if (!ctx)
        return NULL;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        struct cd_ctx *cs = &cd_contexts[i];
        if (atomic_load_explicit(&cs->handle, memory_order_acquire) == ctx &&
            atomic_load_explicit(&cs->state, memory_order_acquire) == CD_CTX_READY)
            return cs;
    }
    return NULL;
}

struct cd_ctx *cd_ctx_current(void)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->ctx_get_current(&ctx) != CUDA_SUCCESS)
        return NULL;
    return cd_ctx_find(ctx);
}

void cd_scope_enter(struct cd_scope *sc, CUcontext ctx, bool relaxed)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext cur = NULL;
    sc->pushed = NULL;
    sc->mode_set = false;
    if (!ops)
        return;
    if (ops->ctx_get_current(&cur) == CUDA_SUCCESS && cur != ctx && ctx &&
        ops->ctx_push(ctx) == CUDA_SUCCESS)
        sc->pushed = ctx;
    if (relaxed) {
        sc->mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        sc->mode_set = ops->exchange_capture_mode(&sc->mode) == CUDA_SUCCESS;
    }
}

void cd_scope_leave(struct cd_scope *sc)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!ops)
        return;
    if (sc->mode_set)
        ops->exchange_capture_mode(&sc->mode);
    if (sc->pushed) {
        CUcontext popped;
        ops->ctx_pop(&popped);
    }
}

/* Claims a free slot for ctx, or finds the slot another thread claimed. */
static struct cd_ctx *claim(CUcontext ctx, bool *mine)
{
    struct cd_ctx *found = NULL, *spare = NULL;
    pthread_mutex_lock(&claim_lock);
    for (int i = 0; i < CD_MAX_CONTEXTS && !found; i++) {
        struct cd_ctx *cs = &cd_contexts[i];
        int st = atomic_load(&cs->state);
        if (atomic_load(&cs->handle) == ctx && (st == CD_CTX_READY || st == CD_CTX_SETUP))
            found = cs;
        else if (!spare && st == CD_CTX_FREE)
            spare = cs;
    }
    *mine = false;
    if (!found && spare) {
        found = spare;
        *mine = true;
        atomic_store(&found->handle, ctx);
        atomic_store(&found->state, CD_CTX_SETUP);
    }
    pthread_mutex_unlock(&claim_lock);
    return found;
}

static void fill_pool(struct cd_ctx *cs, const struct cd_driver_ops *ops)
{
    for (int i = 0; i < PREFILL_EVENTS; i++) {
        CUevent ev;
        if (ops->event_create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            return;
        cd_ctx_event_put(cs, ev);
    }
}

/* Pays the driver's one-time set-up of cuMemFreeAsync on plain device
 * memory (about 10 ms measured) now rather than in the first release.
 * Waits for the private stream only, which holds nothing else yet. */
static void warm_up(struct cd_ctx *cs, const struct cd_driver_ops *ops)
{
    CUdeviceptr p;
    if (ops->mem_alloc(&p, 256) != CUDA_SUCCESS)
        return;
    ops->mem_free_async(p, cs->priv);
    ops->stream_synchronize(cs->priv);
}

static bool setup(struct cd_ctx *cs, CUcontext ctx, const struct cd_driver_ops *ops)
{
    int version = 0;
    ops->driver_get_version(&version);
    cs->ctx_record = version >= 12050 && ops->ctx_record_event;
    /* Before 12.5 the fence is made of events on the program's streams; a
     * blocking private stream then also follows the legacy stream. */
    unsigned flags = cs->ctx_record ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    if (ops->ctx_get_device(&cs->device) != CUDA_SUCCESS ||
        ops->stream_create(&cs->priv, flags) != CUDA_SUCCESS)
        return false;
    if (ops->event_create(&cs->fence, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        ops->stream_destroy(cs->priv);
        return false;
    }
    fill_pool(cs, ops);
    warm_up(cs, ops);
    cd_log(CD_LOG_INFO, "context %p: private stream ready (fence: %s)", (void *)ctx,
           cs->ctx_record ? "cuCtxRecordEvent" : "events on the program's streams");
    return true;
}

struct cd_ctx *cd_ctx_get(CUcontext ctx)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!ctx || !ops)
        return NULL;
    struct cd_ctx *cs = cd_ctx_find(ctx);
    if (cs)
        return cs;
    bool mine;
    cs = claim(ctx, &mine);
    if (!cs) {
        cd_log(CD_LOG_ERROR, "more than %d contexts: releases in context %p pass through",
               CD_MAX_CONTEXTS, (void *)ctx);
        return NULL;
    }
    if (!mine) {
        /* Another thread is setting this context up (milliseconds). */
        while (atomic_load(&cs->state) == CD_CTX_SETUP)
            sched_yield();
        return atomic_load(&cs->state) == CD_CTX_READY ? cs : NULL;
    }
    cd_lifecycle_start();
    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, true);
    bool ok = setup(cs, ctx, ops);
    cd_scope_leave(&sc);
    if (!ok) {
        cd_log(CD_LOG_ERROR, "context %p: cannot make a private stream; its releases pass through",
               (void *)ctx);
        atomic_store(&cs->handle, NULL);
        atomic_store(&cs->state, CD_CTX_FREE);
        return NULL;
    }
    atomic_store(&cs->state, CD_CTX_READY);
    return cs;
}

CUresult cd_ctx_event_get(struct cd_ctx *cs, CUevent *ev)
{
    pthread_mutex_lock(&cs->pool_lock);
    bool have = cs->nevents > 0;
    if (have)
        *ev = cs->events[--cs->nevents];
    pthread_mutex_unlock(&cs->pool_lock);
    if (have)
        return CUDA_SUCCESS;
    return cd_driver_ops()->event_create(ev, CU_EVENT_DISABLE_TIMING);
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = n;
    return true;
}

void cd_ctx_event_put(struct cd_ctx *cs, CUevent ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&cs->pool_lock);
    bool kept = grow((void **)&cs->events, &cs->cap_events, cs->nevents + 1, sizeof(CUevent));
    if (kept)
        cs->events[cs->nevents++] = ev;
    pthread_mutex_unlock(&cs->pool_lock);
    if (!kept)
        cd_driver_ops()->event_destroy(ev);
}

bool cd_ctx_enter(struct cd_ctx *cs)
{
    atomic_fetch_add(&cs->users, 1);
    if (atomic_load(&cs->state) == CD_CTX_READY)
        return true;
    atomic_fetch_sub(&cs->users, 1);
    return false;
}

void cd_ctx_exit(struct cd_ctx *cs)
{
    atomic_fetch_sub(&cs->users, 1);
}

/* Before 12.5: an event on each stream the program made in c, and the
 * final events of destroyed ones. Event records and waits do not wait. */
static CUresult fence_streams(struct cd_ctx *cs, struct cd_ctx *c,
                              const struct cd_driver_ops *ops)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nstreams && rc == CUDA_SUCCESS; i++) {
        rc = ops->event_record(c->streams[i].event, c->streams[i].stream);
        if (rc == CUDA_SUCCESS)
            rc = ops->stream_wait_event(cs->priv, c->streams[i].event, 0);
    }
    for (size_t i = 0; i < c->nfinals && rc == CUDA_SUCCESS; i++)
        rc = ops->stream_wait_event(cs->priv, c->finals[i], 0);
    pthread_mutex_unlock(&c->streams_lock);
    return rc;
}

/* Makes cs's private stream wait for the work submitted so far in c. */
static CUresult fence_one(struct cd_ctx *cs, struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    if (!c->ctx_record)
        return fence_streams(cs, c, ops);
    CUresult rc = ops->ctx_record_event(atomic_load(&c->handle), c->fence);
    return rc == CUDA_SUCCESS ? ops->stream_wait_event(cs->priv, c->fence, 0) : rc;
}

CUresult cd_ctx_fence(struct cd_ctx *cs, CUevent *done)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUresult rc = fence_one(cs, cs, ops);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Other contexts: an error there (a context that faulted runs nothing
     * more) does not stop this release. */
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        struct cd_ctx *c = &cd_contexts[i];
        if (c == cs || atomic_load(&c->state) != CD_CTX_READY || !cd_ctx_enter(c))
            continue;
        CUresult other = fence_one(cs, c, ops);
        cd_ctx_exit(c);
        if (other != CUDA_SUCCESS)
            cd_log(CD_LOG_DEBUG, "fence over context %p: error %d",
                   (void *)atomic_load(&c->handle), (int)other);
    }
    if (!done)
        return CUDA_SUCCESS;
    rc = cd_ctx_event_get(cs, done);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = ops->event_record(*done, cs->priv);
    if (rc != CUDA_SUCCESS) {
        cd_ctx_event_put(cs, *done);
        *done = NULL;
    }
    return rc;
}

void cd_ctx_stream_add(struct cd_ctx *cs, CUstream s)
{
    CUevent ev;
    if (cs->ctx_record || cd_driver_ops()->event_create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&cs->streams_lock);
    bool ok = grow((void **)&cs->streams, &cs->cap_streams, cs->nstreams + 1,
                   sizeof cs->streams[0]);
    if (ok)
        cs->streams[cs->nstreams++] = (struct cd_tracked){s, ev};
    pthread_mutex_unlock(&cs->streams_lock);
    if (!ok)
        cd_driver_ops()->event_destroy(ev);
}

void cd_ctx_stream_remove(struct cd_ctx *cs, CUstream s)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (cs->ctx_record)
        return;
    pthread_mutex_lock(&cs->streams_lock);
    for (size_t i = 0; i < cs->nstreams; i++) {
        if (cs->streams[i].stream != s)
            continue;
        CUevent ev = cs->streams[i].event;
        /* The stream may still run work after its destroy returns: later
         * fences wait for this final record until it completes. */
        if (ops->event_record(ev, s) == CUDA_SUCCESS &&
            grow((void **)&cs->finals, &cs->cap_finals, cs->nfinals + 1, sizeof(CUevent)))
            cs->finals[cs->nfinals++] = ev;
        else
            ops->event_destroy(ev);
        cs->streams[i] = cs->streams[--cs->nstreams];
        break;
    }
    pthread_mutex_unlock(&cs->streams_lock);
}

void cd_ctx_prune_finals(struct cd_ctx *cs)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    pthread_mutex_lock(&cs->streams_lock);
    for (size_t i = 0; i < cs->nfinals;) {
        if (ops->event_query(cs->finals[i]) == CUDA_SUCCESS) {
            ops->event_destroy(cs->finals[i]);
            cs->finals[i] = cs->finals[--cs->nfinals];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&cs->streams_lock);
}

void cd_ctx_release_slot(struct cd_ctx *cs)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    pthread_mutex_lock(&cs->pool_lock);
    for (size_t i = 0; i < cs->nevents; i++)
        ops->event_destroy(cs->events[i]);
    free(cs->events);
    cs->events = NULL;
    cs->nevents = cs->cap_events = 0;
    pthread_mutex_unlock(&cs->pool_lock);
    pthread_mutex_lock(&cs->streams_lock);
    for (size_t i = 0; i < cs->nstreams; i++)
        ops->event_destroy(cs->streams[i].event);
    for (size_t i = 0; i < cs->nfinals; i++)
        ops->event_destroy(cs->finals[i]);
    free(cs->streams);
    free(cs->finals);
    cs->streams = NULL;
    cs->finals = NULL;
    cs->nstreams = cs->cap_streams = cs->nfinals = cs->cap_finals = 0;
    pthread_mutex_unlock(&cs->streams_lock);
    ops->event_destroy(cs->fence);
    ops->stream_destroy(cs->priv);
    cs->fence = NULL;
    cs->priv = NULL;
    atomic_store(&cs->deferred_bytes, 0);
    atomic_store(&cs->cached_device, 0);
    atomic_store(&cs->cached_entries, 0);
    atomic_store(&cs->deferred_entries, 0);
    atomic_store(&cs->over_limit, false);
    atomic_store(&cs->handle, NULL);
    atomic_store(&cs->state, CD_CTX_FREE);
}

void cd_contexts_reset(void)
{
    pthread_mutex_init(&claim_lock, NULL);
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        struct cd_ctx *cs = &cd_contexts[i];
        memset(cs, 0, sizeof *cs);
        pthread_mutex_init(&cs->lock, NULL);
        pthread_mutex_init(&cs->pool_lock, NULL);
        pthread_mutex_init(&cs->streams_lock, NULL);
    }
}

__attribute__((constructor)) static void contexts_init(void)
{
    cd_contexts_reset();
}
