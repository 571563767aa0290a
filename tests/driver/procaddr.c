/* procaddr.c - cuGetProcAddress and cuGetProcAddress_v2.
 *
 * The table maps a base name and the CUDA version that introduced a
 * variant to the exported function of that variant, after the
 * PFN_<name>_v<version>[_ptsz|_ptds] typedefs of cudaTypedefs.h (CUDA
 * 13.0), for every function this driver exports. It holds direct function
 * pointers: resolving through dlsym would go through the shim's dlsym
 * override.
 *
 * Resolution, like the real driver: among the variants of the name that
 * this driver has (introduced at or below cuDriverGetVersion), take the
 * newest one introduced at or below the requested cudaVersion. With
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, a _ptsz/_ptds variant at
 * least as new is taken instead where one exists. Unknown names:
 * CUDA_ERROR_NOT_FOUND / CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; a version
 * below the first variant: CUDA_ERROR_NOT_FOUND /
 * CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. Only base names resolve
 * ("cuMemFree", not "cuMemFree_v2"). */
#include "internal.h"

#include <string.h>

struct proc_entry {
    const char *base;
    int version;      /* CUDA version that introduced this variant */
    void *fn;
    bool per_thread;  /* a _ptsz / _ptds variant */
};

#define D(base, ver, sym) { #base, ver, (void *)&sym, false },
#define P(base, ver, sym) { #base, ver, (void *)&sym, true },

static const struct proc_entry table[] = {
    D(cuGetErrorString, 6000, cuGetErrorString)
    D(cuGetErrorName, 6000, cuGetErrorName)
    D(cuInit, 2000, cuInit)
    D(cuDriverGetVersion, 2020, cuDriverGetVersion)
    D(cuDeviceGet, 2000, cuDeviceGet)
    D(cuDeviceGetCount, 2000, cuDeviceGetCount)
    D(cuDeviceGetName, 2000, cuDeviceGetName)
    D(cuDeviceTotalMem, 2000, cuDeviceTotalMem)
    D(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)
    D(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)
    D(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool)
    D(cuGetExportTable, 3000, cuGetExportTable)

    D(cuCtxCreate, 2000, cuCtxCreate)
    D(cuCtxCreate, 3020, cuCtxCreate_v2)
    D(cuCtxCreate, 11040, cuCtxCreate_v3)
    D(cuCtxCreate, 12050, cuCtxCreate_v4)
    D(cuCtxDestroy, 2000, cuCtxDestroy)
    D(cuCtxDestroy, 4000, cuCtxDestroy_v2)
    D(cuCtxGetCurrent, 4000, cuCtxGetCurrent)
    D(cuCtxSetCurrent, 4000, cuCtxSetCurrent)
    D(cuCtxPushCurrent, 2000, cuCtxPushCurrent)
    D(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)
    D(cuCtxPopCurrent, 2000, cuCtxPopCurrent)
    D(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)
    D(cuCtxGetDevice, 2000, cuCtxGetDevice)
    D(cuCtxGetDevice, 13000, cuCtxGetDevice_v2)
    D(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion)
    D(cuCtxSynchronize, 2000, cuCtxSynchronize)
    D(cuCtxSynchronize, 13000, cuCtxSynchronize_v2)
    D(cuCtxRecordEvent, 12050, cuCtxRecordEvent)
    D(cuCtxWaitEvent, 12050, cuCtxWaitEvent)
    D(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)
    D(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease)
    D(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)
    D(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset)
    D(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2)
    D(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState)

    D(cuDeviceGetDevResource, 12040, cuDeviceGetDevResource)
    D(cuCtxGetDevResource, 12040, cuCtxGetDevResource)
    D(cuGreenCtxGetDevResource, 12040, cuGreenCtxGetDevResource)
    D(cuDevSmResourceSplitByCount, 12040, cuDevSmResourceSplitByCount)
    D(cuDevResourceGenerateDesc, 12040, cuDevResourceGenerateDesc)
    D(cuGreenCtxCreate, 12040, cuGreenCtxCreate)
    D(cuGreenCtxDestroy, 12040, cuGreenCtxDestroy)
    D(cuCtxFromGreenCtx, 12040, cuCtxFromGreenCtx)
    D(cuGreenCtxStreamCreate, 12050, cuGreenCtxStreamCreate)
    D(cuStreamGetGreenCtx, 12040, cuStreamGetGreenCtx)
    D(cuGreenCtxRecordEvent, 12040, cuGreenCtxRecordEvent)
    D(cuGreenCtxWaitEvent, 12040, cuGreenCtxWaitEvent)

    D(cuStreamCreate, 2000, cuStreamCreate)
    D(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority)
    D(cuStreamDestroy, 2000, cuStreamDestroy)
    D(cuStreamDestroy, 4000, cuStreamDestroy_v2)
    D(cuStreamSynchronize, 2000, cuStreamSynchronize)
    P(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz)
    D(cuStreamQuery, 2000, cuStreamQuery)
    P(cuStreamQuery, 7000, cuStreamQuery_ptsz)
    D(cuStreamWaitEvent, 3020, cuStreamWaitEvent)
    P(cuStreamWaitEvent, 7000, cuStreamWaitEvent_ptsz)
    D(cuStreamGetCtx, 9020, cuStreamGetCtx)
    P(cuStreamGetCtx, 9020, cuStreamGetCtx_ptsz)
    D(cuStreamGetCtx, 12050, cuStreamGetCtx_v2)
    P(cuStreamGetCtx, 12050, cuStreamGetCtx_v2_ptsz)
    D(cuStreamGetFlags, 5050, cuStreamGetFlags)
    P(cuStreamGetFlags, 7000, cuStreamGetFlags_ptsz)
    D(cuStreamAddCallback, 5000, cuStreamAddCallback)
    P(cuStreamAddCallback, 7000, cuStreamAddCallback_ptsz)
    D(cuLaunchHostFunc, 10000, cuLaunchHostFunc)
    P(cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz)
    D(cuStreamWriteValue32, 8000, cuStreamWriteValue32)
    P(cuStreamWriteValue32, 8000, cuStreamWriteValue32_ptsz)
    D(cuStreamWriteValue32, 11070, cuStreamWriteValue32_v2)
    P(cuStreamWriteValue32, 11070, cuStreamWriteValue32_v2_ptsz)

    D(cuEventCreate, 2000, cuEventCreate)
    D(cuEventDestroy, 2000, cuEventDestroy)
    D(cuEventDestroy, 4000, cuEventDestroy_v2)
    D(cuEventRecord, 2000, cuEventRecord)
    P(cuEventRecord, 7000, cuEventRecord_ptsz)
    D(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags)
    P(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz)
    D(cuEventQuery, 2000, cuEventQuery)
    D(cuEventSynchronize, 2000, cuEventSynchronize)
    D(cuEventElapsedTime, 2000, cuEventElapsedTime)
    D(cuEventElapsedTime, 12080, cuEventElapsedTime_v2)

    D(cuModuleLoad, 2000, cuModuleLoad)
    D(cuModuleLoadData, 2000, cuModuleLoadData)
    D(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx)
    D(cuModuleLoadFatBinary, 2000, cuModuleLoadFatBinary)
    D(cuModuleGetFunction, 2000, cuModuleGetFunction)
    D(cuModuleUnload, 2000, cuModuleUnload)
    D(cuLibraryLoadData, 12000, cuLibraryLoadData)
    D(cuLibraryLoadFromFile, 12000, cuLibraryLoadFromFile)
    D(cuLibraryUnload, 12000, cuLibraryUnload)
    D(cuLibraryGetKernel, 12000, cuLibraryGetKernel)
    D(cuLibraryGetModule, 12000, cuLibraryGetModule)
    D(cuKernelGetFunction, 12000, cuKernelGetFunction)
    D(cuLaunchKernel, 4000, cuLaunchKernel)
    P(cuLaunchKernel, 7000, cuLaunchKernel_ptsz)
    D(cuLaunchKernelEx, 11060, cuLaunchKernelEx)
    P(cuLaunchKernelEx, 11060, cuLaunchKernelEx_ptsz)
    D(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel)
    P(cuLaunchCooperativeKernel, 9000, cuLaunchCooperativeKernel_ptsz)

    D(cuMemAlloc, 2000, cuMemAlloc)
    D(cuMemAlloc, 3020, cuMemAlloc_v2)
    D(cuMemAllocPitch, 2000, cuMemAllocPitch)
    D(cuMemAllocPitch, 3020, cuMemAllocPitch_v2)
    D(cuMemFree, 2000, cuMemFree)
    D(cuMemFree, 3020, cuMemFree_v2)
    D(cuMemGetInfo, 2000, cuMemGetInfo)
    D(cuMemGetInfo, 3020, cuMemGetInfo_v2)
    D(cuMemGetAddressRange, 2000, cuMemGetAddressRange)
    D(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2)
    D(cuMemAllocHost, 2000, cuMemAllocHost)
    D(cuMemAllocHost, 3020, cuMemAllocHost_v2)
    D(cuMemHostAlloc, 2020, cuMemHostAlloc)
    D(cuMemFreeHost, 2000, cuMemFreeHost)
    D(cuMemHostGetFlags, 2030, cuMemHostGetFlags)
    D(cuMemHostGetDevicePointer, 2020, cuMemHostGetDevicePointer)
    D(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)
    D(cuMemAllocManaged, 6000, cuMemAllocManaged)
    D(cuMemHostRegister, 4000, cuMemHostRegister)
    D(cuMemHostRegister, 6050, cuMemHostRegister_v2)
    D(cuMemHostUnregister, 4000, cuMemHostUnregister)
    D(cuPointerGetAttribute, 4000, cuPointerGetAttribute)
    D(cuPointerGetAttributes, 7000, cuPointerGetAttributes)
    D(cuPointerSetAttribute, 6000, cuPointerSetAttribute)
    D(cuMemGetHandleForAddressRange, 11070, cuMemGetHandleForAddressRange)
    D(cuMemAdvise, 8000, cuMemAdvise)
    D(cuMemAdvise, 12020, cuMemAdvise_v2)
    D(cuMemRangeGetAttribute, 8000, cuMemRangeGetAttribute)
    D(cuMemRangeGetAttributes, 8000, cuMemRangeGetAttributes)
    D(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync)
    P(cuMemPrefetchAsync, 8000, cuMemPrefetchAsync_ptsz)
    D(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2)
    P(cuMemPrefetchAsync, 12020, cuMemPrefetchAsync_v2_ptsz)
    D(cuMemPrefetchBatchAsync, 13000, cuMemPrefetchBatchAsync)
    P(cuMemPrefetchBatchAsync, 13000, cuMemPrefetchBatchAsync_ptsz)
    D(cuMemDiscardAndPrefetchBatchAsync, 13000, cuMemDiscardAndPrefetchBatchAsync)
    P(cuMemDiscardAndPrefetchBatchAsync, 13000, cuMemDiscardAndPrefetchBatchAsync_ptsz)
    D(cuStreamAttachMemAsync, 6000, cuStreamAttachMemAsync)
    P(cuStreamAttachMemAsync, 7000, cuStreamAttachMemAsync_ptsz)
    D(cuMemcpyHtoD, 2000, cuMemcpyHtoD)
    D(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2)
    P(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds)
    D(cuMemcpyDtoH, 2000, cuMemcpyDtoH)
    D(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)
    P(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds)
    D(cuMemsetD8, 2000, cuMemsetD8)
    D(cuMemsetD8, 3020, cuMemsetD8_v2)
    P(cuMemsetD8, 7000, cuMemsetD8_v2_ptds)
    D(cuMemcpyHtoA, 3020, cuMemcpyHtoA_v2)
    P(cuMemcpyHtoA, 7000, cuMemcpyHtoA_v2_ptds)
    D(cuMemcpyAtoH, 3020, cuMemcpyAtoH_v2)
    P(cuMemcpyAtoH, 7000, cuMemcpyAtoH_v2_ptds)
    D(cuMemsetD8Async, 3020, cuMemsetD8Async)
    P(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz)
    D(cuMemsetD16Async, 3020, cuMemsetD16Async)
    P(cuMemsetD16Async, 7000, cuMemsetD16Async_ptsz)
    D(cuMemsetD32Async, 3020, cuMemsetD32Async)
    P(cuMemsetD32Async, 7000, cuMemsetD32Async_ptsz)
    D(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle)
    D(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle)
    D(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2)
    D(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle)

    D(cuMemAllocAsync, 11020, cuMemAllocAsync)
    P(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz)
    D(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync)
    P(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz)
    D(cuMemFreeAsync, 11020, cuMemFreeAsync)
    P(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz)
    D(cuMemPoolCreate, 11020, cuMemPoolCreate)
    D(cuMemPoolDestroy, 11020, cuMemPoolDestroy)
    D(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute)
    D(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute)
    D(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo)
    D(cuMemCreate, 10020, cuMemCreate)
    D(cuMemRelease, 10020, cuMemRelease)

    D(cuArrayCreate, 2000, cuArrayCreate)
    D(cuArrayCreate, 3020, cuArrayCreate_v2)
    D(cuArray3DCreate, 2000, cuArray3DCreate)
    D(cuArray3DCreate, 3020, cuArray3DCreate_v2)
    D(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate)
    D(cuArrayDestroy, 2000, cuArrayDestroy)
    D(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy)

    D(cuStreamBeginCapture, 10000, cuStreamBeginCapture)
    P(cuStreamBeginCapture, 10000, cuStreamBeginCapture_ptsz)
    D(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2)
    P(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz)
    D(cuStreamBeginCaptureToGraph, 12030, cuStreamBeginCaptureToGraph)
    P(cuStreamBeginCaptureToGraph, 12030, cuStreamBeginCaptureToGraph_ptsz)
    D(cuStreamEndCapture, 10000, cuStreamEndCapture)
    P(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz)
    D(cuStreamIsCapturing, 10000, cuStreamIsCapturing)
    P(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz)
    D(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode)
    D(cuGraphDestroy, 10000, cuGraphDestroy)
    D(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags)
    D(cuGraphExecDestroy, 10000, cuGraphExecDestroy)

    D(cuGetProcAddress, 11030, cuGetProcAddress)
    D(cuGetProcAddress, 12000, cuGetProcAddress_v2)
};

#undef D
#undef P

/* Newest variant of base introduced at or below version (and present in
 * this driver), per-thread or not; NULL if none. *known is set when the
 * driver has any variant of base. */
static const struct proc_entry *newest(const char *base, int version, bool per_thread, bool *known)
{
    const struct proc_entry *best = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct proc_entry *e = &table[i];
        if (strcmp(e->base, base) != 0 || e->version > td.version)
            continue;
        *known = true;
        if (e->per_thread == per_thread && e->version <= version &&
            (!best || e->version > best->version))
            best = e;
    }
    return best;
}

static CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    CUresult rc = td_enter_any();
    if (rc != CUDA_SUCCESS)
        return rc;
    const cuuint64_t known_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (!symbol || !pfn || (flags & ~known_flags))
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    td_config_ensure();
    *pfn = NULL;
    bool known = false;
    const struct proc_entry *d = newest(symbol, version, false, &known);
    const struct proc_entry *pt = newest(symbol, version, true, &known);
    const struct proc_entry *e = d ? d : pt;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && pt &&
        (!d || pt->version >= d->version))
        e = pt;
    CUdriverProcAddressQueryResult st = e ? CU_GET_PROC_ADDRESS_SUCCESS
                                        : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (status)
        *status = st;
    if (!e)
        return td_leave(CUDA_ERROR_NOT_FOUND);
    *pfn = e->fn;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    TD_COUNT(cuGetProcAddress);
    return get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

TD_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    TD_COUNT(cuGetProcAddress_v2);
    return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}
