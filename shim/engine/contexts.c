/* contexts.c - context slots: the table, lifetime, private objects, green
 * context aliases, spare events, and the scope of the engine's own calls. */
#include "contexts.h"

#include "array.h"
#include "driver.h"
#include "log.h"
#include "options.h"
#include "stats.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Slots come in chunks that are never freed. 65,536 contexts at a time are
 * far more than a process can create; past that a context's releases pass
 * through, and that is logged once. */
#define CHUNK 64
#define MAX_CHUNKS 1024
static struct cd_ctx *_Atomic chunks[MAX_CHUNKS];
static _Atomic int nslots;
static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_flag full_logged = ATOMIC_FLAG_INIT;

/* Spare events made when a context is first seen, so that releases rarely
 * create one. */
#define PREFILL_EVENTS 16

static struct cd_ctx *slot(int i)
{
    return &atomic_load_explicit(&chunks[i / CHUNK], memory_order_acquire)[i % CHUNK];
}

bool cd_ctx_every(const struct cd_ctx *skip, bool (*fn)(struct cd_ctx *c, bool entered, void *arg),
                  void *arg)
{
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++) {
        struct cd_ctx *c = slot(i);
        if (c == skip)
            continue;
        atomic_fetch_add(&c->walkers, 1);
        bool entered = atomic_load(&c->state) == CD_CTX_READY && cd_ctx_enter(c, atomic_load(&c->gen));
        if (!entered)
            atomic_fetch_sub(&c->walkers, 1);
        bool go = fn(c, entered, arg);
        if (entered)
            cd_ctx_exit_walk(c);
        if (!go)
            return false;
    }
    return true;
}

struct each {
    void (*fn)(struct cd_ctx *c, void *arg);
    void *arg;
};

/* The engine's own walk visits READY slots only (not one that MAY_END). */
static bool each_ready(struct cd_ctx *c, bool entered, void *arg)
{
    struct each *e = arg;
    if (entered)
        e->fn(c, e->arg);
    return true;
}

void cd_ctx_each(void (*fn)(struct cd_ctx *c, void *arg), void *arg)
{
    struct each e = {fn, arg};
    cd_ctx_every(NULL, each_ready, &e);
}

bool cd_ctx_alone(const struct cd_ctx *c)
{
    return atomic_load(&nslots) == 1 && slot(0) == c;
}

struct adopt {
    struct cd_ctx *c;
    unsigned gen;
};

/* Counted as a walk (until cd_ctx_exit_walk): the slot is not one the
 * program named, so a primary release waits for this use as for the
 * engine's walks. */
static void adopt_first(struct cd_ctx *c, void *arg)
{
    struct adopt *a = arg;
    if (a->c)
        return;
    a->gen = atomic_load(&c->gen);
    if (cd_ctx_enter_walk(c, a->gen))
        a->c = c;
}

bool cd_ctx_enter_walk(struct cd_ctx *c, unsigned gen)
{
    atomic_fetch_add(&c->walkers, 1);
    if (cd_ctx_enter(c, gen))
        return true;
    atomic_fetch_sub(&c->walkers, 1);
    return false;
}

void cd_ctx_exit_walk(struct cd_ctx *c)
{
    cd_ctx_exit(c);
    atomic_fetch_sub(&c->walkers, 1);
}

struct cd_ctx *cd_ctx_adopt(unsigned *gen)
{
    struct adopt a = {NULL, 0};
    cd_ctx_each(adopt_first, &a);
    *gen = a.gen;
    return a.c;
}

/* ---- green context aliases ------------------------------------------------ */

static pthread_mutex_t alias_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cd_alias *aliases;
static size_t naliases, cap_aliases;
static _Atomic size_t live_aliases;

void cd_ctx_alias_add(const struct cd_alias *a)
{
    pthread_mutex_lock(&alias_lock);
    for (size_t i = 0; i < naliases; i++) {
        if (aliases[i].green == a->green) {
            pthread_mutex_unlock(&alias_lock);
            return;
        }
    }
    if (cd_array_room((void **)&aliases, &cap_aliases, naliases + 1, sizeof *aliases)) {
        aliases[naliases++] = *a;
        atomic_store(&live_aliases, naliases);
    }
    pthread_mutex_unlock(&alias_lock);
}

bool cd_ctx_alias_known(CUgreenCtx g)
{
    bool found = false;
    pthread_mutex_lock(&alias_lock);
    for (size_t i = 0; i < naliases && !found; i++)
        found = aliases[i].green == g;
    pthread_mutex_unlock(&alias_lock);
    return found;
}

bool cd_ctx_alias_remove(CUgreenCtx g, struct cd_alias *a)
{
    bool found = false;
    pthread_mutex_lock(&alias_lock);
    for (size_t i = 0; i < naliases && !found; i++) {
        if (aliases[i].green == g) {
            *a = aliases[i];
            aliases[i] = aliases[--naliases];
            found = true;
        }
    }
    atomic_store(&live_aliases, naliases);
    pthread_mutex_unlock(&alias_lock);
    return found;
}

/* The context whose slot serves ctx: the primary one for a green one. */
static CUcontext resolve(CUcontext ctx)
{
    if (!ctx || atomic_load_explicit(&live_aliases, memory_order_relaxed) == 0)
        return ctx;
    pthread_mutex_lock(&alias_lock);
    for (size_t i = 0; i < naliases; i++) {
        if (aliases[i].ctx == ctx) {
            ctx = aliases[i].primary;
            break;
        }
    }
    pthread_mutex_unlock(&alias_lock);
    return ctx;
}

/* ---- finding slots ------------------------------------------------------- */

/* The last slot this thread found, checked before the table is searched. */
static _Thread_local struct {
    CUcontext handle;
    struct cd_ctx *slot;
    unsigned gen;
} last;

/* Slots that calls of the program find: READY, or MAY_END (contexts.h). */
static bool usable(int st)
{
    return st == CD_CTX_READY || st == CD_CTX_MAY_END;
}

static bool serves(struct cd_ctx *c, CUcontext ctx)
{
    return atomic_load_explicit(&c->handle, memory_order_acquire) == ctx &&
           usable(atomic_load_explicit(&c->state, memory_order_acquire));
}

struct cd_ctx *cd_ctx_find(CUcontext ctx)
{
    ctx = resolve(ctx);
    if (!ctx)
        return NULL;
    if (last.handle == ctx && serves(last.slot, ctx) && atomic_load(&last.slot->gen) == last.gen)
        return last.slot;
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++) {
        struct cd_ctx *c = slot(i);
        if (serves(c, ctx)) {
            last.handle = ctx;
            last.slot = c;
            last.gen = atomic_load(&c->gen);
            return c;
        }
    }
    return NULL;
}

uint64_t cd_thread_token(void)
{
    static _Atomic uint64_t next = 1;
    static _Thread_local uint64_t token;
    if (!token)
        token = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
    return token;
}

struct cd_ctx *cd_ctx_current(void)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops || ops->ctx_get_current(&ctx) != CUDA_SUCCESS)
        return NULL;
    return cd_ctx_find(ctx);
}

struct cd_ctx *cd_ctx_primary(CUdevice dev)
{
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++) {
        struct cd_ctx *c = slot(i);
        int st = atomic_load(&c->state);
        if ((usable(st) || st == CD_CTX_CLOSING) && c->primary && c->device == dev)
            return c;
    }
    return NULL;
}

/* ---- scope ----------------------------------------------------------------- */

void cd_scope_enter(struct cd_scope *sc, CUcontext ctx, bool relaxed)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext cur = NULL;
    sc->pushed = NULL;
    sc->mode_set = false;
    if (!ops)
        return;
    if (ops->ctx_get_current(&cur) == CUDA_SUCCESS && cur != ctx && ctx &&
        ops->ctx_push(ctx) == CUDA_SUCCESS)
        sc->pushed = ctx;
    if (relaxed) {
        sc->mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        sc->mode_set = ops->exchange_capture_mode(&sc->mode) == CUDA_SUCCESS;
    }
}

void cd_scope_leave(struct cd_scope *sc)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!ops)
        return;
    if (sc->mode_set)
        ops->exchange_capture_mode(&sc->mode);
    if (sc->pushed) {
        CUcontext popped;
        ops->ctx_pop(&popped);
    }
}

/* ---- set-up ---------------------------------------------------------------- */

static void (*_Atomic first_setup)(void);

void cd_ctx_on_first_setup(void (*fn)(void))
{
    atomic_store(&first_setup, fn);
}

static void init_slot(struct cd_ctx *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->drain_lock, NULL);
    pthread_mutex_init(&c->pool_lock, NULL);
    pthread_mutex_init(&c->streams_lock, NULL);
    pthread_mutex_init(&c->far_lock, NULL);
    pthread_mutex_init(&c->word_lock, NULL);
    atomic_store(&c->far_done, UINT64_MAX);
    cd_list_init(&c->deferred);
    cd_list_init(&c->inflight);
    cd_list_init(&c->watches);
}

/* A FREE slot, from the table or a new chunk; under claim_lock. */
static struct cd_ctx *spare_slot(void)
{
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++)
        if (atomic_load(&slot(i)->state) == CD_CTX_FREE)
            return slot(i);
    if (n % CHUNK == 0) {
        if (n / CHUNK >= MAX_CHUNKS)
            return NULL;
        struct cd_ctx *chunk = malloc(CHUNK * sizeof *chunk);
        if (!chunk)
            return NULL;
        for (int i = 0; i < CHUNK; i++)
            init_slot(&chunk[i]);
        atomic_store_explicit(&chunks[n / CHUNK], chunk, memory_order_release);
    }
    atomic_store(&nslots, n + 1);
    return slot(n);
}

/* Claims a slot for ctx, or finds the one another thread claimed. NULL
 * while ctx's slot is closing (its teardown under way): the context is
 * about to go, and one context never gets two slots. */
static struct cd_ctx *claim(CUcontext ctx, bool *mine)
{
    struct cd_ctx *found = NULL;
    bool closing = false;
    *mine = false;
    pthread_mutex_lock(&claim_lock);
    int n = atomic_load(&nslots);
    for (int i = 0; i < n && !found && !closing; i++) {
        struct cd_ctx *c = slot(i);
        int st = atomic_load(&c->state);
        if (atomic_load(&c->handle) != ctx)
            continue;
        if (usable(st) || st == CD_CTX_SETUP)
            found = c;
        closing = st == CD_CTX_CLOSING;
    }
    if (!found && !closing && (found = spare_slot())) {
        *mine = true;
        atomic_store(&found->handle, ctx);
        atomic_store(&found->state, CD_CTX_SETUP);
    }
    pthread_mutex_unlock(&claim_lock);
    return found;
}

static void fill_pool(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    for (int i = 0; i < PREFILL_EVENTS; i++) {
        CUevent ev;
        if (ops->event_create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            return;
        cd_ctx_event_put(c, ev);
    }
}

/* The driver's one-time set-up of stream-ordered frees of plain device
 * memory (about 10 ms measured, once per process) is paid by the waiter
 * thread, not by a program call. */
static _Atomic bool warmed;
static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;

bool cd_ctx_warm_up(struct cd_ctx *c)
{
    if (atomic_load(&warmed))
        return false;
    /* A flush point that comes while the waiter does it waits for the end:
     * then nothing of it is left in flight. */
    pthread_mutex_lock(&warm_lock);
    bool now = !atomic_load(&warmed);
    if (now) {
        const struct cd_driver_ops *ops = cd_driver_ops();
        struct cd_scope sc;
        cd_scope_enter(&sc, atomic_load(&c->handle), true);
        CUdeviceptr p;
        if (ops->mem_alloc(&p, 256) == CUDA_SUCCESS) {
            ops->mem_free_async(p, c->spare);
            ops->stream_synchronize(c->spare);
        }
        cd_scope_leave(&sc);
        atomic_store(&warmed, true);
    }
    pthread_mutex_unlock(&warm_lock);
    return now;
}

bool cd_ctx_warmed(void)
{
    return atomic_load(&warmed);
}

/* Whether ctx is the primary context of its device: asked without changing
 * its reference count when it is active (a retain and a release), and never
 * when it is not (a retain would create it). If another thread releases
 * the program's last reference between the two, this release is the last:
 * it ends the context, and waits for its work. So it is asked only of a
 * context first seen through a call that does not say (cd_ctx_get_as). */
static bool is_primary(CUcontext ctx, CUdevice dev, const struct cd_driver_ops *ops)
{
    unsigned flags;
    int active = 0;
    CUcontext p = NULL;
    if (ops->primary_get_state(dev, &flags, &active) != CUDA_SUCCESS || !active ||
        ops->primary_retain(&p, dev) != CUDA_SUCCESS)
        return false;
    ops->primary_release(dev);
    return p == ctx;
}

/* The fence's word (fence.h), in the current context c. Without it (an
 * older driver, no pinned memory left, CUDEFER_FENCE_WORD=0) every reuse
 * asks the driver about its fence's event. The context's destruction frees
 * it, as it frees the pinned memory a teardown drops. Does not wait. */
static void make_word(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    void *host = NULL;
    CUdeviceptr dev = 0;
    c->word = NULL;
    c->word_dev = 0;
    atomic_store(&c->word_given, 0);
    atomic_store(&c->word_asked, 0);
    if (!cd_option_bool(CD_OPT_FENCE_WORD) || !ops->mem_host_alloc ||
        !ops->host_device_pointer || !ops->stream_write_value32)
        return;
    if (ops->mem_host_alloc(&host, sizeof(uint32_t), CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS) {
        cd_log(CD_LOG_INFO, "context %p: no pinned word for the fences; reuses ask the driver",
               (void *)atomic_load(&c->handle));
        return;
    }
    if (ops->host_device_pointer(&dev, host, 0) != CUDA_SUCCESS || !dev) {
        /* Not reached with unified addressing. Left to the context's
         * destruction: cuMemFreeHost would wait for the GPU. */
        cd_log(CD_LOG_INFO, "context %p: its pinned word has no device address; reuses ask "
               "the driver", (void *)atomic_load(&c->handle));
        return;
    }
    atomic_store((_Atomic uint32_t *)host, 0);
    c->word = host;
    c->word_dev = dev;
}

static bool setup(struct cd_ctx *c, CUcontext ctx, int primary, const struct cd_driver_ops *ops)
{
    c->ctx_record = cd_driver_records_contexts();
    /* Before 12.5 the fence is made of events on the program's streams; a
     * blocking private stream then also follows the legacy stream. */
    unsigned flags = c->ctx_record ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
    if (ops->ctx_get_device(&c->device) != CUDA_SUCCESS ||
        ops->stream_create(&c->priv, flags) != CUDA_SUCCESS)
        return false;
    if (ops->stream_create(&c->spare, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        ops->stream_destroy(c->priv);
        return false;
    }
    if (ops->event_create(&c->fence, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        ops->stream_destroy(c->spare);
        ops->stream_destroy(c->priv);
        return false;
    }
    c->primary = primary >= 0 ? primary == 1 : is_primary(ctx, c->device, ops);
    fill_pool(c, ops);
    make_word(c, ops);
    cd_log(CD_LOG_INFO, "context %p%s: private streams ready (fence: %s%s)", (void *)ctx,
           c->primary ? " (primary)" : "",
           c->ctx_record ? "cuCtxRecordEvent" : "events on the program's streams",
           c->word ? ", and its word" : "");
    return true;
}

struct cd_ctx *cd_ctx_get(CUcontext ctx)
{
    return cd_ctx_get_as(ctx, -1);
}

struct cd_ctx *cd_ctx_get_as(CUcontext ctx, int primary)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    ctx = resolve(ctx);
    if (!ctx || !ops)
        return NULL;
    struct cd_ctx *c = cd_ctx_find(ctx);
    if (c)
        return c;
    bool mine;
    c = claim(ctx, &mine);
    if (!c && atomic_load(&nslots) < CHUNK * MAX_CHUNKS)
        return NULL;
    if (!c) {
        if (!atomic_flag_test_and_set(&full_logged))
            cd_log(CD_LOG_ERROR, "more than %d contexts at once: releases in further contexts "
                   "pass through", CHUNK * MAX_CHUNKS);
        return NULL;
    }
    if (!mine) {
        /* Another thread is setting this context up (milliseconds). */
        while (atomic_load(&c->state) == CD_CTX_SETUP)
            sched_yield();
        return cd_ctx_find(ctx);
    }
    void (*hook)(void) = atomic_load(&first_setup);
    if (hook)
        hook();
    struct cd_scope sc;
    cd_scope_enter(&sc, ctx, true);
    bool ok = setup(c, ctx, primary, ops);
    cd_scope_leave(&sc);
    if (!ok) {
        cd_log(CD_LOG_ERROR, "context %p: cannot make private streams; its releases pass "
               "through", (void *)ctx);
        atomic_store(&c->handle, NULL);
        atomic_store(&c->state, CD_CTX_FREE);
        return NULL;
    }
    atomic_store(&c->state, CD_CTX_READY);
    return c;
}

/* ---- lifetime -------------------------------------------------------------- */

bool cd_ctx_enter(struct cd_ctx *c, unsigned gen)
{
    atomic_fetch_add(&c->users, 1);
    if (atomic_load(&c->state) == CD_CTX_READY && atomic_load(&c->gen) == gen)
        return true;
    atomic_fetch_sub(&c->users, 1);
    return false;
}

bool cd_ctx_enter_own(struct cd_ctx *c, unsigned gen)
{
    atomic_fetch_add(&c->users, 1);
    if (usable(atomic_load(&c->state)) && atomic_load(&c->gen) == gen)
        return true;
    atomic_fetch_sub(&c->users, 1);
    return false;
}

bool cd_ctx_enter_any(struct cd_ctx *c, unsigned *gen)
{
    *gen = atomic_load(&c->gen);
    return cd_ctx_enter_own(c, *gen);
}

void cd_ctx_exit(struct cd_ctx *c)
{
    atomic_fetch_sub(&c->users, 1);
}

/* Waits until *count is 0: uses take microseconds, but a flush under way
 * may wait for the GPU, so it yields first, then naps. */
static void drain(_Atomic int *count)
{
    for (unsigned i = 0; atomic_load(count) != 0; i++) {
        if (i < 1000) {
            sched_yield();
            continue;
        }
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

void cd_ctx_close(struct cd_ctx *c)
{
    atomic_store(&c->state, CD_CTX_CLOSING);
    drain(&c->users);
}

/* The program's calls go on entering; the walks under way end. A walk
 * counts itself before it reads the state, and the state is set before
 * the count is read: one of the two sees the other. */
void cd_ctx_close_maybe(struct cd_ctx *c)
{
    atomic_store(&c->state, CD_CTX_MAY_END);
    drain(&c->walkers);
}

void cd_ctx_reopen(struct cd_ctx *c)
{
    atomic_store(&c->state, CD_CTX_READY);
}

static void forget_events(struct cd_ctx *c, const struct cd_driver_ops *ops, bool alive)
{
    pthread_mutex_lock(&c->pool_lock);
    for (size_t i = 0; alive && i < c->nevents; i++)
        ops->event_destroy(c->events[i]);
    free(c->events);
    c->events = NULL;
    c->nevents = c->cap_events = 0;
    c->events_out = c->events_out_most = 0;
    pthread_mutex_unlock(&c->pool_lock);
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; alive && i < c->nstreams; i++)
        ops->event_destroy(c->streams[i].event);
    for (size_t i = 0; alive && i < c->nfinals; i++)
        ops->event_destroy(c->finals[i].event);
    free(c->streams);
    free(c->finals);
    c->streams = NULL;
    c->finals = NULL;
    c->nstreams = c->cap_streams = c->nfinals = c->cap_finals = 0;
    pthread_mutex_unlock(&c->streams_lock);
}

void cd_ctx_release(struct cd_ctx *c, bool alive)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    forget_events(c, ops, alive && ops);
    if (alive && ops) {
        ops->event_destroy(c->fence);
        ops->stream_destroy(c->spare);
        ops->stream_destroy(c->priv);
    }
    c->fence = NULL;
    c->priv = c->spare = NULL;
    /* Freed by the context's destruction (or gone with it already). */
    c->word = NULL;
    c->word_dev = 0;
    c->held_bytes = c->held_entries = c->cached_bytes = c->cached_entries = 0;
    memset(c->kind_entries, 0, sizeof c->kind_entries);
    /* The program's blocks in it went with the context. */
    cd_stats_add_program_device_bytes(-atomic_exchange(&c->live_bytes, 0));
    atomic_store(&c->peak_bytes, 0);
    atomic_store(&c->live_blocks, 0);
    atomic_store(&c->peak_blocks, 0);
    c->claims = 0;
    atomic_store(&c->sticky, false);
    atomic_fetch_add(&c->gen, 1);
    atomic_store(&c->handle, NULL);
    atomic_store(&c->state, CD_CTX_FREE);
}

/* ---- spare events ---------------------------------------------------------- */

/* Counts an event handed out (1) or back (-1); under pool_lock. */
static void events_out(struct cd_ctx *c, int delta)
{
    c->events_out += (size_t)delta;
    if (c->events_out > c->events_out_most)
        c->events_out_most = c->events_out;
}

CUresult cd_ctx_event_get(struct cd_ctx *c, CUevent *ev)
{
    pthread_mutex_lock(&c->pool_lock);
    bool have = c->nevents > 0;
    if (have)
        *ev = c->events[--c->nevents];
    events_out(c, 1);
    pthread_mutex_unlock(&c->pool_lock);
    if (have)
        return CUDA_SUCCESS;
    CUresult rc = cd_driver_ops()->event_create(ev, CU_EVENT_DISABLE_TIMING);
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_lock(&c->pool_lock);
        events_out(c, -1);
        pthread_mutex_unlock(&c->pool_lock);
    }
    return rc;
}

void cd_ctx_event_put(struct cd_ctx *c, CUevent ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&c->pool_lock);
    bool kept = cd_array_room((void **)&c->events, &c->cap_events, c->nevents + 1,
                              sizeof *c->events);
    if (kept)
        c->events[c->nevents++] = ev;
    if (c->events_out)
        events_out(c, -1);
    pthread_mutex_unlock(&c->pool_lock);
    if (!kept)
        cd_driver_ops()->event_destroy(ev);
}

void cd_ctx_event_trim(struct cd_ctx *c, bool all)
{
    CUevent extra[64];
    size_t n;
    pthread_mutex_lock(&c->pool_lock);
    size_t keep = !all && c->events_out_most > PREFILL_EVENTS ? c->events_out_most : PREFILL_EVENTS;
    c->events_out_most = c->events_out;
    pthread_mutex_unlock(&c->pool_lock);
    do {
        n = 0;
        pthread_mutex_lock(&c->pool_lock);
        while (c->nevents > keep && n < 64)
            extra[n++] = c->events[--c->nevents];
        pthread_mutex_unlock(&c->pool_lock);
        for (size_t i = 0; i < n; i++)
            cd_driver_ops()->event_destroy(extra[i]);
    } while (n == 64);
}

/* ---- a forked child ---------------------------------------------------------- */

void cd_contexts_reset(void)
{
    pthread_mutex_init(&claim_lock, NULL);
    pthread_mutex_init(&alias_lock, NULL);
    naliases = 0;
    atomic_store(&live_aliases, 0);
    atomic_store(&warmed, false);
    pthread_mutex_init(&warm_lock, NULL);
    last.handle = NULL;
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++) {
        struct cd_ctx *c = slot(i);
        unsigned gen = atomic_load(&c->gen);
        init_slot(c); /* the parent's events and lists stay with the parent */
        atomic_store(&c->gen, gen + 1);
    }
}
