/* driver.h - the real CUDA driver, as cudefer reaches it.
 *
 * The real driver is dlopen("libcuda.so.1") (or $CUDEFER_DRIVER), and every
 * driver function cudefer calls itself is looked up here, never through
 * cudefer's own exported names, so nothing cudefer does on its own behalf
 * enters a wrapper. Both upper layers use this file: the doors for the
 * driver function behind each wrapper, the engine for the calls it makes.
 */
#ifndef CUDEFER_DRIVER_H
#define CUDEFER_DRIVER_H

#include <cuda.h>
#include <stdbool.h>

/* glibc's dlsym, found without calling dlsym (so that cudefer's own dlsym
 * override is never entered by cudefer): by dlvsym under every symbol
 * version glibc has given dlsym on any architecture, and failing that from
 * the dynamic symbol table of the library that defines dlvsym. NULL when
 * neither works; cudefer then disables itself with one message. */
typedef void *(*cd_dlsym_fn)(void *, const char *);
cd_dlsym_fn cd_real_dlsym_fn(void);
void *cd_real_dlsym(void *handle, const char *name);

/* What dlsym answers when glibc's cannot be found: name looked up in the
 * dynamic symbol tables of handle's object and those loaded after it
 * (RTLD_NEXT: after the object holding caller). */
void *cd_fallback_dlsym(void *handle, const char *name, const void *caller);

/* The real driver's handle, or NULL when it cannot be opened or when the
 * process holds two different drivers (CUDEFER_DRIVER naming another file
 * than the libcuda.so.1 the program loaded): cudefer then steps aside and
 * says so once. A failed open is retried on a later call. Thread-safe; no
 * lock is held across dlopen. */
void *cd_driver_handle(void);

/* Whether handle is a libcuda.so.1 other than the driver cudefer calls;
 * logs the two-driver case once. */
bool cd_driver_is_foreign(void *handle);

/* The real driver's entry point of exactly this ELF name, or NULL. */
void *cd_driver_sym(const char *name);

/* Driver entry points the engine calls. Names are the ELF names the plain
 * cuda.h maps to. Resolved once by cd_driver_ops(); an optional one is NULL
 * when the driver lacks it (cuCtxRecordEvent before 12.5, green contexts
 * before 12.4, cuStreamWriteValue32_v2 before 11.7). */
struct cd_driver_ops {
    __typeof__(cuDriverGetVersion) *driver_get_version;
    __typeof__(cuCtxGetCurrent) *ctx_get_current;
    __typeof__(cuCtxGetDevice) *ctx_get_device;
    __typeof__(cuDeviceGetAttribute) *device_get_attribute;
    __typeof__(cuCtxGetApiVersion) *ctx_get_api_version;
    __typeof__(cuCtxPushCurrent_v2) *ctx_push;
    __typeof__(cuCtxPopCurrent_v2) *ctx_pop;
    __typeof__(cuCtxRecordEvent) *ctx_record_event;
    __typeof__(cuCtxFromGreenCtx) *ctx_from_green;
    __typeof__(cuDevicePrimaryCtxGetState) *primary_get_state;
    __typeof__(cuDevicePrimaryCtxRetain) *primary_retain;
    __typeof__(cuDevicePrimaryCtxRelease_v2) *primary_release;
    __typeof__(cuStreamCreate) *stream_create;
    __typeof__(cuStreamDestroy_v2) *stream_destroy;
    __typeof__(cuStreamGetCtx) *stream_get_ctx;
    __typeof__(cuStreamWaitEvent) *stream_wait_event;
    __typeof__(cuStreamSynchronize) *stream_synchronize;
    __typeof__(cuStreamIsCapturing) *stream_is_capturing;
    __typeof__(cuEventCreate) *event_create;
    __typeof__(cuEventDestroy_v2) *event_destroy;
    __typeof__(cuEventRecord) *event_record;
    __typeof__(cuEventQuery) *event_query;
    __typeof__(cuEventSynchronize) *event_synchronize;
    __typeof__(cuMemAlloc_v2) *mem_alloc;
    __typeof__(cuMemFreeAsync) *mem_free_async;
    /* The fence's word (fence.h): optional, it is left out without them. */
    __typeof__(cuMemHostAlloc) *mem_host_alloc;
    __typeof__(cuMemHostGetDevicePointer_v2) *host_device_pointer;
    __typeof__(cuStreamWriteValue32_v2) *stream_write_value32;
    __typeof__(cuThreadExchangeStreamCaptureMode) *exchange_capture_mode;
    __typeof__(cuPointerGetAttribute) *pointer_get_attribute;
    /* The releases that may wait for the GPU: called at flush points only. */
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

/* The driver's version (cuDriverGetVersion), or 0 when unknown. */
int cd_driver_version(void);

/* Whether a record of a whole context (cuCtxRecordEvent, driver 12.5+) is
 * there for the fences; before it they record an event on each stream the
 * program made. */
bool cd_driver_records_contexts(void);

/* Whether cudefer calls the driver on its own behalf at all: the driver is
 * usable (cd_driver_ops), glibc's dlsym was found, and the process is not
 * past cudefer's exit handler (cd_driver_stop_using: at exit the driver
 * tears itself down, and from then on every call goes to it unchanged). */
bool cd_driver_in_use(void);
void cd_driver_stop_using(void);

#endif
