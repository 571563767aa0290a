/* fence.c - fences over every context. */
#include "fence.h"

#include "driver.h"
#include "log.h"

#include "array.h"

/* Before 12.5: an event on each stream the program made in o, and the final
 * events of destroyed ones. */
static CUresult fence_streams(struct cd_ctx *c, struct cd_ctx *o, const struct cd_driver_ops *ops)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&o->streams_lock);
    for (size_t i = 0; i < o->nstreams && rc == CUDA_SUCCESS; i++) {
        rc = ops->event_record(o->streams[i].event, o->streams[i].stream);
        if (rc == CUDA_SUCCESS)
            rc = ops->stream_wait_event(c->priv, o->streams[i].event, 0);
    }
    for (size_t i = 0; i < o->nfinals && rc == CUDA_SUCCESS; i++)
        rc = ops->stream_wait_event(c->priv, o->finals[i].event, 0);
    pthread_mutex_unlock(&o->streams_lock);
    return rc;
}

/* Makes c's private stream wait for the work submitted so far in o. */
static CUresult fence_one(struct cd_ctx *c, struct cd_ctx *o, const struct cd_driver_ops *ops)
{
    if (!o->ctx_record)
        return fence_streams(c, o, ops);
    CUresult rc = ops->ctx_record_event(atomic_load(&o->handle), o->fence);
    return rc == CUDA_SUCCESS ? ops->stream_wait_event(c->priv, o->fence, 0) : rc;
}

struct others {
    struct cd_ctx *c;
    const struct cd_driver_ops *ops;
};

static void fence_other(struct cd_ctx *o, void *arg)
{
    struct others *a = arg;
    if (o == a->c)
        return;
    CUresult rc = fence_one(a->c, o, a->ops);
    if (rc != CUDA_SUCCESS)
        cd_log(CD_LOG_DEBUG, "fence over context %p: error %d", (void *)atomic_load(&o->handle),
               (int)rc);
}

/* One context known: its record, into the release's own event. */
static CUresult fence_alone(struct cd_ctx *c, CUevent *done, const struct cd_driver_ops *ops)
{
    CUresult rc = cd_ctx_event_get(c, done);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = ops->ctx_record_event(atomic_load(&c->handle), *done);
    if (rc != CUDA_SUCCESS) {
        cd_ctx_event_put(c, *done);
        *done = NULL;
    }
    return rc;
}

static CUresult fence(struct cd_ctx *c, CUevent *done, bool alone_ok)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (alone_ok && done && c->ctx_record && cd_ctx_alone(c))
        return fence_alone(c, done, ops);
    CUresult rc = fence_one(c, c, ops);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct others a = {c, ops};
    cd_ctx_each(fence_other, &a);
    if (!done)
        return CUDA_SUCCESS;
    rc = cd_ctx_event_get(c, done);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = ops->event_record(*done, c->priv);
    if (rc != CUDA_SUCCESS) {
        cd_ctx_event_put(c, *done);
        *done = NULL;
    }
    return rc;
}

CUresult cd_fence(struct cd_ctx *c, CUevent *done)
{
    return fence(c, done, true);
}

CUresult cd_fence_for_host(struct cd_ctx *c, CUevent *done)
{
    return fence(c, done, false);
}

void cd_fence_stream_added(struct cd_ctx *c, CUstream s, CUcontext owner)
{
    CUevent ev;
    if (c->ctx_record)
        return;
    /* The event is made in the stream's own context (a record on a stream
     * of another context fails). */
    struct cd_scope sc;
    cd_scope_enter(&sc, owner, false);
    CUresult rc = cd_driver_ops()->event_create(&ev, CU_EVENT_DISABLE_TIMING);
    cd_scope_leave(&sc);
    if (rc != CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&c->streams_lock);
    bool ok = cd_array_room((void **)&c->streams, &c->cap_streams, c->nstreams + 1, sizeof c->streams[0]);
    if (ok)
        c->streams[c->nstreams++] = (struct cd_tracked){s, ev, owner};
    pthread_mutex_unlock(&c->streams_lock);
    if (!ok)
        cd_driver_ops()->event_destroy(ev);
}

void cd_fence_stream_removed(struct cd_ctx *c, CUstream s)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record)
        return;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nstreams; i++) {
        if (c->streams[i].stream != s)
            continue;
        CUevent ev = c->streams[i].event;
        /* The stream may still run work after its destroy returns: later
         * fences wait for this final record until it completes. */
        if (ops->event_record(ev, s) == CUDA_SUCCESS &&
            cd_array_room((void **)&c->finals, &c->cap_finals, c->nfinals + 1,
                          sizeof c->finals[0]))
            c->finals[c->nfinals++] = (struct cd_tracked){NULL, ev, c->streams[i].owner};
        else
            ops->event_destroy(ev);
        c->streams[i] = c->streams[--c->nstreams];
        break;
    }
    pthread_mutex_unlock(&c->streams_lock);
}

/* Removes the entries of owner from list (n of them). Their work goes on
 * after owner's destruction (measured: a green context's destruction does
 * not wait for its kernels), so c's private stream waits for it first: a
 * last record on each live stream (streams: true), or the final record
 * already made. Every later fence and free on the private stream comes
 * after that wait; the events then go (a wait keeps what it waits for).
 * Under streams_lock, in the relaxed capture mode. A stream in a capture
 * is left out: the destruction ends that capture. */
static void drop_owned(struct cd_ctx *c, struct cd_tracked *list, size_t *n, CUcontext owner,
                       bool streams, const struct cd_driver_ops *ops)
{
    for (size_t i = 0; i < *n;) {
        if (list[i].owner != owner) {
            i++;
            continue;
        }
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        bool recorded = !streams ||
                        (ops->stream_is_capturing(list[i].stream, &st) == CUDA_SUCCESS &&
                         st == CU_STREAM_CAPTURE_STATUS_NONE &&
                         ops->event_record(list[i].event, list[i].stream) == CUDA_SUCCESS);
        if (recorded)
            ops->stream_wait_event(c->priv, list[i].event, 0);
        ops->event_destroy(list[i].event);
        list[i] = list[--*n];
    }
}

void cd_fence_owner_ending(struct cd_ctx *c, CUcontext owner)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record || !owner)
        return;
    struct cd_scope sc;
    cd_scope_enter(&sc, NULL, true);
    pthread_mutex_lock(&c->streams_lock);
    drop_owned(c, c->streams, &c->nstreams, owner, true, ops);
    drop_owned(c, c->finals, &c->nfinals, owner, false, ops);
    pthread_mutex_unlock(&c->streams_lock);
    cd_scope_leave(&sc);
}

void cd_fence_prune(struct cd_ctx *c)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record)
        return;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nfinals;) {
        if (ops->event_query(c->finals[i].event) == CUDA_SUCCESS) {
            ops->event_destroy(c->finals[i].event);
            c->finals[i] = c->finals[--c->nfinals];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&c->streams_lock);
}
