/* exports.c - one exported function per wrapped driver name.
 *
 * Each wrapper has the exact prototype of the driver function of the same
 * ELF name (cuda_all.h declares them all, so the compiler checks it) and is
 * one line: it calls the shared function of its group with the driver's
 * function of its own name (REAL), so that versioned twins keep the
 * driver's meaning. The shared functions hand the call to the engine where
 * it has something to do, and otherwise call the driver. This file maps
 * names onto the engine; it holds no release policy.
 */
#include "cuda_all.h"

#include "doors.h"
#include "engine.h"

#include <cudefer.h>

#include <limits.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- releases ---------------------------------------------------------------- */

/* A release of the object key of class cls: the engine's answer when it
 * takes it, else real(key), a call of the driver's function of the
 * wrapper's own name (have_real: the driver has it). */
static CUresult release(enum cd_kind cls, uintptr_t key, CUresult (*real)(uintptr_t),
                        bool have_real, enum cd_wrapped w)
{
    CUresult rc;
    if (!have_real)
        return cd_missing(w);
    if (cd_release(cls, key, &rc))
        return rc;
    rc = real(key);
    if (rc == CUDA_SUCCESS)
        cd_release_passed();
    return rc;
}

static CUresult free_v1(uintptr_t p)
{
    return REAL(cuMemFree)((CUdeviceptr_v1)p);
}

static CUresult free_v2(uintptr_t p)
{
    return REAL(cuMemFree_v2)((CUdeviceptr)p);
}

static CUresult free_host(uintptr_t p)
{
    return REAL(cuMemFreeHost)((void *)p);
}

/* An address the driver knows only because cudefer holds the block around
 * it gets the answer for an unknown one (cd_unregister_answer). */
static CUresult unregister(uintptr_t p)
{
    return cd_unregister_answer((void *)p, REAL(cuMemHostUnregister)((void *)p));
}

static CUresult destroy_array(uintptr_t h)
{
    return REAL(cuArrayDestroy)((CUarray)h);
}

static CUresult destroy_mipmapped(uintptr_t h)
{
    return REAL(cuMipmappedArrayDestroy)((CUmipmappedArray)h);
}

static CUresult unload_module(uintptr_t h)
{
    return REAL(cuModuleUnload)((CUmodule)h);
}

static CUresult unload_library(uintptr_t h)
{
    return REAL(cuLibraryUnload)((CUlibrary)h);
}

EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    return release(CD_DEVICE, dptr, free_v1, REAL(cuMemFree) != NULL, CD_W_cuMemFree);
}

EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    return release(CD_DEVICE, dptr, free_v2, REAL(cuMemFree_v2) != NULL, CD_W_cuMemFree_v2);
}

EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
    return release(CD_HOST, (uintptr_t)p, free_host, REAL(cuMemFreeHost) != NULL,
                   CD_W_cuMemFreeHost);
}

EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    return release(CD_REGISTERED, (uintptr_t)p, unregister, REAL(cuMemHostUnregister) != NULL,
                   CD_W_cuMemHostUnregister);
}

EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray hArray)
{
    return release(CD_ARRAY, (uintptr_t)hArray, destroy_array, REAL(cuArrayDestroy) != NULL,
                   CD_W_cuArrayDestroy);
}

EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return release(CD_MIPMAPPED, (uintptr_t)hMipmappedArray, destroy_mipmapped,
                   REAL(cuMipmappedArrayDestroy) != NULL, CD_W_cuMipmappedArrayDestroy);
}

EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    return release(CD_MODULE, (uintptr_t)hmod, unload_module, REAL(cuModuleUnload) != NULL,
                   CD_W_cuModuleUnload);
}

EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
    return release(CD_LIBRARY, (uintptr_t)library, unload_library, REAL(cuLibraryUnload) != NULL,
                   CD_W_cuLibraryUnload);
}

/* ---- stream-ordered frees -------------------------------------------------------- */

typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static CUresult free_async(CUdeviceptr dptr, CUstream s, free_async_fn real, enum cd_wrapped w)
{
    CUresult rc;
    if (!real)
        return cd_missing(w);
    if (cd_free_async(dptr, &rc))
        return rc;
    rc = real(dptr, s);
    if (rc == CUDA_SUCCESS)
        cd_free_async_done(dptr);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, REAL(cuMemFreeAsync), CD_W_cuMemFreeAsync);
}

EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, REAL(cuMemFreeAsync_ptsz), CD_W_cuMemFreeAsync_ptsz);
}

/* ---- synchronisation --------------------------------------------------------------- */

EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
    __typeof__(&cuCtxSynchronize) real = REAL(cuCtxSynchronize);
    if (!real)
        return cd_missing(CD_W_cuCtxSynchronize);
    CUresult rc = real();
    if (rc == CUDA_SUCCESS)
        cd_context_synchronized(NULL);
    return rc;
}

EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    __typeof__(&cuCtxSynchronize_v2) real = REAL(cuCtxSynchronize_v2);
    if (!real)
        return cd_missing(CD_W_cuCtxSynchronize_v2);
    CUresult rc = real(ctx);
    if (rc == CUDA_SUCCESS)
        cd_context_synchronized(ctx);
    return rc;
}

/* ---- allocations that a released block may serve ------------------------------------ */

/* Device memory: the 64-bit and 32-bit calls. */
typedef CUresult (*alloc_device_fn)(CUdeviceptr *, size_t);

static CUresult alloc_device(CUdeviceptr *dptr, size_t bytes, alloc_device_fn real, bool narrow,
                             enum cd_wrapped w)
{
    struct cd_alloc a;
    uintptr_t key;
    CUresult rc;
    if (!real)
        return cd_missing(w);
    cd_alloc_start(&a, cd_wrapped_names[w], CD_DEVICE, bytes, 0, narrow);
    if (dptr && cd_alloc_reuse(&a, &key)) {
        *dptr = (CUdeviceptr)key;
        return CUDA_SUCCESS;
    }
    do
        rc = real(dptr, bytes);
    while (cd_alloc_failed(&a, rc));
    cd_alloc_done(&a, rc, rc == CUDA_SUCCESS ? (uintptr_t)*dptr : 0);
    return rc;
}

/* cuMemAlloc returns a 32-bit pointer and takes a 32-bit size. */
static CUresult alloc_v1(CUdeviceptr *dptr, size_t bytes)
{
    CUdeviceptr_v1 p = 0;
    CUresult rc = REAL(cuMemAlloc)(dptr ? &p : NULL, (unsigned int)bytes);
    if (dptr)
        *dptr = p;
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CUdeviceptr p = 0;
    CUresult rc = alloc_device(dptr ? &p : NULL, bytesize, REAL(cuMemAlloc) ? alloc_v1 : NULL,
                               true, CD_W_cuMemAlloc);
    if (dptr && rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return alloc_device(dptr, bytesize, REAL(cuMemAlloc_v2), false, CD_W_cuMemAlloc_v2);
}

EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    __typeof__(&cuMemAllocManaged) real = REAL(cuMemAllocManaged);
    struct cd_alloc a;
    uintptr_t key;
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuMemAllocManaged);
    /* Only flags the driver accepts are served from released blocks: an
     * invalid one gets the driver's error. */
    bool valid = flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST;
    cd_alloc_start(&a, "cuMemAllocManaged", CD_MANAGED, valid ? bytesize : 0, flags, false);
    if (dptr && cd_alloc_reuse(&a, &key)) {
        *dptr = (CUdeviceptr)key;
        return CUDA_SUCCESS;
    }
    do
        rc = real(dptr, bytesize, flags);
    while (cd_alloc_failed(&a, rc));
    cd_alloc_done(&a, rc, rc == CUDA_SUCCESS ? (uintptr_t)*dptr : 0);
    return rc;
}

/* Pinned host memory: cuMemAllocHost (both widths) and cuMemHostAlloc. */
typedef CUresult (*alloc_host_fn)(void **, size_t, unsigned int);

/* flags: the cuMemHostAlloc call's; none for cuMemAllocHost (alloc_host_call),
 * whose blocks are told apart from cuMemHostAlloc's of the same flags
 * (CD_FLAGS_ALLOC_HOST): the driver's queries answer each its own way.
 * Only flags the driver accepts are served from released blocks: an
 * invalid one gets the driver's error. */
static CUresult alloc_host(void **pp, size_t bytes, unsigned flags, bool alloc_host_call,
                           alloc_host_fn real, enum cd_wrapped w)
{
    struct cd_alloc a;
    uintptr_t key;
    CUresult rc;
    if (!real)
        return cd_missing(w);
    unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                     CU_MEMHOSTALLOC_WRITECOMBINED;
    bool valid = alloc_host_call || !(flags & ~known);
    unsigned kept_as = alloc_host_call ? CD_FLAGS_ALLOC_HOST : flags;
    cd_alloc_start(&a, cd_wrapped_names[w], CD_HOST, valid ? bytes : 0, kept_as, false);
    if (pp && cd_alloc_reuse(&a, &key)) {
        *pp = (void *)key;
        return CUDA_SUCCESS;
    }
    do
        rc = real(pp, bytes, flags);
    while (cd_alloc_failed(&a, rc));
    cd_alloc_done(&a, rc, rc == CUDA_SUCCESS ? (uintptr_t)*pp : 0);
    return rc;
}

static CUresult alloc_host_v1(void **pp, size_t bytes, unsigned int flags)
{
    (void)flags;
    return REAL(cuMemAllocHost)(pp, (unsigned int)bytes);
}

static CUresult alloc_host_v2(void **pp, size_t bytes, unsigned int flags)
{
    (void)flags;
    return REAL(cuMemAllocHost_v2)(pp, bytes);
}

EXPORT CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize)
{
    return alloc_host(pp, bytesize, 0, true, REAL(cuMemAllocHost) ? alloc_host_v1 : NULL,
                      CD_W_cuMemAllocHost);
}

EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return alloc_host(pp, bytesize, 0, true, REAL(cuMemAllocHost_v2) ? alloc_host_v2 : NULL,
                      CD_W_cuMemAllocHost_v2);
}

EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    return alloc_host(pp, bytesize, Flags, false, REAL(cuMemHostAlloc), CD_W_cuMemHostAlloc);
}

/* ---- allocations that are tracked --------------------------------------------------- */

typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);

static CUresult alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned elem, pitch_fn real, bool narrow, enum cd_wrapped w)
{
    struct cd_alloc a;
    CUresult rc;
    if (!real)
        return cd_missing(w);
    cd_alloc_start(&a, cd_wrapped_names[w], CD_DEVICE, 0, 0, narrow);
    do
        rc = real(dptr, pitch, width, height, elem);
    while (cd_alloc_failed(&a, rc));
    a.bytes = rc == CUDA_SUCCESS ? *pitch * height : 0;
    cd_alloc_done(&a, rc, rc == CUDA_SUCCESS ? (uintptr_t)*dptr : 0);
    return rc;
}

static CUresult pitch_v1(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                         unsigned int elem)
{
    CUdeviceptr_v1 p = 0;
    unsigned int pp = 0;
    CUresult rc = REAL(cuMemAllocPitch)(dptr ? &p : NULL, pitch ? &pp : NULL,
                                         (unsigned int)width, (unsigned int)height, elem);
    if (dptr)
        *dptr = p;
    if (pitch)
        *pitch = pp;
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                        unsigned int WidthInBytes, unsigned int Height,
                                        unsigned int ElementSizeBytes)
{
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CUresult rc = alloc_pitch(dptr ? &p : NULL, pPitch ? &pitch : NULL, WidthInBytes, Height,
                              ElementSizeBytes, REAL(cuMemAllocPitch) ? pitch_v1 : NULL, true,
                              CD_W_cuMemAllocPitch);
    if (dptr && rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    if (pPitch && rc == CUDA_SUCCESS)
        *pPitch = (unsigned int)pitch;
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                           size_t Height, unsigned int ElementSizeBytes)
{
    return alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes,
                       REAL(cuMemAllocPitch_v2), false, CD_W_cuMemAllocPitch_v2);
}

/* Registrations: pending unregisters of the range go first. */
typedef CUresult (*register_fn)(void *, size_t, unsigned int);

static CUresult host_register(void *p, size_t bytes, unsigned flags, register_fn real,
                              enum cd_wrapped w)
{
    struct cd_alloc a;
    CUresult rc;
    if (!real)
        return cd_missing(w);
    cd_register_start(p, bytes);
    cd_alloc_start(&a, cd_wrapped_names[w], CD_REGISTERED, bytes, flags, false);
    do
        rc = real(p, bytes, flags);
    while (cd_alloc_failed(&a, rc));
    if (cd_register_failed(rc, p, bytes))
        rc = real(p, bytes, flags);
    cd_alloc_done(&a, rc, rc == CUDA_SUCCESS ? (uintptr_t)p : 0);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags, REAL(cuMemHostRegister), CD_W_cuMemHostRegister);
}

EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags, REAL(cuMemHostRegister_v2),
                         CD_W_cuMemHostRegister_v2);
}

/* Arrays: the bytes a descriptor of any version describes. */
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

/* An allocating call that returns a handle (arrays, modules, libraries):
 * retried after an out-of-memory answer, its handle tracked. call makes the
 * driver's call with the wrapper's arguments. */
struct handle_call {
    CUresult (*call)(const struct handle_call *hc);
    void *out;         /* where the handle lands */
    const void *args;  /* the wrapper's arguments */
};

static CUresult alloc_handle(const struct handle_call *hc, enum cd_kind kind, size_t bytes,
                             bool have_real, enum cd_wrapped w)
{
    struct cd_alloc a;
    CUresult rc;
    if (!have_real)
        return cd_missing(w);
    cd_alloc_start(&a, cd_wrapped_names[w], kind, 0, 0, false);
    do
        rc = hc->call(hc);
    while (cd_alloc_failed(&a, rc));
    a.bytes = bytes;
    uintptr_t key = 0;
    if (rc == CUDA_SUCCESS && hc->out)
        key = (uintptr_t)*(void **)hc->out;
    cd_alloc_done(&a, rc, key);
    return rc;
}

/* Array creation, every descriptor version w names: the driver's call and
 * the bytes the descriptor describes. */
struct array_args {
    enum cd_wrapped w;
    const void *desc;
};

static CUresult call_array(const struct handle_call *hc)
{
    const struct array_args *a = hc->args;
    enum cd_wrapped w = a->w;
    const void *desc = a->desc;
    switch (w) {
    case CD_W_cuArrayCreate: return REAL(cuArrayCreate)(hc->out, desc);
    case CD_W_cuArrayCreate_v2: return REAL(cuArrayCreate_v2)(hc->out, desc);
    case CD_W_cuArray3DCreate: return REAL(cuArray3DCreate)(hc->out, desc);
    default: return REAL(cuArray3DCreate_v2)(hc->out, desc);
    }
}

static size_t described_bytes(enum cd_wrapped w, const void *desc)
{
    const CUDA_ARRAY_DESCRIPTOR_v1 *a1 = desc;
    const CUDA_ARRAY_DESCRIPTOR *a2 = desc;
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *b1 = desc;
    const CUDA_ARRAY3D_DESCRIPTOR *b2 = desc;
    if (!desc)
        return 0;
    switch (w) {
    case CD_W_cuArrayCreate:
        return array_bytes(a1->Width, a1->Height, 1, a1->Format, a1->NumChannels);
    case CD_W_cuArrayCreate_v2:
        return array_bytes(a2->Width, a2->Height, 1, a2->Format, a2->NumChannels);
    case CD_W_cuArray3DCreate:
        return array_bytes(b1->Width, b1->Height, b1->Depth, b1->Format, b1->NumChannels);
    default:
        return array_bytes(b2->Width, b2->Height, b2->Depth, b2->Format, b2->NumChannels);
    }
}

static CUresult create_array(enum cd_wrapped w, CUarray *out, const void *desc, bool have_real)
{
    struct array_args args = {w, desc};
    struct handle_call hc = {call_array, out, &args};
    return alloc_handle(&hc, CD_ARRAY, described_bytes(w, desc), have_real, w);
}

EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
    return create_array(CD_W_cuArrayCreate, pHandle, desc, REAL(cuArrayCreate) != NULL);
}

EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    return create_array(CD_W_cuArrayCreate_v2, pHandle, desc, REAL(cuArrayCreate_v2) != NULL);
}

EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc)
{
    return create_array(CD_W_cuArray3DCreate, pHandle, desc, REAL(cuArray3DCreate) != NULL);
}

EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    return create_array(CD_W_cuArray3DCreate_v2, pHandle, desc, REAL(cuArray3DCreate_v2) != NULL);
}

struct mipmap_args {
    const CUDA_ARRAY3D_DESCRIPTOR *desc;
    unsigned levels;
};

static CUresult call_mipmapped(const struct handle_call *hc)
{
    const struct mipmap_args *a = hc->args;
    return REAL(cuMipmappedArrayCreate)(hc->out, a->desc, a->levels);
}

EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                               const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                               unsigned int numMipmapLevels)
{
    struct mipmap_args args = {desc, numMipmapLevels};
    struct handle_call hc = {call_mipmapped, pHandle, &args};
    /* The levels below the first add at most a third. */
    size_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                      desc->NumChannels) / 3 * 4 : 0;
    return alloc_handle(&hc, CD_MIPMAPPED, bytes, REAL(cuMipmappedArrayCreate) != NULL,
                        CD_W_cuMipmappedArrayCreate);
}

/* Modules and libraries: every load call w names, with its arguments. */
struct load_args {
    enum cd_wrapped w;
    const void *image; /* or the file's name */
    unsigned n;
    CUjit_option *options;
    void **values;
    CUlibraryOption *lib_options;
    void **lib_values;
    unsigned lib_n;
};

static CUresult call_load(const struct handle_call *hc)
{
    const struct load_args *a = hc->args;
    switch (a->w) {
    case CD_W_cuModuleLoad: return REAL(cuModuleLoad)(hc->out, a->image);
    case CD_W_cuModuleLoadData: return REAL(cuModuleLoadData)(hc->out, a->image);
    case CD_W_cuModuleLoadDataEx:
        return REAL(cuModuleLoadDataEx)(hc->out, a->image, a->n, a->options, a->values);
    case CD_W_cuModuleLoadFatBinary: return REAL(cuModuleLoadFatBinary)(hc->out, a->image);
    case CD_W_cuLibraryLoadData:
        return REAL(cuLibraryLoadData)(hc->out, a->image, a->options, a->values, a->n,
                                       a->lib_options, a->lib_values, a->lib_n);
    default:
        return REAL(cuLibraryLoadFromFile)(hc->out, a->image, a->options, a->values, a->n,
                                           a->lib_options, a->lib_values, a->lib_n);
    }
}

static CUresult load(const struct load_args *a, void *out, bool have_real)
{
    struct handle_call hc = {call_load, out, a};
    enum cd_kind kind = a->w == CD_W_cuLibraryLoadData || a->w == CD_W_cuLibraryLoadFromFile
                            ? CD_LIBRARY : CD_MODULE;
    return alloc_handle(&hc, kind, 0, have_real, a->w);
}

EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    struct load_args a = {.w = CD_W_cuModuleLoad, .image = fname};
    return load(&a, module, REAL(cuModuleLoad) != NULL);
}

EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    struct load_args a = {.w = CD_W_cuModuleLoadData, .image = image};
    return load(&a, module, REAL(cuModuleLoadData) != NULL);
}

EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                           unsigned int numOptions, CUjit_option *options,
                                           void **optionValues)
{
    struct load_args a = {.w = CD_W_cuModuleLoadDataEx, .image = image, .n = numOptions,
                          .options = options, .values = optionValues};
    return load(&a, module, REAL(cuModuleLoadDataEx) != NULL);
}

EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    struct load_args a = {.w = CD_W_cuModuleLoadFatBinary, .image = fatCubin};
    return load(&a, module, REAL(cuModuleLoadFatBinary) != NULL);
}

EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code,
                                          CUjit_option *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions,
                                          CUlibraryOption *libraryOptions,
                                          void **libraryOptionValues,
                                          unsigned int numLibraryOptions)
{
    struct load_args a = {CD_W_cuLibraryLoadData, code, numJitOptions, jitOptions,
                          jitOptionsValues, libraryOptions, libraryOptionValues,
                          numLibraryOptions};
    return load(&a, library, REAL(cuLibraryLoadData) != NULL);
}

EXPORT CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                              CUjit_option *jitOptions, void **jitOptionsValues,
                                              unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                              void **libraryOptionValues, unsigned int numLibraryOptions)
{
    struct load_args a = {CD_W_cuLibraryLoadFromFile, fileName, numJitOptions, jitOptions,
                          jitOptionsValues, libraryOptions, libraryOptionValues,
                          numLibraryOptions};
    return load(&a, library, REAL(cuLibraryLoadFromFile) != NULL);
}

/* ---- calls that may run out of memory, not tracked ------------------------------------ */

/* Stream-ordered allocations return addresses the engine does not track: a
 * stale record of the same address goes. */
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s,
                            alloc_async_fn plain, alloc_pool_fn from_pool, enum cd_wrapped w)
{
    struct cd_alloc a;
    CUresult rc;
    if (!plain && !from_pool)
        return cd_missing(w);
    cd_alloc_start(&a, cd_wrapped_names[w], CD_DEVICE, 0, 0, false);
    /* The stream's device's pool, or a pool of any device or the host. */
    cd_alloc_takes(&a, CD_MEM_ANY);
    do
        rc = plain ? plain(dptr, bytes, s) : from_pool(dptr, bytes, pool, s);
    while (cd_alloc_failed(&a, rc));
    if (rc == CUDA_SUCCESS)
        cd_alloc_untracked((uintptr_t)*dptr);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, REAL(cuMemAllocAsync), NULL,
                       CD_W_cuMemAllocAsync);
}

EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, REAL(cuMemAllocAsync_ptsz), NULL,
                       CD_W_cuMemAllocAsync_ptsz);
}

EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool, hStream, NULL, REAL(cuMemAllocFromPoolAsync),
                       CD_W_cuMemAllocFromPoolAsync);
}

EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                     CUmemoryPool pool, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool, hStream, NULL, REAL(cuMemAllocFromPoolAsync_ptsz),
                       CD_W_cuMemAllocFromPoolAsync_ptsz);
}

/* Retries once what cudefer holds is given back (cd_alloc_failed): for
 * calls that allocate device memory the program does not see (a lazily
 * loaded module at a launch or a function lookup, a context, a stream, a
 * virtual-memory handle). The first answer is returned at once when it is
 * not an out-of-memory one: the hot path of a launch is one compare. mem:
 * whose memory the call takes (engine.h, CD_MEM_*). */
static bool retry_taking(struct cd_alloc *a, CUresult rc, enum cd_wrapped w, int mem)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY)
        return false;
    if (!a->call) {
        cd_alloc_start(a, cd_wrapped_names[w], CD_DEVICE, 0, 0, false);
        cd_alloc_takes(a, mem);
    }
    return cd_alloc_failed(a, rc);
}

/* The same for a call whose memory may be any device's: a function's
 * module, a stream or a graph belongs to its own context, which need not
 * be the current one. */
static bool retry(struct cd_alloc *a, CUresult rc, enum cd_wrapped w)
{
    return retry_taking(a, rc, w, CD_MEM_ANY);
}

/* Whose memory cuMemCreate takes: its location's. */
static int created_on(const CUmemAllocationProp *prop)
{
    if (!prop)
        return CD_MEM_ANY;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return prop->location.id >= 0 ? prop->location.id : CD_MEM_ANY;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CD_MEM_HOST;
    default:
        return CD_MEM_ANY;
    }
}

EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    __typeof__(&cuMemCreate) real = REAL(cuMemCreate);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuMemCreate);
    do
        rc = real(handle, size, prop, flags);
    while (retry_taking(&a, rc, CD_W_cuMemCreate, created_on(prop)));
    return rc;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static CUresult launch(launch_fn real, enum cd_wrapped w, CUfunction f, unsigned gx, unsigned gy,
                       unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared,
                       CUstream s, void **params, void **extra)
{
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(w);
    do
        rc = real(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    while (retry(&a, rc, w));
    return rc;
}

EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX,
                                       unsigned int blockDimY, unsigned int blockDimZ,
                                       unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra)
{
    return launch(REAL(cuLaunchKernel), CD_W_cuLaunchKernel, f, gridDimX, gridDimY, gridDimZ,
                  blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
}

EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                            unsigned int gridDimY, unsigned int gridDimZ,
                                            unsigned int blockDimX, unsigned int blockDimY,
                                            unsigned int blockDimZ, unsigned int sharedMemBytes,
                                            CUstream hStream, void **kernelParams, void **extra)
{
    return launch(REAL(cuLaunchKernel_ptsz), CD_W_cuLaunchKernel_ptsz, f, gridDimX, gridDimY,
                  gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                  kernelParams, extra);
}

/* The other launches: also retried after an out-of-memory answer (the
 * module of the function may be loaded lazily at its first launch). */
static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra,
                          __typeof__(&cuLaunchKernelEx) real, enum cd_wrapped w)
{
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(w);
    do
        rc = real(config, f, params, extra);
    while (retry(&a, rc, w));
    return rc;
}

EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                         void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, REAL(cuLaunchKernelEx), CD_W_cuLaunchKernelEx);
}

EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                              void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, REAL(cuLaunchKernelEx_ptsz),
                     CD_W_cuLaunchKernelEx_ptsz);
}

static CUresult launch_cooperative(__typeof__(&cuLaunchCooperativeKernel) real,
                                   enum cd_wrapped w, CUfunction f, unsigned gx, unsigned gy,
                                   unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned shared, CUstream s, void **params)
{
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(w);
    do
        rc = real(f, gx, gy, gz, bx, by, bz, shared, s, params);
    while (retry(&a, rc, w));
    return rc;
}

EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                                  unsigned int gridDimY, unsigned int gridDimZ,
                                                  unsigned int blockDimX, unsigned int blockDimY,
                                                  unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void **kernelParams)
{
    return launch_cooperative(REAL(cuLaunchCooperativeKernel), CD_W_cuLaunchCooperativeKernel, f,
                              gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                              sharedMemBytes, hStream, kernelParams);
}

EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                       unsigned int gridDimY,
                                                       unsigned int gridDimZ,
                                                       unsigned int blockDimX,
                                                       unsigned int blockDimY,
                                                       unsigned int blockDimZ,
                                                       unsigned int sharedMemBytes,
                                                       CUstream hStream, void **kernelParams)
{
    return launch_cooperative(REAL(cuLaunchCooperativeKernel_ptsz),
                              CD_W_cuLaunchCooperativeKernel_ptsz, f, gridDimX, gridDimY,
                              gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                              kernelParams);
}

/* An instantiation allocates device memory for the graph's nodes. */
EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                    unsigned long long flags)
{
    __typeof__(&cuGraphInstantiateWithFlags) real = REAL(cuGraphInstantiateWithFlags);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuGraphInstantiateWithFlags);
    do
        rc = real(phGraphExec, hGraph, flags);
    while (retry(&a, rc, CD_W_cuGraphInstantiateWithFlags));
    return rc;
}

/* ---- free memory ------------------------------------------------------------- */

/* The driver's answer, plus the device memory the program released that
 * cudefer still holds (cd_mem_info): the driver alone would count it free. */
EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
    __typeof__(&cuMemGetInfo_v2) real = REAL(cuMemGetInfo_v2);
    if (!real)
        return cd_missing(CD_W_cuMemGetInfo_v2);
    CUresult rc = real(free, total);
    if (rc == CUDA_SUCCESS)
        cd_mem_info(free, *total);
    return rc;
}

/* The same in 32 bits: a figure the driver clamped stays clamped. */
EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    __typeof__(&cuMemGetInfo) real = REAL(cuMemGetInfo);
    if (!real)
        return cd_missing(CD_W_cuMemGetInfo);
    CUresult rc = real(free, total);
    if (rc == CUDA_SUCCESS && *free < UINT_MAX) {
        size_t f = *free;
        cd_mem_info(&f, *total);
        *free = f < UINT_MAX ? (unsigned int)f : UINT_MAX;
    }
    return rc;
}

/* ---- IPC ------------------------------------------------------------------- */

/* A block another process may map is never handed out again by cudefer's
 * reuse: once the program frees it, it goes back to the driver (fenced). */
EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    __typeof__(&cuIpcGetMemHandle) real = REAL(cuIpcGetMemHandle);
    if (!real)
        return cd_missing(CD_W_cuIpcGetMemHandle);
    CUresult rc = real(pHandle, dptr);
    if (rc == CUDA_SUCCESS)
        cd_block_altered(dptr, 0);
    return rc;
}

/* A mapping of another process's block is the driver's (closed with
 * cuIpcCloseMemHandle, never freed): a stale record of its address goes. */
static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned flags,
                         __typeof__(&cuIpcOpenMemHandle_v2) real, enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    CUresult rc = real(pdptr, handle, flags);
    if (rc == CUDA_SUCCESS && pdptr)
        cd_alloc_untracked((uintptr_t)*pdptr);
    return rc;
}

EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                           unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags, REAL(cuIpcOpenMemHandle), CD_W_cuIpcOpenMemHandle);
}

EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                              unsigned int Flags)
{
    return ipc_open(pdptr, handle, Flags, REAL(cuIpcOpenMemHandle_v2),
                    CD_W_cuIpcOpenMemHandle_v2);
}

/* ---- state the program sets on a block ------------------------------------- */

/* Advice, a prefetch, a stream attachment, a pointer attribute or a dma-buf
 * export: the driver's call; once it succeeded, the blocks it touched never
 * serve another allocation (cd_block_altered: the driver's new allocation
 * carries none of it). Neither the driver's call nor cudefer's part
 * waits. */
static CUresult altered(CUresult rc, CUdeviceptr ptr, size_t bytes)
{
    if (rc == CUDA_SUCCESS)
        cd_block_altered(ptr, bytes);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                    CUdevice device)
{
    __typeof__(&cuMemAdvise) real = REAL(cuMemAdvise);
    if (!real)
        return cd_missing(CD_W_cuMemAdvise);
    return altered(real(devPtr, count, advice, device), devPtr, count);
}

EXPORT CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                       CUmemLocation location)
{
    __typeof__(&cuMemAdvise_v2) real = REAL(cuMemAdvise_v2);
    if (!real)
        return cd_missing(CD_W_cuMemAdvise_v2);
    return altered(real(devPtr, count, advice, location), devPtr, count);
}

static CUresult prefetch_v1(CUdeviceptr ptr, size_t count, CUdevice dev, CUstream s,
                            __typeof__(&cuMemPrefetchAsync) real, enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    return altered(real(ptr, count, dev, s), ptr, count);
}

EXPORT CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                           CUstream hStream)
{
    return prefetch_v1(devPtr, count, dstDevice, hStream, REAL(cuMemPrefetchAsync),
                       CD_W_cuMemPrefetchAsync);
}

EXPORT CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count,
                                                CUdevice dstDevice, CUstream hStream)
{
    return prefetch_v1(devPtr, count, dstDevice, hStream, REAL(cuMemPrefetchAsync_ptsz),
                       CD_W_cuMemPrefetchAsync_ptsz);
}

static CUresult prefetch_v2(CUdeviceptr ptr, size_t count, CUmemLocation loc, unsigned flags,
                            CUstream s, __typeof__(&cuMemPrefetchAsync_v2) real,
                            enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    return altered(real(ptr, count, loc, flags, s), ptr, count);
}

EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count,
                                              CUmemLocation location, unsigned int flags,
                                              CUstream hStream)
{
    return prefetch_v2(devPtr, count, location, flags, hStream, REAL(cuMemPrefetchAsync_v2),
                       CD_W_cuMemPrefetchAsync_v2);
}

EXPORT CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                                   CUmemLocation location, unsigned int flags,
                                                   CUstream hStream)
{
    return prefetch_v2(devPtr, count, location, flags, hStream,
                       REAL(cuMemPrefetchAsync_v2_ptsz), CD_W_cuMemPrefetchAsync_v2_ptsz);
}

/* cuMemPrefetchBatchAsync and cuMemDiscardAndPrefetchBatchAsync, and their
 * _ptsz forms: one prototype. */
static CUresult prefetch_batch(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                               CUmemLocation *locs, size_t *loc_idxs, size_t nlocs,
                               unsigned long long flags, CUstream s,
                               __typeof__(&cuMemPrefetchBatchAsync) real, enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    CUresult rc = real(dptrs, sizes, count, locs, loc_idxs, nlocs, flags, s);
    for (size_t i = 0; rc == CUDA_SUCCESS && dptrs && sizes && i < count; i++)
        cd_block_altered(dptrs[i], sizes[i]);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes, size_t count,
                                                CUmemLocation *prefetchLocs,
                                                size_t *prefetchLocIdxs, size_t numPrefetchLocs,
                                                unsigned long long flags, CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, REAL(cuMemPrefetchBatchAsync),
                          CD_W_cuMemPrefetchBatchAsync);
}

EXPORT CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr *dptrs, size_t *sizes,
                                                     size_t count, CUmemLocation *prefetchLocs,
                                                     size_t *prefetchLocIdxs,
                                                     size_t numPrefetchLocs,
                                                     unsigned long long flags, CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, REAL(cuMemPrefetchBatchAsync_ptsz),
                          CD_W_cuMemPrefetchBatchAsync_ptsz);
}

EXPORT CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *dptrs, size_t *sizes,
                                                          size_t count,
                                                          CUmemLocation *prefetchLocs,
                                                          size_t *prefetchLocIdxs,
                                                          size_t numPrefetchLocs,
                                                          unsigned long long flags,
                                                          CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, REAL(cuMemDiscardAndPrefetchBatchAsync),
                          CD_W_cuMemDiscardAndPrefetchBatchAsync);
}

EXPORT CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(
    CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *prefetchLocs,
    size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, CUstream hStream)
{
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream, REAL(cuMemDiscardAndPrefetchBatchAsync_ptsz),
                          CD_W_cuMemDiscardAndPrefetchBatchAsync_ptsz);
}

static CUresult attach(CUstream s, CUdeviceptr ptr, size_t length, unsigned flags,
                       __typeof__(&cuStreamAttachMemAsync) real, enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    return altered(real(s, ptr, length, flags), ptr, length);
}

EXPORT CUresult CUDAAPI cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length,
                                               unsigned int flags)
{
    return attach(hStream, dptr, length, flags, REAL(cuStreamAttachMemAsync),
                  CD_W_cuStreamAttachMemAsync);
}

EXPORT CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr,
                                                    size_t length, unsigned int flags)
{
    return attach(hStream, dptr, length, flags, REAL(cuStreamAttachMemAsync_ptsz),
                  CD_W_cuStreamAttachMemAsync_ptsz);
}

/* A dma-buf of the range: another device or process may map its pages, as
 * through IPC. */
EXPORT CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                      CUmemRangeHandleType handleType,
                                                      unsigned long long flags)
{
    __typeof__(&cuMemGetHandleForAddressRange) real = REAL(cuMemGetHandleForAddressRange);
    if (!real)
        return cd_missing(CD_W_cuMemGetHandleForAddressRange);
    return altered(real(handle, dptr, size, handleType, flags), dptr, size);
}

EXPORT CUresult CUDAAPI cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                              CUdeviceptr ptr)
{
    __typeof__(&cuPointerSetAttribute) real = REAL(cuPointerSetAttribute);
    if (!real)
        return cd_missing(CD_W_cuPointerSetAttribute);
    return altered(real(value, attribute, ptr), ptr, 0);
}

EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    __typeof__(&cuModuleGetFunction) real = REAL(cuModuleGetFunction);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuModuleGetFunction);
    do
        rc = real(hfunc, hmod, name);
    while (retry(&a, rc, CD_W_cuModuleGetFunction));
    return rc;
}

EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    __typeof__(&cuKernelGetFunction) real = REAL(cuKernelGetFunction);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuKernelGetFunction);
    do
        rc = real(pFunc, kernel);
    while (retry(&a, rc, CD_W_cuKernelGetFunction));
    return rc;
}

/* ---- streams ----------------------------------------------------------------------- */

EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    __typeof__(&cuStreamCreate) real = REAL(cuStreamCreate);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuStreamCreate);
    do
        rc = real(phStream, Flags);
    while (retry(&a, rc, CD_W_cuStreamCreate));
    if (rc == CUDA_SUCCESS)
        cd_stream_created(*phStream);
    return rc;
}

EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
                                                   int priority)
{
    __typeof__(&cuStreamCreateWithPriority) real = REAL(cuStreamCreateWithPriority);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuStreamCreateWithPriority);
    do
        rc = real(phStream, flags, priority);
    while (retry(&a, rc, CD_W_cuStreamCreateWithPriority));
    if (rc == CUDA_SUCCESS)
        cd_stream_created(*phStream);
    return rc;
}

EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx,
                                               unsigned int flags, int priority)
{
    __typeof__(&cuGreenCtxStreamCreate) real = REAL(cuGreenCtxStreamCreate);
    struct cd_alloc a = {.call = NULL};
    CUresult rc;
    if (!real)
        return cd_missing(CD_W_cuGreenCtxStreamCreate);
    cd_green_stream_created(greenCtx);
    do
        rc = real(phStream, greenCtx, flags, priority);
    while (retry(&a, rc, CD_W_cuGreenCtxStreamCreate));
    if (rc == CUDA_SUCCESS)
        cd_stream_created(*phStream);
    return rc;
}

/* The program destroys an object the engine follows (a stream, a
 * context): the engine is told first, then the driver's own call of the
 * wrapper's name w destroys it. Streams and contexts are one group here:
 * their wrappers are the same one line. */
static CUresult destroy(enum cd_wrapped w, uintptr_t h)
{
    if (!cd_real(w))
        return cd_missing(w);
    switch (w) {
    case CD_W_cuStreamDestroy:
    case CD_W_cuStreamDestroy_v2:
        cd_stream_destroying((CUstream)h);
        return w == CD_W_cuStreamDestroy ? REAL(cuStreamDestroy)((CUstream)h)
                                         : REAL(cuStreamDestroy_v2)((CUstream)h);
    case CD_W_cuCtxDestroy:
    case CD_W_cuCtxDestroy_v2: {
        cd_context_destroying((CUcontext)h);
        CUresult rc = w == CD_W_cuCtxDestroy ? REAL(cuCtxDestroy)((CUcontext)h)
                                             : REAL(cuCtxDestroy_v2)((CUcontext)h);
        cd_context_destroyed();
        return rc;
    }
    default:
        return cd_missing(w);
    }
}

EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    return destroy(CD_W_cuStreamDestroy, (uintptr_t)hStream);
}

EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    return destroy(CD_W_cuStreamDestroy_v2, (uintptr_t)hStream);
}

EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
    return destroy(CD_W_cuCtxDestroy, (uintptr_t)ctx);
}

EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    return destroy(CD_W_cuCtxDestroy_v2, (uintptr_t)ctx);
}

/* ---- stream capture -------------------------------------------------------------------- */

/* Every begin variant, reduced to one call of the driver's own function. */
struct begin_args {
    CUstream stream;
    CUstreamCaptureMode mode;
    CUgraph graph;
    const CUgraphNode *deps;
    const CUgraphEdgeData *edges;
    size_t ndeps;
};

static CUresult begin_capture(CUresult (*call)(const struct begin_args *), const struct begin_args *a,
                              bool have_real, bool per_thread, enum cd_wrapped w)
{
    if (!have_real)
        return cd_missing(w);
    cd_capture_begin();
    cd_stream_capturing(a->stream);
    CUresult rc = call(a);
    cd_capture_begun(a->stream, per_thread, rc);
    return rc;
}

static CUresult call_begin(const struct begin_args *a)
{
    return REAL(cuStreamBeginCapture)(a->stream);
}

static CUresult call_begin_ptsz(const struct begin_args *a)
{
    return REAL(cuStreamBeginCapture_ptsz)(a->stream);
}

static CUresult call_begin_v2(const struct begin_args *a)
{
    return REAL(cuStreamBeginCapture_v2)(a->stream, a->mode);
}

static CUresult call_begin_v2_ptsz(const struct begin_args *a)
{
    return REAL(cuStreamBeginCapture_v2_ptsz)(a->stream, a->mode);
}

static CUresult call_begin_graph(const struct begin_args *a)
{
    return REAL(cuStreamBeginCaptureToGraph)(a->stream, a->graph, a->deps, a->edges, a->ndeps,
                                             a->mode);
}

static CUresult call_begin_graph_ptsz(const struct begin_args *a)
{
    return REAL(cuStreamBeginCaptureToGraph_ptsz)(a->stream, a->graph, a->deps, a->edges,
                                                  a->ndeps, a->mode);
}

EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
    struct begin_args a = {.stream = hStream};
    return begin_capture(call_begin, &a, REAL(cuStreamBeginCapture) != NULL, false,
                         CD_W_cuStreamBeginCapture);
}

EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
    struct begin_args a = {.stream = hStream};
    return begin_capture(call_begin_ptsz, &a, REAL(cuStreamBeginCapture_ptsz) != NULL, true,
                         CD_W_cuStreamBeginCapture_ptsz);
}

EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    struct begin_args a = {.stream = hStream, .mode = mode};
    return begin_capture(call_begin_v2, &a, REAL(cuStreamBeginCapture_v2) != NULL, false,
                         CD_W_cuStreamBeginCapture_v2);
}

EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    struct begin_args a = {.stream = hStream, .mode = mode};
    return begin_capture(call_begin_v2_ptsz, &a, REAL(cuStreamBeginCapture_v2_ptsz) != NULL,
                         true, CD_W_cuStreamBeginCapture_v2_ptsz);
}

EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const CUgraphEdgeData *dependencyData,
                                                    size_t numDependencies,
                                                    CUstreamCaptureMode mode)
{
    struct begin_args a = {hStream, mode, hGraph, dependencies, dependencyData, numDependencies};
    return begin_capture(call_begin_graph, &a, REAL(cuStreamBeginCaptureToGraph) != NULL, false,
                         CD_W_cuStreamBeginCaptureToGraph);
}

EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                         const CUgraphNode *dependencies,
                                                         const CUgraphEdgeData *dependencyData,
                                                         size_t numDependencies,
                                                         CUstreamCaptureMode mode)
{
    struct begin_args a = {hStream, mode, hGraph, dependencies, dependencyData, numDependencies};
    return begin_capture(call_begin_graph_ptsz, &a,
                         REAL(cuStreamBeginCaptureToGraph_ptsz) != NULL, true,
                         CD_W_cuStreamBeginCaptureToGraph_ptsz);
}

typedef CUresult (*end_capture_fn)(CUstream, CUgraph *);

static CUresult end_capture(CUstream s, CUgraph *graph, end_capture_fn real, bool per_thread,
                            enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    CUresult rc = real(s, graph);
    cd_capture_ended(s, per_thread, rc);
    return rc;
}

EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, REAL(cuStreamEndCapture), false, CD_W_cuStreamEndCapture);
}

EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, REAL(cuStreamEndCapture_ptsz), true,
                       CD_W_cuStreamEndCapture_ptsz);
}

/* ---- contexts ----------------------------------------------------------------------------- */

/* Every create variant, reduced to one call of the driver's own function. */
struct create_args {
    CUcontext *pctx;
    unsigned flags;
    CUdevice dev;
    CUexecAffinityParam *affinity;
    int naffinity;
    CUctxCreateParams *params;
};

static CUresult call_retain(const struct create_args *a);

static CUresult create_context(CUresult (*call)(const struct create_args *),
                               const struct create_args *a, bool have_real, enum cd_wrapped w)
{
    struct cd_alloc al = {.call = NULL};
    CUresult rc;
    if (!have_real)
        return cd_missing(w);
    do
        rc = call(a);
    while (retry_taking(&al, rc, w, a->dev >= 0 ? (int)a->dev : CD_MEM_ANY));
    if (rc == CUDA_SUCCESS)
        cd_context_created(*a->pctx, call == call_retain);
    return rc;
}

static CUresult call_create(const struct create_args *a)
{
    return REAL(cuCtxCreate)(a->pctx, a->flags, a->dev);
}

static CUresult call_create_v2(const struct create_args *a)
{
    return REAL(cuCtxCreate_v2)(a->pctx, a->flags, a->dev);
}

static CUresult call_create_v3(const struct create_args *a)
{
    return REAL(cuCtxCreate_v3)(a->pctx, a->affinity, a->naffinity, a->flags, a->dev);
}

static CUresult call_create_v4(const struct create_args *a)
{
    return REAL(cuCtxCreate_v4)(a->pctx, a->params, a->flags, a->dev);
}

EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct create_args a = {.pctx = pctx, .flags = flags, .dev = dev};
    return create_context(call_create, &a, REAL(cuCtxCreate) != NULL, CD_W_cuCtxCreate);
}

EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct create_args a = {.pctx = pctx, .flags = flags, .dev = dev};
    return create_context(call_create_v2, &a, REAL(cuCtxCreate_v2) != NULL, CD_W_cuCtxCreate_v2);
}

EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                       int numParams, unsigned int flags, CUdevice dev)
{
    struct create_args a = {pctx, flags, dev, paramsArray, numParams, NULL};
    return create_context(call_create_v3, &a, REAL(cuCtxCreate_v3) != NULL, CD_W_cuCtxCreate_v3);
}

EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                       unsigned int flags, CUdevice dev)
{
    struct create_args a = {pctx, flags, dev, NULL, 0, ctxCreateParams};
    return create_context(call_create_v4, &a, REAL(cuCtxCreate_v4) != NULL, CD_W_cuCtxCreate_v4);
}

/* A retain makes the primary context active if it was not: a creation. */
static CUresult call_retain(const struct create_args *a)
{
    return REAL(cuDevicePrimaryCtxRetain)(a->pctx, a->dev);
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    struct create_args a = {.pctx = pctx, .dev = dev};
    return create_context(call_retain, &a, REAL(cuDevicePrimaryCtxRetain) != NULL,
                          CD_W_cuDevicePrimaryCtxRetain);
}

/* A release or a reset of a device's primary context: either may end it. */
typedef CUresult (*dev_fn)(CUdevice);

static CUresult primary_end(CUdevice dev, dev_fn real, enum cd_wrapped w)
{
    if (!real)
        return cd_missing(w);
    cd_primary_ending(dev);
    CUresult rc = real(dev);
    cd_primary_ended(dev);
    return rc;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_end(dev, REAL(cuDevicePrimaryCtxRelease), CD_W_cuDevicePrimaryCtxRelease);
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_end(dev, REAL(cuDevicePrimaryCtxRelease_v2), CD_W_cuDevicePrimaryCtxRelease_v2);
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_end(dev, REAL(cuDevicePrimaryCtxReset), CD_W_cuDevicePrimaryCtxReset);
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_end(dev, REAL(cuDevicePrimaryCtxReset_v2), CD_W_cuDevicePrimaryCtxReset_v2);
}

EXPORT CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    __typeof__(&cuCtxFromGreenCtx) real = REAL(cuCtxFromGreenCtx);
    if (!real)
        return cd_missing(CD_W_cuCtxFromGreenCtx);
    CUresult rc = real(pContext, hCtx);
    if (rc == CUDA_SUCCESS)
        cd_green_seen(hCtx, *pContext);
    return rc;
}

EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    __typeof__(&cuGreenCtxDestroy) real = REAL(cuGreenCtxDestroy);
    if (!real)
        return cd_missing(CD_W_cuGreenCtxDestroy);
    cd_green_destroying(hCtx);
    CUresult rc = real(hCtx);
    cd_green_destroyed(hCtx);
    return rc;
}

/* ---- entry-point resolvers (interpose.c does the substitution) ------------------------------ */

EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags)
{
    __typeof__(&cuGetProcAddress) real = REAL(cuGetProcAddress);
    if (!real)
        return cd_missing(CD_W_cuGetProcAddress);
    CUresult rc = real(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = cd_substitute(*pfn, symbol, CD_DOOR_PROCADDR);
    return rc;
}

EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus)
{
    __typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
    if (!real)
        return cd_missing(CD_W_cuGetProcAddress_v2);
    CUresult rc = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn && *pfn)
        *pfn = cd_substitute(*pfn, symbol, CD_DOOR_PROCADDR);
    return rc;
}

/* ---- the public API --------------------------------------------------------------------- */

EXPORT int cudefer_flush(void)
{
    return cd_flush_all();
}

EXPORT const char *cudefer_version(void)
{
    return CUDEFER_VERSION_STRING;
}

/* ---- the table of wrappers ---------------------------------------------------------------- */

void *const cd_wrappers[CD_WRAPPED_COUNT] = {
#define CD_WRAP(name) (void *)name,
#include "wrapped.h"
#undef CD_WRAP
};
