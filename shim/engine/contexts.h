/* contexts.h - what the engine keeps per CUDA context, and its lifetime.
 *
 * Each context the engine has seen gets a slot: a private non-blocking
 * stream where fences wait and device frees run, a second private stream
 * that never waits for anything (frees whose fence has passed), an event
 * for cuCtxRecordEvent, a pool of spare events, and its books (books.h).
 * Slots live in a table that grows and never shrinks, so a pointer to a
 * slot stays valid for the life of the process; a generation number tells
 * the context it serves now from the ones it served before.
 *
 * Lifetime: a slot is FREE, SETUP (one thread makes its private objects),
 * READY, MAY_END or CLOSING. Every use of a slot's objects or books is
 * bracketed by cd_ctx_enter and cd_ctx_exit. Closing a slot (teardown)
 * makes further enters fail and waits until the uses under way have ended,
 * so that nothing names a context after the driver destroyed it.
 *
 * Around a primary context's release, which ends the context only if it is
 * the last, the slot MAY_END: the engine's own walks (the waiter, flushes
 * of every context) stay out, but a call of the program that names the
 * context still enters (cd_ctx_enter_own), since the program uses the
 * context and says by that that it lives. A release or an allocation in
 * the context meanwhile is thus neither delayed nor left untracked. If the
 * release was the last, the slot is closed after it, the program's uses
 * drained, and torn down.
 *
 * A green context's CUcontext is an alias of its device's primary context:
 * memory allocated in it belongs to the primary context, and a fence in the
 * primary context covers the green contexts' work (measured on the H200;
 * DESIGN.md).
 */
#ifndef CUDEFER_CONTEXTS_H
#define CUDEFER_CONTEXTS_H

#include "list.h"
#include "registry.h"

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum cd_ctx_state { CD_CTX_FREE, CD_CTX_SETUP, CD_CTX_READY, CD_CTX_MAY_END, CD_CTX_CLOSING };

/* Records of a context's work kept for other contexts' fences at most
 * (fence.c): past that the newest is recorded again. */
#define CD_FAR_RING 32

/* Bins of equal released blocks (kind, bytes, flags) that may serve an
 * allocation, oldest first. Under the slot's lock. */
#define CD_BIN_BUCKETS 256
struct cd_bin {
    struct cd_bin *next;
    enum cd_kind kind;
    size_t bytes;
    unsigned flags;
    size_t n;
    bool looked;         /* a claim has looked at it */
    bool refilled;       /* a block came in since the last claim */
    unsigned streak;     /* allocations in a row that found it refilled */
    struct cd_link list; /* records, by their bin link */
};

/* Releases the engine made while the work before them still ran: the
 * waiter notes when the event recorded behind the first of them has
 * completed (what the driver's call would have waited for, at least). */
struct cd_watch {
    struct cd_link link;
    CUevent event;
    uint64_t since_ns;                  /* the first release */
    bool ended;                         /* a query saw its work end */
    uint32_t count[CD_KIND_COUNT];      /* releases, per kind */
    uint64_t after_sum[CD_KIND_COUNT];  /* the sum of their ns after the first */
};

struct cd_ctx {
    _Atomic(CUcontext) handle;
    _Atomic int state;
    _Atomic unsigned gen;
    _Atomic int users;   /* every use under way */
    _Atomic int walkers; /* of which the engine's own walks (cd_ctx_each) */
    CUdevice device;
    bool primary;
    bool ctx_record;     /* cuCtxRecordEvent exists (driver 12.5+) */
    CUstream priv;       /* fences wait here; frees run behind them */
    CUstream spare;      /* never waits: frees whose fence has passed */
    CUevent fence;       /* shared: a later record covers an earlier one */
    /* The fences' word (fence.h), in host memory the GPU writes through
     * word_dev; NULL with CUDEFER_FENCE_WORD=0 or when it could not be made.
     * word_given: the newest number a fence took; word_asked: the newest
     * one whose write is queued on priv (under word_lock, which queues one
     * at a time). */
    _Atomic uint32_t *word;
    CUdeviceptr word_dev;
    pthread_mutex_t word_lock;
    _Atomic uint32_t word_given, word_asked;

    /* The books (books.c), under lock. lock is held for a few
     * instructions at a time, never across a driver call that waits. */
    pthread_mutex_t lock;
    struct cd_link deferred;           /* records, oldest first */
    struct cd_bin *bins[CD_BIN_BUCKETS];
    long long held_bytes, held_entries;     /* all kinds but device */
    long long cached_bytes, cached_entries; /* device blocks */
    long long kind_entries[CD_KIND_COUNT];  /* entries of each kind */
    /* Device memory the program holds, and the most it held at once. */
    _Atomic long long live_bytes, peak_bytes, live_blocks, peak_blocks;
    int claims;                        /* records a reuse is looking at */
    struct cd_link inflight;           /* device frees issued, not yet batched */
    struct cd_link watches;
    _Atomic uint64_t watch_ns;         /* when the newest watch began */
    _Atomic bool sticky;               /* the context has a sticky error */

    /* Device frees in flight, behind marker events (waiter.c); whoever
     * holds drain_lock settles them. */
    pthread_mutex_t drain_lock;
    struct cd_batch *batches;

    pthread_mutex_t pool_lock;         /* spare events; a few instructions */
    CUevent *events;
    size_t nevents, cap_events;
    size_t events_out, events_out_most; /* handed out now, and most since the last trim */

    /* Before driver 12.5 (fence.c): the streams the program created, each
     * with an event made in the stream's own context (owner: a green
     * context's CUcontext, whose destruction ends them), and final events
     * of destroyed ones that may still run work (stream NULL). at_capture:
     * the event was last recorded just before a capture of the stream
     * began through cudefer, so it covers the work before that capture. */
    pthread_mutex_t streams_lock;
    struct cd_tracked {
        CUstream stream;
        CUevent event;
        CUcontext owner;
        bool at_capture;
    } *streams, *finals;
    size_t nstreams, cap_streams;
    size_t nfinals, cap_finals;

    /* Fences joined on the host (fence.h): records of this context's work
     * made for releases in other contexts, oldest first, each with the
     * number of the first fence it stands for (a record made again for
     * later fences keeps it); a marked one is still to be made (the slot
     * kept walks out at its fence); far_done: every fence up to that number
     * has passed here (UINT64_MAX while the slot serves no context);
     * far_captured: when the waiter last came to make a marked record, a
     * capture live here kept it from being made (fence.h).
     * far_lock is held for a few calls that do not wait. */
    pthread_mutex_t far_lock;
    struct cd_far { uint64_t first; CUevent event; bool marked; } far[CD_FAR_RING];
    unsigned far_head, far_n;
    _Atomic uint64_t far_done;
    _Atomic bool far_captured;
};

/* Device frees behind one marker event recorded on the private stream after
 * them: the batch is done when its marker is. Batches complete in order. */
struct cd_batch {
    struct cd_batch *next;
    CUevent marker;
    struct cd_link records;
};

/* Calls fn on every slot that is READY, entered for the call (skipping one
 * that closes meanwhile). */
void cd_ctx_each(void (*fn)(struct cd_ctx *c, void *arg), void *arg);

/* Calls fn on every slot but skip, in the table's order, while fn returns
 * true: a READY slot entered as a walk (entered true), any other as it is,
 * not entered (fn may then read its atomics only). Returns false when fn
 * stopped the walk. Does not wait. */
bool cd_ctx_every(const struct cd_ctx *skip, bool (*fn)(struct cd_ctx *c, bool entered, void *arg),
                  void *arg);

/* Whether c's slot is the only one the engine has made: no other context
 * has been known (a fence of c covers all that cd_ctx_each would visit). */
bool cd_ctx_alone(const struct cd_ctx *c);

/* A READY slot, entered as a walk (the caller ends the use with
 * cd_ctx_exit_walk), and its generation in *gen; NULL when there is none.
 * For an object that outlives the context it was made in. */
struct cd_ctx *cd_ctx_adopt(unsigned *gen);

/* The READY or MAY_END slot of ctx (a green context's CUcontext names its primary's),
 * or NULL. Does not set one up. */
struct cd_ctx *cd_ctx_find(CUcontext ctx);

/* The READY slot of ctx, set up on first sight: private streams, fence,
 * events. Does not wait. NULL when the driver refused (the context's
 * releases then pass through). */
struct cd_ctx *cd_ctx_get(CUcontext ctx);
/* cd_ctx_get for a context the caller knows to be its device's primary
 * context (primary 1) or not (0), from the call that made it: a slot set
 * up now takes that instead of asking the driver, whose answer costs a
 * retain and a release of the primary context (-1: ask). */
struct cd_ctx *cd_ctx_get_as(CUcontext ctx, int primary);

/* Pays the driver's one-time set-up of stream-ordered frees of plain
 * device memory (about 10 ms, once per process) in c, on its idle stream:
 * the waiter thread calls it, so that no release of the program pays it,
 * and so do the flush points (they wait for it if it is under way). WAITS
 * for the idle stream (which holds nothing of the program's). Returns
 * whether it did the set-up now. */
bool cd_ctx_warm_up(struct cd_ctx *c);

/* Whether the set-up was paid already. */
bool cd_ctx_warmed(void);

/* fn runs once per process before the first slot is set up (the process
 * module starts the waiter and the exit handler there). */
void cd_ctx_on_first_setup(void (*fn)(void));

/* A number of the calling thread, never 0 and never given to another
 * thread of the process (a thread's address would be: a dead thread's
 * stack or storage goes to the next one). Does not wait. */
uint64_t cd_thread_token(void);

/* The current context's slot, or NULL (none current, or never seen). */
struct cd_ctx *cd_ctx_current(void);

/* Announces a use of c's objects and books; false when c does not serve
 * the context of generation gen any more (or is closing). Does not wait. */
bool cd_ctx_enter(struct cd_ctx *c, unsigned gen);
/* cd_ctx_enter_own for whatever context c serves now (calls of the
 * program only). */
bool cd_ctx_enter_any(struct cd_ctx *c, unsigned *gen);
/* cd_ctx_enter for a call of the program naming c's context: also while
 * c MAY_END. Does not wait. */
bool cd_ctx_enter_own(struct cd_ctx *c, unsigned gen);
/* cd_ctx_enter counted as one of the engine's walks, for a use the program
 * did not ask in c's context (a primary release waits for it, as for the
 * walks); ended by cd_ctx_exit_walk. Does not wait. */
bool cd_ctx_enter_walk(struct cd_ctx *c, unsigned gen);
void cd_ctx_exit_walk(struct cd_ctx *c);
void cd_ctx_exit(struct cd_ctx *c);

/* Makes further enters fail and waits until the uses under way have ended
 * (uses are short, but a flush in progress may wait for the GPU: then this
 * waits for it too). */
void cd_ctx_close(struct cd_ctx *c);
/* Keeps the engine's walks out (MAY_END) and waits until the walks under
 * way have ended; the program's own calls go on entering. Waits as
 * cd_ctx_close does (for a walk's flush under way). */
void cd_ctx_close_maybe(struct cd_ctx *c);
/* A closed slot's context lives on: enters succeed again. */
void cd_ctx_reopen(struct cd_ctx *c);
/* A closed slot is done with: with alive, its private objects are destroyed
 * first (the context still exists); without, they are forgotten (they died
 * with the context). The slot is FREE afterwards, its generation moved on. */
void cd_ctx_release(struct cd_ctx *c, bool alive);

/* The slot of the primary context of dev that the engine knows, or NULL. */
struct cd_ctx *cd_ctx_primary(CUdevice dev);

/* Green contexts: the CUcontext green of green context g, on device dev, is
 * an alias of the primary context primary. */
struct cd_alias {
    CUgreenCtx green;
    CUcontext ctx, primary;
    CUdevice device;
};
void cd_ctx_alias_add(const struct cd_alias *a);
/* Whether g's alias is known. */
bool cd_ctx_alias_known(CUgreenCtx g);
/* Removes g's alias into *a; false when g is unknown. */
bool cd_ctx_alias_remove(CUgreenCtx g, struct cd_alias *a);

/* A spare event of c (made if the pool is empty), and its return. */
CUresult cd_ctx_event_get(struct cd_ctx *c, CUevent *ev);
void cd_ctx_event_put(struct cd_ctx *c, CUevent ev);
/* Destroys spare events: with all, those beyond the few a context starts
 * with; otherwise those beyond the most that were out at once since the
 * last trim (a loop that releases as many blocks between two of its
 * synchronisations makes no new events; a burst's go at the flush after
 * the next). The pool grows with the releases in flight. c entered, its
 * context current. Does not wait. */
void cd_ctx_event_trim(struct cd_ctx *c, bool all);

/* Makes ctx current for the calls between enter and leave (pushing it only
 * when it is not current already) and, with relaxed, puts the thread in
 * the relaxed capture mode so that those calls do not invalidate a capture
 * that another thread runs. */
struct cd_scope {
    CUcontext pushed;
    CUstreamCaptureMode mode;
    bool mode_set;
};
void cd_scope_enter(struct cd_scope *sc, CUcontext ctx, bool relaxed);
void cd_scope_leave(struct cd_scope *sc);

/* Forgets every slot without calling the driver (a forked child). */
void cd_contexts_reset(void);

#endif
