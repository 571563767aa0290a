/* teardown.c - what happens to a context's entries when it goes away.
 *
 * Before cuCtxDestroy, the last cuDevicePrimaryCtxRelease or
 * cuDevicePrimaryCtxReset reaches the driver: device frees in flight are
 * forgotten (the destruction completes them), deferred entries whose memory
 * the destruction frees are dropped, the others (registrations, libraries)
 * are released for real, and the shim's own stream and events are destroyed
 * while the context still exists. Nothing is released against a dead
 * context and nothing is leaked.
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

#include <sched.h>
#include <stdlib.h>

/* Device frees already handed to the driver: the context's destruction
 * completes them; their records go. */
static void forget_frees(struct cd_ctx *cs, struct cd_record *list)
{
    int n = 0;
    for (struct cd_record *r = list, *next; r; r = next) {
        next = r->queue_next;
        atomic_fetch_add(&cd_stats.released[r->kind], 1);
        cd_ctx_event_put(cs, r->done);
        cd_finish(r);
        n++;
    }
    cd_frees_done(n);
}

/* Deferred entries: dropped where the teardown frees them (their records
 * stay, TORN, so that a second release of a dead handle does not reach the
 * driver, which crashes on some), released for real otherwise
 * (registrations, libraries). May wait for the GPU. */
static void settle_queue(struct cd_ctx *cs)
{
    for (struct cd_record *r = cd_take_all(&cs->deferred), *next; r; r = next) {
        next = r->queue_next;
        if (cd_backend(r->kind)->freed_by_context) {
            atomic_fetch_add(&cd_stats.dropped[r->kind], 1);
            cd_unbook_deferred(cs, r);
            if (!cd_registry_entomb(r))
                cd_finish(r);
            continue;
        }
        if (r->done)
            cd_driver_ops()->event_synchronize(r->done);
        CUresult rc = cd_backend(r->kind)->release(r);
        atomic_fetch_add(rc == CUDA_SUCCESS ? &cd_stats.released[r->kind]
                                            : &cd_stats.errors[r->kind], 1);
        if (rc != CUDA_SUCCESS)
            cd_log(CD_LOG_ERROR, "release of %s %#lx before teardown failed with error %d",
                   cd_backend(r->kind)->name, (unsigned long)r->key, (int)rc);
        cd_finish_deferred(cs, r);
    }
}

static bool freed_by_context(enum cd_kind kind)
{
    return cd_backend(kind)->freed_by_context;
}

void cd_context_teardown(CUcontext ctx)
{
    cd_capture_context_gone(ctx);
    struct cd_ctx *cs = cd_ctx_find(ctx);
    if (!cs)
        return;
    /* From here on the waiter leaves this context alone, and so do the
     * releases and fences under way once they finish (microseconds). */
    pthread_mutex_lock(&cs->lock);
    atomic_store(&cs->state, CD_CTX_DEAD);
    struct cd_batch *batches = cs->batches;
    cs->batches = NULL;
    pthread_mutex_unlock(&cs->lock);
    while (atomic_load(&cs->users) != 0)
        sched_yield();
    atomic_fetch_add(&cd_stats.flushes[CD_FLUSH_TEARDOWN], 1);

    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, true);
    while (batches) {
        struct cd_batch *next = batches->next;
        cd_ctx_event_put(cs, batches->marker);
        forget_frees(cs, batches->records);
        free(batches);
        batches = next;
    }
    forget_frees(cs, cd_take_all(&cs->inflight));
    settle_queue(cs);
    cd_registry_drop_context(cs, freed_by_context);
    cd_ctx_release_slot(cs);
    cd_scope_leave(&sc);
    cd_log(CD_LOG_INFO, "context %p torn down", (void *)ctx);
}

/* Retains of each device's primary context, to know its last release. */
#define MAX_DEVICES 64
static struct {
    _Atomic int refs;
    _Atomic(CUcontext) ctx;
} primaries[MAX_DEVICES];

void cd_primary_retained(CUdevice dev, CUcontext ctx)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return;
    atomic_fetch_add(&primaries[dev].refs, 1);
    atomic_store(&primaries[dev].ctx, ctx);
    cd_context_created(ctx);
}

void cd_context_created(CUcontext ctx)
{
    /* Fences cover the contexts the shim knows; a context in which the
     * program only launches kernels (from a library loaded with no
     * context) must be known too. */
    if (cd_enabled())
        cd_ctx_get(ctx);
}

void cd_primary_releasing(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEVICES || !cd_enabled())
        return;
    /* A release the shim did not see retained counts as the last one:
     * tearing down early only costs a wait, never a leak. */
    if (atomic_fetch_sub(&primaries[dev].refs, 1) <= 1) {
        atomic_store(&primaries[dev].refs, 0);
        cd_context_teardown(atomic_load(&primaries[dev].ctx));
    }
}

void cd_primary_resetting(CUdevice dev)
{
    if (dev < 0 || dev >= MAX_DEVICES || !cd_enabled())
        return;
    atomic_store(&primaries[dev].refs, 0);
    cd_context_teardown(atomic_load(&primaries[dev].ctx));
}

void cd_primaries_reset(void)
{
    for (int i = 0; i < MAX_DEVICES; i++) {
        atomic_store(&primaries[i].refs, 0);
        atomic_store(&primaries[i].ctx, NULL);
    }
}
