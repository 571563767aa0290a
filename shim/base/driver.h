/* driver.h - the real CUDA driver, as the shim reaches it.
 *
 * The real driver is dlopen("libcuda.so.1") (or $CUDEFER_DRIVER), and every
 * driver function the shim calls itself is looked up here, never through the
 * shim's own exported names, so nothing the shim does on its own behalf
 * re-enters a wrapper.
 */
#ifndef CUDEFER_DRIVER_H
#define CUDEFER_DRIVER_H

#include <cuda.h>
#include <stdbool.h>

/* dlsym as glibc provides it (found with dlvsym, so the shim's own dlsym
 * override is never called by the shim), and a call of it. */
typedef void *(*cd_dlsym_fn)(void *, const char *);
cd_dlsym_fn cd_real_dlsym_fn(void);
void *cd_real_dlsym(void *handle, const char *name);

/* The real driver's handle, or NULL when it cannot be opened. Opens it on
 * first use; a failed open is retried on a later call. Thread-safe; holds no
 * lock across dlopen. */
void *cd_driver_handle(void);

/* The real driver's entry point of exactly this ELF name, or NULL. */
void *cd_driver_sym(const char *name);

/* Driver entry points the release engine calls. Names are the ELF names the
 * plain cuda.h maps to. Resolved once by cd_driver_ops(); a missing one is
 * NULL (cuCtxRecordEvent before driver 12.5). */
struct cd_driver_ops {
    __typeof__(cuDriverGetVersion) *driver_get_version;
    __typeof__(cuCtxGetCurrent) *ctx_get_current;
    __typeof__(cuCtxGetDevice) *ctx_get_device;
    __typeof__(cuCtxGetApiVersion) *ctx_get_api_version;
    __typeof__(cuCtxPushCurrent_v2) *ctx_push;
    __typeof__(cuCtxPopCurrent_v2) *ctx_pop;
    __typeof__(cuCtxRecordEvent) *ctx_record_event;
    __typeof__(cuStreamCreate) *stream_create;
    __typeof__(cuStreamDestroy_v2) *stream_destroy;
    __typeof__(cuStreamGetCtx) *stream_get_ctx;
    __typeof__(cuStreamWaitEvent) *stream_wait_event;
    __typeof__(cuStreamSynchronize) *stream_synchronize;
    __typeof__(cuEventCreate) *event_create;
    __typeof__(cuEventDestroy_v2) *event_destroy;
    __typeof__(cuEventRecord) *event_record;
    __typeof__(cuEventQuery) *event_query;
    __typeof__(cuEventSynchronize) *event_synchronize;
    __typeof__(cuMemAlloc_v2) *mem_alloc;
    __typeof__(cuMemFreeAsync) *mem_free_async;
    __typeof__(cuThreadExchangeStreamCaptureMode) *exchange_capture_mode;
    __typeof__(cuPointerGetAttribute) *pointer_get_attribute;
    /* The releases that may wait for the GPU: called only at flush points. */
    __typeof__(cuMemFree_v2) *mem_free;
    __typeof__(cuMemFreeHost) *mem_free_host;
    __typeof__(cuMemHostUnregister) *mem_host_unregister;
    __typeof__(cuArrayDestroy) *array_destroy;
    __typeof__(cuMipmappedArrayDestroy) *mipmapped_array_destroy;
    __typeof__(cuModuleUnload) *module_unload;
    __typeof__(cuLibraryUnload) *library_unload;
};

/* The engine's driver entry points, or NULL when the driver cannot be
 * opened or lacks one the engine cannot do without. */
const struct cd_driver_ops *cd_driver_ops(void);

#endif
