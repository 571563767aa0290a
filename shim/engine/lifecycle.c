/* lifecycle.c - retiring releases.
 *
 * A release is retired on the caller's thread: its record is found, fenced
 * behind all work already submitted (cd_ctx_fence), and either handed to the
 * driver's stream-ordered free (device memory, then finished by the waiter
 * thread, waiter.c) or pushed on the context's deferred queue (released at a
 * flush point, reclaim.c). Nothing on that path waits for the GPU.
 */
#include "engine.h"
#include "lifecycle.h"

#include "backends.h"
#include "contexts.h"
#include "driver.h"
#include "log.h"
#include "options.h"
#include "queue.h"
#include "registry.h"
#include "stats.h"

#include <pthread.h>
#include <stdlib.h>

static _Atomic long long registered_pending;

/* Ranges of the registrations whose unregister is queued (a handful at a
 * time): a registration that overlaps one must wait for its real release. */
static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;
static struct range {
    uintptr_t lo, hi;
} *ranges;
static size_t nranges, cap_ranges;

static void note_range(const struct cd_record *r, int sign)
{
    struct range want = {r->key, r->key + r->bytes};
    pthread_mutex_lock(&ranges_lock);
    if (sign > 0) {
        if (nranges == cap_ranges) {
            size_t cap = cap_ranges ? cap_ranges * 2 : 16;
            struct range *p = realloc(ranges, cap * sizeof *p);
            if (p) {
                ranges = p;
                cap_ranges = cap;
            }
        }
        /* Without room the range is not noted; the registration's own
         * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED still leads to a flush. */
        if (nranges < cap_ranges)
            ranges[nranges++] = want;
    } else {
        for (size_t i = 0; i < nranges; i++) {
            if (ranges[i].lo == want.lo && ranges[i].hi == want.hi) {
                ranges[i] = ranges[--nranges];
                break;
            }
        }
    }
    pthread_mutex_unlock(&ranges_lock);
}

bool cd_registered_overlap(uintptr_t lo, uintptr_t hi)
{
    bool found = false;
    pthread_mutex_lock(&ranges_lock);
    for (size_t i = 0; i < nranges && !found; i++)
        found = ranges[i].lo < hi && lo < ranges[i].hi;
    pthread_mutex_unlock(&ranges_lock);
    return found;
}

bool cd_enabled(void)
{
    return cd_option_bool(CD_OPT_ENABLE);
}

long long cd_registered_pending(void)
{
    return atomic_load(&registered_pending);
}

void cd_account_deferred(struct cd_ctx *cs, struct cd_record *r, int sign)
{
    long long bytes = sign * (long long)r->bytes;
    atomic_fetch_add(&cs->deferred_entries, sign);
    if (r->kind == CD_DEVICE) {
        atomic_fetch_add(&cs->cached_device, bytes);
        atomic_fetch_add(&cs->cached_entries, sign);
        cd_stats_add_cached_device_bytes(bytes);
        return;
    }
    atomic_fetch_add(&cs->deferred_bytes, bytes);
    cd_stats_add_deferred_bytes(bytes);
    if (r->kind == CD_REGISTERED) {
        atomic_fetch_add(&registered_pending, sign);
        note_range(r, sign);
    }
}

/* Removes a finished record everywhere and frees it. The caller already
 * gave its event back. */
void cd_finish(struct cd_record *r)
{
    cd_registry_remove(r);
    free(r);
}

/* Hands the oldest fenced device blocks of the queue to cuMemFreeAsync
 * until the cache is within CUDEFER_DEVICE_CACHE bytes and
 * CD_DEVICE_CACHE_BLOCKS blocks (which keeps the queue short enough to
 * walk); the waiter finishes them. Does not wait. Called with cs's context
 * current. */
static bool over_cache(struct cd_ctx *cs, long long bytes, long long blocks)
{
    return atomic_load(&cs->cached_device) > bytes || atomic_load(&cs->cached_entries) > blocks;
}

static void evict_device(struct cd_ctx *cs)
{
    long long limit = cd_option_int(CD_OPT_DEVICE_CACHE);
    if (!over_cache(cs, limit, CD_DEVICE_CACHE_BLOCKS) || !cd_fence_enter())
        return;
    /* Down to three quarters, so that one walk of the queue serves many
     * releases. */
    long long bytes = limit / 4 * 3, blocks = CD_DEVICE_CACHE_BLOCKS / 4 * 3;
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_record *keep = NULL, **tail = &keep;
    for (struct cd_record *r = cd_take_all(&cs->deferred), *next; r; r = next) {
        next = r->queue_next;
        if (r->kind == CD_DEVICE && r->done && over_cache(cs, bytes, blocks) &&
            ops->mem_free_async((CUdeviceptr)r->key, cs->priv) == CUDA_SUCCESS) {
            cd_unbook_deferred(cs, r);
            cd_queue_inflight(cs, r);
            continue;
        }
        r->queue_next = NULL;
        *tail = r;
        tail = &r->queue_next;
    }
    cd_fence_exit();
    cd_push_all(&cs->deferred, keep); /* oldest first: the newest ends on top */
}

static void queue_deferred(struct cd_ctx *cs, struct cd_record *r)
{
    /* Once pushed, r belongs to whoever takes the queue (a flush may
     * release and free it at once): nothing of it is read after the push. */
    bool device = r->kind == CD_DEVICE;
    cd_account_deferred(cs, r, +1);
    cd_push(&cs->deferred, r);
    if (device) {
        evict_device(cs);
        return;
    }
    if (atomic_load(&cs->deferred_bytes) > cd_option_int(CD_OPT_MAX_DEFERRED_BYTES) ||
        atomic_load(&cs->deferred_entries) - atomic_load(&cs->cached_entries) >
            cd_option_int(CD_OPT_MAX_DEFERRED_ENTRIES))
        atomic_store(&cs->over_limit, true);
}

void cd_unbook_deferred(struct cd_ctx *cs, struct cd_record *r)
{
    cd_account_deferred(cs, r, -1);
    cd_ctx_event_put(cs, r->done);
    r->done = NULL;
}

void cd_finish_deferred(struct cd_ctx *cs, struct cd_record *r)
{
    cd_unbook_deferred(cs, r);
    cd_finish(r);
}

static bool is_sticky(CUresult rc)
{
    switch (rc) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return true;
    default:
        return false;
    }
}

/* The context has a sticky error: nothing queued can be released in it any
 * more, and its teardown frees it all. */
static void drop_queue(struct cd_ctx *cs, CUresult why)
{
    long long n = 0;
    for (struct cd_record *r = cd_take_all(&cs->deferred), *next; r; r = next) {
        next = r->queue_next;
        atomic_fetch_add(&cd_stats.dropped[r->kind], 1);
        cd_finish_deferred(cs, r);
        n++;
    }
    cd_log(CD_LOG_ERROR, "context %p has error %d: dropped %lld queued releases "
           "(the context's destruction frees them)", (void *)atomic_load(&cs->handle),
           (int)why, n);
}

/* Fences r behind all work submitted so far in its context; for device
 * memory with no cache, also issues the stream-ordered free. *issued tells
 * whether the free was issued. Does not wait. */
static CUresult fence_record(struct cd_ctx *cs, struct cd_record *r, bool *issued)
{
    *issued = false;
    bool cached = r->kind != CD_DEVICE || cd_option_int(CD_OPT_DEVICE_CACHE) > 0;
    CUresult rc = cd_ctx_fence(cs, cached ? &r->done : NULL);
    if (rc != CUDA_SUCCESS || cached)
        return rc;
    /* The waiter marks when it is done (a marker per batch of frees). */
    rc = cd_driver_ops()->mem_free_async((CUdeviceptr)r->key, cs->priv);
    *issued = rc == CUDA_SUCCESS;
    return rc;
}

/* Puts a fenced or unfenced record where it belongs. */
static void place(struct cd_ctx *cs, struct cd_record *r, bool issued)
{
    if (issued)
        cd_queue_inflight(cs, r);
    else
        queue_deferred(cs, r);
}

/* Fences the entries queued while captures were live, once none is. */
void cd_fence_backlogs(void)
{
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        struct cd_ctx *cs = &cd_contexts[i];
        if (atomic_load(&cs->state) != CD_CTX_READY)
            continue;
        struct cd_record *list = cd_take_all(&cs->deferred);
        if (!list)
            continue;
        struct cd_scope sc;
        cd_scope_enter(&sc, atomic_load(&cs->handle), false);
        bool open = cd_fence_enter();
        for (struct cd_record *r = list, *next; r; r = next) {
            next = r->queue_next;
            bool issued = false;
            if (open && !r->done) {
                cd_account_deferred(cs, r, -1);
                if (fence_record(cs, r, &issued) != CUDA_SUCCESS)
                    r->done = NULL;
                place(cs, r, issued);
            } else {
                cd_push(&cs->deferred, r);
            }
        }
        if (open)
            cd_fence_exit();
        cd_scope_leave(&sc);
    }
}

/* Whether the current context, if any, is alive: one the shim knows is;
 * another one is asked (a call that does not wait). */
static bool current_context_usable(const struct cd_driver_ops *ops)
{
    CUcontext cur = NULL;
    unsigned version;
    if (ops->ctx_get_current(&cur) != CUDA_SUCCESS)
        return false;
    return !cur || cd_ctx_find(cur) || ops->ctx_get_api_version(cur, &version) == CUDA_SUCCESS;
}

/* The caller's path of every intercepted release. Never waits for the GPU:
 * registry and event-pool locks are held for a few instructions, and the
 * driver calls (cuCtxGetCurrent, cuCtxRecordEvent, cuStreamWaitEvent,
 * cuMemFreeAsync, cuEventRecord, cuEventCreate) return without waiting. */
static bool retire(enum cd_kind cls, uintptr_t key, CUresult *rc)
{
    if (!cd_enabled())
        return false;
    /* No current context is needed: the record names the context, which
     * the scope below makes current (the driver, measured, frees memory
     * with no current context too). A destroyed current context gets the
     * driver's own answer. */
    const struct cd_driver_ops *ops = cd_driver_ops();
    /* cuLibraryUnload needs no context at all. */
    if (!ops || (cls != CD_LIBRARY && !current_context_usable(ops)))
        return false;
    struct cd_record *r = NULL;
    switch (cd_registry_retire(cls, key, &r)) {
    case CD_NOT_FOUND:
        atomic_fetch_add(&cd_stats.passed[cls], 1);
        return false;
    case CD_WAS_TORN:
        /* Its context is gone, and the object with it: the driver, given
         * the dead handle, may crash (a second release of an array). */
        cd_log(CD_LOG_DEBUG, "%s %#lx released after its context's destruction",
               cd_backend(cls)->name, (unsigned long)key);
        *rc = cd_backend(cls)->torn_release;
        return true;
    case CD_ALREADY_RETIRED:
        cd_log(CD_LOG_DEBUG, "%s %#lx released twice", cd_backend(cls)->name, (unsigned long)key);
        *rc = cd_backend(cls)->double_release;
        return true;
    case CD_RETIRED_NOW:
        break;
    }
    struct cd_ctx *cs = r->ctx;
    if (!cd_option_bool(cd_backend(r->kind)->option) || !cd_ctx_enter(cs)) {
        /* The driver's own call releases it; the record goes with it. */
        atomic_fetch_add(&cd_stats.passed[r->kind], 1);
        cd_finish(r);
        return false;
    }

    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), false);
    bool issued = false;
    CUresult frc = CUDA_SUCCESS;
    r->done = NULL;
    if (cd_fence_enter()) {
        frc = fence_record(cs, r, &issued);
        cd_fence_exit();
    }
    cd_scope_leave(&sc);

    if (frc != CUDA_SUCCESS && !issued) {
        if (is_sticky(frc)) {
            cd_finish(r);
            drop_queue(cs, frc);
            cd_ctx_exit(cs);
            *rc = frc;
            return true;
        }
        cd_log(CD_LOG_ERROR, "cannot fence a %s release (error %d): the driver releases it",
               cd_backend(r->kind)->name, (int)frc);
        atomic_fetch_add(&cd_stats.passed[r->kind], 1);
        cd_ctx_event_put(cs, r->done);
        cd_ctx_exit(cs);
        cd_finish(r);
        return false;
    }
    atomic_fetch_add(&cd_stats.deferred[r->kind], 1);
    cd_log(CD_LOG_DEBUG, "%s %#lx deferred%s", cd_backend(r->kind)->name, (unsigned long)r->key,
           r->done || issued ? "" : " (capture live: fenced when it ends)");
    place(cs, r, issued);
    cd_ctx_exit(cs);
    *rc = CUDA_SUCCESS;
    return true;
}

bool cd_release_device(CUdeviceptr ptr, CUresult *rc)
{
    return ptr && retire(CD_DEVICE, (uintptr_t)ptr, rc);
}

bool cd_release_host(void *ptr, CUresult *rc)
{
    return ptr && retire(CD_HOST, (uintptr_t)ptr, rc);
}

bool cd_release_registered(void *ptr, CUresult *rc)
{
    return ptr && retire(CD_REGISTERED, (uintptr_t)ptr, rc);
}

bool cd_release_array(CUarray array, CUresult *rc)
{
    return array && retire(CD_ARRAY, (uintptr_t)array, rc);
}

bool cd_release_mipmapped(CUmipmappedArray array, CUresult *rc)
{
    return array && retire(CD_MIPMAPPED, (uintptr_t)array, rc);
}

bool cd_release_module(CUmodule module, CUresult *rc)
{
    return module && retire(CD_MODULE, (uintptr_t)module, rc);
}

bool cd_release_library(CUlibrary library, CUresult *rc)
{
    return library && retire(CD_LIBRARY, (uintptr_t)library, rc);
}

/* The base of the driver's allocation holding ptr; false when the driver
 * does not know ptr (any more). Does not wait. */
static bool range_start(const struct cd_driver_ops *ops, void *ptr, uintptr_t *base)
{
    CUdeviceptr b = 0;
    if (ops->pointer_get_attribute(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
        return false;
    *base = (uintptr_t)b;
    return true;
}

CUresult cd_unregister_answer(void *ptr, CUresult rc)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (rc != CUDA_ERROR_INVALID_VALUE || !ptr || !cd_enabled() || !ops ||
        !ops->pointer_get_attribute)
        return rc;
    /* The driver knew ptr when it answered. A block the shim holds for the
     * program, or one it held then and has really released since (its
     * record goes only after the driver's release), is one the driver
     * would not know without the shim. */
    static const enum cd_kind classes[] = {CD_DEVICE, CD_HOST, CD_REGISTERED};
    uintptr_t base;
    if (!range_start(ops, ptr, &base))
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (cd_registry_is_retired(classes[i], base))
            return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return range_start(ops, ptr, &base) ? rc : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

void cd_track(enum cd_kind kind, uintptr_t key, size_t bytes, unsigned flags)
{
    if (!cd_enabled() || !key)
        return;
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return;
    struct cd_ctx *cs = cd_ctx_get(ctx);
    struct cd_record *r = cs ? calloc(1, sizeof *r) : NULL;
    if (!r)
        return; /* its release passes through */
    r->kind = kind;
    r->key = key;
    r->bytes = bytes;
    r->flags = flags;
    r->ctx = cs;
    cd_registry_insert(r);
}

static struct cd_ctx *context_of(CUstream stream, bool create)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->stream_get_ctx(stream, &ctx) != CUDA_SUCCESS)
        return NULL;
    return create ? cd_ctx_get(ctx) : cd_ctx_find(ctx);
}

void cd_stream_created(CUstream stream)
{
    struct cd_ctx *cs = cd_enabled() ? context_of(stream, true) : NULL;
    if (cs)
        cd_ctx_stream_add(cs, stream);
}

void cd_stream_destroying(CUstream stream)
{
    cd_capture_stream_gone(stream);
    struct cd_ctx *cs = cd_enabled() ? context_of(stream, false) : NULL;
    if (cs)
        cd_ctx_stream_remove(cs, stream);
}

/* ---- process ----------------------------------------------------------- */

/* A forked child has no CUDA context of its parent's and none of its
 * threads: it starts with empty queues and no waiter. */
static void in_child(void)
{
    cd_contexts_reset();
    cd_registry_reset();
    cd_stats_reset();
    cd_capture_reset();
    cd_waiter_reset();
    cd_primaries_reset();
    atomic_store(&registered_pending, 0);
    pthread_mutex_init(&ranges_lock, NULL);
    nranges = 0;
}

__attribute__((constructor)) static void lifecycle_init(void)
{
    pthread_atfork(NULL, NULL, in_child);
}

__attribute__((destructor)) static void lifecycle_fini(void)
{
    /* A program that never set up a context still reports. */
    cd_stats_report();
}
