/* arrays.c - CUDA arrays and mipmapped arrays.
 *
 * An array has no contents, only a size counted against device capacity:
 * width * max(height,1) * max(depth,1) * channels * element size of its
 * format (a mipmapped array counts its base level only). Destroying one
 * is a waiting release (validate, then wait for every stream of the
 * context while holding its launch lock). */
#include "internal.h"

/* Bytes per channel element of a format; 0 for an unknown format. */
static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
    case CU_AD_FORMAT_NV12:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
        return 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
        return 8;
    default:
        return (unsigned)f >= 0x91 && (unsigned)f <= 0xb3 ? 1 : 0;
    }
}

/* Size of an array described by these fields, 0 if the description is
 * invalid (zero width, 0/3/5+ channels, unknown format, overflow). */
static size_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    size_t fb = format_bytes(f);
    if (w == 0 || fb == 0 || (ch != 1 && ch != 2 && ch != 4))
        return 0;
    size_t dims[] = { h ? h : 1, d ? d : 1, ch, fb };
    size_t bytes = w;
    for (size_t i = 0; i < 4; i++) {
        if (bytes > SIZE_MAX / dims[i])
            return 0;
        bytes *= dims[i];
    }
    return bytes;
}

/* Creates an array object of kind (TD_OBJ_ARRAY or TD_OBJ_MIPMAP). */
static CUresult array_create(void **out, size_t bytes, enum td_objkind kind)
{
    struct td_ctx *c;
    CUresult rc = td_enter_unsafe(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out || bytes == 0)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (!td_cap_take(td_cap_dev(c->dev), bytes))
        return td_leave(CUDA_ERROR_OUT_OF_MEMORY);
    struct td_array *a = td_xcalloc(1, sizeof *a);
    td_obj_register(&a->h, kind, td_ctx_root(c));
    a->bytes = bytes;
    a->cap = td_cap_dev(c->dev);
    td_live_add(TESTDRV_ARRAY, 1, (long long)bytes);
    *out = a;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    TD_COUNT(cuArrayCreate_v2);
    size_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels) : 0;
    return array_create((void **)pHandle, bytes, TD_OBJ_ARRAY);
}

TD_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    TD_COUNT(cuArrayCreate);
    size_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels) : 0;
    return array_create((void **)pHandle, bytes, TD_OBJ_ARRAY);
}

TD_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    TD_COUNT(cuArray3DCreate_v2);
    size_t bytes = d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : 0;
    return array_create((void **)pHandle, bytes, TD_OBJ_ARRAY);
}

TD_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    TD_COUNT(cuArray3DCreate);
    size_t bytes = d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : 0;
    return array_create((void **)pHandle, bytes, TD_OBJ_ARRAY);
}

TD_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                          const CUDA_ARRAY3D_DESCRIPTOR *d,
                                          unsigned int numMipmapLevels)
{
    TD_COUNT(cuMipmappedArrayCreate);
    size_t bytes = d && numMipmapLevels
                       ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels)
                       : 0;
    return array_create((void **)pHandle, bytes, TD_OBJ_MIPMAP);
}

/* Destroys an array: validated at once, then a waiting release; no
 * current context needed (td_enter_release). The handle is dead from the
 * start (a second destroy fails at once). */
static CUresult array_destroy(void *h, enum td_objkind kind)
{
    struct td_ctx *c;
    struct td_obj *o;
    CUresult rc = td_enter_release(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* An array of a destroyed context: CONTEXT_IS_DESTROYED (measured on
     * an H200, driver 580.159.04, 2026-11-29: tests/gpu/conform.c
     * cuArrayDestroy(after_ctx_destroy)). */
    if ((rc = td_obj_get(h, kind, &o)) != CUDA_SUCCESS)
        return td_leave(rc == CUDA_ERROR_INVALID_CONTEXT ? CUDA_ERROR_CONTEXT_IS_DESTROYED : rc);
    struct td_array *a = (struct td_array *)o;
    a->h.released = true;
    struct td_ctx *wctx = a->h.ctx->alive ? a->h.ctx : c;
    if (wctx)
        td_ctx_wait_idle(wctx, true);
    td_live_add(TESTDRV_ARRAY, -1, -(long long)a->bytes);
    td_cap_give((enum td_cap)a->cap, a->bytes);
    free(a->data);
    a->data = NULL;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    TD_COUNT(cuArrayDestroy);
    return array_destroy(hArray, TD_OBJ_ARRAY);
}

TD_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    TD_COUNT(cuMipmappedArrayDestroy);
    return array_destroy(hMipmappedArray, TD_OBJ_MIPMAP);
}
