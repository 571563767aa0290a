/* events.c - events, cuStreamWaitEvent, cuCtxRecordEvent / cuCtxWaitEvent.
 *
 * An event holds the dependencies its last record captured: a stream
 * record captures (stream, seq of the record op); cuCtxRecordEvent
 * captures (stream, last seq) of every stream of the context without
 * queueing anything, so it adds no dependency between streams. An event
 * is complete when all of them have completed; a never-recorded event is
 * complete.
 *
 * An event made while a green context is current belongs to its primary
 * context, and works with the primary's streams and with those of every
 * green context of it (cuda.h: "hEvent and hCtx must be from the same
 * primary context"; measured on an H200, driver 580.159.04, 2026-12-01,
 * tests/gpu/facts.c green: an event made in a green context recorded by
 * cuCtxRecordEvent on the primary). */
#include "internal.h"

/* Looks up a live event (lock held). */
static CUresult event_get(CUevent h, struct td_event **out)
{
    struct td_obj *o;
    CUresult rc = td_obj_get(h, TD_OBJ_EVENT, &o);
    if (rc == CUDA_SUCCESS)
        *out = (struct td_event *)o;
    return rc;
}

/* Replaces what ev captures (a new record). */
static void event_rerecord(struct td_event *ev, struct td_capture *cap)
{
    td_deps_free(&ev->deps);
    ev->gen++;
    ev->recorded = true;
    ev->time_ns = 0;
    ev->capture = cap;
}

/* Adds every dependency of from to to. */
static void deps_add_all(struct td_deps *to, const struct td_deps *from)
{
    for (size_t i = 0; i < from->n; i++)
        td_deps_add(to, from->v[i].s, from->v[i].seq);
}

/* Sets the completion time of a finished record whose time is not known
 * yet (context records: no op marks their end). */
static void event_settle(struct td_event *ev)
{
    if (ev->recorded && ev->time_ns == 0)
        ev->time_ns = td_now_ns();
}

TD_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    TD_COUNT(cuEventCreate);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!phEvent || (Flags & ~known) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct td_ctx *c;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_event *ev = td_xcalloc(1, sizeof *ev);
    td_obj_register(&ev->h, TD_OBJ_EVENT, td_ctx_root(c));
    ev->flags = Flags;
    td_live_add(TESTDRV_EVENT, 1, 0);
    *phEvent = (CUevent)ev;
    return td_leave(CUDA_SUCCESS);
}

/* Destroys an event at once, even with its record still pending. */
static CUresult event_destroy(CUevent h)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_event *ev;
    if ((rc = event_get(h, &ev)) != CUDA_SUCCESS)
        return td_leave(rc);
    ev->h.released = true;
    td_deps_free(&ev->deps);
    td_live_add(TESTDRV_EVENT, -1, 0);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuEventDestroy(CUevent hEvent)
{
    TD_COUNT(cuEventDestroy);
    return event_destroy(hEvent);
}

TD_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    TD_COUNT(cuEventDestroy_v2);
    return event_destroy(hEvent);
}

/* cuEventRecord*: the event and the stream must share a context (a green
 * context's stream: its primary context). On a
 * capturing stream the record is captured (the event then belongs to the
 * capture). */
static CUresult event_record(CUevent hev, CUstream hs, bool ptsz, unsigned flags)
{
    CUresult rc = td_enter_args(!(flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL));
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_event *ev;
    struct td_stream *s;
    bool captured;
    if ((rc = event_get(hev, &ev)) != CUDA_SUCCESS ||
        (rc = td_stream_get(hs, ptsz, &s)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (ev->h.ctx != td_ctx_root(s->h.ctx))
        return td_leave(CUDA_ERROR_INVALID_HANDLE);
    if ((rc = td_stream_submit_check(s, &captured)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (captured) {
        event_rerecord(ev, s->capture);
        td_capture_record(s, td_op_new(TD_OP_NOP));
        return td_leave(CUDA_SUCCESS);
    }
    struct td_op *op = td_op_new(TD_OP_RECORD);
    op->u.record.ev = ev;
    op->u.record.gen = ev->gen + 1;
    if ((rc = td_stream_enqueue(s, op)) != CUDA_SUCCESS)
        return td_leave(rc);
    event_rerecord(ev, NULL);
    td_deps_add(&ev->deps, s, s->submitted);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    TD_COUNT(cuEventRecord);
    return event_record(hEvent, hStream, false, 0);
}

TD_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    TD_COUNT(cuEventRecord_ptsz);
    return event_record(hEvent, hStream, true, 0);
}

TD_EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    TD_COUNT(cuEventRecordWithFlags);
    return event_record(hEvent, hStream, false, flags);
}

TD_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    TD_COUNT(cuEventRecordWithFlags_ptsz);
    return event_record(hEvent, hStream, true, flags);
}

/* Common front of cuEventQuery / cuEventSynchronize: an event last
 * recorded in a capture cannot be waited for (its capture is
 * invalidated if still live), then the unsafe-call rule, then the sticky
 * error of the event's context. */
static CUresult event_host_call(CUevent h, struct td_event **out)
{
    CUresult rc = event_get(h, out);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_event *ev = *out;
    if (ev->capture) {
        if (!ev->capture->ended)
            td_capture_invalidate(ev->capture);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if ((rc = td_capture_check_unsafe()) != CUDA_SUCCESS)
        return rc;
    return ev->h.ctx->sticky;
}

/* CUDA_SUCCESS when the captured work is done, else CUDA_ERROR_NOT_READY.
 * Never gives stream-ordered frees back (the real driver does not). */
TD_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    TD_COUNT(cuEventQuery);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_event *ev;
    if ((rc = event_host_call(hEvent, &ev)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (!td_deps_done(&ev->deps))
        return td_leave(CUDA_ERROR_NOT_READY);
    event_settle(ev);
    return td_leave(CUDA_SUCCESS);
}

/* Waits for the captured work, then gives back the frees it covers. */
TD_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    TD_COUNT(cuEventSynchronize);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_event *ev;
    if ((rc = event_host_call(hEvent, &ev)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_deps deps = { 0 };
    uint64_t gen = ev->gen;
    deps_add_all(&deps, &ev->deps);
    td_host_sync(&deps);
    if (!ev->h.released && ev->gen == gen)
        event_settle(ev);
    return td_leave(ev->h.ctx->sticky);
}

static CUresult elapsed_time(float *ms, CUevent hstart, CUevent hend)
{
    CUresult rc = td_enter_args(ms != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_event *a, *b;
    if ((rc = event_get(hstart, &a)) != CUDA_SUCCESS ||
        (rc = event_get(hend, &b)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (!a->recorded || !b->recorded || a->capture || b->capture ||
        ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        return td_leave(CUDA_ERROR_INVALID_HANDLE);
    if (!td_deps_done(&a->deps) || !td_deps_done(&b->deps))
        return td_leave(CUDA_ERROR_NOT_READY);
    event_settle(a);
    event_settle(b);
    *ms = (float)((double)((int64_t)(b->time_ns - a->time_ns)) / 1e6);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    TD_COUNT(cuEventElapsedTime);
    return elapsed_time(pMilliseconds, hStart, hEnd);
}

TD_EXPORT CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    TD_COUNT(cuEventElapsedTime_v2);
    return elapsed_time(pMilliseconds, hStart, hEnd);
}

/* ------------------------------------------------------------------ */
/* cuStreamWaitEvent                                                   */

/* Waiting on an event recorded in a live capture from a stream outside
 * any capture makes that stream join the capture (fork/join capture);
 * from a stream in another capture it would merge them (refused). */
static CUresult wait_captured_event(struct td_stream *s, struct td_event *ev, bool captured)
{
    struct td_capture *cap = ev->capture;
    if (cap->ended)
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    if (captured && s->capture != cap)
        return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    if (!captured) {
        if (s->type == TD_ST_LEGACY || s->h.ctx != cap->ctx)
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        s->capture = cap;
    }
    td_capture_record(s, td_op_new(TD_OP_NOP));
    return CUDA_SUCCESS;
}

static CUresult stream_wait_event(CUstream hs, bool ptsz, CUevent hev, unsigned flags)
{
    struct td_stream *s;
    struct td_event *ev;
    bool captured;
    CUresult rc = td_enter_stream(hs, ptsz, !(flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL), &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = event_get(hev, &ev)) != CUDA_SUCCESS ||
        (rc = td_stream_submit_check(s, &captured)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (ev->capture)
        return td_leave(wait_captured_event(s, ev, captured));
    struct td_op *op = td_op_new(TD_OP_NOP);
    if (captured) {
        td_capture_record(s, op);
        return td_leave(CUDA_SUCCESS);
    }
    deps_add_all(&op->deps, &ev->deps);
    return td_leave(td_stream_enqueue(s, op));
}

TD_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    TD_COUNT(cuStreamWaitEvent);
    return stream_wait_event(hStream, false, hEvent, Flags);
}

TD_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    TD_COUNT(cuStreamWaitEvent_ptsz);
    return stream_wait_event(hStream, true, hEvent, Flags);
}

/* ------------------------------------------------------------------ */
/* Context-wide events (driver API 12.5+)                              */

/* cuCtxRecordEvent / cuCtxWaitEvent exist only from version 12050; below
 * that they answer CUDA_ERROR_NOT_SUPPORTED (and cuGetProcAddress does
 * not find them). Lock held. */
static bool ctx_events_supported(void) { return td.version >= 12050; }

/* The context named by a cuCtxRecordEvent / cuCtxWaitEvent (NULL:
 * current), lock held. A destroyed green context is
 * CUDA_ERROR_CONTEXT_IS_DESTROYED (measured on an H200, driver 580.159.04,
 * 2026-12-01, tests/gpu/facts.c green-dead, for cuCtxRecordEvent), counted
 * as a dead call; other dead contexts as td_ctx_arg answers. */
static CUresult ctx_event_ctx(CUcontext hctx, struct td_ctx **c)
{
    struct td_ctx *g = hctx ? (struct td_ctx *)td_obj_find(hctx, TD_OBJ_CTX) : NULL;
    if (g && g->parent && !g->alive) {
        td_dead_call();
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    return td_ctx_arg(hctx, c);
}

/* td_enter, then the front of cuCtxRecordEvent / cuCtxWaitEvent: the
 * version check, the context (NULL: current), the event. CUDA_SUCCESS with
 * td.mu held, or an error without it. */
static CUresult ctx_event_enter(CUcontext hctx, CUevent hev, struct td_ctx **c,
                                struct td_event **ev)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ctx_events_supported())
        return td_leave(CUDA_ERROR_NOT_SUPPORTED);
    if ((rc = ctx_event_ctx(hctx, c)) != CUDA_SUCCESS || (rc = event_get(hev, ev)) != CUDA_SUCCESS)
        return td_leave(rc);
    return CUDA_SUCCESS;
}

/* Records in ev all work submitted so far to c (a primary context: its
 * green contexts' too; a green context: its own only, measured: 0 ms for
 * a kernel on a primary stream, the whole green kernel for one on its
 * stream). The event must belong to c's root. Lock held. */
static CUresult ctx_record(struct td_ctx *c, struct td_event *ev)
{
    if (ev->h.ctx != td_ctx_root(c))
        return CUDA_ERROR_INVALID_HANDLE;
    if (td_capture_in_ctx(c)) {
        td_capture_invalidate_ctx(c);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (c->sticky != CUDA_SUCCESS)
        return c->sticky;
    event_rerecord(ev, NULL);
    td_ctx_snapshot(c, &ev->deps);
    return CUDA_SUCCESS;
}

/* Makes all future work of c (a primary context: and of its green
 * contexts, see streams.c) wait for ev. Lock held. */
static CUresult ctx_wait(struct td_ctx *c, struct td_event *ev)
{
    if (ev->capture || td_capture_in_ctx(c)) {
        if (ev->capture && !ev->capture->ended)
            td_capture_invalidate(ev->capture);
        td_capture_invalidate_ctx(c);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (c->sticky != CUDA_SUCCESS)
        return c->sticky;
    deps_add_all(&c->wait_deps, &ev->deps);
    return CUDA_SUCCESS;
}

TD_EXPORT CUresult cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent)
{
    TD_COUNT(cuCtxRecordEvent);
    struct td_ctx *c = NULL;
    struct td_event *ev = NULL; /* set when rc is CUDA_SUCCESS (-O3 cannot tell) */
    CUresult rc = ctx_event_enter(hCtx, hEvent, &c, &ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(ctx_record(c, ev));
}

TD_EXPORT CUresult cuCtxWaitEvent(CUcontext hCtx, CUevent hEvent)
{
    TD_COUNT(cuCtxWaitEvent);
    struct td_ctx *c = NULL;
    struct td_event *ev = NULL; /* set when rc is CUDA_SUCCESS (-O3 cannot tell) */
    CUresult rc = ctx_event_enter(hCtx, hEvent, &c, &ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(ctx_wait(c, ev));
}

/* td_enter, then the front of cuGreenCtxRecordEvent / cuGreenCtxWaitEvent
 * (driver API 12.4+): the green context and the event. CUDA_SUCCESS with
 * td.mu held, or an error without it. */
static CUresult green_event_enter(CUgreenCtx hg, CUevent hev, struct td_ctx **c,
                                  struct td_event **ev)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!td_green_supported())
        return td_leave(CUDA_ERROR_NOT_SUPPORTED);
    if ((rc = td_green_get(hg, c)) != CUDA_SUCCESS || (rc = event_get(hev, ev)) != CUDA_SUCCESS)
        return td_leave(rc);
    return CUDA_SUCCESS;
}

/* Same as cuCtxRecordEvent on the green context's CUcontext. */
TD_EXPORT CUresult cuGreenCtxRecordEvent(CUgreenCtx hCtx, CUevent hEvent)
{
    TD_COUNT(cuGreenCtxRecordEvent);
    struct td_ctx *c = NULL;
    struct td_event *ev = NULL; /* set when rc is CUDA_SUCCESS (-O3 cannot tell) */
    CUresult rc = green_event_enter(hCtx, hEvent, &c, &ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(ctx_record(c, ev));
}

TD_EXPORT CUresult cuGreenCtxWaitEvent(CUgreenCtx hCtx, CUevent hEvent)
{
    TD_COUNT(cuGreenCtxWaitEvent);
    struct td_ctx *c = NULL;
    struct td_event *ev = NULL; /* set when rc is CUDA_SUCCESS (-O3 cannot tell) */
    CUresult rc = green_event_enter(hCtx, hEvent, &c, &ev);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(ctx_wait(c, ev));
}
