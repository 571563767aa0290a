/* capture.c - stream capture: begin/end, capture modes and the rules that
 * invalidate a capture in progress.
 *
 * Work queued on a capturing stream is recorded (counted as graph nodes)
 * and never runs. A graph can be instantiated (cuGraphInstantiateWithFlags)
 * and the executable graph destroyed, but not launched (cuGraphLaunch is
 * not part of the test driver). Invalidation rules, after the real driver
 * (cuda.h and DESIGN.md section 2):
 *  - "potentially unsafe" calls (synchronisations, queries, allocations,
 *    releases, module and array create/destroy) from a thread whose mode
 *    forbids them: GLOBAL mode is forbidden while any GLOBAL capture is live
 *    in another thread, or a non-RELAXED capture of its own; THREAD_LOCAL
 *    mode only by a non-RELAXED capture of its own; RELAXED never. The call
 *    returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 *    captures that forbade it;
 *  - any operation on the legacy stream while a blocking stream of its
 *    context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, invalidated;
 *  - cuCtxRecordEvent / cuCtxWaitEvent on a context with a capture:
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidated (events.c);
 *  - synchronising or querying a capturing stream, or an event recorded in
 *    a capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidated.
 * Capture objects are never freed (events keep pointing at them). */
#include "internal.h"

/* ------------------------------------------------------------------ */
/* Invalidation                                                        */

void td_capture_invalidate(struct td_capture *c)
{
    if (c->invalidated || c->ended)
        return;
    c->invalidated = true;
    td.invalidated++;
}

CUresult td_capture_check_unsafe(void)
{
    if (td_tls.mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    pthread_t self = pthread_self();
    bool hit = false;
    for (struct td_capture *c = td.captures; c; c = c->next) {
        bool mine = pthread_equal(c->thread, self);
        bool forbids = (mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
                       (!mine && td_tls.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                        c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (forbids) {
            td_capture_invalidate(c);
            hit = true;
        }
    }
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* True if a blocking stream of ctx is capturing; with invalidate, their
 * captures are invalidated. */
static bool blocking_capture(struct td_ctx *ctx, bool invalidate)
{
    bool hit = false;
    for (struct td_stream *s = ctx->streams; s; s = s->next)
        if (s->capture && td_stream_is_blocking(s)) {
            hit = true;
            if (invalidate)
                td_capture_invalidate(s->capture);
        }
    return hit;
}

CUresult td_capture_check_legacy(struct td_ctx *ctx)
{
    return blocking_capture(ctx, true) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

bool td_capture_in_ctx(struct td_ctx *ctx)
{
    for (struct td_capture *c = td.captures; c; c = c->next)
        if (c->ctx == ctx)
            return true;
    return false;
}

size_t td_capture_invalidate_ctx(struct td_ctx *ctx)
{
    size_t n = 0;
    for (struct td_capture *c = td.captures; c; c = c->next)
        if (c->ctx == ctx) {
            td_capture_invalidate(c);
            n++;
        }
    return n;
}

void td_capture_record(struct td_stream *s, struct td_op *op)
{
    s->capture->nodes++;
    td_op_free(op);
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */

/* Ends a capture: off the live list, every stream in it leaves it. */
static void capture_finish(struct td_capture *cap)
{
    cap->ended = true;
    for (struct td_capture **pp = &td.captures; *pp; pp = &(*pp)->next)
        if (*pp == cap) {
            *pp = cap->next;
            break;
        }
    /* Kept for the life of the process (an event recorded in it still
     * names it), and so still reachable. */
    cap->next = td.ended;
    td.ended = cap;
    for (struct td_stream *s = cap->ctx->streams; s; s = s->next)
        if (s->capture == cap)
            s->capture = NULL;
}

void td_capture_end_ctx(struct td_ctx *ctx)
{
    struct td_capture *c = td.captures;
    while (c) {
        struct td_capture *next = c->next;
        if (c->ctx == ctx) {
            td_capture_invalidate(c);
            capture_finish(c);
        }
        c = next;
    }
}

void td_capture_stream_destroyed(struct td_stream *s)
{
    struct td_capture *cap = s->capture;
    if (!cap)
        return;
    td_capture_invalidate(cap);
    if (cap->origin == s)
        capture_finish(cap);
    else
        s->capture = NULL;
}

static bool mode_valid(CUstreamCaptureMode mode)
{
    return mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
           mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

/* Begins a capture on a stream (not the legacy one). graph: capture into
 * this existing graph (cuStreamBeginCaptureToGraph) or NULL. */
static CUresult begin_capture(CUstream h, bool ptsz, CUstreamCaptureMode mode, CUgraph graph)
{
    struct td_stream *s;
    CUresult rc = td_enter_stream(h, ptsz, mode_valid(mode), &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_obj *g = NULL;
    if (graph && (rc = td_obj_get(graph, TD_OBJ_GRAPH, &g)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (s->type == TD_ST_LEGACY)
        return td_leave(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (s->capture)
        return td_leave(CUDA_ERROR_ILLEGAL_STATE);
    if (s->h.ctx->sticky != CUDA_SUCCESS)
        return td_leave(s->h.ctx->sticky);
    struct td_capture *cap = td_xcalloc(1, sizeof *cap);
    cap->id = td.next_id++;
    cap->mode = mode;
    cap->thread = pthread_self();
    cap->ctx = s->h.ctx;
    cap->origin = s;
    cap->graph = (struct td_graph *)g;
    cap->next = td.captures;
    td.captures = cap;
    s->capture = cap;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    TD_COUNT(cuStreamBeginCapture);
    return begin_capture(hStream, false, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL);
}

TD_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    TD_COUNT(cuStreamBeginCapture_ptsz);
    return begin_capture(hStream, true, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL);
}

TD_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    TD_COUNT(cuStreamBeginCapture_v2);
    return begin_capture(hStream, false, mode, NULL);
}

TD_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    TD_COUNT(cuStreamBeginCapture_v2_ptsz);
    return begin_capture(hStream, true, mode, NULL);
}

static CUresult begin_capture_to_graph(CUstream h, bool ptsz, CUgraph g, const CUgraphNode *deps,
                                       size_t ndeps, CUstreamCaptureMode mode)
{
    if (!g || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(h, ptsz, mode, g);
}

TD_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                               const CUgraphNode *dependencies,
                                               const CUgraphEdgeData *dependencyData,
                                               size_t numDependencies, CUstreamCaptureMode mode)
{
    TD_COUNT(cuStreamBeginCaptureToGraph);
    (void)dependencyData;
    return begin_capture_to_graph(hStream, false, hGraph, dependencies, numDependencies, mode);
}

TD_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const CUgraphEdgeData *dependencyData,
                                                    size_t numDependencies, CUstreamCaptureMode mode)
{
    TD_COUNT(cuStreamBeginCaptureToGraph_ptsz);
    (void)dependencyData;
    return begin_capture_to_graph(hStream, true, hGraph, dependencies, numDependencies, mode);
}

/* Ends the capture begun on this stream. An invalidated capture ends with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and a NULL graph. */
static CUresult end_capture(CUstream h, bool ptsz, CUgraph *phGraph)
{
    struct td_stream *s;
    CUresult rc = td_enter_stream(h, ptsz, phGraph != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_capture *cap = s->capture;
    if (!cap)
        return td_leave(CUDA_ERROR_ILLEGAL_STATE);
    if (cap->origin != s)
        return td_leave(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(cap->thread, pthread_self()))
        return td_leave(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    capture_finish(cap);
    if (cap->invalidated) {
        *phGraph = NULL;
        return td_leave(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    struct td_graph *g = cap->graph;
    if (!g) {
        g = td_xcalloc(1, sizeof *g);
        td_obj_register(&g->h, TD_OBJ_GRAPH, NULL);
    }
    g->nodes += cap->nodes;
    *phGraph = (CUgraph)g;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    TD_COUNT(cuStreamEndCapture);
    return end_capture(hStream, false, phGraph);
}

TD_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    TD_COUNT(cuStreamEndCapture_ptsz);
    return end_capture(hStream, true, phGraph);
}

/* Capture status of a stream. On the legacy stream while a blocking
 * stream captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, nothing
 * invalidated (as documented). */
static CUresult is_capturing(CUstream h, bool ptsz, CUstreamCaptureStatus *status)
{
    struct td_stream *s;
    CUresult rc = td_enter_stream(h, ptsz, status != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s->type == TD_ST_LEGACY && blocking_capture(s->h.ctx, false))
        return td_leave(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    *status = !s->capture ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                        : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    TD_COUNT(cuStreamIsCapturing);
    return is_capturing(hStream, false, captureStatus);
}

TD_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    TD_COUNT(cuStreamIsCapturing_ptsz);
    return is_capturing(hStream, true, captureStatus);
}

TD_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    TD_COUNT(cuThreadExchangeStreamCaptureMode);
    CUresult rc = td_enter_args(mode && mode_valid(*mode));
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureMode old = td_tls.mode;
    td_tls.mode = *mode;
    *mode = old;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    TD_COUNT(cuGraphDestroy);
    struct td_obj *g;
    CUresult rc = td_enter_obj(hGraph, TD_OBJ_GRAPH, hGraph != NULL, &g);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (struct td_capture *c = td.captures; c; c = c->next)
        if (c->graph == (struct td_graph *)g)
            return td_leave(CUDA_ERROR_ILLEGAL_STATE);
    g->released = true;
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Executable graphs                                                   */

/* cuGraphInstantiateWithFlags: an executable graph of the current context
 * (CUDA_ERROR_INVALID_CONTEXT without one). The flags it accepts are those
 * cuda.h lists for it; CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD belongs to
 * cuGraphInstantiateWithParams (CUDA_ERROR_INVALID_VALUE here). Does not
 * wait. */
TD_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                               unsigned long long flags)
{
    TD_COUNT(cuGraphInstantiateWithFlags);
    const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    struct td_obj *g;
    struct td_ctx *c;
    CUresult rc = td_enter_obj(hGraph, TD_OBJ_GRAPH, phGraphExec && hGraph && !(flags & ~known),
                               &g);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_graph_exec *e = td_xcalloc(1, sizeof *e);
    td_obj_register(&e->h, TD_OBJ_GRAPH_EXEC, td_ctx_root(c));
    e->nodes = ((struct td_graph *)g)->nodes;
    *phGraphExec = (CUgraphExec)e;
    return td_leave(CUDA_SUCCESS);
}

/* cuGraphExecDestroy: does not wait (nothing of it can be running). */
TD_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    TD_COUNT(cuGraphExecDestroy);
    struct td_obj *e;
    CUresult rc = td_enter_obj(hGraphExec, TD_OBJ_GRAPH_EXEC, hGraphExec != NULL, &e);
    if (rc != CUDA_SUCCESS)
        return rc;
    e->released = true;
    return td_leave(CUDA_SUCCESS);
}
