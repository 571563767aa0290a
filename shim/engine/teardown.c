/* teardown.c - contexts that go away.
 *
 * Before cuCtxDestroy reaches the driver, the context's slot is closed (uses under way end first; a flush in progress
 * may make this wait for the GPU, as the destruction itself does), and
 * everything held for it is settled while the context still exists:
 *   - device frees in flight and watches end (the destruction completes
 *     them);
 *   - deferred entries are dropped: the destruction frees device, managed
 *     and pinned memory, registrations, arrays and modules (measured on the
 *     H200); each record stays as a TORN tomb, so that a second release of
 *     a dead handle does not reach the driver; libraries, which outlive
 *     contexts, are released for real (this may wait);
 *   - every live record of the context becomes a TORN tomb;
 *   - the private streams and events are destroyed.
 * Nothing is released against a dead context, and nothing is leaked.
 *
 * A primary context's release may or may not be its last, whatever a count
 * would say (a retain made before cudefer was loaded, a green context's
 * reference): the slot is closed around the call, and the driver is asked
 * afterwards. If the context is still active, the slot reopens with
 * everything it held; if not, it is torn down after the fact, without
 * naming the dead context (its private objects died with it). A reset
 * always ends the context, and a green context's destruction releases a
 * reference on its primary context: both take the same way.
 */
#include "engine.h"

#include "array.h"
#include "backends.h"
#include "books.h"
#include "capture.h"
#include "contexts.h"
#include "driver.h"
#include "fence.h"
#include "log.h"
#include "reclaim.h"
#include "registry.h"
#include "retire.h"
#include "stats.h"
#include "waiter.h"

#include <pthread.h>

/* Teardowns begun by this thread whose destruction has not returned, and
 * the devices of the first few (counted in transit for that device). */
#define ENDING_DEVICES 4
static _Thread_local int ending;
static _Thread_local int ending_device[ENDING_DEVICES];

/* Ranges of pending unregisters that this thread's destructions under way
 * undo when they return, each with the depth of its teardown (ending). Till
 * then the driver holds the registration: a registration of those pages
 * from another thread must wait for it as for a queued unregister, not
 * fail with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (tests/race.c
 * race-across). */
static _Thread_local struct held_range {
    uintptr_t lo, hi;
    int depth;
} *held;
static _Thread_local size_t nheld, cap_held;

/* Keeps r's range pending until this thread's destruction returns. False
 * when r holds none, or without memory for it (then it goes at once). */
static bool hold_range(struct cd_record *r)
{
    if (r->kind != CD_REGISTERED || !r->pending ||
        !cd_array_room((void **)&held, &cap_held, nheld + 1, sizeof *held))
        return false;
    cd_books_unregistered_later(r);
    held[nheld++] = (struct held_range){r->key, r->key + r->bytes, ending};
    return true;
}

/* This thread's destruction of depth (ending, counted from 1) has
 * returned, and those it began. */
static void undo_held(int depth)
{
    while (nheld && held[nheld - 1].depth >= depth) {
        nheld--;
        cd_books_range_undone(held[nheld].lo, held[nheld].hi);
    }
    if (!nheld) {
        free(held);
        held = NULL;
        cap_held = 0;
    }
}

/* Settles the entries of a closed slot: dropped where the destruction
 * frees them, released for real otherwise (libraries; may wait). alive:
 * the destruction is still to come (a registration it undoes stays
 * pending till then). */
static void settle_books(struct cd_ctx *c, bool alive)
{
    struct cd_link list;
    cd_list_init(&list);
    cd_books_take_all(c, &CD_TAKE_ALL(CD_ALL_KINDS), NULL, &list);
    while (!cd_list_empty(&list)) {
        struct cd_record *r = CD_CONTAINER(list.next, struct cd_record, age);
        cd_list_remove(&r->age);
        if (alive)
            cd_ctx_event_put(c, r->done);
        r->done = NULL;
        if (!alive || !hold_range(r))
            cd_books_unregistered(r);
        if (cd_backend((enum cd_kind)r->kind)->freed_by_context) {
            atomic_fetch_add(&cd_stats.dropped[r->kind], 1);
            cd_registry_end(r, CD_TORN);
            continue;
        }
        CUresult rc = cd_backend((enum cd_kind)r->kind)->release(r);
        atomic_fetch_add(rc == CUDA_SUCCESS ? &cd_stats.released[r->kind]
                                            : &cd_stats.errors[r->kind], 1);
        if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_DEINITIALIZED)
            cd_log(CD_LOG_ERROR, "release of %s %#lx at its context's teardown failed with "
                   "error %d", cd_kind_name((enum cd_kind)r->kind), (unsigned long)r->key,
                   (int)rc);
        cd_registry_end(r, CD_GONE);
    }
}

/* The kinds a context's destruction frees. */
static unsigned freed_by_context(void)
{
    unsigned mask = 0;
    for (int k = 0; k < CD_KIND_COUNT; k++)
        if (cd_backend((enum cd_kind)k)->freed_by_context)
            mask |= 1u << k;
    return mask;
}

/* Tears down the closed slot c; with alive, its context still exists (and
 * is current), else the driver destroyed it already. */
static void tear(struct cd_ctx *c, bool alive)
{
    CUcontext ctx = atomic_load(&c->handle);
    atomic_fetch_add(&cd_stats.flushes[CD_FLUSH_TEARDOWN], 1);
    cd_waiter_forget(c, alive);
    settle_books(c, alive);
    cd_registry_tear(c, freed_by_context());
    cd_fence_forget(c, alive);
    cd_ctx_release(c, alive);
    cd_log(CD_LOG_INFO, "context %p torn down%s", (void *)ctx, alive ? "" : " after its end");
}

void cd_context_created(CUcontext ctx, bool primary)
{
    /* Fences cover the contexts the engine knows; a context in which the
     * program only launches kernels must be known too. */
    if (cd_engine_on())
        cd_ctx_get_as(ctx, primary);
}

static int ending_device_at(int i)
{
    return i < ENDING_DEVICES ? ending_device[i] : -1;
}

void cd_context_destroying(CUcontext ctx)
{
    if (!cd_engine_on())
        return;
    cd_capture_context_gone(ctx);
    struct cd_ctx *c = cd_ctx_find(ctx);
    if (!c)
        return;
    if (ending < ENDING_DEVICES)
        ending_device[ending] = (int)c->device;
    cd_reclaim_ending(ending_device_at(ending), +1);
    ending++;
    cd_ctx_close(c);
    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, true);
    tear(c, true);
    cd_scope_leave(&sc);
}

void cd_context_destroyed(void)
{
    if (ending > 0) {
        undo_held(ending);
        ending--;
        cd_reclaim_ending(ending_device_at(ending), -1);
    }
}

/* ---- primary and green contexts ---------------------------------------------- */

/* Primary releases, resets and green destructions are made one at a time
 * (the engine's part of them): the slot a call closed is reopened or torn
 * down by the same call. */
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local struct cd_ctx *closed;
static _Thread_local CUdevice closed_device;

/* Closes dev's primary slot before a call that may end the context. */
static void close_primary(CUdevice dev)
{
    pthread_mutex_lock(&primary_lock);
    closed = cd_ctx_primary(dev);
    closed_device = dev;
    if (closed) {
        cd_reclaim_ending((int)dev, +1);
        cd_ctx_close_maybe(closed);
    }
}

/* After the call: reopens the slot if the driver says the context lives,
 * else tears it down after the fact. */
static void settle_primary(void)
{
    struct cd_ctx *c = closed;
    closed = NULL;
    if (c) {
        const struct cd_driver_ops *ops = cd_driver_ops();
        unsigned flags = 0;
        int active = 1;
        if (!ops || ops->primary_get_state(closed_device, &flags, &active) != CUDA_SUCCESS)
            active = 1;
        if (active) {
            cd_ctx_reopen(c);
            /* Registrations waiting for its pending unregisters. */
            cd_books_registered_poke();
            /* Records other contexts' fences marked for it meanwhile can
             * be made now. */
            cd_waiter_see_marks();
        } else {
            /* The program's calls that entered meanwhile end first. */
            cd_ctx_close(c);
            cd_capture_context_gone(atomic_load(&c->handle));
            tear(c, false);
        }
        cd_reclaim_ending((int)closed_device, -1);
    }
    pthread_mutex_unlock(&primary_lock);
}

void cd_primary_ending(CUdevice dev)
{
    if (cd_engine_on())
        close_primary(dev);
    else
        pthread_mutex_lock(&primary_lock);
}

void cd_primary_ended(CUdevice dev)
{
    (void)dev;
    settle_primary();
}

void cd_green_seen(CUgreenCtx green, CUcontext ctx)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!cd_engine_on() || !green || !ctx)
        return;
    struct cd_alias a = {green, ctx, NULL, 0};
    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, false);
    CUresult rc = ops->ctx_get_device(&a.device);
    cd_scope_leave(&sc);
    /* The green context holds a reference on the primary context: a retain
     * and a release of it are not its last. */
    if (rc != CUDA_SUCCESS || ops->primary_retain(&a.primary, a.device) != CUDA_SUCCESS)
        return;
    ops->primary_release(a.device);
    cd_ctx_alias_add(&a);
    cd_ctx_get_as(a.primary, 1);
}

/* The device of a green context the engine did not see converted. */
static bool green_device(CUgreenCtx green, struct cd_alias *a)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!ops->ctx_from_green || ops->ctx_from_green(&a->ctx, green) != CUDA_SUCCESS)
        return false;
    struct cd_scope sc;
    cd_scope_enter(&sc, a->ctx, false);
    CUresult rc = ops->ctx_get_device(&a->device);
    cd_scope_leave(&sc);
    return rc == CUDA_SUCCESS;
}

void cd_green_stream_created(CUgreenCtx green)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!cd_engine_on() || !ops->ctx_from_green || cd_ctx_alias_known(green))
        return;
    if (ops->ctx_from_green(&ctx, green) == CUDA_SUCCESS)
        cd_green_seen(green, ctx);
}

void cd_green_destroying(CUgreenCtx green)
{
    struct cd_alias a;
    if (!cd_engine_on() || (!cd_ctx_alias_remove(green, &a) && !green_device(green, &a))) {
        pthread_mutex_lock(&primary_lock);
        closed = NULL;
        return;
    }
    cd_capture_context_gone(a.ctx);
    close_primary(a.device);
    if (closed)
        cd_fence_owner_ending(closed, a.ctx);
}

void cd_green_destroyed(CUgreenCtx green)
{
    (void)green;
    settle_primary();
}
