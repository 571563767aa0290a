/* driver.c - opening the real driver and looking up its entry points. */
#include "driver.h"

#include "log.h"
#include "options.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <sched.h>
#include <stddef.h>

/* Called from the dlsym override before a sanitizer runtime has finished
 * its own start (it looks its real functions up with dlsym): not
 * instrumented. */
__attribute__((no_sanitize_thread, no_sanitize_address)) cd_dlsym_fn cd_real_dlsym_fn(void)
{
    static _Atomic(cd_dlsym_fn) real;
    cd_dlsym_fn fn = atomic_load_explicit(&real, memory_order_acquire);
    if (fn)
        return fn;
    /* glibc 2.34 moved dlsym into libc under a new version; older ones
     * only have the 2.2.5 one. */
    fn = (cd_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!fn)
        fn = (cd_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (fn)
        atomic_store_explicit(&real, fn, memory_order_release);
    return fn;
}

void *cd_real_dlsym(void *handle, const char *name)
{
    cd_dlsym_fn fn = cd_real_dlsym_fn();
    return fn ? fn(handle, name) : NULL;
}

static _Atomic(void *) driver;

void *cd_driver_handle(void)
{
    void *h = atomic_load_explicit(&driver, memory_order_acquire);
    if (h)
        return h;
    const char *path = cd_option_str(CD_OPT_DRIVER);
    if (!path || !*path)
        path = "libcuda.so.1";
    /* No lock is held here: two threads may both open the driver, which
     * only raises its reference count. */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        cd_log(CD_LOG_ERROR, "cannot open the CUDA driver %s: %s", path, dlerror());
        return NULL;
    }
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&driver, &expected, h)) {
        dlclose(h);
        h = expected;
    }
    return h;
}

void *cd_driver_sym(const char *name)
{
    void *h = cd_driver_handle();
    return h ? cd_real_dlsym(h, name) : NULL;
}

struct op_name {
    size_t offset;
    const char *name;
    bool optional;
};

#define OP(field, sym, opt) { offsetof(struct cd_driver_ops, field), sym, opt }
static const struct op_name op_names[] = {
    OP(driver_get_version, "cuDriverGetVersion", false),
    OP(ctx_get_current, "cuCtxGetCurrent", false),
    OP(ctx_get_device, "cuCtxGetDevice", false),
    OP(ctx_get_api_version, "cuCtxGetApiVersion", false),
    OP(ctx_push, "cuCtxPushCurrent_v2", false),
    OP(ctx_pop, "cuCtxPopCurrent_v2", false),
    OP(ctx_record_event, "cuCtxRecordEvent", true),
    OP(stream_create, "cuStreamCreate", false),
    OP(stream_destroy, "cuStreamDestroy_v2", false),
    OP(stream_get_ctx, "cuStreamGetCtx", false),
    OP(stream_wait_event, "cuStreamWaitEvent", false),
    OP(stream_synchronize, "cuStreamSynchronize", false),
    OP(event_create, "cuEventCreate", false),
    OP(event_destroy, "cuEventDestroy_v2", false),
    OP(event_record, "cuEventRecord", false),
    OP(event_query, "cuEventQuery", false),
    OP(event_synchronize, "cuEventSynchronize", false),
    OP(mem_alloc, "cuMemAlloc_v2", false),
    OP(mem_free_async, "cuMemFreeAsync", false),
    OP(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", false),
    OP(pointer_get_attribute, "cuPointerGetAttribute", true),
    OP(mem_free, "cuMemFree_v2", false),
    OP(mem_free_host, "cuMemFreeHost", false),
    OP(mem_host_unregister, "cuMemHostUnregister", false),
    OP(array_destroy, "cuArrayDestroy", false),
    OP(mipmapped_array_destroy, "cuMipmappedArrayDestroy", false),
    OP(module_unload, "cuModuleUnload", false),
    OP(library_unload, "cuLibraryUnload", true),
};
#undef OP

static struct cd_driver_ops ops;
enum { OPS_UNRESOLVED, OPS_READY, OPS_UNUSABLE, OPS_RESOLVING };
static _Atomic int ops_state;

static int resolve_ops(void)
{
    if (!cd_driver_handle())
        return OPS_UNRESOLVED; /* retried on a later call */
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++) {
        void *fn = cd_driver_sym(op_names[i].name);
        if (!fn && !op_names[i].optional) {
            cd_log(CD_LOG_ERROR, "the CUDA driver lacks %s: releases pass through unchanged",
                   op_names[i].name);
            return OPS_UNUSABLE;
        }
        *(void **)((char *)&ops + op_names[i].offset) = fn;
    }
    return OPS_READY;
}

const struct cd_driver_ops *cd_driver_ops(void)
{
    for (;;) {
        int state = atomic_load_explicit(&ops_state, memory_order_acquire);
        if (state == OPS_READY)
            return &ops;
        if (state == OPS_UNUSABLE)
            return NULL;
        if (state == OPS_RESOLVING) {
            /* Another thread is looking names up; that takes microseconds
             * and never waits for this one. */
            sched_yield();
            continue;
        }
        if (!atomic_compare_exchange_weak(&ops_state, &state, OPS_RESOLVING))
            continue;
        state = resolve_ops();
        atomic_store_explicit(&ops_state, state, memory_order_release);
        if (state == OPS_UNRESOLVED)
            return NULL;
    }
}
