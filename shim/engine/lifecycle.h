/* lifecycle.h - what the engine's files share among themselves.
 *
 * lifecycle.c retires releases, capture.c gates fences against stream
 * capture, waiter.c finishes device frees, reclaim.c flushes and reuses,
 * teardown.c settles a context that goes away.
 */
#ifndef CUDEFER_LIFECYCLE_H
#define CUDEFER_LIFECYCLE_H

#include "engine.h"

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

struct cd_ctx;
struct cd_record;

#define CD_ALL_KINDS ((1u << CD_KIND_COUNT) - 1)

/* Device blocks a context keeps for reuse at most, whatever their bytes. */
#define CD_DEVICE_CACHE_BLOCKS 256

/* CUDEFER_ENABLE. */
bool cd_enabled(void);

/* lifecycle.c: the books of deferred entries. */
void cd_account_deferred(struct cd_ctx *cs, struct cd_record *r, int sign);
/* Removes a finished record from the registry and frees it (its event was
 * given back already). */
void cd_finish(struct cd_record *r);
/* Takes a deferred entry off its context's books: the accounting, and its
 * event goes back to the pool. The record itself stays. */
void cd_unbook_deferred(struct cd_ctx *cs, struct cd_record *r);
/* cd_unbook_deferred, then cd_finish: after its real release or drop. */
void cd_finish_deferred(struct cd_ctx *cs, struct cd_record *r);
/* Registrations whose unregister is queued, and whether one of them
 * overlaps [lo, hi). */
long long cd_registered_pending(void);
bool cd_registered_overlap(uintptr_t lo, uintptr_t hi);
/* Fences what was queued while captures were live (none is now). */
void cd_fence_backlogs(void);

/* capture.c */
bool cd_fence_enter(void); /* false while a capture is live */
void cd_fence_exit(void);
void cd_capture_reset(void);
/* A capture also ends when its stream or its context is destroyed. */
void cd_capture_stream_gone(CUstream stream);
void cd_capture_context_gone(CUcontext ctx);

/* waiter.c: starts the waiter thread and the exit handler, once per process
 * (again in a forked child); called when the first context is set up. */
void cd_lifecycle_start(void);
void cd_queue_inflight(struct cd_ctx *cs, struct cd_record *r);
long long cd_frees_pending(void);
void cd_frees_done(long long n);
void cd_waiter_reset(void);

/* teardown.c */
void cd_primaries_reset(void);

#endif
