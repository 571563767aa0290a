/* fence.c - fences over every context: the releasing one's on the GPU, the
 * others' joined on the host. */
#include "fence.h"

#include "clock.h"
#include "driver.h"
#include "log.h"

#include "array.h"

#include <sched.h>
#include <time.h>

/* Before 12.5: c's private stream waits for an event on each stream the
 * program made in c, and for the final events of destroyed ones. */
static CUresult fence_streams(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nstreams && rc == CUDA_SUCCESS; i++) {
        rc = ops->event_record(c->streams[i].event, c->streams[i].stream);
        c->streams[i].at_capture = false;
        if (rc == CUDA_SUCCESS)
            rc = ops->stream_wait_event(c->priv, c->streams[i].event, 0);
    }
    for (size_t i = 0; i < c->nfinals && rc == CUDA_SUCCESS; i++)
        rc = ops->stream_wait_event(c->priv, c->finals[i].event, 0);
    pthread_mutex_unlock(&c->streams_lock);
    return rc;
}

/* Makes c's private stream wait for the work submitted so far in c. */
static CUresult fence_own_stream(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    if (!c->ctx_record)
        return fence_streams(c, ops);
    CUresult rc = ops->ctx_record_event(atomic_load(&c->handle), c->fence);
    return rc == CUDA_SUCCESS ? ops->stream_wait_event(c->priv, c->fence, 0) : rc;
}

/* The next number of c's word (never 0), for a fence whose record is
 * made: a write asked for afterwards (cd_fence_word_ask) follows a record
 * that covers it. */
static uint32_t word_number(struct cd_ctx *c)
{
    uint32_t n = atomic_fetch_add(&c->word_given, 1) + 1;
    return n ? n : atomic_fetch_add(&c->word_given, 1) + 1;
}

/* c's part, into a spare event: its record (12.5 and newer, and not for
 * the host), or the private stream's wait and a record behind it; and,
 * with word, its number in c's word. */
static CUresult fence_own(struct cd_ctx *c, CUevent *done, uint32_t *word, bool for_host,
                          const struct cd_driver_ops *ops)
{
    CUresult rc = cd_ctx_event_get(c, done);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (c->ctx_record && !for_host) {
        rc = ops->ctx_record_event(atomic_load(&c->handle), *done);
    } else {
        rc = fence_own_stream(c, ops);
        if (rc == CUDA_SUCCESS)
            rc = ops->event_record(*done, c->priv);
    }
    if (rc != CUDA_SUCCESS) {
        cd_ctx_event_put(c, *done);
        *done = NULL;
    } else if (word && c->word) {
        *word = word_number(c);
    }
    return rc;
}

bool cd_fence_word_passed(const struct cd_ctx *c, uint32_t word)
{
    if (!word || !c->word)
        return false;
    uint32_t seen = atomic_load_explicit(c->word, memory_order_acquire);
    return (int32_t)(seen - word) >= 0;
}

/* Numbers given since the last write before a look asks for the next one.
 * Measured on an H200 (bench/RESULTS.md, run 66: the 4 KiB loop rows, two
 * rounds of each way in turn; cudefer / the pool): asking whenever the
 * write before had landed made a device iteration slower than without the
 * word (1.16-1.57x against 1.24-1.38x: in that loop half the looks asked,
 * and a write costs 1.4 us, a record and a wait 0.3 us each, facts word);
 * once 4 numbers waited, 0.96-1.34x; once 16, 1.18-1.67x (the blocks a
 * look finds are younger than the last write more often). */
#define WORD_BATCH 4

void cd_fence_word_ask(struct cd_ctx *c)
{
    if (!c->word)
        return;
    uint32_t asked = atomic_load(&c->word_asked);
    uint32_t given = atomic_load(&c->word_given);
    /* Too few new numbers, or a write still on its way: its landing lets a
     * later look ask again, for every number given meanwhile. */
    if (!given || (uint32_t)(given - asked) < WORD_BATCH ||
        atomic_load_explicit(c->word, memory_order_acquire) != asked)
        return;
    if (pthread_mutex_trylock(&c->word_lock) != 0)
        return;
    const struct cd_driver_ops *ops = cd_driver_ops();
    asked = atomic_load(&c->word_asked);
    given = atomic_load(&c->word_given);
    if (asked != given && given) {
        /* Every fence numbered up to given made its record before it took
         * its number, and this record comes after: it covers them all. */
        CUresult rc = fence_own_stream(c, ops);
        if (rc == CUDA_SUCCESS)
            rc = ops->stream_write_value32(c->priv, c->word_dev, given,
                                           CU_STREAM_WRITE_VALUE_DEFAULT);
        if (rc == CUDA_SUCCESS)
            atomic_store(&c->word_asked, given);
        else
            cd_log(CD_LOG_DEBUG, "the fences' word of context %p: error %d; reuses ask the "
                   "events", (void *)atomic_load(&c->handle), (int)rc);
    }
    pthread_mutex_unlock(&c->word_lock);
}

/* ---- the other contexts' part, joined on the host ------------------------------ */

/* Numbers fences and keeps each context's records in their order. */
static pthread_mutex_t far_lock = PTHREAD_MUTEX_INITIALIZER;
/* The newest number whose records are all made or marked. */
static _Atomic uint64_t far_seq;
/* Marked records over every slot (still to be made). */
static _Atomic int far_marks;

/* Records the work submitted so far in o into ev (an event of o). */
static CUresult record_work(struct cd_ctx *o, CUevent ev, const struct cd_driver_ops *ops)
{
    if (o->ctx_record)
        return ops->ctx_record_event(atomic_load(&o->handle), ev);
    /* Before 12.5: o's private stream follows o's streams, and the event
     * is recorded there (o's own work: o's synchronisation covers it). */
    CUresult rc = fence_streams(o, ops);
    return rc == CUDA_SUCCESS ? ops->event_record(ev, o->priv) : rc;
}

/* Drops o's oldest records that have completed (or whose context faulted:
 * it runs nothing more), up to a marked one; under o->far_lock. */
static void far_pop(struct cd_ctx *o, const struct cd_driver_ops *ops)
{
    while (o->far_n > 0 && !o->far[o->far_head].marked &&
           ops->event_query(o->far[o->far_head].event) != CUDA_ERROR_NOT_READY) {
        o->far_head = (o->far_head + 1) % CD_FAR_RING;
        o->far_n--;
    }
}

/* Brings o->far_done up to date; o entered. Returns whether a marked
 * record holds it back (made only when the waiter can: not while a capture
 * is live in o). */
static bool far_refresh(struct cd_ctx *o, const struct cd_driver_ops *ops)
{
    /* Read first: every number up to it has its records in the rings. */
    uint64_t seq = atomic_load_explicit(&far_seq, memory_order_acquire);
    pthread_mutex_lock(&o->far_lock);
    far_pop(o, ops);
    atomic_store(&o->far_done, o->far_n ? o->far[o->far_head].first - 1 : seq);
    bool marked = o->far_n && o->far[o->far_head].marked;
    pthread_mutex_unlock(&o->far_lock);
    return marked;
}

/* An event of o for its ring, made in o. */
static CUresult far_event(struct cd_ctx *o, CUevent *ev, const struct cd_driver_ops *ops)
{
    struct cd_scope sc;
    cd_scope_enter(&sc, atomic_load(&o->handle), false);
    CUresult rc = ops->event_create(ev, CU_EVENT_DISABLE_TIMING);
    cd_scope_leave(&sc);
    return rc;
}

/* Every fence before number tag may have passed in o, none from it on:
 * a record of o now stands for tag; under far_lock. */
static void far_lower(struct cd_ctx *o, uint64_t tag)
{
    if (atomic_load(&o->far_done) >= tag)
        atomic_store(&o->far_done, tag - 1);
}

/* A slot that serves no context (yet) runs nothing of any fence's time. */
static bool far_idle(const struct cd_ctx *o)
{
    int st = atomic_load(&o->state);
    return st == CD_CTX_FREE || st == CD_CTX_SETUP;
}

/* o's newest entry, or NULL; under far_lock. */
static struct cd_far *far_newest(struct cd_ctx *o)
{
    return o->far_n ? &o->far[(o->far_head + o->far_n - 1) % CD_FAR_RING] : NULL;
}

/* Records o's work so far into e (its event made if needed); under
 * far_lock, o entered. */
static CUresult far_make(struct cd_ctx *o, struct cd_far *e, const struct cd_driver_ops *ops)
{
    CUresult rc = e->event ? CUDA_SUCCESS : far_event(o, &e->event, ops);
    if (rc == CUDA_SUCCESS)
        rc = record_work(o, e->event, ops);
    if (rc == CUDA_SUCCESS && e->marked) {
        e->marked = false;
        atomic_fetch_sub(&far_marks, 1);
    }
    return rc;
}

/* Records o's work under number tag; under far_lock, o entered. A marked
 * newest entry is made now, and stands for tag too. A full ring records
 * its newest again: that record then stands for every number from its
 * first to tag, and completes no earlier than the one it replaces (it
 * covers more work), so the context has passed no number from its first
 * on until it completes. */
static void far_push(struct cd_ctx *o, uint64_t tag, const struct cd_driver_ops *ops)
{
    pthread_mutex_lock(&o->far_lock);
    struct cd_far *e = far_newest(o);
    bool again = e && e->marked;
    if (!again && o->far_n == CD_FAR_RING)
        far_pop(o, ops);
    again = again || o->far_n == CD_FAR_RING;
    if (!again)
        e = &o->far[(o->far_head + o->far_n) % CD_FAR_RING];
    CUresult rc = far_make(o, e, ops);
    if (rc == CUDA_SUCCESS) {
        if (!again) {
            e->first = tag;
            o->far_n++;
        }
        far_lower(o, tag);
    }
    pthread_mutex_unlock(&o->far_lock);
    if (rc != CUDA_SUCCESS)
        cd_log(rc == CUDA_ERROR_OUT_OF_MEMORY ? CD_LOG_ERROR : CD_LOG_DEBUG,
               "fence over context %p: error %d%s", (void *)atomic_load(&o->handle), (int)rc,
               rc == CUDA_ERROR_OUT_OF_MEMORY ? " (no event for its record): its work is not "
                                                "waited for"
                                              : "");
}

struct far_fencing {
    uint64_t tag;
    bool any;
    const struct cd_driver_ops *ops;
};

/* Marks o's record under number tag, to be made once o lets walks in
 * again (o keeps them out around a primary release: a call on it could
 * name a context that the release ended). A marked newest entry already
 * stands for tag; a full ring marks its newest. Makes no driver call. */
static void far_mark(struct cd_ctx *o, uint64_t tag)
{
    /* Not known to be held by a capture until the waiter has looked. */
    atomic_store(&o->far_captured, false);
    pthread_mutex_lock(&o->far_lock);
    struct cd_far *e = far_newest(o);
    if (!e || !e->marked) {
        if (o->far_n < CD_FAR_RING) {
            e = &o->far[(o->far_head + o->far_n++) % CD_FAR_RING];
            e->first = tag;
        }
        e->marked = true;
        atomic_fetch_add(&far_marks, 1);
    }
    far_lower(o, tag);
    pthread_mutex_unlock(&o->far_lock);
}

static bool far_make_one(struct cd_ctx *o, bool entered, void *arg)
{
    struct far_fencing *m = arg;
    if (entered) {
        far_push(o, m->tag, m->ops);
        m->any = true;
    } else if (atomic_load(&o->state) == CD_CTX_MAY_END) {
        far_mark(o, m->tag);
        m->any = true;
    }
    return true;
}

/* Records the work of every other context the engine knows (marks it, in
 * a slot that keeps walks out); the number, or 0 when there was none. */
static uint64_t far_fence(struct cd_ctx *c, const struct cd_driver_ops *ops)
{
    pthread_mutex_lock(&far_lock);
    struct far_fencing m = {atomic_load(&far_seq) + 1, false, ops};
    cd_ctx_every(c, far_make_one, &m);
    if (m.any)
        atomic_store_explicit(&far_seq, m.tag, memory_order_release);
    pthread_mutex_unlock(&far_lock);
    return m.any ? m.tag : 0;
}

struct far_ask {
    uint64_t far;
    bool ending;   /* a slot that could not be asked, or a marked record, held it back */
    bool uncaught; /* one of them was not a record a capture kept from being made */
};

static bool far_reached(struct cd_ctx *o, bool entered, void *arg)
{
    struct far_ask *a = arg;
    if (atomic_load(&o->far_done) >= a->far)
        return true;
    /* A slot that serves no context yet runs nothing of the fence's time;
     * one that closes, or keeps walks out, is asked again later. */
    if (!entered) {
        if (far_idle(o))
            return true;
        a->ending = a->uncaught = true;
        return false;
    }
    bool marked = far_refresh(o, cd_driver_ops());
    if (atomic_load(&o->far_done) >= a->far)
        return true;
    a->ending |= marked;
    a->uncaught |= !marked || !atomic_load(&o->far_captured);
    return false;
}

static bool far_passed(struct cd_ctx *c, struct far_ask *a)
{
    return a->far == 0 || cd_ctx_every(c, far_reached, a);
}

bool cd_fence_far_passed(struct cd_ctx *c, uint64_t far)
{
    struct far_ask a = {far, false, false};
    return far_passed(c, &a);
}

CUresult cd_fence_query(struct cd_ctx *c, CUevent done, uint64_t far)
{
    CUresult q = done ? cd_driver_ops()->event_query(done) : CUDA_SUCCESS;
    if (q == CUDA_SUCCESS && !cd_fence_far_passed(c, far))
        q = CUDA_ERROR_NOT_READY;
    return q;
}

static bool far_low(struct cd_ctx *o, bool entered, void *arg)
{
    uint64_t *floor = arg;
    if (!entered && far_idle(o))
        return true;
    if (entered && atomic_load(&o->far_done) < *floor)
        far_refresh(o, cd_driver_ops());
    uint64_t done = atomic_load(&o->far_done);
    if (done < *floor)
        *floor = done;
    return true;
}

uint64_t cd_fence_far_floor(struct cd_ctx *c)
{
    uint64_t floor = UINT64_MAX;
    if (!cd_ctx_alone(c))
        cd_ctx_every(c, far_low, &floor);
    return floor;
}

enum cd_far_wait cd_fence_far_wait(struct cd_ctx *c, uint64_t far, uint64_t deadline)
{
    uint64_t held_since = 0;
    for (unsigned i = 0;; i++) {
        struct far_ask a = {far, false, false};
        if (far_passed(c, &a))
            return CD_FAR_PASSED;
        if (deadline && cd_now_ns() >= deadline)
            return CD_FAR_LATE;
        if (a.ending) {
            uint64_t now = cd_now_ns();
            if (!held_since)
                held_since = now;
            else if (now - held_since > CD_FAR_GIVE_UP_NS)
                return a.uncaught ? CD_FAR_HELD : CD_FAR_CAPTURED;
        } else {
            held_since = 0;
        }
        if (i < 100) {
            sched_yield();
            continue;
        }
        struct timespec nap = {0, i < 1000 ? 20000 : 200000};
        nanosleep(&nap, NULL);
    }
}

void cd_fence_trim(struct cd_ctx *c)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    pthread_mutex_lock(&c->far_lock);
    far_pop(c, ops);
    for (unsigned i = c->far_n; i < CD_FAR_RING; i++) {
        struct cd_far *e = &c->far[(c->far_head + i) % CD_FAR_RING];
        if (e->event)
            ops->event_destroy(e->event);
        e->event = NULL;
    }
    pthread_mutex_unlock(&c->far_lock);
}

bool cd_fence_fill(struct cd_ctx *c)
{
    atomic_store(&c->far_captured, false);
    if (atomic_load(&far_marks) == 0)
        return false;
    pthread_mutex_lock(&c->far_lock);
    struct cd_far *e = far_newest(c);
    if (e && e->marked)
        far_make(c, e, cd_driver_ops());
    pthread_mutex_unlock(&c->far_lock);
    return atomic_load(&far_marks) != 0;
}

void cd_fence_fill_held(struct cd_ctx *c)
{
    atomic_store(&c->far_captured, true);
}

bool cd_fence_marked(void)
{
    return atomic_load(&far_marks) != 0;
}

void cd_fence_forget(struct cd_ctx *c, bool alive)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    pthread_mutex_lock(&c->far_lock);
    for (unsigned i = 0; i < c->far_n; i++)
        if (c->far[(c->far_head + i) % CD_FAR_RING].marked)
            atomic_fetch_sub(&far_marks, 1);
    for (size_t i = 0; i < CD_FAR_RING; i++) {
        if (alive && ops && c->far[i].event)
            ops->event_destroy(c->far[i].event);
        c->far[i].event = NULL;
        c->far[i].marked = false;
    }
    c->far_head = c->far_n = 0;
    atomic_store(&c->far_done, UINT64_MAX);
    atomic_store(&c->far_captured, false);
    pthread_mutex_unlock(&c->far_lock);
}

void cd_fence_reset(void)
{
    pthread_mutex_init(&far_lock, NULL);
    atomic_store(&far_marks, 0);
}

/* ---- fences ---------------------------------------------------------------------- */

static CUresult fence(struct cd_ctx *c, CUevent *done, uint64_t *far, uint32_t *word,
                      bool for_host)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (word)
        *word = 0;
    CUresult rc = fence_own(c, done, word, for_host, ops);
    if (far)
        *far = rc == CUDA_SUCCESS && !cd_ctx_alone(c) ? far_fence(c, ops) : 0;
    return rc;
}

CUresult cd_fence(struct cd_ctx *c, CUevent *done, uint64_t *far, uint32_t *word)
{
    return fence(c, done, far, word, false);
}

CUresult cd_fence_for_host(struct cd_ctx *c, CUevent *done, uint64_t *far)
{
    return fence(c, done, far, NULL, true);
}

void cd_fence_stream_added(struct cd_ctx *c, CUstream s, CUcontext owner)
{
    CUevent ev;
    if (c->ctx_record)
        return;
    /* The event is made in the stream's own context (a record on a stream
     * of another context fails). */
    struct cd_scope sc;
    cd_scope_enter(&sc, owner, false);
    CUresult rc = cd_driver_ops()->event_create(&ev, CU_EVENT_DISABLE_TIMING);
    cd_scope_leave(&sc);
    if (rc != CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&c->streams_lock);
    bool ok = cd_array_room((void **)&c->streams, &c->cap_streams, c->nstreams + 1, sizeof c->streams[0]);
    if (ok)
        c->streams[c->nstreams++] = (struct cd_tracked){s, ev, owner, false};
    pthread_mutex_unlock(&c->streams_lock);
    if (!ok)
        cd_driver_ops()->event_destroy(ev);
}

/* Whether s is in a capture now. */
static bool capturing(CUstream s, const struct cd_driver_ops *ops)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return ops->stream_is_capturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Whether the tracked stream t's event now covers all its real work: a
 * record made now, or, in a capture begun through cudefer, the record made
 * just before that capture (a record in a capture is a node of the graph,
 * which no stream outside the capture may wait for: CUDA_ERROR_STREAM_
 * CAPTURE_ISOLATION, and every later fence would fail). A stream that
 * joined a capture some other way gets a record made now, as before (its
 * fences then fail, and their releases go to the driver). */
static bool record_last(struct cd_tracked *t, const struct cd_driver_ops *ops)
{
    if (t->at_capture && capturing(t->stream, ops))
        return true;
    return ops->event_record(t->event, t->stream) == CUDA_SUCCESS;
}

void cd_fence_stream_capturing(struct cd_ctx *c, CUstream s)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record)
        return;
    struct cd_scope sc;
    cd_scope_enter(&sc, NULL, true);
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nstreams; i++)
        if (c->streams[i].stream == s && !capturing(s, ops))
            c->streams[i].at_capture =
                ops->event_record(c->streams[i].event, s) == CUDA_SUCCESS;
    pthread_mutex_unlock(&c->streams_lock);
    cd_scope_leave(&sc);
}

void cd_fence_stream_removed(struct cd_ctx *c, CUstream s)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record)
        return;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nstreams; i++) {
        if (c->streams[i].stream != s)
            continue;
        CUevent ev = c->streams[i].event;
        /* The stream may still run work after its destroy returns: later
         * fences wait for this final record until it completes. */
        if (record_last(&c->streams[i], ops) &&
            cd_array_room((void **)&c->finals, &c->cap_finals, c->nfinals + 1,
                          sizeof c->finals[0]))
            c->finals[c->nfinals++] = (struct cd_tracked){NULL, ev, c->streams[i].owner, false};
        else
            ops->event_destroy(ev);
        c->streams[i] = c->streams[--c->nstreams];
        break;
    }
    pthread_mutex_unlock(&c->streams_lock);
}

/* Removes the entries of owner from list (n of them). Their work goes on
 * after owner's destruction (measured: a green context's destruction does
 * not wait for its kernels), so c's private stream waits for it first: a
 * last record on each live stream (streams: true), or the final record
 * already made. Every later fence and free on the private stream comes
 * after that wait; the events then go (a wait keeps what it waits for).
 * Under streams_lock, in the relaxed capture mode. A stream in a capture
 * begun through cudefer is waited for up to that capture's start (the
 * destruction ends the capture); one that joined a capture otherwise is
 * left out. */
static void drop_owned(struct cd_ctx *c, struct cd_tracked *list, size_t *n, CUcontext owner,
                       bool streams, const struct cd_driver_ops *ops)
{
    for (size_t i = 0; i < *n;) {
        if (list[i].owner != owner) {
            i++;
            continue;
        }
        bool recorded = !streams || (capturing(list[i].stream, ops)
                                         ? list[i].at_capture
                                         : ops->event_record(list[i].event, list[i].stream) ==
                                               CUDA_SUCCESS);
        if (recorded)
            ops->stream_wait_event(c->priv, list[i].event, 0);
        ops->event_destroy(list[i].event);
        list[i] = list[--*n];
    }
}

void cd_fence_owner_ending(struct cd_ctx *c, CUcontext owner)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record || !owner)
        return;
    struct cd_scope sc;
    cd_scope_enter(&sc, NULL, true);
    pthread_mutex_lock(&c->streams_lock);
    drop_owned(c, c->streams, &c->nstreams, owner, true, ops);
    drop_owned(c, c->finals, &c->nfinals, owner, false, ops);
    pthread_mutex_unlock(&c->streams_lock);
    cd_scope_leave(&sc);
}

void cd_fence_prune(struct cd_ctx *c)
{
    const struct cd_driver_ops *ops = cd_driver_ops();
    if (c->ctx_record)
        return;
    pthread_mutex_lock(&c->streams_lock);
    for (size_t i = 0; i < c->nfinals;) {
        if (ops->event_query(c->finals[i].event) == CUDA_SUCCESS) {
            ops->event_destroy(c->finals[i].event);
            c->finals[i] = c->finals[--c->nfinals];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&c->streams_lock);
}
