/* contexts.c - contexts, the per-thread current-context stack, primary
 * contexts, green contexts' life cycle and context teardown.
 *
 * A user context (cuCtxCreate*) dies for good at cuCtxDestroy. A primary
 * context keeps one handle per device: it is active while the program
 * holds a retain or a green context lives (each holds a reference, as
 * measured on an H200, driver 580.159.04, 2026-12-01, tests/gpu/facts.c
 * green), and each activation starts clean (objects of the previous
 * activation stay dead).
 *
 * A green context is a context of its own (its CUcontext differs from the
 * primary's and stays the same) with its own streams; what is made while
 * it is current (memory, events, modules, arrays) belongs to the primary
 * context (measured: the memory's CU_POINTER_ATTRIBUTE_CONTEXT is the
 * primary's, and it outlives cuGreenCtxDestroy). cuGreenCtxDestroy does
 * not wait (measured: 0 ms under a running kernel); its streams die with
 * it, and the work they still hold runs on.
 *
 * Teardown of a user or primary context (cuCtxDestroy, last primary
 * reference, reset) destroys the primary's green contexts first, waits for
 * the streams of the context and of its green contexts, then frees what
 * the context owns: device, pinned host, managed and registered memory
 * (registrations are undone: the range can be registered again, measured
 * by facts register), arrays, modules, streams, events. Pool memory and
 * cuMemCreate handles are not the context's and survive; libraries are
 * context-independent and survive too (only their load into this context
 * goes). Later calls naming the context or its objects are counted
 * (testdrv_dead_context_calls). */
#include "internal.h"

#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* Current-context stack                                               */

static struct td_ctx *stack_top(void)
{
    return td_tls.depth ? td_tls.stack[td_tls.depth - 1] : NULL;
}

/* A thread's stack is freed when the thread ends. */
static pthread_key_t stack_key;
static pthread_once_t stack_once = PTHREAD_ONCE_INIT;

static void stack_free(void *v)
{
    free(v);
    td_tls.stack = NULL;
    td_tls.cap = td_tls.depth = 0;
}

static void stack_key_make(void)
{
    pthread_key_create(&stack_key, stack_free);
}

static void stack_push(struct td_ctx *c)
{
    if (td_tls.depth == td_tls.cap) {
        size_t cap = td_tls.cap ? td_tls.cap * 2 : 8;
        struct td_ctx **v = realloc(td_tls.stack, cap * sizeof *v);
        if (!v)
            abort();
        td_tls.stack = v;
        td_tls.cap = cap;
        pthread_once(&stack_once, stack_key_make);
        pthread_setspecific(stack_key, v);
    }
    td_tls.stack[td_tls.depth++] = c;
}

static struct td_ctx *stack_pop(void)
{
    return td_tls.depth ? td_tls.stack[--td_tls.depth] : NULL;
}

/* ------------------------------------------------------------------ */
/* Lookups used by every other file                                    */

/* The end of a context lookup that found c: NULL (unknown handle, or no
 * current context) -> CUDA_ERROR_INVALID_CONTEXT; destroyed (and not
 * dead_ok) -> counted as a dead call, dead_rc; else *out = c. */
static CUresult ctx_found(struct td_ctx *c, bool dead_ok, CUresult dead_rc, struct td_ctx **out)
{
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->alive && !dead_ok) {
        td_dead_call();
        return dead_rc;
    }
    *out = c;
    return CUDA_SUCCESS;
}

CUresult td_cur_ctx(struct td_ctx **out)
{
    return ctx_found(stack_top(), false, CUDA_ERROR_CONTEXT_IS_DESTROYED, out);
}

CUresult td_cur_ctx_usable(struct td_ctx **out)
{
    CUresult rc = td_cur_ctx(out);
    if (rc == CUDA_SUCCESS && (*out)->sticky != CUDA_SUCCESS)
        rc = (*out)->sticky;
    return rc;
}

CUresult td_cur_ctx_unsafe(struct td_ctx **out)
{
    CUresult rc = td_cur_ctx_usable(out);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_capture_check_unsafe();
}

CUresult td_ctx_arg(CUcontext h, struct td_ctx **out)
{
    if (!h)
        return td_cur_ctx(out);
    struct td_ctx *c = (struct td_ctx *)td_obj_find(h, TD_OBJ_CTX);
    return ctx_found(c, false, CUDA_ERROR_INVALID_CONTEXT, out);
}

/* A context handle for the stack operations: known contexts only; a
 * destroyed user context is refused (counted), an inactive primary one is
 * accepted (using it later fails with CONTEXT_IS_DESTROYED), and so is a
 * destroyed green context, counted (measured on an H200, driver
 * 580.159.04, 2026-12-01, tests/gpu/facts.c green-dead: cuCtxPushCurrent
 * of it returns CUDA_SUCCESS). */
static CUresult ctx_for_stack(CUcontext h, struct td_ctx **out)
{
    struct td_ctx *c = (struct td_ctx *)td_obj_find(h, TD_OBJ_CTX);
    if (c && c->parent && !c->alive)
        td_dead_call();
    return ctx_found(c, c && (c->primary || c->parent), CUDA_ERROR_INVALID_CONTEXT, out);
}

struct td_ctx *td_ctx_root(struct td_ctx *c) { return c->parent ? c->parent : c; }

/* A fault ends every context of its device, and the device's contexts made
 * or activated afterwards (measured on an H200, driver 580.159.04,
 * 2026-12-03, tests/gpu/facts.c xctx: after a fault in a second context
 * and its destruction, the primary context's next cuMemAllocHost and the
 * next cuCtxCreate answered CUDA_ERROR_ILLEGAL_ADDRESS). */
void td_ctx_set_sticky(struct td_ctx *c, CUresult rc)
{
    int dev = td_ctx_root(c)->dev;
    if (td.dev_sticky[dev] == CUDA_SUCCESS)
        td.dev_sticky[dev] = rc;
    for (struct td_obj *o = td.all; o; o = o->all_next) {
        if (o->kind != TD_OBJ_CTX)
            continue;
        struct td_ctx *x = (struct td_ctx *)o;
        if (x->dev == dev && x->sticky == CUDA_SUCCESS)
            x->sticky = td.dev_sticky[dev];
    }
}

/* td_enter_args, then td_ctx_arg(h): the front of a call on a context
 * passed explicitly (NULL: current). */
static CUresult ctx_arg_enter(CUcontext h, bool args_ok, struct td_ctx **out)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = td_ctx_arg(h, out)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */

/* Makes c alive with a fresh legacy stream and no green contexts. */
static void ctx_activate(struct td_ctx *c)
{
    c->alive = true;
    c->sticky = td.dev_sticky[c->dev];
    c->greens = NULL;
    c->green_refs = 0;
    c->streams = NULL; /* release_holds is left alone: a release of the
                          previous activation may still be unwinding */
    c->legacy = td_stream_new(c, TD_ST_LEGACY, 0, 0);
    td_live_add(TESTDRV_CONTEXT, 1, 0);
}

/* Marks one object of a dying context dead and undoes its accounting. */
static void obj_teardown(struct td_obj *o)
{
    o->ctx_dead = true;
    switch (o->kind) {
    case TD_OBJ_STREAM: {
        struct td_stream *s = (struct td_stream *)o;
        if (s->type == TD_ST_USER)
            td_live_add(TESTDRV_STREAM, -1, 0);
        td_stream_close(s);
        break;
    }
    case TD_OBJ_EVENT:
        td_live_add(TESTDRV_EVENT, -1, 0);
        td_deps_free(&((struct td_event *)o)->deps);
        break;
    case TD_OBJ_MODULE:
        if (!((struct td_module *)o)->lib)
            td_live_add(TESTDRV_MODULE, -1, 0);
        break;
    case TD_OBJ_ARRAY:
    case TD_OBJ_MIPMAP: {
        struct td_array *a = (struct td_array *)o;
        td_live_add(TESTDRV_ARRAY, -1, -(long long)a->bytes);
        td_cap_give((enum td_cap)a->cap, a->bytes);
        break;
    }
    default:
        break;
    }
}

/* Marks every object of c dead and undoes its accounting. */
static void ctx_objects_teardown(struct td_ctx *c)
{
    for (struct td_obj *o = td.all; o; o = o->all_next)
        if (o->ctx == c && o != &c->h && !o->released && !o->ctx_dead)
            obj_teardown(o);
}

/* Destroys a green context without waiting: it refuses new work, its
 * captures end, its streams die (their queued work still runs). Owns no
 * memory or other objects (its root does). */
static void green_teardown(struct td_ctx *g)
{
    g->alive = false;
    td_capture_end_ctx(g);
    ctx_objects_teardown(g);
    td_deps_free(&g->wait_deps);
    td_live_add(TESTDRV_CONTEXT, -1, 0);
    pthread_cond_broadcast(&td.cv);
}

/* Tears c down (td.mu held; dropped while waiting for its streams). The
 * caller has checked c is alive. A primary context's green contexts go
 * first (cuDevicePrimaryCtxReset destroys everything of the device's
 * context; not measured with green contexts alive). */
static void ctx_teardown(struct td_ctx *c)
{
    c->alive = false; /* refuse new work from here on */
    for (struct td_ctx *g = c->greens; g; g = g->green_next)
        if (g->alive)
            green_teardown(g);
    c->green_refs = 0;
    td_note_wait_call();
    td_capture_end_ctx(c);
    td_ctx_wait_idle(c, false);
    td_pending_teardown_ctx(c);
    td_mem_teardown_ctx(c);
    td_libraries_teardown_ctx(c);
    ctx_objects_teardown(c);
    td_deps_free(&c->wait_deps);
    td_live_add(TESTDRV_CONTEXT, -1, 0);
    pthread_cond_broadcast(&td.cv);
}

/* Creates a user context on dev and makes it current (lock held). */
static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= td.ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    if (flags & ~0xFFu)
        return CUDA_ERROR_INVALID_VALUE;
    if (td.dev_sticky[dev] != CUDA_SUCCESS)
        return td.dev_sticky[dev];
    struct td_ctx *c = td_xcalloc(1, sizeof *c);
    td_obj_register(&c->h, TD_OBJ_CTX, c);
    c->dev = dev;
    c->flags = flags;
    ctx_activate(c);
    stack_push(c);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

/* Every cuCtxCreate variant ends here; the extra parameters of _v3 and
 * _v4 (affinity, create params) are accepted and ignored. */
static CUresult ctx_create_api(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(ctx_create(pctx, flags, dev));
}

TD_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    TD_COUNT(cuCtxCreate);
    return ctx_create_api(pctx, flags, dev);
}

TD_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    TD_COUNT(cuCtxCreate_v2);
    return ctx_create_api(pctx, flags, dev);
}

TD_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                  int numParams, unsigned int flags, CUdevice dev)
{
    TD_COUNT(cuCtxCreate_v3);
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create_api(pctx, flags, dev);
}

TD_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                  unsigned int flags, CUdevice dev)
{
    TD_COUNT(cuCtxCreate_v4);
    (void)ctxCreateParams;
    return ctx_create_api(pctx, flags, dev);
}

/* cuCtxDestroy: tears a user context down; pops it if it is the calling
 * thread's current one. Primary and green contexts cannot be destroyed
 * this way. */
static CUresult ctx_destroy(CUcontext h)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c = (struct td_ctx *)td_obj_find(h, TD_OBJ_CTX);
    if (!c || c->primary)
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    if (!c->alive) {
        td_dead_call();
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    }
    if (c->parent) /* a green context goes with cuGreenCtxDestroy (a guess) */
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    if (stack_top() == c)
        stack_pop();
    ctx_teardown(c);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    TD_COUNT(cuCtxDestroy);
    return ctx_destroy(ctx);
}

TD_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    TD_COUNT(cuCtxDestroy_v2);
    return ctx_destroy(ctx);
}

/* ------------------------------------------------------------------ */
/* Current context                                                     */

TD_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    TD_COUNT(cuCtxGetCurrent);
    CUresult rc = td_enter_args(pctx != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    *pctx = (CUcontext)stack_top();
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    TD_COUNT(cuCtxSetCurrent);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ctx) {
        stack_pop();
        return td_leave(CUDA_SUCCESS);
    }
    struct td_ctx *c;
    if ((rc = ctx_for_stack(ctx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (td_tls.depth)
        td_tls.stack[td_tls.depth - 1] = c;
    else
        stack_push(c);
    return td_leave(CUDA_SUCCESS);
}

static CUresult ctx_push(CUcontext ctx)
{
    CUresult rc = td_enter_args(ctx != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c;
    if ((rc = ctx_for_stack(ctx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    stack_push(c);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    TD_COUNT(cuCtxPushCurrent);
    return ctx_push(ctx);
}

TD_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    TD_COUNT(cuCtxPushCurrent_v2);
    return ctx_push(ctx);
}

static CUresult ctx_pop(CUcontext *pctx)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!td_tls.depth)
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    struct td_ctx *c = stack_pop();
    if (pctx)
        *pctx = (CUcontext)c;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    TD_COUNT(cuCtxPopCurrent);
    return ctx_pop(pctx);
}

TD_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    TD_COUNT(cuCtxPopCurrent_v2);
    return ctx_pop(pctx);
}

/* Device of a context (NULL: current). */
static CUresult ctx_get_device(CUdevice *device, CUcontext h)
{
    struct td_ctx *c;
    CUresult rc = ctx_arg_enter(h, device != NULL, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    *device = c->dev;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    TD_COUNT(cuCtxGetDevice);
    return ctx_get_device(device, NULL);
}

TD_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    TD_COUNT(cuCtxGetDevice_v2);
    return ctx_get_device(device, ctx);
}

TD_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    TD_COUNT(cuCtxGetApiVersion);
    struct td_ctx *c;
    CUresult rc = ctx_arg_enter(ctx, version != NULL, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    *version = 3020;
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Synchronisation                                                     */

/* cuCtxSynchronize: waits for all work submitted so far in the context,
 * on every stream, then gives back the stream-ordered frees it covered.
 * Returns the context's sticky error if it has (or gets) one. A destroyed
 * context named by cuCtxSynchronize_v2 is CUDA_ERROR_CONTEXT_IS_DESTROYED
 * (measured on an H200, driver 580.159.04, 2026-11-29: tests/gpu/conform.c
 * cuCtxSynchronize_v2(destroyed_context)). */
static CUresult ctx_synchronize(CUcontext h)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_ctx *c = h ? (struct td_ctx *)td_obj_find(h, TD_OBJ_CTX) : NULL;
    if (c && !c->alive) {
        td_dead_call();
        return td_leave(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    if ((rc = td_ctx_arg(h, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    td_note_wait_call();
    if ((rc = td_capture_check_unsafe()) != CUDA_SUCCESS)
        return td_leave(rc);
    if (c->sticky != CUDA_SUCCESS)
        return td_leave(c->sticky);
    struct td_deps deps = { 0 };
    td_ctx_snapshot(c, &deps);
    /* The real driver's synchronisation waits for the context's own work,
     * and for another context's only where that work waits for it (a
     * stream wait on another context's event): counted, so that tests can
     * tell whose work a synchronisation waited for. */
    if (td_deps_reach_foreign(&deps, td_ctx_root(c))) {
        td.foreign_syncs++;
        td_tls.foreign_syncs++;
    }
    td_host_sync(&deps);
    return td_leave(c->sticky);
}

TD_EXPORT CUresult cuCtxSynchronize(void)
{
    TD_COUNT(cuCtxSynchronize);
    return ctx_synchronize(NULL);
}

TD_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    TD_COUNT(cuCtxSynchronize_v2);
    return ctx_synchronize(ctx);
}

/* ------------------------------------------------------------------ */
/* Primary contexts                                                    */

static CUresult primary_get(CUdevice dev, struct td_ctx **out)
{
    if (dev < 0 || dev >= td.ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *out = td.primary[dev];
    return CUDA_SUCCESS;
}

/* td_enter_args, then primary_get: the front of the primary-context
 * calls. */
static CUresult primary_enter(CUdevice dev, bool args_ok, struct td_ctx **out)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = primary_get(dev, out)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

TD_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    TD_COUNT(cuDevicePrimaryCtxRetain);
    struct td_ctx *c;
    CUresult rc = primary_enter(dev, pctx != NULL, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!c->alive)
        ctx_activate(c);
    c->refcount++;
    *pctx = (CUcontext)c;
    return td_leave(CUDA_SUCCESS);
}

/* Drops one of the program's retains; the last one tears the context
 * down unless a green context still holds it. */
static CUresult primary_release(CUdevice dev)
{
    struct td_ctx *c;
    CUresult rc = primary_enter(dev, true, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!c->alive || c->refcount <= 0)
        return td_leave(CUDA_ERROR_INVALID_CONTEXT);
    if (--c->refcount == 0 && c->green_refs == 0)
        ctx_teardown(c);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    TD_COUNT(cuDevicePrimaryCtxRelease);
    return primary_release(dev);
}

TD_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    TD_COUNT(cuDevicePrimaryCtxRelease_v2);
    return primary_release(dev);
}

/* Tears the primary context down whatever its retain count, its green
 * contexts included. */
static CUresult primary_reset(CUdevice dev)
{
    struct td_ctx *c;
    CUresult rc = primary_enter(dev, true, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (c->alive) {
        c->refcount = 0;
        ctx_teardown(c);
    }
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    TD_COUNT(cuDevicePrimaryCtxReset);
    return primary_reset(dev);
}

TD_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    TD_COUNT(cuDevicePrimaryCtxReset_v2);
    return primary_reset(dev);
}

/* Active exactly while the program holds a retain or a green context
 * lives: inactive after the last release or a reset. */
TD_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    TD_COUNT(cuDevicePrimaryCtxGetState);
    struct td_ctx *c;
    CUresult rc = primary_enter(dev, flags && active, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    *flags = c->flags;
    *active = c->alive ? 1 : 0;
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Green contexts' life cycle (the API is in green.c)                  */

/* Drops the dead green contexts of p whose streams have all drained. */
static void greens_prune(struct td_ctx *p)
{
    for (struct td_ctx **pp = &p->greens; *pp;) {
        struct td_ctx *g = *pp;
        if (!g->alive && !g->streams)
            *pp = g->green_next;
        else
            pp = &g->green_next;
    }
}

struct td_ctx *td_green_ctx_new(int dev, unsigned sm_count)
{
    struct td_ctx *p = td.primary[dev];
    if (!p->alive)
        ctx_activate(p);
    p->green_refs++;
    greens_prune(p);
    struct td_ctx *g = td_xcalloc(1, sizeof *g);
    td_obj_register(&g->h, TD_OBJ_CTX, g);
    g->dev = dev;
    g->flags = p->flags;
    g->parent = p;
    g->sm_count = sm_count;
    ctx_activate(g);
    g->sticky = p->sticky;
    g->green_next = p->greens;
    p->greens = g;
    return g;
}

void td_green_ctx_destroy(struct td_ctx *g)
{
    struct td_ctx *p = g->parent;
    green_teardown(g);
    if (--p->green_refs == 0 && p->refcount == 0 && p->alive)
        ctx_teardown(p);
}
