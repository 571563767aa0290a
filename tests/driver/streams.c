/* streams.c - streams, their worker threads and op queues, the legacy
 * stream's implicit synchronisation, waiting releases, and the stream API.
 *
 * Legacy stream rules (as the real driver): an op queued on the legacy
 * stream waits for all work already queued on the blocking streams of its
 * context (user streams created without CU_STREAM_NON_BLOCKING and the
 * per-thread default streams); an op queued on a blocking stream waits for
 * the work already queued on the legacy stream. Non-blocking streams are
 * independent of both. */
#include "internal.h"

#include <signal.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* Stream objects                                                      */

bool td_stream_is_blocking(const struct td_stream *s)
{
    return s->type == TD_ST_PER_THREAD ||
           (s->type == TD_ST_USER && !(s->flags & CU_STREAM_NON_BLOCKING));
}

struct td_stream *td_stream_new(struct td_ctx *ctx, enum td_stype type,
                                unsigned flags, int priority)
{
    struct td_stream *s = td_xcalloc(1, sizeof *s);
    td_obj_register(&s->h, TD_OBJ_STREAM, ctx);
    s->type = type;
    s->flags = flags;
    s->priority = priority;
    s->owner = pthread_self();
    pthread_cond_init(&s->cv, NULL);
    s->next = ctx->streams;
    ctx->streams = s;
    s->linked = true;
    return s;
}

/* Takes s off its context's stream list (once drained and closed). */
static void stream_unlink(struct td_stream *s)
{
    if (!s->linked)
        return;
    for (struct td_stream **pp = &s->h.ctx->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    s->linked = false;
}

void td_stream_close(struct td_stream *s)
{
    s->closing = true;
    if (!s->worker_running && !s->head)
        stream_unlink(s);
    pthread_cond_signal(&s->cv);
}

/* The calling thread's per-thread default stream of ctx (made on first
 * use). */
static struct td_stream *per_thread_stream(struct td_ctx *ctx)
{
    pthread_t self = pthread_self();
    for (struct td_stream *s = ctx->streams; s; s = s->next)
        if (s->type == TD_ST_PER_THREAD && !s->closing && pthread_equal(s->owner, self))
            return s;
    return td_stream_new(ctx, TD_ST_PER_THREAD, 0, 0);
}

CUresult td_stream_get(CUstream h, bool ptsz, struct td_stream **out)
{
    bool legacy = h == CU_STREAM_LEGACY || (!h && !ptsz);
    bool per_thread = h == CU_STREAM_PER_THREAD || (!h && ptsz);
    if (legacy || per_thread) {
        struct td_ctx *c;
        CUresult rc = td_cur_ctx(&c);
        if (rc != CUDA_SUCCESS)
            return rc;
        *out = legacy ? c->legacy : per_thread_stream(c);
        return CUDA_SUCCESS;
    }
    struct td_obj *o;
    CUresult rc = td_obj_get(h, TD_OBJ_STREAM, &o);
    if (rc != CUDA_SUCCESS)
        return rc;
    *out = (struct td_stream *)o;
    return CUDA_SUCCESS;
}

CUresult td_enter_stream(CUstream h, bool ptsz, bool args_ok, struct td_stream **out)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = td_stream_get(h, ptsz, out)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Ops and the worker                                                  */

struct td_op *td_op_new(enum td_opkind kind)
{
    struct td_op *op = td_xcalloc(1, sizeof *op);
    op->kind = kind;
    return op;
}

void td_op_free(struct td_op *op)
{
    td_deps_free(&op->deps);
    free(op);
}

/* Runs one op (td.mu held; dropped around user code and sleeps). */
static void op_run(struct td_stream *s, struct td_op *op)
{
    switch (op->kind) {
    case TD_OP_NOP:
        break;
    case TD_OP_KERNEL:
    case TD_OP_SPIN:
        td_kernel_run(s, op);
        break;
    case TD_OP_RECORD:
        if (op->u.record.ev->gen == op->u.record.gen)
            op->u.record.ev->time_ns = td_now_ns();
        break;
    case TD_OP_HOSTFN:
        pthread_mutex_unlock(&td.mu);
        op->u.hostfn.fn(op->u.hostfn.data);
        pthread_mutex_lock(&td.mu);
        break;
    case TD_OP_CALLBACK: {
        CUresult status = s->h.ctx->sticky;
        pthread_mutex_unlock(&td.mu);
        op->u.callback.fn(op->u.callback.handle, status, op->u.callback.data);
        pthread_mutex_lock(&td.mu);
        break;
    }
    case TD_OP_FREE:
        td_pool_free_passed(op->u.free.a, s, op->seq);
        break;
    case TD_OP_WRITE32:
        td_write_value_run(s, op);
        break;
    case TD_OP_MEMSET:
        td_memset_run(s, op);
        break;
    }
}

/* Worker thread of one stream: runs its ops in order, each once its
 * dependencies are met; exits when the stream is closed and drained. */
static void *worker_main(void *arg)
{
    struct td_stream *s = arg;
    pthread_mutex_lock(&td.mu);
    for (;;) {
        while (!s->head && !s->closing)
            pthread_cond_wait(&s->cv, &td.mu);
        struct td_op *op = s->head;
        if (!op)
            break;
        while (!td_deps_done(&op->deps))
            pthread_cond_wait(&td.cv, &td.mu);
        op_run(s, op);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed = op->seq;
        td_op_free(op);
        pthread_cond_broadcast(&td.cv);
    }
    s->worker_running = false;
    stream_unlink(s);
    pthread_cond_broadcast(&td.cv);
    pthread_mutex_unlock(&td.mu);
    return NULL;
}

/* Starts s's worker if it is not running: detached (never keeps the
 * process alive, never joined) and with every signal blocked (signals go
 * to the program's threads). False if no thread could be made. */
static bool ensure_worker(struct td_stream *s)
{
    if (s->worker_running)
        return true;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)1 << 20);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int err = pthread_create(&t, &attr, worker_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0)
        return false;
    s->worker_running = true;
    return true;
}

/* Adds a context's cuCtxWaitEvent dependencies to op, dropping those
 * already met. */
static void add_wait_deps(struct td_deps *w, struct td_op *op)
{
    size_t keep = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (w->v[i].s->completed >= w->v[i].seq)
            continue;
        td_deps_add(&op->deps, w->v[i].s, w->v[i].seq);
        w->v[keep++] = w->v[i];
    }
    w->n = keep;
}

/* Adds the implicit dependencies of an op queued on s. */
static void add_implicit_deps(struct td_stream *s, struct td_op *op)
{
    struct td_ctx *c = s->h.ctx;
    if (s->type == TD_ST_LEGACY) {
        for (struct td_stream *b = c->streams; b; b = b->next)
            if (b != s && td_stream_is_blocking(b) && b->completed < b->submitted)
                td_deps_add(&op->deps, b, b->submitted);
    } else if (td_stream_is_blocking(s) && c->legacy->completed < c->legacy->submitted) {
        td_deps_add(&op->deps, c->legacy, c->legacy->submitted);
    }
    add_wait_deps(&c->wait_deps, op);
    if (c->parent) /* cuCtxWaitEvent on the primary holds its green contexts too */
        add_wait_deps(&c->parent->wait_deps, op);
}

CUresult td_stream_enqueue(struct td_stream *s, struct td_op *op)
{
    if (!ensure_worker(s)) {
        td_op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    add_implicit_deps(s, op);
    op->seq = ++s->submitted;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    return CUDA_SUCCESS;
}

CUresult td_stream_submit_check(struct td_stream *s, bool *captured)
{
    *captured = false;
    struct td_ctx *c = s->h.ctx;
    if (!c->alive) { /* being torn down by another thread */
        td_dead_call();
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (c->sticky != CUDA_SUCCESS)
        return c->sticky;
    if (s->type == TD_ST_LEGACY) {
        CUresult rc = td_capture_check_legacy(c);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (s->capture) {
        if (s->capture->invalidated)
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        *captured = true;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Snapshots, waiting releases, the launch lock                        */

void td_stream_snapshot(struct td_stream *s, struct td_deps *out)
{
    td_deps_add(out, s, s->submitted);
    if (s->type != TD_ST_LEGACY)
        return;
    for (struct td_stream *b = s->h.ctx->streams; b; b = b->next)
        if (td_stream_is_blocking(b))
            td_deps_add(out, b, b->submitted);
}

/* Adds every stream of ctx alone to out. */
static void streams_snapshot(const struct td_ctx *ctx, struct td_deps *out)
{
    for (struct td_stream *s = ctx->streams; s; s = s->next)
        td_deps_add(out, s, s->submitted);
}

void td_ctx_snapshot(struct td_ctx *ctx, struct td_deps *out)
{
    streams_snapshot(ctx, out);
    if (ctx->parent)
        return;
    for (const struct td_ctx *g = ctx->greens; g; g = g->green_next)
        streams_snapshot(g, out);
}

void td_ctx_wait_idle(struct td_ctx *ctx, bool hold_launch)
{
    ctx = td_ctx_root(ctx);
    if (hold_launch)
        ctx->release_holds++;
    struct td_deps deps = { 0 };
    td_ctx_snapshot(ctx, &deps);
    td_wait_deps(&deps);
    td_deps_free(&deps);
    if (hold_launch) {
        ctx->release_holds--;
        pthread_cond_broadcast(&td.cv);
    }
}

static bool launch_lock_free(void *arg)
{
    const struct td_ctx *c = arg;
    return c->release_holds == 0 || !c->alive;
}

/* Blocks while a waiting release holds the launch lock of ctx's root
 * (which a green context shares with its primary context). */
static void launch_gate(struct td_ctx *ctx)
{
    td_block_until(launch_lock_free, td_ctx_root(ctx));
}

CUresult td_launch_stream(CUstream h, bool ptsz, struct td_stream **out)
{
    for (;;) {
        struct td_stream *s;
        CUresult rc = td_stream_get(h, ptsz, &s);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (td_ctx_root(s->h.ctx)->release_holds == 0) {
            *out = s;
            return CUDA_SUCCESS;
        }
        launch_gate(s->h.ctx);
    }
}

/* ------------------------------------------------------------------ */
/* Stream API                                                          */

/* A program's stream of c (lock held). */
static CUstream user_stream_new(struct td_ctx *c, unsigned flags, int priority)
{
    /* Priorities are clamped to the range an H200 reports, [-5, 0]. */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    struct td_stream *s = td_stream_new(c, TD_ST_USER, flags, priority);
    td_live_add(TESTDRV_STREAM, 1, 0);
    return (CUstream)s;
}

/* cuStreamCreate*: a stream of the current context (of a green context's
 * own when its CUcontext is current, as cuda.h describes it). */
static CUresult stream_create(CUstream *phStream, unsigned flags, int priority)
{
    CUresult rc = td_enter_args(phStream && !(flags & ~(unsigned)CU_STREAM_NON_BLOCKING));
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    *phStream = user_stream_new(c, flags, priority);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    TD_COUNT(cuStreamCreate);
    return stream_create(phStream, Flags, 0);
}

TD_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    TD_COUNT(cuStreamCreateWithPriority);
    return stream_create(phStream, flags, priority);
}

/* cuGreenCtxStreamCreate (driver API 12.5+): a stream of the green
 * context, whatever is current; CU_STREAM_NON_BLOCKING is required. */
TD_EXPORT CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx,
                                          unsigned int flags, int priority)
{
    TD_COUNT(cuGreenCtxStreamCreate);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (td.version < 12050) /* cudaTypedefs.h: PFN_cuGreenCtxStreamCreate_v12050 */
        return td_leave(CUDA_ERROR_NOT_SUPPORTED);
    struct td_ctx *g;
    if ((rc = td_green_get(greenCtx, &g)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (!phStream || flags != CU_STREAM_NON_BLOCKING)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (g->sticky != CUDA_SUCCESS)
        return td_leave(g->sticky);
    *phStream = user_stream_new(g, flags, priority);
    return td_leave(CUDA_SUCCESS);
}

/* Destroys a user stream: returns at once; queued work still runs. */
static CUresult stream_destroy(CUstream h)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return td_leave(CUDA_ERROR_INVALID_HANDLE);
    struct td_obj *o;
    if ((rc = td_obj_get(h, TD_OBJ_STREAM, &o)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_stream *s = (struct td_stream *)o;
    td_capture_stream_destroyed(s);
    s->h.released = true;
    td_live_add(TESTDRV_STREAM, -1, 0);
    td_stream_close(s);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    TD_COUNT(cuStreamDestroy);
    return stream_destroy(hStream);
}

TD_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    TD_COUNT(cuStreamDestroy_v2);
    return stream_destroy(hStream);
}

/* Common front of cuStreamSynchronize / cuStreamQuery: resolves the
 * stream and applies the capture rules (the stream itself capturing:
 * its capture is invalidated; an unsafe call: see capture.c). */
static CUresult stream_host_call(CUstream h, bool ptsz, struct td_stream **out)
{
    CUresult rc = td_stream_get(h, ptsz, out);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_stream *s = *out;
    if (s->capture) {
        td_capture_invalidate(s->capture);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if ((rc = td_capture_check_unsafe()) != CUDA_SUCCESS)
        return rc;
    if (s->type == TD_ST_LEGACY && (rc = td_capture_check_legacy(s->h.ctx)) != CUDA_SUCCESS)
        return rc;
    return s->h.ctx->sticky;
}

/* Waits for all work queued on the stream so far (for the legacy stream,
 * also the blocking streams' work), then gives back the stream-ordered
 * frees it covered. */
static CUresult stream_synchronize(CUstream h, bool ptsz)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_stream *s;
    if ((rc = stream_host_call(h, ptsz, &s)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_deps deps = { 0 };
    td_stream_snapshot(s, &deps);
    td_host_sync(&deps);
    return td_leave(s->h.ctx->sticky);
}

TD_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    TD_COUNT(cuStreamSynchronize);
    return stream_synchronize(hStream, false);
}

TD_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    TD_COUNT(cuStreamSynchronize_ptsz);
    return stream_synchronize(hStream, true);
}

/* CUDA_SUCCESS if all work queued so far has finished, else
 * CUDA_ERROR_NOT_READY. Never gives memory back. */
static CUresult stream_query(CUstream h, bool ptsz)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_stream *s;
    if ((rc = stream_host_call(h, ptsz, &s)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_deps deps = { 0 };
    td_stream_snapshot(s, &deps);
    rc = td_deps_done(&deps) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    td_deps_free(&deps);
    return td_leave(rc);
}

TD_EXPORT CUresult cuStreamQuery(CUstream hStream)
{
    TD_COUNT(cuStreamQuery);
    return stream_query(hStream, false);
}

TD_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    TD_COUNT(cuStreamQuery_ptsz);
    return stream_query(hStream, true);
}

/* cuStreamGetCtx answers the stream's context: for a green context's
 * stream its CUcontext (measured on an H200, driver 580.159.04,
 * 2026-12-01, tests/gpu/facts.c green). cuStreamGetCtx_v2 (pgreen) answers
 * the primary context and the green context instead, as cuda.h says. */
static CUresult stream_get_ctx(CUstream h, bool ptsz, CUcontext *pctx, CUgreenCtx *pgreen)
{
    struct td_stream *s;
    CUresult rc = td_enter_stream(h, ptsz, pctx != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c = s->h.ctx;
    *pctx = (CUcontext)(pgreen ? td_ctx_root(c) : c);
    if (pgreen)
        *pgreen = c->parent ? (CUgreenCtx)c->green : NULL;
    return td_leave(CUDA_SUCCESS);
}

/* cuStreamGetGreenCtx (driver API 12.4+): the green context of the
 * stream's context, or NULL. */
TD_EXPORT CUresult cuStreamGetGreenCtx(CUstream hStream, CUgreenCtx *phCtx)
{
    TD_COUNT(cuStreamGetGreenCtx);
    struct td_stream *s;
    CUresult rc = td_enter_stream(hStream, false, phCtx != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!td_green_supported())
        return td_leave(CUDA_ERROR_NOT_SUPPORTED);
    *phCtx = s->h.ctx->parent ? (CUgreenCtx)s->h.ctx->green : NULL;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    TD_COUNT(cuStreamGetCtx);
    return stream_get_ctx(hStream, false, pctx, NULL);
}

TD_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    TD_COUNT(cuStreamGetCtx_ptsz);
    return stream_get_ctx(hStream, true, pctx, NULL);
}

TD_EXPORT CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    TD_COUNT(cuStreamGetCtx_v2);
    if (!pGreenCtx)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_get_ctx(hStream, false, pCtx, pGreenCtx);
}

TD_EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    TD_COUNT(cuStreamGetCtx_v2_ptsz);
    if (!pGreenCtx)
        return CUDA_ERROR_INVALID_VALUE;
    return stream_get_ctx(hStream, true, pCtx, pGreenCtx);
}

static CUresult stream_get_flags(CUstream h, bool ptsz, unsigned *flags)
{
    struct td_stream *s;
    CUresult rc = td_enter_stream(h, ptsz, flags != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    *flags = s->flags;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    TD_COUNT(cuStreamGetFlags);
    return stream_get_flags(hStream, false, flags);
}

TD_EXPORT CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
    TD_COUNT(cuStreamGetFlags_ptsz);
    return stream_get_flags(hStream, true, flags);
}

/* Queues a host-function or callback op (not a launch: no launch lock). */
static CUresult stream_host_op(CUstream h, bool ptsz, struct td_op *op)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS) {
        td_op_free(op);
        return rc;
    }
    struct td_stream *s;
    bool captured;
    if ((rc = td_stream_get(h, ptsz, &s)) != CUDA_SUCCESS ||
        (rc = td_stream_submit_check(s, &captured)) != CUDA_SUCCESS) {
        td_op_free(op);
        return td_leave(rc);
    }
    if (captured) {
        td_capture_record(s, op);
        return td_leave(CUDA_SUCCESS);
    }
    return td_leave(td_stream_enqueue(s, op));
}

static CUresult add_callback(CUstream h, bool ptsz, CUstreamCallback fn, void *data, unsigned flags)
{
    if (!fn || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct td_op *op = td_op_new(TD_OP_CALLBACK);
    op->u.callback.fn = fn;
    op->u.callback.data = data;
    op->u.callback.handle = h;
    return stream_host_op(h, ptsz, op);
}

TD_EXPORT CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback,
                                       void *userData, unsigned int flags)
{
    TD_COUNT(cuStreamAddCallback);
    return add_callback(hStream, false, callback, userData, flags);
}

TD_EXPORT CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback,
                                            void *userData, unsigned int flags)
{
    TD_COUNT(cuStreamAddCallback_ptsz);
    return add_callback(hStream, true, callback, userData, flags);
}

static CUresult launch_host_func(CUstream h, bool ptsz, CUhostFn fn, void *data)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct td_op *op = td_op_new(TD_OP_HOSTFN);
    op->u.hostfn.fn = fn;
    op->u.hostfn.data = data;
    return stream_host_op(h, ptsz, op);
}

/* cuStreamWriteValue32: the word is written when the stream reaches it
 * (measured on an H200, bench/RESULTS.md run 62: never before the work it
 * follows; it works although CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1
 * says 0). Flags other than the two defined, or an address that is 0 or not
 * 4-byte aligned, get CUDA_ERROR_INVALID_VALUE (not measured); a word
 * outside live memory faults the context when it runs. */
static CUresult write_value(CUstream h, bool ptsz, CUdeviceptr addr, cuuint32_t value,
                            unsigned flags)
{
    if (!addr || addr % 4 ||
        (flags != CU_STREAM_WRITE_VALUE_DEFAULT && flags != CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER))
        return CUDA_ERROR_INVALID_VALUE;
    struct td_op *op = td_op_new(TD_OP_WRITE32);
    op->u.write.addr = (uintptr_t)addr;
    op->u.write.value = value;
    return stream_host_op(h, ptsz, op);
}

TD_EXPORT CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags)
{
    TD_COUNT(cuStreamWriteValue32);
    return write_value(stream, false, addr, value, flags);
}

TD_EXPORT CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                           unsigned int flags)
{
    TD_COUNT(cuStreamWriteValue32_v2);
    return write_value(stream, false, addr, value, flags);
}

TD_EXPORT CUresult cuStreamWriteValue32_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                             unsigned int flags)
{
    TD_COUNT(cuStreamWriteValue32_ptsz);
    return write_value(stream, true, addr, value, flags);
}

TD_EXPORT CUresult cuStreamWriteValue32_v2_ptsz(CUstream stream, CUdeviceptr addr,
                                                cuuint32_t value, unsigned int flags)
{
    TD_COUNT(cuStreamWriteValue32_v2_ptsz);
    return write_value(stream, true, addr, value, flags);
}

TD_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    TD_COUNT(cuLaunchHostFunc);
    return launch_host_func(hStream, false, fn, userData);
}

TD_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    TD_COUNT(cuLaunchHostFunc_ptsz);
    return launch_host_func(hStream, true, fn, userData);
}
