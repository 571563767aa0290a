/* exports.c - one exported function per wrapped driver name.
 *
 * Each wrapper has the exact prototype of the driver function of the same
 * ELF name (cuda_all.h declares them all, so the compiler checks it), hands
 * the call to the release engine where the engine has something to do, and
 * otherwise calls the driver's function of that same name. This file maps
 * names onto the engine; it holds no release policy.
 */
#include "cuda_all.h"

#include "engine.h"
#include "interpose.h"

#include <cudefer.h>

#define EXPORT __attribute__((visibility("default")))

/* The driver's function of this wrapper's own name, typed. */
#define REAL(name) ((__typeof__(&name))cd_real_fn(&real_##name))

#define DECLARE_REAL(name) static struct cd_real real_##name = {#name, NULL, 0, false}

/* Start of every wrapper: notes the first call, finds the driver function. */
#define ENTER(name)                                                         \
    __typeof__(&name) real = REAL(name);                                    \
    cd_note_call(&real_##name);                                             \
    if (!real)                                                              \
        return (CUresult)cd_missing(#name)

/* An allocating call: a queue over its limits is released first; on
 * out-of-memory the queue is released and the call retried once. */
#define ALLOC_CALL(rc, ...)                                                 \
    do {                                                                    \
        cd_alloc_begin();                                                   \
        rc = real(__VA_ARGS__);                                             \
        if (cd_alloc_failed(rc, __func__))                                  \
            rc = real(__VA_ARGS__);                                         \
    } while (0)

/* An allocating call (ALLOC_CALL with the arguments after bytes) whose
 * object, *out, is tracked as kind with bytes (evaluated on success only). */
#define ALLOC_TRACKED_BODY(kind, out, bytes, ...)                           \
    CUresult rc;                                                            \
    ALLOC_CALL(rc, __VA_ARGS__);                                            \
    if (rc == CUDA_SUCCESS)                                                 \
        cd_track(kind, (uintptr_t)*(out), bytes, 0);                        \
    return rc

/* The driver's call with the wrapper's arguments; on success, hook (an
 * expression that may use the results). */
#define REAL_THEN(hook, ...)                                                \
    CUresult rc = real(__VA_ARGS__);                                        \
    if (rc == CUDA_SUCCESS)                                                 \
        hook;                                                               \
    return rc

/* A release: the engine's answer when it takes the call (key is the
 * address or handle), the driver's otherwise. */
#define RELEASE_BODY(release, key, arg)                                     \
    CUresult rc;                                                            \
    if (release(key, &rc))                                                  \
        return rc;                                                          \
    return real(arg)

/* An allocation of kind that a block released earlier may serve (when ok:
 * arguments the driver accepts): else ALLOC_CALL(args...), and the new
 * block tracked. *out receives the block, cast to type. */
#define REUSE_OR_ALLOC_BODY(kind, ok, out, type, bytes, flags, ...)         \
    CUresult rc;                                                            \
    uintptr_t again;                                                        \
    if ((out) && (ok) && cd_reuse(kind, bytes, flags, &again)) {            \
        *(out) = (type)again;                                               \
        return CUDA_SUCCESS;                                                \
    }                                                                       \
    ALLOC_CALL(rc, __VA_ARGS__);                                            \
    if (rc == CUDA_SUCCESS)                                                 \
        cd_track(kind, (uintptr_t)*(out), bytes, flags);                    \
    return rc

/* ---- releases ---------------------------------------------------------- */

DECLARE_REAL(cuMemFree);
EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    ENTER(cuMemFree);
    RELEASE_BODY(cd_release_device, (CUdeviceptr)dptr, dptr);
}

DECLARE_REAL(cuMemFree_v2);
EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER(cuMemFree_v2);
    RELEASE_BODY(cd_release_device, dptr, dptr);
}

DECLARE_REAL(cuMemFreeHost);
EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
    ENTER(cuMemFreeHost);
    RELEASE_BODY(cd_release_host, p, p);
}

DECLARE_REAL(cuMemHostUnregister);
EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    ENTER(cuMemHostUnregister);
    CUresult rc;
    if (cd_release_registered(p, &rc))
        return rc;
    return cd_unregister_answer(p, real(p));
}

DECLARE_REAL(cuArrayDestroy);
EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray hArray)
{
    ENTER(cuArrayDestroy);
    RELEASE_BODY(cd_release_array, hArray, hArray);
}

DECLARE_REAL(cuMipmappedArrayDestroy);
EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    ENTER(cuMipmappedArrayDestroy);
    RELEASE_BODY(cd_release_mipmapped, hMipmappedArray, hMipmappedArray);
}

DECLARE_REAL(cuModuleUnload);
EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    ENTER(cuModuleUnload);
    RELEASE_BODY(cd_release_module, hmod, hmod);
}

DECLARE_REAL(cuLibraryUnload);
EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    ENTER(cuLibraryUnload);
    RELEASE_BODY(cd_release_library, library, library);
}

/* ---- synchronisation --------------------------------------------------- */

DECLARE_REAL(cuCtxSynchronize);
EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
    ENTER(cuCtxSynchronize);
    CUresult rc = real();
    if (rc == CUDA_SUCCESS)
        cd_context_synchronized(NULL);
    return rc;
}

DECLARE_REAL(cuCtxSynchronize_v2);
EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    ENTER(cuCtxSynchronize_v2);
    REAL_THEN(cd_context_synchronized(ctx), ctx);
}

/* ---- device, managed and host memory ----------------------------------- */

DECLARE_REAL(cuMemAlloc);
EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    ENTER(cuMemAlloc);
    REUSE_OR_ALLOC_BODY(CD_DEVICE, true, dptr, CUdeviceptr_v1, bytesize, 0, dptr, bytesize);
}

DECLARE_REAL(cuMemAlloc_v2);
EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER(cuMemAlloc_v2);
    REUSE_OR_ALLOC_BODY(CD_DEVICE, true, dptr, CUdeviceptr, bytesize, 0, dptr, bytesize);
}

DECLARE_REAL(cuMemAllocPitch);
EXPORT CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                        unsigned int WidthInBytes, unsigned int Height,
                                        unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch);
    ALLOC_TRACKED_BODY(CD_DEVICE, dptr, (size_t)*pPitch * Height,
                       dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

DECLARE_REAL(cuMemAllocPitch_v2);
EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                           size_t Height, unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch_v2);
    ALLOC_TRACKED_BODY(CD_DEVICE, dptr, *pPitch * Height,
                       dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

DECLARE_REAL(cuMemAllocManaged);
EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ENTER(cuMemAllocManaged);
    bool valid = flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST;
    REUSE_OR_ALLOC_BODY(CD_MANAGED, valid, dptr, CUdeviceptr, bytesize, flags, dptr, bytesize,
                        flags);
}

DECLARE_REAL(cuMemAllocHost);
EXPORT CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize)
{
    ENTER(cuMemAllocHost);
    REUSE_OR_ALLOC_BODY(CD_HOST, true, pp, void *, bytesize, CD_FLAGS_ALLOC_HOST, pp, bytesize);
}

DECLARE_REAL(cuMemAllocHost_v2);
EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    ENTER(cuMemAllocHost_v2);
    REUSE_OR_ALLOC_BODY(CD_HOST, true, pp, void *, bytesize, CD_FLAGS_ALLOC_HOST, pp, bytesize);
}

DECLARE_REAL(cuMemHostAlloc);
EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    ENTER(cuMemHostAlloc);
    /* Only flags the driver accepts: an invalid one gets the driver's error. */
    bool valid = !(Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                       CU_MEMHOSTALLOC_WRITECOMBINED));
    REUSE_OR_ALLOC_BODY(CD_HOST, valid, pp, void *, bytesize, Flags, pp, bytesize, Flags);
}

/* A registration that overlaps a queued unregister would fail with
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: those go first. */
#define REGISTER_BODY()                                                     \
    CUresult rc;                                                            \
    cd_before_register(p, bytesize);                                        \
    ALLOC_CALL(rc, p, bytesize, Flags);                                     \
    if (cd_register_failed(rc, p, bytesize))                                \
        rc = real(p, bytesize, Flags);                                      \
    if (rc == CUDA_SUCCESS)                                                 \
        cd_track(CD_REGISTERED, (uintptr_t)p, bytesize, Flags);                    \
    return rc

DECLARE_REAL(cuMemHostRegister);
EXPORT CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    ENTER(cuMemHostRegister);
    REGISTER_BODY();
}

DECLARE_REAL(cuMemHostRegister_v2);
EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    ENTER(cuMemHostRegister_v2);
    REGISTER_BODY();
}

/* ---- stream-ordered and virtual memory: retried, not tracked ----------- */

DECLARE_REAL(cuMemAllocAsync);
EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync);
    CUresult rc;
    ALLOC_CALL(rc, dptr, bytesize, hStream);
    return rc;
}

DECLARE_REAL(cuMemAllocAsync_ptsz);
EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER(cuMemAllocAsync_ptsz);
    CUresult rc;
    ALLOC_CALL(rc, dptr, bytesize, hStream);
    return rc;
}

DECLARE_REAL(cuMemAllocFromPoolAsync);
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync);
    CUresult rc;
    ALLOC_CALL(rc, dptr, bytesize, pool, hStream);
    return rc;
}

DECLARE_REAL(cuMemAllocFromPoolAsync_ptsz);
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                     CUmemoryPool pool, CUstream hStream)
{
    ENTER(cuMemAllocFromPoolAsync_ptsz);
    CUresult rc;
    ALLOC_CALL(rc, dptr, bytesize, pool, hStream);
    return rc;
}

DECLARE_REAL(cuMemCreate);
EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(cuMemCreate);
    CUresult rc;
    ALLOC_CALL(rc, handle, size, prop, flags);
    return rc;
}

/* ---- arrays ------------------------------------------------------------ */

static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;
    }
}

static size_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels)
{
    return w * (h ? h : 1) * (d ? d : 1) * format_bytes(f) * (channels ? channels : 1);
}

/* Bytes of the array a descriptor (of any version) describes, depth d. */
#define DESC_BYTES(desc, d)                                                 \
    array_bytes((desc)->Width, (desc)->Height, d, (desc)->Format, (desc)->NumChannels)

DECLARE_REAL(cuArrayCreate);
EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
    ENTER(cuArrayCreate);
    ALLOC_TRACKED_BODY(CD_ARRAY, pHandle, DESC_BYTES(desc, 1), pHandle, desc);
}

DECLARE_REAL(cuArrayCreate_v2);
EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    ENTER(cuArrayCreate_v2);
    ALLOC_TRACKED_BODY(CD_ARRAY, pHandle, DESC_BYTES(desc, 1), pHandle, desc);
}

DECLARE_REAL(cuArray3DCreate);
EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc)
{
    ENTER(cuArray3DCreate);
    ALLOC_TRACKED_BODY(CD_ARRAY, pHandle, DESC_BYTES(desc, desc->Depth), pHandle, desc);
}

DECLARE_REAL(cuArray3DCreate_v2);
EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    ENTER(cuArray3DCreate_v2);
    ALLOC_TRACKED_BODY(CD_ARRAY, pHandle, DESC_BYTES(desc, desc->Depth), pHandle, desc);
}

DECLARE_REAL(cuMipmappedArrayCreate);
EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                               const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                               unsigned int numMipmapLevels)
{
    ENTER(cuMipmappedArrayCreate);
    /* The levels below the first add at most a third. */
    ALLOC_TRACKED_BODY(CD_MIPMAPPED, pHandle, DESC_BYTES(desc, desc->Depth) / 3 * 4, pHandle, desc,
                       numMipmapLevels);
}

/* ---- modules and libraries --------------------------------------------- */

DECLARE_REAL(cuModuleLoad);
EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    ENTER(cuModuleLoad);
    ALLOC_TRACKED_BODY(CD_MODULE, module, 0, module, fname);
}

DECLARE_REAL(cuModuleLoadData);
EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    ENTER(cuModuleLoadData);
    ALLOC_TRACKED_BODY(CD_MODULE, module, 0, module, image);
}

DECLARE_REAL(cuModuleLoadDataEx);
EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                           unsigned int numOptions, CUjit_option *options,
                                           void **optionValues)
{
    ENTER(cuModuleLoadDataEx);
    ALLOC_TRACKED_BODY(CD_MODULE, module, 0, module, image, numOptions, options, optionValues);
}

DECLARE_REAL(cuModuleLoadFatBinary);
EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    ENTER(cuModuleLoadFatBinary);
    ALLOC_TRACKED_BODY(CD_MODULE, module, 0, module, fatCubin);
}

DECLARE_REAL(cuLibraryLoadData);
EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code,
                                          CUjit_option *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions,
                                          CUlibraryOption *libraryOptions,
                                          void **libraryOptionValues,
                                          unsigned int numLibraryOptions)
{
    ENTER(cuLibraryLoadData);
    ALLOC_TRACKED_BODY(CD_LIBRARY, library, 0,
                       library, code, jitOptions, jitOptionsValues, numJitOptions, libraryOptions,
                       libraryOptionValues, numLibraryOptions);
}

DECLARE_REAL(cuLibraryLoadFromFile);
EXPORT CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                              CUjit_option *jitOptions, void **jitOptionsValues,
                                              unsigned int numJitOptions,
                                              CUlibraryOption *libraryOptions,
                                              void **libraryOptionValues,
                                              unsigned int numLibraryOptions)
{
    ENTER(cuLibraryLoadFromFile);
    ALLOC_TRACKED_BODY(CD_LIBRARY, library, 0,
                       library, fileName, jitOptions, jitOptionsValues, numJitOptions,
                       libraryOptions, libraryOptionValues, numLibraryOptions);
}

/* ---- streams ----------------------------------------------------------- */

DECLARE_REAL(cuStreamCreate);
EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    ENTER(cuStreamCreate);
    REAL_THEN(cd_stream_created(*phStream), phStream, Flags);
}

DECLARE_REAL(cuStreamCreateWithPriority);
EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
                                                   int priority)
{
    ENTER(cuStreamCreateWithPriority);
    REAL_THEN(cd_stream_created(*phStream), phStream, flags, priority);
}

DECLARE_REAL(cuStreamDestroy);
EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    ENTER(cuStreamDestroy);
    cd_stream_destroying(hStream);
    return real(hStream);
}

DECLARE_REAL(cuStreamDestroy_v2);
EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    ENTER(cuStreamDestroy_v2);
    cd_stream_destroying(hStream);
    return real(hStream);
}

/* ---- stream capture ---------------------------------------------------- */

#define BEGIN_CAPTURE(...)                                                  \
    cd_capture_begin();                                                     \
    CUresult rc = real(__VA_ARGS__);                                        \
    cd_capture_begun(hStream, rc);                                          \
    return rc

DECLARE_REAL(cuStreamBeginCapture);
EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
    ENTER(cuStreamBeginCapture);
    BEGIN_CAPTURE(hStream);
}

DECLARE_REAL(cuStreamBeginCapture_ptsz);
EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
    ENTER(cuStreamBeginCapture_ptsz);
    BEGIN_CAPTURE(hStream);
}

DECLARE_REAL(cuStreamBeginCapture_v2);
EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2);
    BEGIN_CAPTURE(hStream, mode);
}

DECLARE_REAL(cuStreamBeginCapture_v2_ptsz);
EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2_ptsz);
    BEGIN_CAPTURE(hStream, mode);
}

DECLARE_REAL(cuStreamBeginCaptureToGraph);
EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const CUgraphEdgeData *dependencyData,
                                                    size_t numDependencies,
                                                    CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCaptureToGraph);
    BEGIN_CAPTURE(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
}

DECLARE_REAL(cuStreamBeginCaptureToGraph_ptsz);
EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                         const CUgraphNode *dependencies,
                                                         const CUgraphEdgeData *dependencyData,
                                                         size_t numDependencies,
                                                         CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCaptureToGraph_ptsz);
    BEGIN_CAPTURE(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
}

DECLARE_REAL(cuStreamEndCapture);
EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    ENTER(cuStreamEndCapture);
    CUresult rc = real(hStream, phGraph);
    cd_capture_ended(hStream, rc);
    return rc;
}

DECLARE_REAL(cuStreamEndCapture_ptsz);
EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    ENTER(cuStreamEndCapture_ptsz);
    CUresult rc = real(hStream, phGraph);
    cd_capture_ended(hStream, rc);
    return rc;
}

/* ---- contexts ---------------------------------------------------------- */

DECLARE_REAL(cuCtxCreate);
EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate);
    REAL_THEN(cd_context_created(*pctx), pctx, flags, dev);
}

DECLARE_REAL(cuCtxCreate_v2);
EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v2);
    REAL_THEN(cd_context_created(*pctx), pctx, flags, dev);
}

DECLARE_REAL(cuCtxCreate_v3);
EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                       int numParams, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v3);
    REAL_THEN(cd_context_created(*pctx), pctx, paramsArray, numParams, flags, dev);
}

DECLARE_REAL(cuCtxCreate_v4);
EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                       unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v4);
    REAL_THEN(cd_context_created(*pctx), pctx, ctxCreateParams, flags, dev);
}

DECLARE_REAL(cuCtxDestroy);
EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
    ENTER(cuCtxDestroy);
    cd_context_teardown(ctx);
    return real(ctx);
}

DECLARE_REAL(cuCtxDestroy_v2);
EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2);
    cd_context_teardown(ctx);
    return real(ctx);
}

DECLARE_REAL(cuDevicePrimaryCtxRetain);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain);
    REAL_THEN(cd_primary_retained(dev, *pctx), pctx, dev);
}

DECLARE_REAL(cuDevicePrimaryCtxRelease);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease);
    cd_primary_releasing(dev);
    return real(dev);
}

DECLARE_REAL(cuDevicePrimaryCtxRelease_v2);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease_v2);
    cd_primary_releasing(dev);
    return real(dev);
}

DECLARE_REAL(cuDevicePrimaryCtxReset);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset);
    cd_primary_resetting(dev);
    return real(dev);
}

DECLARE_REAL(cuDevicePrimaryCtxReset_v2);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2);
    cd_primary_resetting(dev);
    return real(dev);
}

/* ---- entry-point resolvers (interpose.c does the substitution) --------- */

void *cd_substitute(void *fn, const char *door_name, enum cd_door door);

DECLARE_REAL(cuGetProcAddress);
EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags)
{
    ENTER(cuGetProcAddress);
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = cd_substitute(*pfn, symbol, CD_DOOR_PROCADDR);
    return rc;
}

DECLARE_REAL(cuGetProcAddress_v2);
EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus)
{
    ENTER(cuGetProcAddress_v2);
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = cd_substitute(*pfn, symbol, CD_DOOR_PROCADDR);
    return rc;
}

/* ---- the public API ---------------------------------------------------- */

EXPORT int cudefer_flush(void)
{
    return cd_flush_all();
}

EXPORT const char *cudefer_version(void)
{
    return CUDEFER_VERSION_STRING;
}

/* ---- the table of wrapped names ---------------------------------------- */

#define WRAP(name) {#name, (void *)name, &real_##name}

const struct cd_wrapper cd_wrappers[] = {
    WRAP(cuArray3DCreate),
    WRAP(cuArray3DCreate_v2),
    WRAP(cuArrayCreate),
    WRAP(cuArrayCreate_v2),
    WRAP(cuArrayDestroy),
    WRAP(cuCtxCreate),
    WRAP(cuCtxCreate_v2),
    WRAP(cuCtxCreate_v3),
    WRAP(cuCtxCreate_v4),
    WRAP(cuCtxDestroy),
    WRAP(cuCtxDestroy_v2),
    WRAP(cuCtxSynchronize),
    WRAP(cuCtxSynchronize_v2),
    WRAP(cuDevicePrimaryCtxRelease),
    WRAP(cuDevicePrimaryCtxRelease_v2),
    WRAP(cuDevicePrimaryCtxReset),
    WRAP(cuDevicePrimaryCtxReset_v2),
    WRAP(cuDevicePrimaryCtxRetain),
    WRAP(cuGetProcAddress),
    WRAP(cuGetProcAddress_v2),
    WRAP(cuLibraryLoadData),
    WRAP(cuLibraryLoadFromFile),
    WRAP(cuLibraryUnload),
    WRAP(cuMemAlloc),
    WRAP(cuMemAllocAsync),
    WRAP(cuMemAllocAsync_ptsz),
    WRAP(cuMemAllocFromPoolAsync),
    WRAP(cuMemAllocFromPoolAsync_ptsz),
    WRAP(cuMemAllocHost),
    WRAP(cuMemAllocHost_v2),
    WRAP(cuMemAllocManaged),
    WRAP(cuMemAllocPitch),
    WRAP(cuMemAllocPitch_v2),
    WRAP(cuMemAlloc_v2),
    WRAP(cuMemCreate),
    WRAP(cuMemFree),
    WRAP(cuMemFreeHost),
    WRAP(cuMemFree_v2),
    WRAP(cuMemHostAlloc),
    WRAP(cuMemHostRegister),
    WRAP(cuMemHostRegister_v2),
    WRAP(cuMemHostUnregister),
    WRAP(cuMipmappedArrayCreate),
    WRAP(cuMipmappedArrayDestroy),
    WRAP(cuModuleLoad),
    WRAP(cuModuleLoadData),
    WRAP(cuModuleLoadDataEx),
    WRAP(cuModuleLoadFatBinary),
    WRAP(cuModuleUnload),
    WRAP(cuStreamBeginCapture),
    WRAP(cuStreamBeginCaptureToGraph),
    WRAP(cuStreamBeginCaptureToGraph_ptsz),
    WRAP(cuStreamBeginCapture_ptsz),
    WRAP(cuStreamBeginCapture_v2),
    WRAP(cuStreamBeginCapture_v2_ptsz),
    WRAP(cuStreamCreate),
    WRAP(cuStreamCreateWithPriority),
    WRAP(cuStreamDestroy),
    WRAP(cuStreamDestroy_v2),
    WRAP(cuStreamEndCapture),
    WRAP(cuStreamEndCapture_ptsz),
};

const size_t cd_wrapper_count = sizeof cd_wrappers / sizeof cd_wrappers[0];
