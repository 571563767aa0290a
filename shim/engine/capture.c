/* capture.c - the capture gate and the table of live captures. */
#include "capture.h"

#include "array.h"
#include "contexts.h"
#include "engine.h"
#include "log.h"
#include "driver.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

static _Atomic int captures_live;
static _Atomic int fences_active;
/* Captures counted live whose entry is not in the table yet (their
 * context is not known); under table_lock but for cd_capture_begin's
 * increment. */
static _Atomic int captures_pending;

/* A live capture: the stream as the program named it, made canonical (the
 * per-thread default stream is CU_STREAM_PER_THREAD plus its thread; each
 * context has its own), and its context. */
struct capture {
    CUstream stream;
    pthread_t thread;
    CUcontext ctx;
    unsigned long long id; /* which capture of the stream (cd_capture_check) */
};
static unsigned long long next_id; /* under table_lock */

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct capture *table;
static size_t ntable, cap_table;
static atomic_flag full_logged = ATOMIC_FLAG_INIT;

/* Per-thread captures end with their thread. */
static pthread_key_t thread_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

bool cd_gate_enter(void)
{
    atomic_fetch_add(&fences_active, 1);
    if (atomic_load(&captures_live) == 0)
        return true;
    atomic_fetch_sub(&fences_active, 1);
    return false;
}

void cd_gate_exit(void)
{
    atomic_fetch_sub(&fences_active, 1);
}

/* The contexts of the live captures, copied under the lock (their calls
 * are made outside it); more than this many shut the gate. */
#define GATE_BESIDE_MAX 64

bool cd_gate_enter_beside(bool (*in)(CUcontext ctx, void *arg), void *arg)
{
    atomic_fetch_add(&fences_active, 1);
    if (atomic_load(&captures_live) == 0)
        return true;
    CUcontext ctxs[GATE_BESIDE_MAX];
    size_t n = 0;
    pthread_mutex_lock(&table_lock);
    bool shut = atomic_load(&captures_pending) != 0 || ntable > GATE_BESIDE_MAX;
    for (size_t i = 0; !shut && i < ntable; i++)
        ctxs[n++] = table[i].ctx;
    pthread_mutex_unlock(&table_lock);
    for (size_t i = 0; !shut && i < n; i++)
        shut = !ctxs[i] || in(ctxs[i], arg);
    if (shut)
        atomic_fetch_sub(&fences_active, 1);
    return !shut;
}

bool cd_capture_live(void)
{
    return atomic_load(&captures_live) != 0;
}

static void (*_Atomic reopened)(void);

void cd_capture_on_reopen(void (*fn)(void))
{
    atomic_store(&reopened, fn);
}

static void capture_done(int n)
{
    void (*fn)(void) = atomic_load(&reopened);
    if (n > 0 && atomic_fetch_sub(&captures_live, n) == n && fn)
        fn();
}

void cd_capture_begin(void)
{
    atomic_fetch_add(&captures_live, 1);
    atomic_fetch_add(&captures_pending, 1);
    while (atomic_load(&fences_active) != 0)
        sched_yield();
}

static CUstream canonical(CUstream stream, bool per_thread)
{
    if (stream == CU_STREAM_PER_THREAD || (stream == NULL && per_thread))
        return CU_STREAM_PER_THREAD;
    return stream ? stream : CU_STREAM_LEGACY;
}

static void thread_gone(void *arg);

static void make_key(void)
{
    pthread_key_create(&thread_key, thread_gone);
}

/* The context of a capture: the stream's own, the current one for the
 * default streams. */
static CUcontext context_of(CUstream stream)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    CUcontext ctx = NULL;
    if (!ops)
        return NULL;
    if (stream == CU_STREAM_PER_THREAD || stream == CU_STREAM_LEGACY ||
        ops->stream_get_ctx(stream, &ctx) != CUDA_SUCCESS)
        ops->ctx_get_current(&ctx);
    return ctx;
}

void cd_capture_begun(CUstream stream, bool per_thread, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        atomic_fetch_sub(&captures_pending, 1);
        capture_done(1);
        return;
    }
    struct capture c = {canonical(stream, per_thread), pthread_self(), NULL, 0};
    c.ctx = context_of(c.stream);
    pthread_mutex_lock(&table_lock);
    c.id = ++next_id;
    bool kept = cd_array_room((void **)&table, &cap_table, ntable + 1, sizeof *table);
    if (kept)
        table[ntable++] = c;
    /* In the table now (a gate looks at both under the lock). */
    atomic_fetch_sub(&captures_pending, 1);
    pthread_mutex_unlock(&table_lock);
    if (c.stream == CU_STREAM_PER_THREAD && kept) {
        pthread_once(&key_once, make_key);
        pthread_setspecific(thread_key, (void *)1);
    }
    if (kept)
        return;
    /* Out of memory for the table: the capture is not counted, so that the
     * gate cannot stay shut for good. Fences made during it may invalidate
     * it, which the program sees as a failed capture. */
    if (!atomic_flag_test_and_set(&full_logged))
        cd_log(CD_LOG_ERROR, "out of memory for the table of captures: a capture is not "
               "guarded and may be invalidated");
    capture_done(1);
}

/* A capture of stream, or with ctx every capture of ctx. The default
 * streams are each context's own: the per-thread stream's capture is this
 * thread's in the current context (cur; NULL when it is not known). */
static bool matches(const struct capture *c, CUstream stream, CUcontext ctx, CUcontext cur)
{
    if (ctx)
        return c->ctx == ctx;
    if (c->stream != stream)
        return false;
    if (stream != CU_STREAM_PER_THREAD && stream != CU_STREAM_LEGACY)
        return true;
    if (cur && c->ctx && c->ctx != cur)
        return false;
    return stream != CU_STREAM_PER_THREAD || pthread_equal(c->thread, pthread_self());
}

/* Ends the captures that picked selects (with all false, the first only). */
static void end_where(bool (*picked)(const struct capture *c, const void *arg), const void *arg,
                      bool all)
{
    int ended = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < ntable;) {
        if (!picked(&table[i], arg)) {
            i++;
            continue;
        }
        table[i] = table[--ntable];
        ended++;
        if (!all)
            break;
    }
    pthread_mutex_unlock(&table_lock);
    capture_done(ended);
}

struct where {
    CUstream stream;
    CUcontext ctx, cur;
};

static bool of_stream_or_ctx(const struct capture *c, const void *arg)
{
    const struct where *w = arg;
    return matches(c, w->stream, w->ctx, w->cur);
}

/* Ends the captures of stream (the first match; a default stream's in the
 * current context) or, with ctx, all of ctx's. */
static void forget(CUstream stream, CUcontext ctx)
{
    struct where w = {stream, ctx, NULL};
    if (!ctx && (stream == CU_STREAM_PER_THREAD || stream == CU_STREAM_LEGACY))
        w.cur = context_of(stream);
    end_where(of_stream_or_ctx, &w, ctx != NULL);
}

/* Whether stream has stopped capturing, as the driver says; asked in the
 * relaxed capture mode, which never invalidates a capture. */
static bool stopped(CUstream stream)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (!ops || !ops->stream_is_capturing)
        return false;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool relaxed = ops->exchange_capture_mode(&mode) == CUDA_SUCCESS;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CUresult rc = ops->stream_is_capturing(stream, &status);
    if (relaxed)
        ops->exchange_capture_mode(&mode);
    return rc != CUDA_SUCCESS || status == CU_STREAM_CAPTURE_STATUS_NONE;
}

void cd_capture_ended(CUstream stream, bool per_thread, CUresult rc)
{
    CUstream canon = canonical(stream, per_thread);
    /* Success, or an invalidated capture that the end closed. Other errors
     * (the wrong thread ending a global capture, a stream that was not
     * capturing) leave a live capture live: the driver says. */
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
        rc == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED || stopped(canon))
        forget(canon, NULL);
}

void cd_capture_stream_gone(CUstream stream)
{
    if (stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD)
        forget(stream, NULL);
}

void cd_capture_context_gone(CUcontext ctx)
{
    if (ctx)
        forget(NULL, ctx);
}

static bool of_this_thread(const struct capture *c, const void *arg)
{
    (void)arg;
    return c->stream == CU_STREAM_PER_THREAD && pthread_equal(c->thread, pthread_self());
}

static void thread_gone(void *arg)
{
    (void)arg;
    end_where(of_this_thread, NULL, true);
}

static bool of_id(const struct capture *c, const void *arg)
{
    return c->id == *(const unsigned long long *)arg;
}

/* Whether the capture of id is still in the table and its stream has
 * stopped capturing. Asked under the table's lock: a stream's or a
 * context's end takes that lock (forget) before the driver's destruction,
 * so the stream named is alive. */
static bool stopped_while_listed(const struct capture *c)
{
    bool listed = false, gone = false;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < ntable && !listed; i++)
        listed = table[i].id == c->id;
    if (listed)
        gone = stopped(c->stream);
    pthread_mutex_unlock(&table_lock);
    return gone;
}

void cd_capture_check(void)
{
    if (atomic_load(&captures_live) == 0)
        return;
    /* Streams the program created can be asked from any thread. Each
     * capture is named by its id: between the question and the answer the
     * program may end that capture and begin another on the same stream,
     * which must stay counted. Each is asked with its context's slot
     * entered as a walk, which a primary release or a green context's
     * destruction waits for (a context may end in them without the table
     * being told first), and only while still listed. */
    struct capture seen[64];
    size_t n = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < ntable && n < 64; i++)
        if (table[i].stream != CU_STREAM_PER_THREAD && table[i].stream != CU_STREAM_LEGACY)
            seen[n++] = table[i];
    pthread_mutex_unlock(&table_lock);
    for (size_t i = 0; i < n; i++) {
        struct cd_ctx *slot = seen[i].ctx ? cd_ctx_find(seen[i].ctx) : NULL;
        if (!slot || !cd_ctx_enter_walk(slot, atomic_load(&slot->gen)))
            continue;
        bool gone = cd_ctx_find(seen[i].ctx) == slot && stopped_while_listed(&seen[i]);
        cd_ctx_exit_walk(slot);
        if (gone)
            end_where(of_id, &seen[i].id, false);
    }
}

void cd_capture_reset(void)
{
    pthread_mutex_init(&table_lock, NULL);
    ntable = 0;
    next_id = 0;
    atomic_store(&captures_live, 0);
    atomic_store(&fences_active, 0);
    atomic_store(&captures_pending, 0);
}
