/* reclaim.c - where deferred releases really happen, and reuse.
 *
 * Flush points are moments where waiting is what the program does anyway:
 * an allocation that failed (released, then retried once), cuCtxSynchronize,
 * cudefer_flush(), the next allocation of a context over its limits, a
 * registration that overlaps a queued unregister. A flush takes the queue
 * whole and holds no lock while the driver waits, so other threads' releases,
 * allocations and launches carry on.
 *
 * Before any of that, an allocation may be served by a released block whose
 * fence has passed (pinned host and managed memory), with no driver call.
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

#include <time.h>

/* Really releases the entries of cs's queue whose kind is in mask, oldest
 * first; with wait_frees, also waits until the device frees in flight are
 * done, so that their memory is back with the driver. MAY WAIT for the GPU.
 * Holds no lock meanwhile: the queue was taken whole, and other threads push
 * onto a new one. Returns whether there was anything to do. */
static bool flush_context(struct cd_ctx *cs, enum cd_flush_reason why, unsigned mask,
                          bool wait_frees)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_record *list = cd_take_all(&cs->deferred);
    bool frees = wait_frees && cd_frees_pending() > 0;
    if (!list && !frees)
        return false;
    atomic_fetch_add(&cd_stats.flushes[why], 1);

    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&cs->handle), true);
    if (frees)
        ops->stream_synchronize(cs->priv);
    struct cd_record *keep = NULL;
    int released = 0, failed = 0;
    for (struct cd_record *r = list, *next; r; r = next) {
        next = r->queue_next;
        if (!(mask & (1u << r->kind))) {
            r->queue_next = keep;
            keep = r;
            continue;
        }
        /* The driver's release waits for its own context only; the fence
         * also covers kernels of other contexts (peer access). */
        if (r->done)
            ops->event_synchronize(r->done);
        CUresult rc = cd_backend(r->kind)->release(r);
        if (rc != CUDA_SUCCESS) {
            cd_log(CD_LOG_ERROR, "deferred release of %s %#lx failed with error %d",
                   cd_backend(r->kind)->name, (unsigned long)r->key, (int)rc);
            atomic_fetch_add(&cd_stats.errors[r->kind], 1);
            failed++;
        } else {
            atomic_fetch_add(&cd_stats.released[r->kind], 1);
            released++;
        }
        cd_finish_deferred(cs, r);
    }
    cd_scope_leave(&sc);
    cd_push_all(&cs->deferred, keep);
    cd_log(CD_LOG_INFO, "flush (%s) of context %p: %d released, %d failed",
           cd_flush_reason_name(why), (void *)atomic_load(&cs->handle), released, failed);
    return true;
}

static bool flush_all(enum cd_flush_reason why, unsigned mask, bool wait_frees)
{
    bool any = false;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load(&cd_contexts[i].state) == CD_CTX_READY)
            any |= flush_context(&cd_contexts[i], why, mask, wait_frees);
    return any;
}

int cd_flush_all(void)
{
    if (cd_enabled() && cd_driver_ops())
        flush_all(CD_FLUSH_EXPLICIT, CD_ALL_KINDS, true);
    return 0;
}

void cd_context_synchronized(CUcontext ctx)
{
    if (!cd_enabled())
        return;
    struct cd_ctx *cs = ctx ? cd_ctx_find(ctx) : cd_ctx_current();
    if (cs)
        flush_context(cs, CD_FLUSH_SYNC, CD_ALL_KINDS, false);
}

void cd_alloc_begin(void)
{
    if (!cd_enabled())
        return;
    struct cd_ctx *cs = cd_ctx_current();
    if (cs && atomic_exchange(&cs->over_limit, false))
        flush_context(cs, CD_FLUSH_LIMIT, CD_ALL_KINDS, false);
}

bool cd_alloc_failed(CUresult rc, const char *call)
{
    if (rc != CUDA_ERROR_OUT_OF_MEMORY || !cd_enabled() || !cd_driver_ops())
        return false;
    if (!flush_all(CD_FLUSH_OOM, CD_ALL_KINDS, true))
        return false;
    atomic_fetch_add(&cd_stats.retries, 1);
    cd_log(CD_LOG_INFO, "%s ran out of memory: released the queue, retrying", call);
    return true;
}

/* Candidates looked at per allocation, newest first. Of those that match,
 * only the oldest is queried: fences complete in the order of the private
 * stream, so when it has not passed, the newer ones have not either. */
#define REUSE_SCAN 64

bool cd_reuse(enum cd_kind kind, size_t bytes, unsigned flags, uintptr_t *key)
{
    if (!cd_enabled() || !cd_backend(kind)->reusable || !cd_option_bool(cd_backend(kind)->option))
        return false;
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_ctx *cs = ops ? cd_ctx_current() : NULL;
    /* An event query during a capture would invalidate it. */
    if (!cs || atomic_load(&cs->deferred_entries) == 0 || !cd_fence_enter())
        return false;
    /* Taken whole, like a flush (a flush meanwhile finds it empty, and the
     * entries again later); only the first REUSE_SCAN are looked at. */
    struct cd_record *list = atomic_exchange_explicit(&cs->deferred, NULL, memory_order_acquire);
    struct cd_record **link = &list, **oldest = NULL, *hit = NULL;
    for (int n = 0; *link && n < REUSE_SCAN; n++, link = &(*link)->queue_next) {
        const struct cd_record *r = *link;
        if (r->kind == kind && r->bytes == bytes && r->flags == flags && r->done)
            oldest = link;
    }
    if (oldest && ops->event_query((*oldest)->done) == CUDA_SUCCESS) {
        hit = *oldest;
        *oldest = hit->queue_next;
    }
    cd_push_list(&cs->deferred, list);
    cd_fence_exit();
    if (!hit)
        return false;
    cd_unbook_deferred(cs, hit);
    cd_registry_unretire(hit);
    atomic_fetch_add(&cd_stats.reused[kind], 1);
    cd_log(CD_LOG_DEBUG, "%s %#lx reused", cd_backend(kind)->name, (unsigned long)hit->key);
    *key = hit->key;
    return true;
}

/* Releases the queued unregisters overlapping [lo, hi). One may be out of
 * the queue for a moment, in another thread's flush, reuse or eviction: it
 * is then released there, or put back and released here. MAY WAIT (for
 * that flush, which may wait for the GPU). Gives up after 10 s. */
static bool release_overlapping(uintptr_t lo, uintptr_t hi)
{
    bool any = false;
    for (int round = 0; cd_registered_overlap(lo, hi); round++) {
        any |= flush_all(CD_FLUSH_REGISTER, 1u << CD_REGISTERED, false);
        if (!cd_registered_overlap(lo, hi))
            break;
        if (round == 100000) {
            cd_log(CD_LOG_ERROR, "a queued unregister of %#lx stays out of reach",
                   (unsigned long)lo);
            break;
        }
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
    return any;
}

void cd_before_register(void *ptr, size_t bytes)
{
    if (!cd_enabled() || cd_registered_pending() == 0)
        return;
    release_overlapping((uintptr_t)ptr, (uintptr_t)ptr + bytes);
}

bool cd_register_failed(CUresult rc, void *ptr, size_t bytes)
{
    if (rc != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || !cd_enabled() ||
        cd_registered_pending() == 0)
        return false;
    /* The range may differ from the queued one only in its pages. */
    uintptr_t lo = (uintptr_t)ptr & ~(uintptr_t)4095, hi = (uintptr_t)ptr + bytes + 4095;
    bool any = release_overlapping(lo, hi & ~(uintptr_t)4095);
    return flush_all(CD_FLUSH_REGISTER, 1u << CD_REGISTERED, false) || any;
}
