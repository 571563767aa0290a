/* interpose.c - the dlsym and cuGetProcAddress doors, and the driver
 * functions behind each wrapper. */
#include "interpose.h"

#include "driver.h"
#include "log.h"
#include "options.h"

#include <cuda.h>
#include <dlfcn.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

void *cd_real_fn(struct cd_real *r)
{
    void *fn = atomic_load_explicit(&r->fn, memory_order_acquire);
    if (!fn) {
        fn = cd_driver_sym(r->name);
        if (fn)
            atomic_store_explicit(&r->fn, fn, memory_order_release);
    }
    return fn;
}

static const char *door_names(unsigned doors)
{
    static const char *const names[8] = {
        "exported symbol", "exported symbol", "dlsym", "exported symbol and dlsym",
        "cuGetProcAddress", "exported symbol and cuGetProcAddress", "dlsym and cuGetProcAddress",
        "every door",
    };
    return names[doors & 7];
}

void cd_note_call(struct cd_real *r)
{
    if (atomic_load_explicit(&r->called, memory_order_relaxed) ||
        atomic_exchange(&r->called, true))
        return;
    unsigned doors = atomic_load(&r->doors);
    /* A wrapper never handed out was called by its exported name. */
    if (!doors)
        atomic_fetch_or(&r->doors, CD_DOOR_EXPORT);
    cd_log(CD_LOG_DEBUG, "first call of %s (reached through: %s)", r->name,
           door_names(doors ? doors : CD_DOOR_EXPORT));
}

int cd_missing(const char *name)
{
    cd_log(CD_LOG_ERROR, "the CUDA driver has no %s", name);
    return CUDA_ERROR_NOT_FOUND;
}

/* On the dlsym override's path: not instrumented (see dlsym). */
__attribute__((no_sanitize_thread, no_sanitize_address)) static const struct cd_wrapper *
by_name(const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u')
        return NULL;
    for (size_t i = 0; i < cd_wrapper_count; i++)
        if (strcmp(cd_wrappers[i].name, name) == 0)
            return &cd_wrappers[i];
    return NULL;
}

static void handed_out(const struct cd_wrapper *w, enum cd_door door, const char *asked)
{
    atomic_fetch_or(&w->real->doors, door);
    cd_log(CD_LOG_DEBUG, "%s(%s) -> wrapper %s", door == CD_DOOR_DLSYM ? "dlsym" : "cuGetProcAddress",
           asked, w->name);
}

/* The wrapper of the driver function fn, matched by address so that the
 * variant the resolver picked (by version and per-thread flag) is kept. */
void *cd_substitute(void *fn, const char *asked, enum cd_door door)
{
    if (!cd_option_bool(CD_OPT_ENABLE))
        return fn;
    for (size_t i = 0; i < cd_wrapper_count; i++) {
        if (cd_real_fn(cd_wrappers[i].real) == fn) {
            handed_out(&cd_wrappers[i], door, asked);
            return cd_wrappers[i].fn;
        }
    }
    return fn;
}

/* Set while this thread is inside the shim's own lookups: a dlsym made
 * meanwhile (the driver's constructors, NVML's initialisation) gets the
 * plain answer, which also rules out recursion. No lock is held. */
static _Thread_local int in_lookup;

static void *lookup(void *handle, const char *name)
{
    void *found = cd_real_dlsym(handle, name);
    if (!found)
        return found;
    const struct cd_wrapper *w = by_name(name);
    in_lookup = 1;
    bool ours = cd_option_bool(CD_OPT_ENABLE) && cd_real_fn(w->real) == found;
    in_lookup = 0;
    if (!ours)
        return found;
    handed_out(w, CD_DOOR_DLSYM, name);
    return w->fn;
}

/* glibc's dlsym finds RTLD_NEXT relative to its caller, which would be the
 * shim for every lookup made through this override (sanitizer runtimes and
 * other interposers look their real functions up that way). So every lookup
 * that is not of a wrapped name goes to glibc's dlsym as a tail call, which
 * keeps the program's return address: glibc sees the program's caller. Not
 * instrumented by sanitizers, which would turn the tail call into a call. */
EXPORT __attribute__((no_sanitize_thread, no_sanitize_address)) void *
dlsym(void *handle, const char *name)
{
    cd_dlsym_fn real = cd_real_dlsym_fn();
    /* The thread-local flag is read last: a sanitizer runtime that is
     * still starting intercepts the thread-local access itself. */
    if (handle == RTLD_NEXT || !by_name(name) || in_lookup)
        return real(handle, name);
    return lookup(handle, name);
}
