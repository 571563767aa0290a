/* retire.c - the caller's path of every release.
 *
 * A release is retired on the caller's thread: its record is found, fenced
 * behind all work already submitted (fence.c), and either freed through the
 * driver's stream-ordered free (device memory, settled by the waiter) or
 * deferred on its context's books. Nothing on that path waits for the GPU,
 * past the limits too, with one exception: a registration's release waits
 * for the work submitted before it (the pages are the program's again).
 */
#include "engine.h"
#include "retire.h"

#include "backends.h"
#include "books.h"
#include "capture.h"
#include "clock.h"
#include "contexts.h"
#include "driver.h"
#include "fence.h"
#include "log.h"
#include "nvtx.h"
#include "options.h"
#include "registry.h"
#include "stats.h"
#include "waiter.h"

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

/* The driver's own call releases r: its record ends (a handle keeps a
 * tomb, so that a second release does not reach the driver). */
static bool pass_through(struct cd_record *r, const char *why)
{
    cd_log(CD_LOG_DEBUG, "%s %#lx: the driver's own release (%s)",
           cd_kind_name((enum cd_kind)r->kind), (unsigned long)r->key, why);
    atomic_fetch_add(&cd_stats.passed[r->kind], 1);
    cd_registry_end(r, CD_GONE);
    return false;
}

/* Beyond CUDEFER_MAX_DEFERRED_BYTES or _ENTRIES the release is deferred all
 * the same: the driver's own call would wait for every kernel of the
 * context. The limits are soft: what a context holds past them goes back
 * at the next flush point (cuCtxSynchronize, cudefer_flush, an allocation
 * short of memory, the context's end), and reuse serves allocations of the
 * same sizes meanwhile. Counted, and said once at level info. */
static void note_over_limit(struct cd_ctx *c, const struct cd_record *r)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    atomic_fetch_add(&cd_stats.over_limit[r->kind], 1);
    if (!atomic_flag_test_and_set(&said))
        cd_log(CD_LOG_INFO, "context %p holds more released memory than "
               "CUDEFER_MAX_DEFERRED_BYTES or _ENTRIES allow: releases go on without waiting, "
               "and what is held goes back at the next flush point",
               (void *)atomic_load(&c->handle));
}

void cd_retire_drop_event(struct cd_ctx *c, struct cd_record *r)
{
    cd_ctx_event_put(c, r->done);
    r->done = NULL;
    r->far = 0;
    r->word = 0;
}

/* A release made while the work before it still runs would have waited in
 * the driver: a managed block's releasing thread is noted (a later
 * allocation of its size by that thread may wait instead, cache.c); and
 * where the statistics are shown, the release is counted and watched until
 * that work ends (waiter.c). Otherwise a release of another kind asks
 * nothing: the query, and the watch's own, would cost every release made
 * while the GPU runs behind for a figure nobody reads. */
static void note_saving(struct cd_ctx *c, struct cd_record *r)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    r->debtor = 0;
    bool gathered = cd_stats_gathered();
    if (r->kind != CD_MANAGED && !gathered)
        return;
    if (!r->done || ops->event_query(r->done) != CUDA_ERROR_NOT_READY)
        return;
    if (r->kind == CD_MANAGED)
        r->debtor = cd_thread_token();
    if (!gathered)
        return;
    atomic_fetch_add(&cd_stats.would_wait[r->kind], 1);
    cd_waiter_watch(c, (enum cd_kind)r->kind);
}

void cd_retire_free(struct cd_ctx *c, CUstream stream, struct cd_link *records)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_link issued;
    long long n = 0;
    cd_list_init(&issued);
    while (!cd_list_empty(records)) {
        struct cd_record *r = CD_CONTAINER(records->next, struct cd_record, age);
        cd_list_remove(&r->age);
        /* The fence may be a record the stream did not wait for (fence.h). */
        CUresult rc = r->done ? ops->stream_wait_event(stream, r->done, 0) : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS)
            rc = ops->mem_free_async((CUdeviceptr)r->key, stream);
        if (rc != CUDA_SUCCESS) {
            cd_log(CD_LOG_DEBUG, "cuMemFreeAsync of %#lx: error %d; kept", (unsigned long)r->key,
                   (int)rc);
            cd_books_defer(c, r);
            continue;
        }
        cd_retire_drop_event(c, r);
        cd_list_append(&issued, &r->age);
        n++;
    }
    cd_waiter_add(c, &issued, n);
}

/* The device cache's bytes and count of blocks in c: CUDEFER_DEVICE_CACHE
 * (and its count, CD_CACHE_BLOCKS or one a MiB), or how far the program's
 * device memory in c is below CUDEFER_DEVICE_CACHE_PEAK percent of its
 * peaks, whichever is more. A training step that releases its activations
 * and allocates them again in the next step is then served from the cache
 * however many and large they are, and the context never holds more than
 * that percentage of what the program once held itself (100: no more; the
 * default 200 leaves room for blocks the GPU has not finished with). */
static void cache_limits(struct cd_ctx *c, long long *bytes, long long *blocks)
{
    *bytes = cd_option_int(CD_OPT_DEVICE_CACHE);
    *blocks = *bytes >> 20 > CD_CACHE_BLOCKS ? *bytes >> 20 : CD_CACHE_BLOCKS;
    long long percent = cd_option_int(CD_OPT_DEVICE_CACHE_PEAK);
    if (*bytes && percent) {
        long long room, count;
        cd_books_below_peak(c, percent, &room, &count);
        if (room > *bytes)
            *bytes = room;
        if (count > *blocks)
            *blocks = count;
    }
}

/* After a device release: over the cache's limits the waiter evicts, off
 * the program's thread (measured on an H200, bench/RESULTS.md: 2,000
 * releases in a row that evicted on the caller's thread cost +1,189 ns
 * each over the driver's call, +664 ns with a cache that evicted nothing).
 * A quarter past them (the waiter falls behind, or a cache of 0) the
 * release evicts itself, so that the cache stays bounded. */
static void evict_after_release(struct cd_ctx *c)
{
    long long limit, blocks;
    cache_limits(c, &limit, &blocks);
    if (!cd_books_over_cache(c, limit, blocks))
        return;
    if (!cd_books_over_cache(c, limit + limit / 4, blocks + blocks / 4) || cd_retire_evict(c))
        cd_waiter_poke();
}

void cd_retire_grown(struct cd_ctx *c)
{
    long long limit, blocks;
    cache_limits(c, &limit, &blocks);
    if (cd_books_over_cache(c, limit, blocks))
        cd_waiter_poke();
}

bool cd_retire_evict(struct cd_ctx *c)
{
    long long limit, blocks;
    cache_limits(c, &limit, &blocks);
    if (!cd_books_over_cache(c, limit, blocks))
        return false;
    if (!cd_gate_enter())
        return true;
    struct cd_link list;
    cd_list_init(&list);
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), false);
    /* Down to three quarters, so that one walk serves many releases; only
     * blocks whose other contexts' records have passed. */
    uint64_t far = cd_fence_far_floor(c);
    /* In transit until the waiter has them (cd_retire_free). */
    cd_books_transit(c->device, 1);
    if (cd_books_take_over_cache(c, limit / 4 * 3, blocks / 4 * 3, far, &list))
        cd_retire_free(c, c->priv, &list);
    cd_books_transit(c->device, -1);
    cd_scope_leave(&sc);
    cd_gate_exit();
    return cd_books_over_cache(c, limit, blocks);
}

/* The context has a sticky error: nothing can be released in it any more,
 * and its destruction frees everything. r stays on the books, unfenced, for
 * the teardown; the caller gets the error the driver's own call gives. */
static bool keep_for_teardown(struct cd_ctx *c, struct cd_record *r, CUresult why, CUresult *rc)
{
    cd_retire_drop_event(c, r);
    cd_books_defer(c, r);
    if (!atomic_exchange(&c->sticky, true))
        cd_log(CD_LOG_ERROR, "context %p has error %d: its %zu queued releases are kept until "
               "its destruction, which frees them", (void *)atomic_load(&c->handle), (int)why,
               cd_books_entries(c));
    *rc = why;
    return true;
}

/* Fences r in c (cd_fence): a kind a reuse can serve also takes a number
 * of c's word. Inside the capture gate. Does not wait. */
static CUresult fence_record(struct cd_ctx *c, struct cd_record *r)
{
    bool reusable = cd_backend((enum cd_kind)r->kind)->reusable;
    return cd_fence(c, &r->done, &r->far, reusable ? &r->word : NULL);
}

/* Fences r (unless a capture is live) and puts it where it belongs: freed,
 * or deferred. Called with c entered. Does not wait. */
static bool fence_and_place(struct cd_ctx *c, struct cd_record *r, CUresult *rc)
{
    const struct cd_backend *b = cd_backend((enum cd_kind)r->kind);
    CUresult frc = CUDA_SUCCESS;
    bool fenced = false;
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), false);
    if (cd_gate_enter()) {
        frc = fence_record(c, r);
        fenced = frc == CUDA_SUCCESS;
        if (fenced)
            note_saving(c, r);
        /* A context that kept walks out got a mark to be recorded later:
         * the waiter does it. */
        if (r->far)
            cd_waiter_see_marks();
        cd_gate_exit();
    }
    cd_scope_leave(&sc);
    if (is_sticky(frc))
        return keep_for_teardown(c, r, frc, rc);
    if (frc != CUDA_SUCCESS) {
        cd_retire_drop_event(c, r);
        /* After the driver's deinitialisation at exit every call fails:
         * the driver's own answer, quietly. */
        if (frc != CUDA_ERROR_DEINITIALIZED)
            cd_log(CD_LOG_ERROR, "cannot fence a %s release (error %d): the driver releases it",
                   cd_kind_name((enum cd_kind)r->kind), (int)frc);
        return pass_through(r, "no fence");
    }
    atomic_fetch_add(&cd_stats.deferred[r->kind], 1);
    cd_log(CD_LOG_DEBUG, "%s %#lx deferred%s", cd_kind_name((enum cd_kind)r->kind),
           (unsigned long)r->key, fenced ? "" : " (a capture is live: fenced when it ends)");
    bool free_now = b->stream_ordered && fenced &&
                    (atomic_load(&r->no_reuse) || cd_option_int(CD_OPT_DEVICE_CACHE) == 0);
    /* Not before the other contexts' records have passed (fence.h): until
     * then it waits on the books, and the waiter frees it (cd_retire_evict). */
    if (free_now && cd_gate_enter()) {
        free_now = cd_fence_far_passed(c, r->far);
        if (free_now) {
            struct cd_link one;
            cd_list_init(&one);
            cd_list_append(&one, &r->age);
            cd_retire_free(c, c->priv, &one);
        }
        cd_gate_exit();
    } else {
        free_now = false;
    }
    if (!free_now) {
        cd_books_defer(c, r);
        if (b->stream_ordered)
            evict_after_release(c);
    }
    /* The last capture may have ended between the gate's answer and the
     * deferral, after it fenced what was deferred (cd_retire_backlog): then
     * this entry is fenced here. Either the capture's end sees it on the
     * books, or this sees no capture live. */
    if (!fenced && !cd_capture_live())
        cd_retire_backlog();
    *rc = CUDA_SUCCESS;
    return true;
}

/* A registration's release: the pages are the program's once it returns,
 * so it WAITS until the work submitted before it has finished (not for work
 * submitted after it, and holding nothing another thread needs: other
 * threads' launches go on): its own context's, and for at most
 * CD_FAR_GIVE_UP_NS more the other contexts'. Their kernels can write a
 * context's registered pages, PORTABLE or not, and the driver's own
 * unregister does not wait for them: it returned in 0.2 ms beside another
 * context's kernel writing the pages, which then faulted (bench/RESULTS.md,
 * run 95); one of them may wait for this very thread (the GPU check
 * hidden-wait, case register-over: this waited for it for ever). The
 * driver's own unregister, which would wait for everything and stall every
 * launch, is deferred; it is made at once when the other contexts' work
 * has not ended by then, or a live capture keeps another context's record
 * of the fence from being made (5 ms after the rest of the fence passed):
 * it waits for its own context's work and unmaps the pages, so that
 * another context's kernel that still uses them faults rather than
 * writing pages the program has back, as without cudefer. */
static bool unregister_after_work(struct cd_ctx *c, struct cd_record *r, CUresult *rc)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), false);
    CUresult frc = CUDA_ERROR_NOT_READY;
    if (cd_gate_enter()) {
        frc = cd_fence_for_host(c, &r->done, &r->far);
        cd_gate_exit();
    }
    cd_scope_leave(&sc);
    /* The wait below is for the records it may have marked
     * (tests/test_scenarios.c,
     * unregister_beside_a_release_waiting_for_a_flush_returns). */
    if (frc == CUDA_SUCCESS && r->far)
        cd_waiter_see_marks();
    if (frc != CUDA_SUCCESS) {
        /* A live capture, or an error: the driver's own call. */
        cd_retire_drop_event(c, r);
        return pass_through(r, "a live capture or an error");
    }
    /* In the relaxed capture mode: a capture another thread starts meanwhile
     * is not invalidated by this wait. */
    struct cd_scope relaxed;
    cd_scope_enter(&relaxed, NULL, true);
    uint64_t t0 = cd_now_ns();
    enum cd_far_wait far = CD_FAR_PASSED;
    if (cd_fence_query(c, r->done, r->far) == CUDA_ERROR_NOT_READY) {
        atomic_fetch_add(&cd_stats.would_wait[CD_REGISTERED], 1);
        cd_range_push("cudefer: unregister waits for the work before it");
        ops->event_synchronize(r->done);
        far = cd_fence_far_wait(c, r->far, cd_now_ns() + CD_FAR_GIVE_UP_NS);
        cd_range_pop();
        atomic_fetch_add(&cd_stats.unregister_waits, 1);
        atomic_fetch_add(&cd_stats.unregister_wait_ns, cd_now_ns() - t0);
    }
    cd_scope_leave(&relaxed);
    if (far != CD_FAR_PASSED) {
        /* Work of another context still running, or a record of one that a
         * live capture or the context's end keeps from being made (the
         * thread that captures may be waiting for this one): the driver's
         * own unregister. */
        atomic_fetch_add(&cd_stats.unregister_passed, 1);
        cd_retire_drop_event(c, r);
        return pass_through(r, "another context's part of its fence did not pass in 5 ms");
    }
    atomic_fetch_add(&cd_stats.deferred[CD_REGISTERED], 1);
    cd_books_defer(c, r);
    *rc = CUDA_SUCCESS;
    return true;
}

/* Whether the current context, if any, is alive: one the engine knows is;
 * another one is asked (a call that does not wait). */
static bool current_context_usable(const struct cd_driver_ops *ops)
{
    CUcontext cur = NULL;
    unsigned version;
    if (ops->ctx_get_current(&cur) != CUDA_SUCCESS)
        return false;
    return !cur || cd_ctx_find(cur) || ops->ctx_get_api_version(cur, &version) == CUDA_SUCCESS;
}

/* A release within its context, entered. */
static bool place(struct cd_ctx *c, struct cd_record *r, CUresult *rc)
{
    if (!cd_books_room(c, r))
        note_over_limit(c, r);
    if (r->kind == CD_REGISTERED && cd_option_int(CD_OPT_REGISTERED) == CD_REGISTERED_WAIT)
        return unregister_after_work(c, r, rc);
    return fence_and_place(c, r, rc);
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

/* A memory tomb at key (its context's destruction freed the block there)
 * is stale when the driver has since handed the address out again through
 * a call cudefer does not see (cuExternalMemoryGetMappedBuffer,
 * cuMemPoolImportPointer): the driver knows key as an allocation's start.
 * Then the tomb goes, and the release is the driver's. Does not wait. */
static bool stale_tomb(const struct cd_driver_ops *ops, enum cd_kind cls, uintptr_t key)
{
    uintptr_t base;
    if ((cls != CD_DEVICE && cls != CD_HOST) || !ops->pointer_get_attribute ||
        !range_start(ops, (void *)key, &base) || base != key)
        return false;
    cd_books_forget(cls, key);
    cd_log(CD_LOG_DEBUG, "%s %#lx: the driver handed the address of a destroyed context's block "
           "out again; its own release", cd_kind_name(cls), (unsigned long)key);
    return true;
}

static bool retire(enum cd_kind cls, uintptr_t key, CUresult *rc)
{
    if (!key || !cd_engine_on())
        return false;
    const struct cd_driver_ops *ops = cd_driver_ops();
    /* No current context is needed (the record names the context); a
     * destroyed current context gets the driver's own answer. Libraries
     * need no context at all. */
    if (cls != CD_LIBRARY && !current_context_usable(ops))
        return false;
    struct cd_record *r = NULL;
    switch (cd_registry_retire(cls, key, &r)) {
    case CD_NOT_FOUND:
        cd_log(CD_LOG_DEBUG, "%s %#lx: not tracked, the driver's own release", cd_kind_name(cls),
               (unsigned long)key);
        atomic_fetch_add(&cd_stats.passed[cls], 1);
        return false;
    case CD_WAS_TORN:
        /* A registration's tomb is an address of the program's pages: a
         * registration or pinned block made since may cover it without
         * starting there, which the driver then answers otherwise
         * (INVALID_VALUE): its own call answers. */
        *rc = cd_backend(cls)->torn_release;
        if (*rc != CUDA_SUCCESS && stale_tomb(ops, cls, key)) {
            atomic_fetch_add(&cd_stats.passed[cls], 1);
            return false;
        }
        return *rc != CUDA_SUCCESS;
    case CD_WAS_GONE:
    case CD_ALREADY_RETIRED:
        cd_log(CD_LOG_DEBUG, "%s %#lx released twice", cd_kind_name(cls), (unsigned long)key);
        *rc = cd_backend(cls)->double_release;
        return true;
    case CD_RETIRED_NOW:
        break;
    }
    struct cd_ctx *c = r->ctx;
    /* A library names no context: its use of the slot is not the
     * program's, and is entered as a walk (contexts.h). */
    bool library = r->kind == CD_LIBRARY;
    bool walk = library;
    bool entered = c && (library ? cd_ctx_enter_walk(c, r->gen) : cd_ctx_enter_own(c, r->gen));
    if (!entered && library) {
        /* A library outlives the context it was loaded in, or its slot
         * keeps walks out for a moment (MAY_END: another thread releases
         * that primary context): its release is kept in another context
         * that lives (the fence covers every context). When there is none
         * (one context, the common case), the thread's current context
         * serves, entered for this call as the program's own: a binding
         * that names a context that ended finds its slot closed. */
        unsigned gen;
        c = cd_ctx_adopt(&gen);
        entered = c != NULL;
        if (!entered && (c = cd_ctx_current()) != NULL) {
            entered = cd_ctx_enter_any(c, &gen);
            walk = false;
        }
        if (entered)
            cd_registry_move(r, c, gen);
    }
    if (!entered)
        return pass_through(r, "its context has ended or is ending");
    if (r->kind == CD_DEVICE)
        cd_books_live(c, r->bytes, -1);
    bool took = false;
    if (!cd_backend_on((enum cd_kind)r->kind))
        took = pass_through(r, "its kind is off");
    else
        took = place(c, r, rc);
    if (walk)
        cd_ctx_exit_walk(c);
    else
        cd_ctx_exit(c);
    return took;
}

bool cd_release(enum cd_kind cls, uintptr_t key, CUresult *rc)
{
    return retire(cls, key, rc);
}

void cd_release_passed(void)
{
    if (cd_engine_on())
        cd_registry_note_returned();
}

/* ---- the backlog of a capture ------------------------------------------------ */

static void fence_backlog(struct cd_ctx *c, void *arg)
{
    (void)arg;
    struct cd_link list;
    cd_list_init(&list);
    /* In transit until back on the books (holds_anything in reclaim.c). */
    cd_books_transit(c->device, 1);
    if (!cd_books_take_unfenced(c, &list)) {
        cd_books_transit(c->device, -1);
        return;
    }
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&c->handle), false);
    while (!cd_list_empty(&list)) {
        struct cd_record *r = CD_CONTAINER(list.next, struct cd_record, age);
        cd_list_remove(&r->age);
        if (!atomic_load(&c->sticky) && cd_gate_enter()) {
            if (fence_record(c, r) != CUDA_SUCCESS)
                cd_retire_drop_event(c, r);
            cd_gate_exit();
        }
        cd_books_defer(c, r);
    }
    cd_scope_leave(&sc);
    cd_books_transit(c->device, -1);
    cd_waiter_see_marks();
    cd_retire_evict(c);
}

void cd_retire_backlog(void)
{
    if (cd_engine_on())
        cd_ctx_each(fence_backlog, NULL);
}

/* ---- answers and other ends ------------------------------------------------------ */

CUresult cd_unregister_answer(void *ptr, CUresult rc)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (rc != CUDA_ERROR_INVALID_VALUE || !ptr || !cd_engine_on() || !ops->pointer_get_attribute)
        return rc;
    /* The driver knew ptr when it answered. A block the engine holds for
     * the program, or one it held then and has really released since (its
     * record goes only after the driver's release), is one the driver would
     * not know without cudefer. */
    static const enum cd_kind classes[] = {CD_DEVICE, CD_HOST, CD_REGISTERED};
    uintptr_t base;
    if (!range_start(ops, ptr, &base))
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (cd_registry_is_retired(classes[i], base))
            return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return range_start(ops, ptr, &base) ? rc : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

bool cd_free_async(CUdeviceptr ptr, CUresult *rc)
{
    if (!ptr || !cd_engine_on() || !cd_registry_is_retired(CD_DEVICE, (uintptr_t)ptr))
        return false;
    /* The program released it already (cudefer holds it): the driver's
     * answer for freed memory, measured. */
    *rc = CUDA_ERROR_INVALID_VALUE;
    return true;
}

void cd_free_async_done(CUdeviceptr ptr)
{
    if (ptr && cd_engine_on())
        cd_books_forget(CD_DEVICE, (uintptr_t)ptr);
}

/* Marks the LIVE block that starts at key, of any reusable kind; its size,
 * or 0 when cudefer tracks none there. */
static size_t bar_reuse(uintptr_t key)
{
    size_t bytes = cd_registry_bar_reuse(CD_DEVICE, key); /* managed memory too */
    return bytes ? bytes : cd_registry_bar_reuse(CD_HOST, key);
}

/* The most blocks one call marks: a range over more is the program's
 * mistake, which the driver has already answered. */
#define ALTERED_BLOCKS_MAX 64

void cd_block_altered(CUdeviceptr ptr, size_t bytes)
{
    if (!ptr || !cd_engine_on())
        return;
    const struct cd_driver_ops *ops = cd_driver_ops();
    uintptr_t at = (uintptr_t)ptr;
    uintptr_t end = bytes && at + bytes > at ? at + bytes : at + 1;
    for (int i = 0; at < end && i < ALTERED_BLOCKS_MAX; i++) {
        size_t size = bar_reuse(at);
        if (size) {
            at += size;
            continue;
        }
        /* Inside a block, or not one of cudefer's. */
        uintptr_t base;
        size_t span = 0;
        if (!ops->pointer_get_attribute || !range_start(ops, (void *)at, &base) ||
            ops->pointer_get_attribute(&span, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                       (CUdeviceptr)at) != CUDA_SUCCESS ||
            base > at || base + span <= at)
            return;
        if (base != at)
            bar_reuse(base);
        at = base + span;
    }
}

void cd_alloc_untracked(uintptr_t key)
{
    if (key && cd_engine_on())
        cd_books_forget(CD_DEVICE, key);
}
