/* advice.c - what a program sets on an allocation after making it:
 * managed-memory advice (cuMemAdvise), prefetches (cuMemPrefetchAsync and
 * the batch forms), stream attachment (cuStreamAttachMemAsync) and the
 * pointer attribute SYNC_MEMOPS (cuPointerSetAttribute), with the queries
 * that answer them (cuMemRangeGetAttribute(s), cuPointerGetAttribute); and
 * dma-buf exports (cuMemGetHandleForAddressRange).
 *
 * Each is kept on the allocation, so a new allocation has none of it, even
 * at the address of one just freed: measured on an H200, driver 580.159.04,
 * 2026-12-03 (tests/gpu/inherit.c, bench/RESULTS.md run 111): after advice
 * READ_MOSTLY, PREFERRED_LOCATION (the host) and ACCESSED_BY (device 0), a
 * prefetch to device 0 and SYNC_MEMOPS = 1, a freed block's successor at
 * the same address answers 0, CU_DEVICE_INVALID (-2), -2, -2 and 0.
 *
 * Simplified: the state belongs to the whole allocation (the real driver
 * keeps advice per page range); a range must lie in one managed
 * allocation; a prefetch's and an attachment's state is set when the call
 * is made (they are ordered on the stream as a no-op, or captured), not
 * when the stream reaches them. None of these calls waits.
 */
#include "internal.h"

#include <fcntl.h>
#include <unistd.h>

/* The managed allocation holding [p, p + bytes), or NULL. */
static struct td_alloc *managed_range(CUdeviceptr p, size_t bytes)
{
    struct td_alloc *a = p && bytes ? td_alloc_covering((uintptr_t)p, bytes) : NULL;
    return a && a->kind == TESTDRV_MANAGED ? a : NULL;
}

/* A location as the v1 calls name it: a device ordinal, CU_DEVICE_CPU for
 * the host; CU_DEVICE_INVALID for a location no call accepts. */
static int location_device(CUmemLocation loc)
{
    switch (loc.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return loc.id >= 0 && loc.id < td.ndevices ? loc.id : CU_DEVICE_INVALID;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CU_DEVICE_CPU;
    default:
        return CU_DEVICE_INVALID;
    }
}

/* A device as the v1 calls take it, checked the same way. */
static int v1_device(CUdevice d)
{
    return d == CU_DEVICE_CPU ? CU_DEVICE_CPU
           : d >= 0 && d < td.ndevices ? d
                                      : CU_DEVICE_INVALID;
}

/* The _TYPE (type) or _ID part of a location kept as location_device's
 * answer; CU_DEVICE_INVALID, nothing set, is the invalid type. */
static int location_part(int dev, bool type)
{
    if (dev == CU_DEVICE_INVALID)
        return type ? CU_MEM_LOCATION_TYPE_INVALID : CU_DEVICE_INVALID;
    if (dev == CU_DEVICE_CPU)
        return type ? CU_MEM_LOCATION_TYPE_HOST : 0;
    return type ? CU_MEM_LOCATION_TYPE_DEVICE : dev;
}

/* ---- advice --------------------------------------------------------------- */

/* READ_MOSTLY ignores the location; the others need a device or the host. */
static CUresult advise(CUdeviceptr p, size_t count, CUmem_advise advice, int dev)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = managed_range(p, count);
    if (!a)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    bool located = advice != CU_MEM_ADVISE_SET_READ_MOSTLY &&
                   advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY &&
                   advice != CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION;
    if (located && dev == CU_DEVICE_INVALID)
        return td_leave(CUDA_ERROR_INVALID_DEVICE);
    switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
        a->read_mostly = true;
        break;
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
        a->read_mostly = false;
        break;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
        a->preferred = dev;
        break;
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        a->preferred = CU_DEVICE_INVALID;
        break;
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
        a->accessed_by = dev;
        break;
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        if (a->accessed_by == dev)
            a->accessed_by = CU_DEVICE_INVALID;
        break;
    default:
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    }
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                               CUdevice device)
{
    TD_COUNT(cuMemAdvise);
    return advise(devPtr, count, advice, v1_device(device));
}

TD_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                  CUmemLocation location)
{
    TD_COUNT(cuMemAdvise_v2);
    return advise(devPtr, count, advice, location_device(location));
}

/* ---- queries of a range ------------------------------------------------------ */

/* One attribute of a's range into data (size bytes). */
static CUresult range_attribute(const struct td_alloc *a, void *data, size_t size,
                                CUmem_range_attribute attr)
{
    int *out = data;
    if (attr == CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) {
        if (size == 0 || size % sizeof(int))
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < size / sizeof(int); i++)
            out[i] = CU_DEVICE_INVALID;
        out[0] = a->accessed_by;
        return CUDA_SUCCESS;
    }
    if (size != sizeof(int))
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
        *out = a->read_mostly;
        return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION:
        *out = a->preferred;
        return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
        *out = a->last_prefetch;
        return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE:
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID:
        *out = location_part(a->preferred, attr == CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE);
        return CUDA_SUCCESS;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE:
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID:
        *out = location_part(a->last_prefetch,
                             attr == CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE);
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

TD_EXPORT CUresult cuMemRangeGetAttribute(void *data, size_t dataSize,
                                          CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                          size_t count)
{
    TD_COUNT(cuMemRangeGetAttribute);
    CUresult rc = td_enter_args(data != NULL);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = managed_range(devPtr, count);
    if (!a)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    return td_leave(range_attribute(a, data, dataSize, attribute));
}

TD_EXPORT CUresult cuMemRangeGetAttributes(void **data, size_t *dataSizes,
                                           CUmem_range_attribute *attributes,
                                           size_t numAttributes, CUdeviceptr devPtr, size_t count)
{
    TD_COUNT(cuMemRangeGetAttributes);
    CUresult rc = td_enter_args(data && dataSizes && attributes && numAttributes > 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = managed_range(devPtr, count);
    if (!a)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
        rc = data[i] ? range_attribute(a, data[i], dataSizes[i], attributes[i])
                     : CUDA_ERROR_INVALID_VALUE;
    return td_leave(rc);
}

/* ---- stream-ordered: prefetches and attachment -------------------------------- */

/* The front of a stream-ordered call on managed ranges: resolves the
 * stream and the capture rules (td.mu held on success). */
static CUresult stream_front(CUstream h, bool ptsz, struct td_stream **s, bool *captured)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_stream_get(h, ptsz, s)) != CUDA_SUCCESS ||
        (rc = td_stream_submit_check(*s, captured)) != CUDA_SUCCESS)
        return td_leave(rc);
    return CUDA_SUCCESS;
}

/* Orders a no-op on s for the call (or records it in s's capture), then
 * drops td.mu. */
static CUresult stream_back(struct td_stream *s, bool captured)
{
    struct td_op *op = td_op_new(TD_OP_NOP);
    if (captured) {
        td_capture_record(s, op);
        return td_leave(CUDA_SUCCESS);
    }
    return td_leave(td_stream_enqueue(s, op));
}

static CUresult prefetch(CUdeviceptr p, size_t count, int dev, CUstream h, bool ptsz)
{
    struct td_stream *s;
    bool captured;
    CUresult rc = stream_front(h, ptsz, &s, &captured);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = managed_range(p, count);
    if (!a)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (dev == CU_DEVICE_INVALID)
        return td_leave(CUDA_ERROR_INVALID_DEVICE);
    a->last_prefetch = dev;
    return stream_back(s, captured);
}

TD_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                      CUstream hStream)
{
    TD_COUNT(cuMemPrefetchAsync);
    return prefetch(devPtr, count, v1_device(dstDevice), hStream, false);
}

TD_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                           CUstream hStream)
{
    TD_COUNT(cuMemPrefetchAsync_ptsz);
    return prefetch(devPtr, count, v1_device(dstDevice), hStream, true);
}

TD_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                         unsigned int flags, CUstream hStream)
{
    TD_COUNT(cuMemPrefetchAsync_v2);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return prefetch(devPtr, count, location_device(location), hStream, false);
}

TD_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                              CUmemLocation location, unsigned int flags,
                                              CUstream hStream)
{
    TD_COUNT(cuMemPrefetchAsync_v2_ptsz);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return prefetch(devPtr, count, location_device(location), hStream, true);
}

/* The batch forms: range i goes to the location whose first index
 * (locIdxs, ascending, the first 0) is the last at or below i: the index
 * of that location, from l, the one of range i - 1. */
static size_t batch_location(size_t i, size_t l, const size_t *loc_idxs, size_t nlocs)
{
    while (l + 1 < nlocs && loc_idxs[l + 1] <= i)
        l++;
    return l;
}

/* Every range is checked before any is changed. */
static CUresult prefetch_batch(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                               CUmemLocation *locs, size_t *loc_idxs, size_t nlocs,
                               unsigned long long flags, CUstream h, bool ptsz)
{
    if (!dptrs || !sizes || !count || !locs || !loc_idxs || !nlocs || nlocs > count ||
        loc_idxs[0] != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct td_stream *s;
    bool captured;
    CUresult rc = stream_front(h, ptsz, &s, &captured);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (size_t i = 0, l = 0; i < count; i++) {
        l = batch_location(i, l, loc_idxs, nlocs);
        if (!managed_range(dptrs[i], sizes[i]))
            return td_leave(CUDA_ERROR_INVALID_VALUE);
        if (location_device(locs[l]) == CU_DEVICE_INVALID)
            return td_leave(CUDA_ERROR_INVALID_DEVICE);
    }
    for (size_t i = 0, l = 0; i < count; i++) {
        l = batch_location(i, l, loc_idxs, nlocs);
        managed_range(dptrs[i], sizes[i])->last_prefetch = location_device(locs[l]);
    }
    return stream_back(s, captured);
}

TD_EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                           CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                           size_t numPrefetchLocs, unsigned long long flags,
                                           CUstream hStream)
{
    TD_COUNT(cuMemPrefetchBatchAsync);
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, false);
}

TD_EXPORT CUresult cuMemPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                CUmemLocation *prefetchLocs,
                                                size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                unsigned long long flags, CUstream hStream)
{
    TD_COUNT(cuMemPrefetchBatchAsync_ptsz);
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, true);
}

TD_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes,
                                                     size_t count, CUmemLocation *prefetchLocs,
                                                     size_t *prefetchLocIdxs,
                                                     size_t numPrefetchLocs,
                                                     unsigned long long flags, CUstream hStream)
{
    TD_COUNT(cuMemDiscardAndPrefetchBatchAsync);
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, false);
}

TD_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync_ptsz(
    CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *prefetchLocs,
    size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, CUstream hStream)
{
    TD_COUNT(cuMemDiscardAndPrefetchBatchAsync_ptsz);
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, true);
}

/* dptr: the start of a managed allocation; length 0 or its size. */
static CUresult attach(CUstream h, CUdeviceptr dptr, size_t length, unsigned flags, bool ptsz)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
        flags != CU_MEM_ATTACH_SINGLE)
        return CUDA_ERROR_INVALID_VALUE;
    struct td_stream *s;
    bool captured;
    CUresult rc = stream_front(h, ptsz, &s, &captured);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_at((uintptr_t)dptr);
    if (!a || a->kind != TESTDRV_MANAGED || (length && length != a->size))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    a->attached = true;
    a->attach = flags;
    return stream_back(s, captured);
}

TD_EXPORT CUresult cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length,
                                          unsigned int flags)
{
    TD_COUNT(cuStreamAttachMemAsync);
    return attach(hStream, dptr, length, flags, false);
}

TD_EXPORT CUresult cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr,
                                               size_t length, unsigned int flags)
{
    TD_COUNT(cuStreamAttachMemAsync_ptsz);
    return attach(hStream, dptr, length, flags, true);
}

/* ---- the pointer attribute -------------------------------------------------- */

/* Only SYNC_MEMOPS can be set; any live allocation but a registration. */
TD_EXPORT CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    TD_COUNT(cuPointerSetAttribute);
    CUresult rc = td_enter_args(value != NULL && attribute == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)ptr, 0);
    if (!a || a->kind == TESTDRV_REGISTERED)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    a->sync_memops = *(const int *)value != 0;
    return td_leave(CUDA_SUCCESS);
}

/* ---- dma-buf export ---------------------------------------------------------- */

/* A dma-buf of a page-aligned range of one device or pinned allocation: a
 * descriptor of /dev/null stands for it (the program closes it); the
 * allocation remembers it was exported. Does not wait. */
TD_EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                 CUmemRangeHandleType handleType,
                                                 unsigned long long flags)
{
    TD_COUNT(cuMemGetHandleForAddressRange);
    long page = sysconf(_SC_PAGESIZE);
    CUresult rc = td_enter_args(handle && size && handleType == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD &&
                                (flags == 0 || flags == CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE) &&
                                dptr % (CUdeviceptr)page == 0 && size % (size_t)page == 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_alloc *a = td_alloc_covering((uintptr_t)dptr, size);
    if (!a || (a->kind != TESTDRV_DEVICE && a->kind != TESTDRV_HOST))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return td_leave(CUDA_ERROR_OPERATING_SYSTEM);
    *(int *)handle = fd;
    a->dmabuf = true;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT int testdrv_dmabuf_exported(CUdeviceptr ptr)
{
    pthread_mutex_lock(&td.mu);
    struct td_alloc *a = td_alloc_covering((uintptr_t)ptr, 0);
    int exported = a && a->dmabuf;
    pthread_mutex_unlock(&td.mu);
    return exported;
}

TD_EXPORT int testdrv_managed_attachment(CUdeviceptr ptr)
{
    pthread_mutex_lock(&td.mu);
    struct td_alloc *a = td_alloc_at((uintptr_t)ptr);
    int flags = !a || a->kind != TESTDRV_MANAGED ? -1 : (int)(a->attached ? a->attach : a->flags);
    pthread_mutex_unlock(&td.mu);
    return flags;
}
