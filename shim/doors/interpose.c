/* interpose.c - the dlsym and cuGetProcAddress doors, and the driver
 * function behind each wrapper. */
#include "doors.h"

#include "driver.h"
#include "log.h"
#include "options.h"
#include "stats.h"

#include <cuda.h>
#include <dlfcn.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

const char *const cd_wrapped_names[CD_WRAPPED_COUNT] = {
#define CD_WRAP(name) #name,
#include "wrapped.h"
#undef CD_WRAP
};

static struct {
    _Atomic(void *) fn;
    _Atomic unsigned doors; /* doors the wrapper was handed out through */
    _Atomic bool called;
} reals[CD_WRAPPED_COUNT];

static const char *door_names(unsigned doors)
{
    static const char *const names[8] = {
        "exported symbol", "exported symbol", "dlsym", "exported symbol and dlsym",
        "cuGetProcAddress", "exported symbol and cuGetProcAddress", "dlsym and cuGetProcAddress",
        "every door",
    };
    return names[doors & 7];
}

/* The first call of a wrapper: logged with the doors it was handed out
 * through (one never handed out was called by its exported name). */
static void first_call(enum cd_wrapped w)
{
    if (atomic_exchange(&reals[w].called, true))
        return;
    cd_stats_note_use();
    unsigned doors = atomic_load(&reals[w].doors);
    if (!doors)
        atomic_fetch_or(&reals[w].doors, CD_DOOR_EXPORT);
    cd_log(CD_LOG_DEBUG, "first call of %s (reached through: %s)", cd_wrapped_names[w],
           door_names(doors ? doors : CD_DOOR_EXPORT));
}

static void *lookup_real(enum cd_wrapped w)
{
    void *fn = atomic_load_explicit(&reals[w].fn, memory_order_acquire);
    if (!fn) {
        fn = cd_driver_sym(cd_wrapped_names[w]);
        if (fn)
            atomic_store_explicit(&reals[w].fn, fn, memory_order_release);
    }
    return fn;
}

void *cd_real(enum cd_wrapped w)
{
    if (!atomic_load_explicit(&reals[w].called, memory_order_relaxed))
        first_call(w);
    return lookup_real(w);
}

int cd_missing(enum cd_wrapped w)
{
    cd_log(CD_LOG_ERROR, "the CUDA driver has no %s", cd_wrapped_names[w]);
    return CUDA_ERROR_NOT_FOUND;
}

/* The wrapped name, or a negative value. On the dlsym override's path: not
 * instrumented (see dlsym). */
__attribute__((no_sanitize_thread, no_sanitize_address)) static int by_name(const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u')
        return -1;
    for (int i = 0; i < CD_WRAPPED_COUNT; i++)
        if (strcmp(cd_wrapped_names[i], name) == 0)
            return i;
    return -1;
}

static void handed_out(enum cd_wrapped w, enum cd_door door, const char *asked)
{
    atomic_fetch_or(&reals[w].doors, door);
    cd_log(CD_LOG_DEBUG, "%s(%s) -> wrapper %s", door == CD_DOOR_DLSYM ? "dlsym" : "cuGetProcAddress",
           asked, cd_wrapped_names[w]);
}

void *cd_substitute(void *fn, const char *asked, enum cd_door door)
{
    if (!cd_option_bool(CD_OPT_ENABLE) || !fn)
        return fn;
    for (int i = 0; i < CD_WRAPPED_COUNT; i++) {
        if (lookup_real((enum cd_wrapped)i) == fn) {
            handed_out((enum cd_wrapped)i, door, asked);
            return cd_wrappers[i];
        }
    }
    return fn;
}

/* Set while this thread is inside cudefer's own lookups: a dlsym made
 * meanwhile (the driver's constructors, NVML's initialisation) gets the
 * plain answer, which also rules out recursion. No lock is held. */
static _Thread_local int in_lookup;

static void *lookup(void *handle, const char *name, int w)
{
    void *found = cd_real_dlsym(handle, name);
    if (!found)
        return found;
    in_lookup = 1;
    bool ours = cd_option_bool(CD_OPT_ENABLE) && lookup_real((enum cd_wrapped)w) == found;
    bool foreign = !ours && cd_driver_is_foreign(handle);
    in_lookup = 0;
    if (!ours || foreign)
        return found;
    handed_out((enum cd_wrapped)w, CD_DOOR_DLSYM, name);
    return cd_wrappers[w];
}

/* glibc's dlsym resolves RTLD_NEXT relative to its caller, which must stay
 * the program's caller, not cudefer (sanitizer runtimes and other
 * interposers look their real functions up that way). So every lookup that
 * is not of a wrapped name goes to glibc's dlsym as a tail call, whatever
 * the optimisation level: guaranteed with musttail where the compiler has
 * it, else by optimising this one function (GCC). Not instrumented by
 * sanitizers, which would turn the tail call into a call. */
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define CD_TAIL __attribute__((musttail))
#endif
#endif
#ifdef CD_TAIL
#define CD_TAIL_FUNCTION
#elif defined(__GNUC__) && !defined(__clang__)
#define CD_TAIL
#define CD_TAIL_FUNCTION __attribute__((optimize("O2", "optimize-sibling-calls")))
#else
#error "dlsym's tail call needs musttail (clang 13, GCC 15) or GCC's optimize attribute"
#endif

EXPORT CD_TAIL_FUNCTION __attribute__((no_sanitize_thread, no_sanitize_address)) void *
dlsym(void *handle, const char *name)
{
    cd_dlsym_fn real = cd_real_dlsym_fn();
    if (!real)
        return cd_fallback_dlsym(handle, name, __builtin_return_address(0));
    /* The thread-local flag is read last: a sanitizer runtime that is
     * still starting intercepts the thread-local access itself. */
    int w = handle == RTLD_NEXT ? -1 : by_name(name);
    if (w < 0 || in_lookup)
        CD_TAIL return real(handle, name);
    return lookup(handle, name, w);
}
