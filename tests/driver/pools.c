/* pools.c - stream-ordered memory (cuMemAllocAsync, cuMemFreeAsync,
 * pools), the pending-free bookkeeping behind testdrv_pending_free_bytes,
 * and VMM handles (cuMemCreate / cuMemRelease).
 *
 * cuMemFreeAsync(p, s) returns at once. When s reaches the free, p stops
 * being live (a kernel still touching it faults) - with no regard for any
 * other stream, which is the hazard the shim must fence against. The bytes
 * then stay counted against capacity ("pending") until a host
 * synchronisation that waited for the free's position returns
 * (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize; a successful
 * query is not enough). Coverage is direct: the sync must have waited on
 * the free's stream at or after the free (dependencies reached through
 * other streams' event waits are not followed).
 *
 * Pools: allocations never reuse an address. Memory given back to a pool
 * is kept reserved (reusable by that pool only) up to its release
 * threshold; the rest goes back to capacity. cuMemPoolTrimTo releases
 * reserved memory. cuMemFree of pool memory waits like any cuMemFree and
 * then returns the memory to the pool at once. */
#include "internal.h"

#include <stdlib.h>

struct pending {
    struct pending *next;
    struct td_alloc *a;
    struct td_stream *s;
    uint64_t seq;
};

static struct pending *pendings;

/* ------------------------------------------------------------------ */
/* Pools                                                               */

static struct td_pool *pool_new(int dev, enum testdrv_kind kind, bool is_default)
{
    struct td_pool *pl = td_xcalloc(1, sizeof *pl);
    td_obj_register(&pl->h, TD_OBJ_POOL, NULL);
    pl->dev = dev;
    pl->kind = kind;
    pl->cap = kind == TESTDRV_HOST ? TD_CAP_HOST : td_cap_dev(dev);
    pl->is_default = is_default;
    pl->reuse[0] = pl->reuse[1] = pl->reuse[2] = 1;
    return pl;
}

void td_pools_init(void)
{
    td.default_pool = td_xcalloc((size_t)td.ndevices, sizeof *td.default_pool);
    for (int d = 0; d < td.ndevices; d++)
        td.default_pool[d] = pool_new(d, TESTDRV_DEVICE, true);
}

/* Looks up a live pool; bad handles are CUDA_ERROR_INVALID_VALUE. */
static CUresult pool_get(CUmemoryPool h, struct td_pool **out)
{
    struct td_obj *o;
    if (td_obj_get(h, TD_OBJ_POOL, &o) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (struct td_pool *)o;
    return CUDA_SUCCESS;
}

static size_t pool_reserved(const struct td_pool *pl)
{
    return pl->used + pl->pending + pl->idle;
}

static void pool_note_high(struct td_pool *pl)
{
    if (pl->used > pl->used_high)
        pl->used_high = pl->used;
    if (pool_reserved(pl) > pl->reserved_high)
        pl->reserved_high = pool_reserved(pl);
}

/* Freed, synchronised bytes come back to pl: kept reserved up to the
 * release threshold (a destroyed pool keeps nothing), the rest goes back
 * to capacity. */
static void pool_return(struct td_pool *pl, size_t bytes)
{
    size_t held = pl->used + pl->idle;
    size_t room = !pl->h.released && pl->threshold > held ? (size_t)(pl->threshold - held) : 0;
    size_t keep = bytes < room ? bytes : room;
    pl->idle += keep;
    td_cap_give(pl->cap, bytes - keep);
}

/* Takes size bytes from pl: from its reserve if it holds enough, else
 * from capacity. Makes the allocation record (context c as attribute). */
static CUresult pool_take(struct td_pool *pl, size_t size, struct td_ctx *c, struct td_alloc **out)
{
    bool from_idle = pl->idle >= size;
    if (pl->max_size && !from_idle && pool_reserved(pl) + size > pl->max_size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (from_idle)
        pl->idle -= size;
    else if (!td_cap_take(pl->cap, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = pl->kind == TESTDRV_DEVICE ? td_va_reserve(size, false)
                                                : (uintptr_t)td_host_map(size);
    if (!base) {
        if (from_idle)
            pl->idle += size;
        else
            td_cap_give(pl->cap, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct td_alloc *a = td_alloc_add(base, size, size, pl->kind, pl->cap, c);
    a->pool = pl;
    a->host_backed = pl->kind != TESTDRV_DEVICE;
    pl->used += size;
    pool_note_high(pl);
    *out = a;
    return CUDA_SUCCESS;
}

void td_pool_free_now(struct td_alloc *a)
{
    struct td_pool *pl = a->pool;
    td_alloc_unlink(a);
    pl->used -= a->size;
    pool_return(pl, a->size);
    free(a);
}

/* ------------------------------------------------------------------ */
/* Pending frees                                                       */

void td_pool_free_passed(struct td_alloc *a, struct td_stream *s, uint64_t seq)
{
    if (a->torn) {
        /* Its context was torn down meanwhile (the free was queued on
         * another context's stream): teardown already gave it back. */
        free(a);
        return;
    }
    td_alloc_unlink(a);
    if (a->pool) {
        a->pool->used -= a->size;
        a->pool->pending += a->size;
    }
    if (td_cap_is_device(a->cap))
        td.pending_bytes[a->cap] += a->size;
    struct pending *p = td_xcalloc(1, sizeof *p);
    p->a = a;
    p->s = s;
    p->seq = seq;
    p->next = pendings;
    pendings = p;
}

/* The bytes of one pending free come back (to its pool or capacity). */
static void pending_release(struct pending *p)
{
    struct td_alloc *a = p->a;
    if (td_cap_is_device(a->cap))
        td.pending_bytes[a->cap] -= a->size;
    if (a->pool) {
        a->pool->pending -= a->size;
        pool_return(a->pool, a->size);
    } else {
        td_alloc_give_cap(a);
    }
    free(a);
    free(p);
}

static bool pending_covered(const struct pending *p, const struct td_deps *deps)
{
    for (size_t i = 0; i < deps->n; i++)
        if (deps->v[i].s == p->s && deps->v[i].seq >= p->seq)
            return true;
    return false;
}

/* Releases the pending frees for which match(p, arg) holds. */
static void pending_release_if(bool (*match)(const struct pending *, const void *), const void *arg)
{
    struct pending **pp = &pendings;
    while (*pp) {
        struct pending *p = *pp;
        if (match(p, arg)) {
            *pp = p->next;
            pending_release(p);
        } else {
            pp = &p->next;
        }
    }
}

static bool match_covered(const struct pending *p, const void *deps)
{
    return pending_covered(p, deps);
}

/* Frees made on a stream of ctx or of one of its green contexts. */
static bool match_ctx(const struct pending *p, const void *ctx)
{
    return td_ctx_root(p->s->h.ctx) == ctx;
}

void td_pending_cover(const struct td_deps *deps)
{
    pending_release_if(match_covered, deps);
}

void td_pending_teardown_ctx(struct td_ctx *ctx)
{
    pending_release_if(match_ctx, ctx);
}

/* ------------------------------------------------------------------ */
/* Stream-ordered allocation and free                                  */

/* Allocates from pl (NULL: the default pool of the stream's device) in
 * stream order. The memory is usable at once. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool hpool, CUstream h,
                            bool ptsz)
{
    struct td_stream *s;
    bool captured;
    CUresult rc = td_enter_stream(h, ptsz, dptr != NULL, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_stream_submit_check(s, &captured)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_pool *pl = td.default_pool[s->h.ctx->dev];
    if (hpool && (rc = pool_get(hpool, &pl)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (size == 0)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct td_alloc *a;
    if ((rc = pool_take(pl, size, td_ctx_root(s->h.ctx), &a)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (captured)
        td_capture_record(s, td_op_new(TD_OP_NOP));
    *dptr = (CUdeviceptr)a->base;
    return td_leave_alloc(CUDA_SUCCESS, pl->kind);
}

TD_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    TD_COUNT(cuMemAllocAsync);
    return alloc_async(dptr, bytesize, NULL, hStream, false);
}

TD_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    TD_COUNT(cuMemAllocAsync_ptsz);
    return alloc_async(dptr, bytesize, NULL, hStream, true);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream h, bool ptsz)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, h, ptsz);
}

TD_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                           CUmemoryPool pool, CUstream hStream)
{
    TD_COUNT(cuMemAllocFromPoolAsync);
    return alloc_from_pool(dptr, bytesize, pool, hStream, false);
}

TD_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream)
{
    TD_COUNT(cuMemAllocFromPoolAsync_ptsz);
    return alloc_from_pool(dptr, bytesize, pool, hStream, true);
}

/* The first cuMemFreeAsync of non-pool memory in a process costs the
 * real driver about 10 ms of set-up (DESIGN.md section 1); later ones are
 * cheap. The test driver sleeps that long once (td.mu dropped) and counts
 * it as time the caller was blocked, so a test can tell whether a program
 * release paid it. */
#define FREE_ASYNC_SETUP_NS (10u * 1000000u)
static bool free_async_set_up;

/* Validates a cuMemFreeAsync of p on stream h: resolves the stream and
 * the allocation. CUDA_SUCCESS with *out NULL means nothing to free. */
static CUresult free_async_check(uintptr_t p, CUstream h, bool ptsz, struct td_stream **s,
                                 bool *captured, struct td_alloc **out)
{
    CUresult rc;
    *out = NULL;
    if ((rc = td_stream_get(h, ptsz, s)) != CUDA_SUCCESS ||
        (rc = td_stream_submit_check(*s, captured)) != CUDA_SUCCESS)
        return rc;
    if (p == 0)
        return CUDA_SUCCESS;
    struct td_alloc *a = td_alloc_at(p);
    if (!a) {
        if (td_graveyard_has(p))
            td_dead_call();
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a->kind == TESTDRV_MANAGED && !a->pool)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (a->busy || a->imported || (!a->pool && a->kind != TESTDRV_DEVICE))
        return CUDA_ERROR_INVALID_VALUE; /* imported: as for cuMemFree (memory.c) */
    *out = a;
    return CUDA_SUCCESS;
}

/* cuMemFreeAsync: device memory (cuMemAlloc* or a pool) by its base.
 * Managed memory from cuMemAllocManaged: CUDA_ERROR_NOT_SUPPORTED. On a
 * capturing stream the free is only recorded (the memory stays). */
static CUresult free_async(uintptr_t p, CUstream h, bool ptsz)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_stream *s;
    bool captured;
    struct td_alloc *a;
    if ((rc = free_async_check(p, h, ptsz, &s, &captured, &a)) != CUDA_SUCCESS || !a)
        return td_leave(rc);
    if (!a->pool && !free_async_set_up) {
        free_async_set_up = true;
        uint64_t t0 = td_now_ns();
        pthread_mutex_unlock(&td.mu);
        td_sleep_ns(FREE_ASYNC_SETUP_NS);
        pthread_mutex_lock(&td.mu);
        td_tls.blocked_ns += td_now_ns() - t0;
        if ((rc = free_async_check(p, h, ptsz, &s, &captured, &a)) != CUDA_SUCCESS || !a)
            return td_leave(rc);
    }
    if (captured) {
        td_capture_record(s, td_op_new(TD_OP_NOP));
        return td_leave(CUDA_SUCCESS);
    }
    struct td_op *op = td_op_new(TD_OP_FREE);
    op->u.free.a = a;
    a->busy = true;
    if ((rc = td_stream_enqueue(s, op)) != CUDA_SUCCESS)
        a->busy = false;
    return td_leave(rc);
}

TD_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    TD_COUNT(cuMemFreeAsync);
    return free_async((uintptr_t)dptr, hStream, false);
}

TD_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    TD_COUNT(cuMemFreeAsync_ptsz);
    return free_async((uintptr_t)dptr, hStream, true);
}

/* ------------------------------------------------------------------ */
/* Pool API                                                            */

/* Kind of memory a pool's properties describe, or -1 if unsupported. */
static int pool_kind(const CUmemPoolProps *props)
{
    CUmemLocationType t = props->location.type;
    bool host = t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    bool dev = t == CU_MEM_LOCATION_TYPE_DEVICE &&
               props->location.id >= 0 && props->location.id < td.ndevices;
    if (props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED)
        return dev ? TESTDRV_DEVICE : host ? TESTDRV_HOST : -1;
    if (props->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return dev || t == CU_MEM_LOCATION_TYPE_NONE ? TESTDRV_MANAGED : -1;
    return -1;
}

TD_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    TD_COUNT(cuMemPoolCreate);
    CUresult rc = td_enter_args(pool && poolProps);
    if (rc != CUDA_SUCCESS)
        return rc;
    int kind = pool_kind(poolProps);
    if (kind < 0)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    int dev = poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? poolProps->location.id : 0;
    struct td_pool *pl = pool_new(dev, (enum testdrv_kind)kind, false);
    pl->max_size = poolProps->maxSize;
    *pool = (CUmemoryPool)pl;
    return td_leave(CUDA_SUCCESS);
}

/* td_enter_args, then pool_get: the front of a call on one pool. */
static CUresult pool_enter(CUmemoryPool h, bool args_ok, struct td_pool **out)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = pool_get(h, out)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

/* Destroys a pool at once; allocations still out stay valid and their
 * memory goes back to capacity when freed. */
TD_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    TD_COUNT(cuMemPoolDestroy);
    struct td_pool *pl;
    CUresult rc = pool_enter(pool, true, &pl);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pl->is_default)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    pl->h.released = true;
    td_cap_give(pl->cap, pl->idle);
    pl->idle = 0;
    return td_leave(CUDA_SUCCESS);
}

static CUresult pool_set(struct td_pool *pl, CUmemPool_attribute attr, const void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pl->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(const int *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pl->threshold = *(const cuuint64_t *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pl->reserved_high = pool_reserved(pl);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pl->used_high = pl->used;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult pool_read(const struct td_pool *pl, CUmemPool_attribute attr, void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pl->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pl->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool_reserved(pl);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pl->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pl->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pl->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* cuMemPoolSetAttribute (set: attr from *value) and
 * cuMemPoolGetAttribute (attr into *value). */
static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, bool set)
{
    struct td_pool *pl;
    CUresult rc = pool_enter(pool, value != NULL, &pl);
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(set ? pool_set(pl, attr, value) : pool_read(pl, attr, value));
}

TD_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    TD_COUNT(cuMemPoolSetAttribute);
    return pool_attribute(pool, attr, value, true);
}

TD_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    TD_COUNT(cuMemPoolGetAttribute);
    return pool_attribute(pool, attr, value, false);
}

/* Releases reserved, unused memory until at most minBytesToKeep stay
 * reserved (memory in use or pending is never released). */
TD_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    TD_COUNT(cuMemPoolTrimTo);
    struct td_pool *pl;
    CUresult rc = pool_enter(pool, true, &pl);
    if (rc != CUDA_SUCCESS)
        return rc;
    size_t reserved = pool_reserved(pl);
    if (reserved > minBytesToKeep) {
        size_t excess = reserved - minBytesToKeep;
        size_t drop = excess < pl->idle ? excess : pl->idle;
        pl->idle -= drop;
        td_cap_give(pl->cap, drop);
    }
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* VMM handles                                                         */

TD_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    TD_COUNT(cuMemCreate);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle || !prop || size == 0 || flags != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    CUmemLocationType t = prop->location.type;
    enum td_cap cap;
    if (t == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 && prop->location.id < td.ndevices)
        cap = td_cap_dev(prop->location.id);
    else if (t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
             t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        cap = TD_CAP_HOST;
    else
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (!td_cap_take(cap, size))
        return td_leave(CUDA_ERROR_OUT_OF_MEMORY);
    struct td_vmm *v = td_xcalloc(1, sizeof *v);
    td_obj_register(&v->h, TD_OBJ_VMM, NULL);
    v->bytes = size;
    v->cap = cap;
    td_live_add(TESTDRV_VMM, 1, (long long)size);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    TD_COUNT(cuMemRelease);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_obj *o;
    if (td_obj_get((const void *)(uintptr_t)handle, TD_OBJ_VMM, &o) != CUDA_SUCCESS)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct td_vmm *v = (struct td_vmm *)o;
    v->h.released = true;
    td_cap_give(v->cap, v->bytes);
    td_live_add(TESTDRV_VMM, -1, -(long long)v->bytes);
    return td_leave(CUDA_SUCCESS);
}
