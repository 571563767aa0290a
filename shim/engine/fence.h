/* fence.h - ordering a release behind all work submitted so far, on the GPU.
 *
 * With driver 12.5 and newer, cuCtxRecordEvent captures every stream of a
 * context (measured: non-blocking, legacy and per-thread streams; a primary
 * context's record covers its green contexts too), and the private stream
 * waits for that event. Every context the engine knows is fenced, since a
 * kernel of another context may use the memory (peer access, portable
 * pinned memory, managed memory). Before 12.5 there is no such call: an
 * event is recorded on every stream the program created (the engine watches
 * stream creation and destruction), and the private stream is a blocking
 * one, which follows the legacy stream.
 *
 * When the engine has known one context only (the common case of a
 * program on one GPU), the fence is that context's record alone, made into
 * the release's event: one driver call instead of three, and the private
 * stream does not wait for it. Whatever frees memory on the private stream
 * therefore makes it wait for the record's event first (cd_retire_free).
 *
 * Nothing here waits for the GPU: records and stream waits return at once
 * (0.46 us for a record, a wait and a record, measured). Callers hold the
 * capture gate (capture.h): a record during a live capture would
 * invalidate it.
 */
#ifndef CUDEFER_FENCE_H
#define CUDEFER_FENCE_H

#include "contexts.h"

/* Records in *done a spare event that completes when the work submitted so
 * far in every context the engine knows has finished. With several
 * contexts known, or before 12.5, c's private stream waits for that work
 * and *done is recorded behind it; with one, *done is c's own record and
 * the private stream is left as it was. done NULL: the private stream waits,
 * no event. Called with c entered and its context current. An error of c's
 * own record is returned (a sticky error of the context); another
 * context's is not (a context that faulted runs nothing more). */
CUresult cd_fence(struct cd_ctx *c, CUevent *done);
/* cd_fence for a host that waits for *done at once (a registration's
 * release): always the private stream's wait and a record behind it, even
 * with one context known. Measured on an H200 (bench/RESULTS.md, run 12):
 * a 4 KiB registration loop whose unregister synchronised a context's
 * record took 120-127 us an iteration against 94-119 us before; with a
 * stream's event, 94-121 us, as before. */
CUresult cd_fence_for_host(struct cd_ctx *c, CUevent *done);

/* Before driver 12.5: the streams of the program, for the fences; owner is
 * the stream's own context (a green context's CUcontext for its streams). */
void cd_fence_stream_added(struct cd_ctx *c, CUstream s, CUcontext owner);
void cd_fence_stream_removed(struct cd_ctx *c, CUstream s);
/* Before owner (a green context) is destroyed, which ends its streams
 * without their destroy calls but not their work: c's private stream waits
 * for their last work, and their streams and final events are dropped.
 * Does not wait on the host. */
void cd_fence_owner_ending(struct cd_ctx *c, CUcontext owner);
/* Drops final events of destroyed streams that have completed (waiter). */
void cd_fence_prune(struct cd_ctx *c);

#endif
