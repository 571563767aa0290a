/* green.c - green contexts (driver API 12.4+): device resources, their
 * split into SM groups, resource descriptors, and the green context
 * handles (cuGreenCtxCreate / cuGreenCtxDestroy / cuCtxFromGreenCtx).
 *
 * Resources are only numbers here: a device has TD_SM_COUNT SMs, a
 * partition at least SM_MIN_PARTITION of them in multiples of
 * SM_ALIGNMENT (cuda.h's guideline for compute capability 9.0, 2 and 2
 * with CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING); nothing runs on
 * fewer SMs. A CUdevResource carries, in its driver-private padding, the
 * device it came from and the split that made it, so that
 * cuDevResourceGenerateDesc can check them as cuda.h describes.
 *
 * What a green context is and does (its streams, what it owns, its
 * destruction) is in contexts.c; its streams in streams.c
 * (cuGreenCtxStreamCreate), its events in events.c. Below version 12040
 * every call here answers CUDA_ERROR_NOT_SUPPORTED (and cuGetProcAddress
 * does not find them). */
#include "internal.h"

#include <string.h>

#define SM_MIN_PARTITION 8u
#define SM_ALIGNMENT 8u
#define SM_FINE 2u          /* partition and alignment without co-scheduling */
#define RES_MAGIC 0x54445253u /* "TDRS": a resource this driver wrote */

/* What the driver keeps in a CUdevResource's _internal_padding. */
struct res_tag {
    uint32_t magic;
    int32_t dev;
    uint64_t split; /* 0: a whole device's or context's resources */
};

static uint64_t next_split = 1;

bool td_green_supported(void) { return td.version >= 12040; }

/* td_enter, then the version check: the front of every call here. */
static CUresult green_enter(void)
{
    CUresult rc = td_enter();
    if (rc == CUDA_SUCCESS && !td_green_supported())
        rc = td_leave(CUDA_ERROR_NOT_SUPPORTED);
    return rc;
}

CUresult td_green_get(CUgreenCtx h, struct td_ctx **out)
{
    struct td_green *g = (struct td_green *)td_obj_find(h, TD_OBJ_GREEN);
    if (!g)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!g->ctx->alive) {
        td_dead_call();
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    *out = g->ctx;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Resources                                                           */

/* Writes an SM resource of sm_count SMs of dev, made by split. */
static void sm_resource(CUdevResource *r, int dev, unsigned sm_count, uint64_t split)
{
    struct res_tag tag = { RES_MAGIC, dev, split };
    memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    memcpy(r->_internal_padding, &tag, sizeof tag);
    r->sm.smCount = sm_count;
    r->sm.minSmPartitionSize = SM_MIN_PARTITION;
    r->sm.smCoscheduledAlignment = SM_ALIGNMENT;
}

/* Reads back the tag of a resource this driver wrote: not SM ->
 * CUDA_ERROR_INVALID_RESOURCE_TYPE; not ours -> CUDA_ERROR_INVALID_VALUE. */
static CUresult resource_tag(const CUdevResource *r, struct res_tag *tag)
{
    if (r->type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    memcpy(tag, r->_internal_padding, sizeof *tag);
    return tag->magic == RES_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The SM resources of dev with sm_count SMs into *r (lock held). */
static CUresult get_resource(CUdevResource *r, CUdevResourceType type, int dev, unsigned sm_count)
{
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM)
        return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(r, dev, sm_count, 0);
    return CUDA_SUCCESS;
}

TD_EXPORT CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource *resource,
                                          CUdevResourceType type)
{
    TD_COUNT(cuDeviceGetDevResource);
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (device < 0 || device >= td.ndevices)
        return td_leave(CUDA_ERROR_INVALID_DEVICE);
    return td_leave(get_resource(resource, type, device, TD_SM_COUNT));
}

/* A green context's CUcontext has its share of SMs, any other context the
 * whole device. */
TD_EXPORT CUresult cuCtxGetDevResource(CUcontext hCtx, CUdevResource *resource,
                                       CUdevResourceType type)
{
    TD_COUNT(cuCtxGetDevResource);
    struct td_ctx *c;
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_ctx_arg(hCtx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    return td_leave(get_resource(resource, type, c->dev, c->parent ? c->sm_count : TD_SM_COUNT));
}

TD_EXPORT CUresult cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource *resource,
                                            CUdevResourceType type)
{
    TD_COUNT(cuGreenCtxGetDevResource);
    struct td_ctx *c;
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_green_get(hCtx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    return td_leave(get_resource(resource, type, c->dev, c->sm_count));
}

/* SMs of one group: minCount raised to the minimum partition and rounded
 * up to the alignment. */
static unsigned group_size(unsigned min_count, unsigned use_flags)
{
    bool fine = use_flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING;
    unsigned min = fine ? SM_FINE : SM_MIN_PARTITION, align = fine ? SM_FINE : SM_ALIGNMENT;
    unsigned n = min_count > min ? min_count : min;
    return (n + align - 1) / align * align;
}

/* cuDevSmResourceSplitByCount: as many groups of group_size SMs as asked
 * for and fit (result NULL: how many would fit); the rest goes to
 * *remaining. No group fits: CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION (a
 * guess; cuda.h lists it). */
static CUresult sm_split(CUdevResource *result, unsigned *nb, const CUdevResource *input,
                         CUdevResource *remaining, unsigned use_flags, unsigned min_count)
{
    const unsigned known = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
                           CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE;
    struct res_tag tag;
    if (!nb || !input || (use_flags & ~known) || (result && *nb == 0))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = resource_tag(input, &tag);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (min_count > input->sm.smCount)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned size = group_size(min_count, use_flags), fit = input->sm.smCount / size;
    if (!result) {
        *nb = fit;
        return CUDA_SUCCESS;
    }
    unsigned n = *nb < fit ? *nb : fit;
    if (n == 0)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    uint64_t split = next_split++;
    for (unsigned i = 0; i < n; i++)
        sm_resource(&result[i], tag.dev, size, split);
    if (remaining)
        sm_resource(remaining, tag.dev, input->sm.smCount - n * size, split);
    *nb = n;
    return CUDA_SUCCESS;
}

TD_EXPORT CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups,
                                               const CUdevResource *input,
                                               CUdevResource *remaining, unsigned int useFlags,
                                               unsigned int minCount)
{
    TD_COUNT(cuDevSmResourceSplitByCount);
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    return td_leave(sm_split(result, nbGroups, input, remaining, useFlags, minCount));
}

/* Checks the resources of one descriptor (cuda.h: one device; several
 * only from one split) and sums their SMs into *sm_count; *dev gets their
 * device. */
static CUresult desc_check(const CUdevResource *res, unsigned n, int *dev, unsigned *sm_count)
{
    struct res_tag first = { 0 }, tag;
    *sm_count = 0;
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = resource_tag(&res[i], &tag);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (i == 0)
            first = tag;
        if (tag.dev != first.dev || (n > 1 && (tag.split == 0 || tag.split != first.split)))
            return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        *sm_count += res[i].sm.smCount;
    }
    *dev = first.dev;
    return CUDA_SUCCESS;
}

TD_EXPORT CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources,
                                             unsigned int nbResources)
{
    TD_COUNT(cuDevResourceGenerateDesc);
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    int dev = 0;
    unsigned sm_count = 0;
    if (!phDesc || !resources || nbResources == 0)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if ((rc = desc_check(resources, nbResources, &dev, &sm_count)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_resdesc *d = td_xcalloc(1, sizeof *d);
    td_obj_register(&d->h, TD_OBJ_RESDESC, NULL);
    d->dev = dev;
    d->sm_count = sm_count;
    *phDesc = (CUdevResourceDesc)d;
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Green context handles                                               */

/* cuGreenCtxCreate: flags must be CU_GREEN_CTX_DEFAULT_STREAM (cuda.h:
 * required); the descriptor must be of dev (else CUDA_ERROR_INVALID_VALUE,
 * a guess). Takes a reference on dev's primary context (td_green_ctx_new)
 * and does not make the green context current. */
TD_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                                    unsigned int flags)
{
    TD_COUNT(cuGreenCtxCreate);
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dev < 0 || dev >= td.ndevices)
        return td_leave(CUDA_ERROR_INVALID_DEVICE);
    const struct td_resdesc *d = (const struct td_resdesc *)td_obj_find(desc, TD_OBJ_RESDESC);
    if (!phCtx || flags != CU_GREEN_CTX_DEFAULT_STREAM || !d || d->dev != dev)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    struct td_green *g = td_xcalloc(1, sizeof *g);
    td_obj_register(&g->h, TD_OBJ_GREEN, NULL);
    g->ctx = td_green_ctx_new(dev, d->sm_count);
    g->ctx->green = g;
    *phCtx = (CUgreenCtx)g;
    return td_leave(CUDA_SUCCESS);
}

/* cuGreenCtxDestroy: returns at once even with work queued on its streams
 * (measured: 0 ms), unless it drops the last reference on the primary
 * context, whose teardown waits (measured: afterwards the primary context
 * is inactive). */
TD_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    TD_COUNT(cuGreenCtxDestroy);
    struct td_ctx *c;
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_green_get(hCtx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    td_green_ctx_destroy(c);
    return td_leave(CUDA_SUCCESS);
}

/* cuCtxFromGreenCtx: the green context's CUcontext, the same handle on
 * every call, different from the primary context's (measured on an H200,
 * driver 580.159.04, 2026-12-01, tests/gpu/facts.c green). */
TD_EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    TD_COUNT(cuCtxFromGreenCtx);
    struct td_ctx *c;
    CUresult rc = green_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pContext)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if ((rc = td_green_get(hCtx, &c)) != CUDA_SUCCESS)
        return td_leave(rc);
    *pContext = (CUcontext)c;
    return td_leave(CUDA_SUCCESS);
}
