/* core.c - global state, locking, blocking, handle table, accounting.
 *
 * See internal.h for the concurrency model. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct td_state td = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .next_id = 1,
};

_Thread_local struct td_tls td_tls = { .mode = CU_STREAM_CAPTURE_MODE_GLOBAL };

atomic_uint_fast64_t td_call_counts[TD_EP_COUNT];

/* ------------------------------------------------------------------ */
/* Entry and exit                                                      */

/* The latest moment a wait of at least TD_LOCK_STALL_NS for td.mu ended
 * (testdrv_lock_stall_end_ns). */
_Atomic uint64_t td_lock_stall_end;

/* Takes td.mu for a call. One lock serialises the whole simulation, which
 * the real driver does not: when the machine is overloaded, a thread that
 * holds it can be descheduled for tens of milliseconds while every other
 * call waits. Such waits are noted, so that a test timing calls can tell
 * them from a wait for the GPU. */
static void lock_for_call(void)
{
    if (pthread_mutex_trylock(&td.mu) == 0)
        return;
    uint64_t t0 = td_now_ns();
    pthread_mutex_lock(&td.mu);
    uint64_t t1 = td_now_ns();
    if (t1 - t0 < TD_LOCK_STALL_NS)
        return;
    uint64_t last = atomic_load(&td_lock_stall_end);
    while (last < t1 && !atomic_compare_exchange_weak(&td_lock_stall_end, &last, t1))
        ;
}

CUresult td_enter_any(void)
{
    lock_for_call();
    if (td.forked || td.deinitialized) {
        CUresult rc = td.forked ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_DEINITIALIZED;
        if (td.deinitialized && !td.deinit_reported) {
            td.deinit_reported = true;
            fputs("testdriver: driver call after the driver was torn down at exit "
                  "(CUDA_ERROR_DEINITIALIZED)\n", stderr);
        }
        pthread_mutex_unlock(&td.mu);
        return rc;
    }
    return CUDA_SUCCESS;
}

CUresult td_enter(void)
{
    CUresult rc = td_enter_any();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!td.initialized) {
        pthread_mutex_unlock(&td.mu);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    return CUDA_SUCCESS;
}

CUresult td_enter_args(bool args_ok)
{
    CUresult rc = td_enter();
    if (rc == CUDA_SUCCESS && !args_ok)
        rc = td_leave(CUDA_ERROR_INVALID_VALUE);
    return rc;
}

CUresult td_leave(CUresult rc)
{
    pthread_mutex_unlock(&td.mu);
    return rc;
}

CUresult td_leave_alloc(CUresult rc, enum testdrv_kind kind)
{
    unsigned usec = rc == CUDA_SUCCESS ? td.alloc_cost_us[kind] : 0;
    pthread_mutex_unlock(&td.mu);
    if (usec)
        td_sleep_ns((uint64_t)usec * 1000u);
    return rc;
}

/* fork(): the child of an initialised driver cannot use it (its worker
 * threads are gone), like the real driver; every call there returns
 * CUDA_ERROR_NOT_INITIALIZED. The lock is held across fork so the child
 * gets it in a consistent state. */
static void atfork_prepare(void) { pthread_mutex_lock(&td.mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&td.mu); }
static void atfork_child(void)
{
    pthread_mutex_init(&td.mu, NULL);
    pthread_cond_init(&td.cv, NULL);
    if (td.initialized)
        td.forked = true;
}

__attribute__((constructor)) static void td_core_ctor(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Process exit: like the real driver, the test driver tears itself down
 * when its library is finalised; calls made after that (from other
 * libraries' destructors, say) get CUDA_ERROR_DEINITIALIZED and the first
 * one is reported on stderr. Worker threads are left alone (they hold no
 * resources that outlive the process). With TESTDRIVER_EXIT=atexit the
 * teardown is an exit handler that cuInit registers (td_exit_handler_install),
 * so that exit handlers the program registered before it run after the
 * teardown, as CUDA programs whose static objects outlive the driver see. */
static void td_deinit(void)
{
    pthread_mutex_lock(&td.mu);
    td.deinitialized = true;
    pthread_mutex_unlock(&td.mu);
}

__attribute__((destructor)) static void td_core_dtor(void)
{
    td_deinit();
}

void td_exit_handler_install(void)
{
    atexit(td_deinit);
}

/* ------------------------------------------------------------------ */
/* Time and blocking                                                   */

uint64_t td_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void td_sleep_ns(uint64_t ns)
{
    struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u),
                           .tv_nsec = (long)(ns % 1000000000u) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void td_block_until(bool (*done)(void *arg), void *arg)
{
    if (done(arg))
        return;
    uint64_t t0 = td_now_ns();
    while (!done(arg))
        pthread_cond_wait(&td.cv, &td.mu);
    td_tls.blocked_ns += td_now_ns() - t0;
}

void td_note_wait_call(void) { td_tls.wait_calls++; }

void td_dead_call(void) { td.dead_calls++; }

void *td_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fputs("testdriver: out of host memory\n", stderr);
        abort();
    }
    return p;
}

/* ------------------------------------------------------------------ */
/* Handle table: open addressing on the object address. Objects are     */
/* never removed (see internal.h), so there are no tombstones.          */

static struct td_obj **table;
static size_t table_cap, table_used;

static size_t slot_of(const void *h, size_t cap)
{
    uintptr_t x = (uintptr_t)h;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15u;
    return (size_t)(x >> 7) & (cap - 1);
}

static void table_put(struct td_obj *o)
{
    size_t i = slot_of(o, table_cap);
    while (table[i])
        i = (i + 1) & (table_cap - 1);
    table[i] = o;
}

static void table_grow(void)
{
    struct td_obj **old = table;
    size_t old_cap = table_cap;
    table_cap = old_cap ? old_cap * 2 : 1024;
    table = td_xcalloc(table_cap, sizeof *table);
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            table_put(old[i]);
    free(old);
}

void td_obj_register(struct td_obj *o, enum td_objkind kind, struct td_ctx *ctx)
{
    o->kind = kind;
    o->ctx = ctx;
    o->all_next = td.all;
    td.all = o;
    if ((table_used + 1) * 2 > table_cap)
        table_grow();
    table_put(o);
    table_used++;
}

struct td_obj *td_obj_find(const void *h, enum td_objkind kind)
{
    if (!h || !table_cap)
        return NULL;
    for (size_t i = slot_of(h, table_cap); table[i]; i = (i + 1) & (table_cap - 1))
        if ((const void *)table[i] == h)
            return table[i]->kind == kind ? table[i] : NULL;
    return NULL;
}

/* The checks of td_enter_release, td.mu held (and kept either way). */
static CUresult release_front(struct td_ctx **c)
{
    td_note_wait_call();
    *c = NULL;
    CUresult rc = td_cur_ctx_usable(c);
    if (rc == CUDA_ERROR_INVALID_CONTEXT)
        *c = NULL;
    else if (rc != CUDA_SUCCESS)
        return rc;
    return td_capture_check_unsafe();
}

/* td_enter, then front(c); td.mu is dropped again if front fails. */
static CUresult enter_with(CUresult (*front)(struct td_ctx **c), struct td_ctx **c)
{
    CUresult rc = td_enter();
    if (rc == CUDA_SUCCESS && (rc = front(c)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

CUresult td_enter_release(struct td_ctx **c) { return enter_with(release_front, c); }

CUresult td_enter_unsafe(struct td_ctx **c) { return enter_with(td_cur_ctx_unsafe, c); }

CUresult td_obj_get(const void *h, enum td_objkind kind, struct td_obj **out)
{
    struct td_obj *o = td_obj_find(h, kind);
    if (!o || o->released)
        return CUDA_ERROR_INVALID_HANDLE;
    if (o->ctx_dead) {
        td_dead_call();
        return o->ctx && o->ctx->parent ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                                        : CUDA_ERROR_INVALID_CONTEXT;
    }
    *out = o;
    return CUDA_SUCCESS;
}

CUresult td_enter_obj(const void *h, enum td_objkind kind, bool args_ok, struct td_obj **out)
{
    CUresult rc = td_enter_args(args_ok);
    if (rc == CUDA_SUCCESS && (rc = td_obj_get(h, kind, out)) != CUDA_SUCCESS)
        td_leave(rc);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Dependencies                                                        */

static bool dep_done(const struct td_dep *d) { return d->s->completed >= d->seq; }

void td_deps_add(struct td_deps *d, struct td_stream *s, uint64_t seq)
{
    struct td_dep dep = { s, seq };
    if (seq == 0)
        return;
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].s == s) {
            if (d->v[i].seq < seq)
                d->v[i].seq = seq;
            return;
        }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        struct td_dep *v = realloc(d->v, d->cap * sizeof *v);
        if (!v) {
            fputs("testdriver: out of host memory\n", stderr);
            abort();
        }
        d->v = v;
    }
    d->v[d->n++] = dep;
}

void td_deps_free(struct td_deps *d)
{
    free(d->v);
    d->v = NULL;
    d->n = d->cap = 0;
}

bool td_deps_done(const struct td_deps *d)
{
    for (size_t i = 0; i < d->n; i++)
        if (!dep_done(&d->v[i]))
            return false;
    return true;
}

static bool deps_done_cb(void *arg) { return td_deps_done(arg); }

/* Breadth first over the unfinished (stream, seq) points d stands for and
 * those their unfinished ops wait for, each stream explored once up to the
 * greatest seq asked of it: true as soon as at_point(stream, arg) answers
 * true for a point, or at_op(op) for an unfinished op (either may be NULL).
 * Lock held. */
static bool deps_reach(const struct td_deps *d,
                       bool (*at_point)(const struct td_stream *s, const void *arg),
                       bool (*at_op)(const struct td_op *op), const void *arg)
{
    struct td_deps todo = { 0 }, seen = { 0 };
    for (size_t i = 0; i < d->n; i++)
        td_deps_add(&todo, d->v[i].s, d->v[i].seq);
    bool hit = false;
    for (size_t i = 0; i < todo.n && !hit; i++) {
        struct td_dep p = todo.v[i];
        if (dep_done(&p))
            continue;
        if (at_point && at_point(p.s, arg)) {
            hit = true;
            break;
        }
        uint64_t from = 0;
        for (size_t k = 0; k < seen.n; k++)
            if (seen.v[k].s == p.s)
                from = seen.v[k].seq;
        if (from >= p.seq)
            continue;
        td_deps_add(&seen, p.s, p.seq);
        for (struct td_op *op = p.s->head; op && op->seq <= p.seq && !hit; op = op->next) {
            if (op->seq <= from)
                continue;
            if (at_op && at_op(op)) {
                hit = true;
                break;
            }
            for (size_t k = 0; k < op->deps.n; k++)
                if (!dep_done(&op->deps.v[k]))
                    td_deps_add(&todo, op->deps.v[k].s, op->deps.v[k].seq);
        }
    }
    td_deps_free(&todo);
    td_deps_free(&seen);
    return hit;
}

static bool foreign_point(const struct td_stream *s, const void *root)
{
    return td_ctx_root(s->h.ctx) != root;
}

bool td_deps_reach_foreign(const struct td_deps *d, struct td_ctx *root)
{
    return deps_reach(d, foreign_point, NULL, root);
}

static bool kernel_op(const struct td_op *op)
{
    return op->kind == TD_OP_KERNEL || op->kind == TD_OP_SPIN;
}

void td_wait_deps(const struct td_deps *d)
{
    if (!td_deps_done(d) && deps_reach(d, NULL, kernel_op, NULL))
        td_tls.kernel_waits++;
    td_block_until(deps_done_cb, (void *)d);
}

void td_host_sync(struct td_deps *d)
{
    td_wait_deps(d);
    td_pending_cover(d);
    td_deps_free(d);
}

/* ------------------------------------------------------------------ */
/* Accounting                                                          */

void td_live_add(enum testdrv_kind kind, long count, long long bytes)
{
    td.live[kind] += (size_t)count;
    td.live_bytes[kind] += (size_t)bytes;
}

static bool fits(enum td_cap cap, size_t bytes)
{
    return bytes <= td.cap_total[cap] && td.cap_used[cap] <= td.cap_total[cap] - bytes;
}

/* A device allocation that does not fit moves managed pages of its device
 * out to the host, as many bytes as it asks for (as far as there are):
 * measured on an H200, driver 580.159.04 (bench/RESULTS.md, run 99), where
 * 71 GB of cuMemAlloc beside 107 GB of managed memory on the device
 * succeeded and cuMemGetInfo then said as much free as before it. Not with
 * TESTDRIVER_CONCURRENT_MANAGED=0 (a device without concurrent managed
 * access, whose managed memory stays on the device). */
bool td_cap_take(enum td_cap cap, size_t bytes)
{
    if (!fits(cap, bytes) && td_cap_is_device(cap) && td.managed_moves &&
        td.managed_resident[cap]) {
        size_t out = bytes < td.managed_resident[cap] ? bytes : td.managed_resident[cap];
        td.managed_resident[cap] -= out;
        td.cap_used[cap] -= out;
    }
    if (!fits(cap, bytes))
        return false;
    td.cap_used[cap] += bytes;
    return true;
}

void td_cap_give(enum td_cap cap, size_t bytes)
{
    td.cap_used[cap] -= bytes < td.cap_used[cap] ? bytes : td.cap_used[cap];
}

/* Managed memory counts against its device while resident; it is never
 * moved out to serve another managed allocation. */
bool td_cap_take_managed(enum td_cap cap, size_t bytes)
{
    if (!fits(cap, bytes))
        return false;
    td.cap_used[cap] += bytes;
    td.managed_live[cap] += bytes;
    td.managed_resident[cap] += bytes;
    return true;
}

/* Which of a device's managed bytes were moved out is not kept: a release
 * gives back what stays resident beyond what is still allocated. */
void td_cap_give_managed(enum td_cap cap, size_t bytes)
{
    td.managed_live[cap] -= bytes < td.managed_live[cap] ? bytes : td.managed_live[cap];
    if (td.managed_resident[cap] > td.managed_live[cap]) {
        td_cap_give(cap, td.managed_resident[cap] - td.managed_live[cap]);
        td.managed_resident[cap] = td.managed_live[cap];
    }
}
