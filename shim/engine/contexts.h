/* contexts.h - what the shim keeps per CUDA context.
 *
 * Each context the shim has seen an allocation in gets a private
 * non-blocking stream (made when the context is first seen, never on a
 * release), a fence event, a pool of events, and two lists: deferred entries
 * (released at flush points) and device frees in flight (finished by the
 * waiter thread).
 */
#ifndef CUDEFER_CONTEXTS_H
#define CUDEFER_CONTEXTS_H

#include "registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

enum cd_ctx_state { CD_CTX_FREE, CD_CTX_SETUP, CD_CTX_READY, CD_CTX_DEAD };

/* Device frees behind one marker event that the waiter recorded on the
 * private stream after them: the batch is done when its marker is. Batches
 * complete in order, as the private stream runs in order. */
struct cd_batch {
    struct cd_batch *next;
    CUevent marker;
    struct cd_record *records;
};

struct cd_ctx {
    _Atomic(CUcontext) handle;
    _Atomic int state;
    _Atomic int users;    /* short paths using its objects right now */
    CUdevice device;
    CUstream priv;        /* the shim's own stream: fences, frees */
    CUevent fence;        /* shared: a later record covers an earlier one */
    bool ctx_record;      /* cuCtxRecordEvent exists (driver 12.5+) */

    _Atomic(struct cd_record *) deferred; /* pushed lock-free; taken whole */
    _Atomic(struct cd_record *) inflight; /* device frees submitted */
    _Atomic long long deferred_bytes;    /* without device blocks */
    _Atomic long long deferred_entries;  /* with device blocks */
    _Atomic long long cached_device;     /* bytes of device blocks queued */
    _Atomic long long cached_entries;    /* device blocks queued */
    _Atomic bool over_limit;

    pthread_mutex_t lock;          /* the waiter's pass against teardown */
    struct cd_batch *batches;      /* device frees the waiter watches */
    pthread_mutex_t pool_lock;     /* held for a few instructions only */
    CUevent *events;               /* pool of spare events */
    size_t nevents, cap_events;

    /* Before driver 12.5: streams the program created, each with an event,
     * and final events of destroyed streams that may still run work. */
    pthread_mutex_t streams_lock;
    struct cd_tracked { CUstream stream; CUevent event; } *streams;
    size_t nstreams, cap_streams;
    CUevent *finals;
    size_t nfinals, cap_finals;
};

/* Every slot, for iteration (state READY are live contexts). */
#define CD_MAX_CONTEXTS 64
extern struct cd_ctx cd_contexts[CD_MAX_CONTEXTS];

/* The ready state of ctx, or NULL. */
struct cd_ctx *cd_ctx_find(CUcontext ctx);

/* The ready state of ctx, set up on first sight: private stream, fence,
 * events, and the one-time cost of the driver's first cuMemFreeAsync.
 * Called on allocation paths only. NULL when no slot is free or the driver
 * refused (the context's releases then pass through). */
struct cd_ctx *cd_ctx_get(CUcontext ctx);

/* The current context's state, or NULL (no current context, or unseen). */
struct cd_ctx *cd_ctx_current(void);

/* Makes the private stream wait for all work submitted so far in the
 * context and in every other context the shim knows (a kernel on another
 * device may read the memory through peer access), then records a spare
 * event behind it in *done. Does not wait. */
CUresult cd_ctx_fence(struct cd_ctx *cs, CUevent *done);

/* Announces a short use of cs's stream and events (microseconds, no GPU
 * wait); false when cs is not ready. Teardown waits until no use is left. */
bool cd_ctx_enter(struct cd_ctx *cs);
void cd_ctx_exit(struct cd_ctx *cs);

/* A spare event of the context (made if the pool is empty), and its return. */
CUresult cd_ctx_event_get(struct cd_ctx *cs, CUevent *ev);
void cd_ctx_event_put(struct cd_ctx *cs, CUevent ev);

/* Fallback fences (before 12.5) need the program's streams. */
void cd_ctx_stream_add(struct cd_ctx *cs, CUstream s);
void cd_ctx_stream_remove(struct cd_ctx *cs, CUstream s);
/* Drops final events that have completed; called by the waiter. */
void cd_ctx_prune_finals(struct cd_ctx *cs);

/* Destroys the private objects and frees the slot. The caller made sure no
 * entry refers to them any more. Called with the context still alive. */
void cd_ctx_release_slot(struct cd_ctx *cs);

/* Forgets every context without calling the driver (a forked child). */
void cd_contexts_reset(void);

/* Makes ctx current for the calls between enter and leave (pushing it only
 * when it is not current already) and, with relaxed, puts the thread in the
 * relaxed capture mode so that those calls do not invalidate a capture that
 * another thread runs. */
struct cd_scope {
    CUcontext pushed;
    CUstreamCaptureMode mode;
    bool mode_set;
};
void cd_scope_enter(struct cd_scope *sc, CUcontext ctx, bool relaxed);
void cd_scope_leave(struct cd_scope *sc);

#endif
