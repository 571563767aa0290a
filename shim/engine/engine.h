/* engine.h - the release engine, as the interposition layer calls it.
 *
 * The engine decides what becomes of a release: a fenced stream-ordered free,
 * an entry on a context's deferred queue, or the driver's own call. It knows
 * nothing of how a call reached it (exported symbol, dlsym, cuGetProcAddress).
 *
 * Functions named cd_release_* return true when the engine took the release
 * and stored the caller's result in *rc; false means "make the driver's own
 * call", which is always correct (it is what the program asked for). They
 * never call anything that may wait for the GPU.
 */
#ifndef CUDEFER_ENGINE_H
#define CUDEFER_ENGINE_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a released object is; one row each in backends.c. */
enum cd_kind {
    CD_DEVICE,     /* cuMemAlloc, cuMemAllocPitch */
    CD_MANAGED,    /* cuMemAllocManaged */
    CD_HOST,       /* cuMemAllocHost, cuMemHostAlloc */
    CD_REGISTERED, /* cuMemHostRegister */
    CD_ARRAY,      /* cuArrayCreate, cuArray3DCreate */
    CD_MIPMAPPED,  /* cuMipmappedArrayCreate */
    CD_MODULE,     /* cuModuleLoad* */
    CD_LIBRARY,    /* cuLibraryLoad* */
    CD_KIND_COUNT
};

/* --- releases (never wait for the GPU) --------------------------------- */

/* cuMemFree of device or managed memory. */
bool cd_release_device(CUdeviceptr ptr, CUresult *rc);
bool cd_release_host(void *ptr, CUresult *rc);
bool cd_release_registered(void *ptr, CUresult *rc);
bool cd_release_array(CUarray array, CUresult *rc);
bool cd_release_mipmapped(CUmipmappedArray array, CUresult *rc);
bool cd_release_module(CUmodule module, CUresult *rc);
bool cd_release_library(CUlibrary library, CUresult *rc);

/* The answer to cuMemHostUnregister(ptr) given the driver's answer rc: an
 * address the driver still knows only because the shim holds the block the
 * program released around it gets the code for an address the driver does
 * not know (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) instead of
 * CUDA_ERROR_INVALID_VALUE. Does not wait. */
CUresult cd_unregister_answer(void *ptr, CUresult rc);

/* --- allocations --------------------------------------------------------- */

/* Called before an allocating call: when the current context's deferred
 * queue is over its limits, releases it here. May wait for the GPU. */
void cd_alloc_begin(void);

/* Called with the result of a failed allocating call of the given kind (the
 * kind decides nothing yet but is logged). When rc is an out-of-memory error
 * and something is queued, releases what is queued (may wait for the GPU)
 * and returns true: the caller retries once and returns the retry's result. */
bool cd_alloc_failed(CUresult rc, const char *call);

/* Records a successful allocation so that its release can be deferred.
 * flags are the allocating call's flags (CD_FLAGS_ALLOC_HOST for
 * cuMemAllocHost, whose memory is not told apart by flags). */
void cd_track(enum cd_kind kind, uintptr_t key, size_t bytes, unsigned flags);
#define CD_FLAGS_ALLOC_HOST 0x80000000u

/* Serves an allocation of kind, bytes and flags with a block the program
 * released earlier in the current context whose fence has passed: no kernel
 * submitted before its release can still use it. Returns true and the block
 * in *key, or false (the caller allocates from the driver). Does not wait. */
bool cd_reuse(enum cd_kind kind, size_t bytes, unsigned flags, uintptr_t *key);

/* Before cuMemHostRegister of [ptr, ptr + bytes): releases queued
 * unregisters that overlap it (may wait for the GPU), so the registration
 * does not fail with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. */
void cd_before_register(void *ptr, size_t bytes);

/* After a registration failed with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
 * releases every queued unregister (may wait). True when the caller should
 * retry. */
bool cd_register_failed(CUresult rc, void *ptr, size_t bytes);

/* --- streams, capture, synchronisation, teardown ------------------------- */

/* A stream the program created (successfully) / is about to destroy. */
void cd_stream_created(CUstream stream);
void cd_stream_destroying(CUstream stream);

/* Around cuStreamBeginCapture*: cd_capture_begin before the real call (it
 * waits for fences already in progress, which take microseconds, never for
 * the GPU), cd_capture_begun after it with its result. */
void cd_capture_begin(void);
void cd_capture_begun(CUstream stream, CUresult rc);
/* After cuStreamEndCapture*, with the stream and the call's result. */
void cd_capture_ended(CUstream stream, CUresult rc);

/* After a successful cuCtxSynchronize (ctx NULL: the current one): releases
 * that context's queue. The GPU is idle for it, so this waits very little. */
void cd_context_synchronized(CUcontext ctx);

/* Before a context goes away (cuCtxDestroy, the last primary release,
 * primary reset): releases or drops its entries and its private objects.
 * May wait for the GPU (as the teardown itself does). */
void cd_context_teardown(CUcontext ctx);

/* A context the program created: set up now, so that fences cover it
 * even if nothing is ever allocated in it. */
void cd_context_created(CUcontext ctx);

/* Primary contexts: the shim counts retains to know the last release. */
void cd_primary_retained(CUdevice dev, CUcontext ctx);
/* Before cuDevicePrimaryCtxRelease: tears the context down if this is its
 * last reference. */
void cd_primary_releasing(CUdevice dev);
/* Before cuDevicePrimaryCtxReset. */
void cd_primary_resetting(CUdevice dev);

/* Releases every context's queue now (cudefer_flush). May wait. */
int cd_flush_all(void);

#endif
