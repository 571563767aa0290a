/* capture.h - the capture gate.
 *
 * While any stream capture is live, the engine fences no release and
 * queries no event from a thread in the global capture mode: a
 * cuCtxRecordEvent of the capturing context, a legacy-stream record or an
 * event query from such a thread invalidates a capture in progress
 * (measured). Releases made meanwhile are deferred unfenced, and fenced
 * when the last capture ends. Only the records that other contexts' fences
 * wait for (fence.h: marked ones, made late) are made while captures are
 * live elsewhere (cd_gate_enter_beside).
 *
 * A fence announces itself (cd_gate_enter) before it looks at the live
 * captures; a capture counts itself live, then waits for the fences already
 * announced (each takes microseconds) before the real cuStreamBeginCapture.
 * Sequentially consistent atomics make the two never miss each other.
 *
 * A capture ends, for the gate, however it ends: cuStreamEndCapture on the
 * stream however it is named (a created stream, the per-thread default
 * stream as CU_STREAM_PER_THREAD or as stream 0 of a _ptsz call), its
 * invalidation (the program still ends it), its stream's destruction, its
 * context's destruction, the end of the thread whose per-thread stream it
 * captures, or the driver saying the stream no longer captures. The table
 * of live captures grows as needed.
 */
#ifndef CUDEFER_CAPTURE_H
#define CUDEFER_CAPTURE_H

#include <cuda.h>
#include <stdbool.h>

/* fn runs each time the last live capture ends (the retire path fences
 * what was deferred meanwhile). */
void cd_capture_on_reopen(void (*fn)(void));

/* false while a capture is live: then nothing may be recorded. */
bool cd_gate_enter(void);
void cd_gate_exit(void);
/* The gate for a record of one context's work only (cuCtxRecordEvent of
 * it, made in the relaxed mode): false while a live capture is in a context
 * for which in(ctx, arg) holds, or in one not known yet (a capture being
 * begun, or whose context could not be asked). Captures in other contexts
 * do not shut it: such a record leaves them intact (measured, DESIGN.md
 * §1.3). cd_gate_exit ends it. Does not wait. */
bool cd_gate_enter_beside(bool (*in)(CUcontext ctx, void *arg), void *arg);

/* Whether a capture is live now (a hint: one may start right after). */
bool cd_capture_live(void);

/* A capture also ends when its stream or its context goes. */
void cd_capture_stream_gone(CUstream stream);
void cd_capture_context_gone(CUcontext ctx);

/* Asks the driver about the captured streams it can name, and ends those
 * that no longer capture (the waiter, now and then, while the gate is
 * shut). Does not wait. */
void cd_capture_check(void);

/* Forgets every capture (a forked child). */
void cd_capture_reset(void);

#endif
