/* fence.h - ordering a release behind all work submitted so far, on the GPU.
 *
 * A release's fence has two parts.
 *
 * Its own context's: with driver 12.5 and newer, cuCtxRecordEvent captures
 * every stream of a context (measured: non-blocking, legacy and per-thread
 * streams; a primary context's record covers its green contexts too), made
 * into the release's event (one driver call). Whatever frees memory on the
 * private stream makes it wait for that event first (cd_retire_free).
 * Before 12.5 there is no such call: an event is recorded on every stream
 * the program created (the engine watches stream creation and
 * destruction), the private stream, a blocking one that follows the legacy
 * stream, waits for them, and the release's event is recorded behind.
 *
 * The other contexts' (far): a kernel of another context may use the
 * memory (peer access, portable pinned memory, managed memory), so every
 * other context the engine knows records its work too, into a ring of its
 * own events, under one number that the fence keeps (far; 0 when there was
 * no other context). Those records are joined on the host: reuses, flushes
 * and stream-ordered frees ask whether they have passed, and nothing on
 * the GPU waits for them. A wait of the releasing context's streams for
 * them would make the program's cuCtxSynchronize of that context wait for
 * the other contexts' work, which the driver's does not (measured on an
 * H200, bench/RESULTS.md run 18: a kernel in the other context that waited
 * for the synchronising thread hung it).
 *
 * Fences are numbered under one lock, and a context's records are kept in
 * the order of their numbers: the oldest record that has not completed
 * tells up to which number the context has passed (records complete in
 * order: a later one covers all an earlier one does). A context that has
 * ended, or has not been set up, has passed every fence.
 *
 * The word: each fence of a release that may be reused takes a number in
 * its context, and a reuse reads a word of host memory that the GPU
 * writes with the newest number whose fences have passed, instead of
 * querying the fence's event. Measured on an H200 (bench/RESULTS.md, runs
 * 58 and 62): while the GPU runs behind, that query took 1.6 us of a
 * 4 KiB allocate-touch-release iteration of 6.8 us; the word was never
 * seen before the event had passed, and trailed it by about 5 us.
 *
 * The writes are asked for by the reuses, not by the releases: a record
 * of the context, the private stream's wait for it and a write of the
 * newest number behind (cd_fence_word_ask), one at a time, once the one
 * before has landed and four numbers wait. Every fence numbered up to that
 * number made its record before it took the number, so the new record
 * covers them all. Measured (runs 63 and 65): behind a running kernel,
 * after 50 ms of sleep, a write took 21-26 us and the wait 6-7 us; a wait
 * and a write on each release brought a release under a running kernel
 * from 0.039 ms to 0.054-0.075 ms, past the 0.05 ms it must stay under.
 * A release now only takes a number (0.038 ms in run 65).
 *
 * A word not there yet is no answer: the reuse queries the event, as
 * without it. Numbers are 32 bits and compared modulo 2^32: a number reads
 * as passed when the word is at or up to 2^31 past it. A false answer
 * would need 2^31 numbers given between a write's asking and its landing;
 * a number older than 2^31 behind the word reads as not passed, and is
 * asked of the event. The word is made unless CUDEFER_FENCE_WORD=0; every
 * real-GPU check passed on this form (run 68: the hazards check 0 faults in
 * 15 runs, a release under a running kernel 0.036 ms).
 *
 * Nothing here waits for the GPU but cd_fence_far_wait: records, stream
 * waits and queries return at once (0.46 us for a record, a wait and a
 * record, measured). Fences are made inside the capture gate (capture.h):
 * a record during a live capture would invalidate it; the queries are
 * made inside the gate or in the relaxed capture mode.
 */
#ifndef CUDEFER_FENCE_H
#define CUDEFER_FENCE_H

#include "contexts.h"

/* Records in *done a spare event that completes when the work submitted so
 * far in c has finished, and, when far is not NULL, in *far the number of
 * the other contexts' records (0: none was needed). Called with c entered
 * and its context current. An error of c's own record is returned (a
 * sticky error of the context); another context's is not (a context that
 * faulted runs nothing more). *word (unless NULL): the fence's number in
 * c's word, or 0 when it has none (then only the event tells). */
CUresult cd_fence(struct cd_ctx *c, CUevent *done, uint64_t *far, uint32_t *word);
/* cd_fence for a host that waits for *done at once (a registration's
 * release): c's part is always the private stream's wait and a record
 * behind it. Measured on an H200 (bench/RESULTS.md, run 12): a 4 KiB
 * registration loop whose unregister synchronised a context's record took
 * 120-127 us an iteration against 94-119 us before; with a stream's event,
 * 94-121 us, as before. */
CUresult cd_fence_for_host(struct cd_ctx *c, CUevent *done, uint64_t *far);

/* Whether c's word says that c's part of the fence numbered word has
 * passed. False says nothing: ask the event. Reads memory only. */
bool cd_fence_word_passed(const struct cd_ctx *c, uint32_t word);
/* Asks the GPU to write the newest number given in c into c's word once
 * its fences have passed (a record of c, the private stream's wait for it,
 * the write), unless fewer than four numbers were given since the last
 * write, that write has not landed yet, or another thread is asking. c
 * entered, its context current, inside the capture gate. Does not wait. */
void cd_fence_word_ask(struct cd_ctx *c);
/* Whether the other contexts' part of a fence made in c has passed; looks
 * at their newest records (queries). Does not wait. */
bool cd_fence_far_passed(struct cd_ctx *c, uint64_t far);
/* CUDA_SUCCESS when both parts of the fence (done, far) made in c have
 * passed, CUDA_ERROR_NOT_READY when one has not, or the error of done's
 * query. Does not wait. */
CUresult cd_fence_query(struct cd_ctx *c, CUevent done, uint64_t far);
/* The number up to which every fence made in c has passed in the other
 * contexts (UINT64_MAX with none), now. Does not wait. */
uint64_t cd_fence_far_floor(struct cd_ctx *c);
/* How long the engine waits for other contexts' records where the thread
 * that waits may be the one they wait for: records that ending contexts or
 * captures hold back (cd_fence_far_wait), and any records where
 * the call would not have waited for other contexts without cudefer (an
 * unregister, a registration over a pending unregister: retire.c,
 * reclaim.c). */
#define CD_FAR_GIVE_UP_NS 5000000ull

/* What cd_fence_far_wait found. */
enum cd_far_wait {
    CD_FAR_PASSED,   /* the other contexts' part has passed */
    CD_FAR_HELD,     /* held back by ending contexts or records to be made */
    CD_FAR_CAPTURED, /* held back only by records that captures kept from being made */
    CD_FAR_LATE,     /* not passed by the deadline */
};

/* WAITS until the other contexts' part of a fence made in c has passed
 * (polls: no lock is held while it waits, and other threads' fences go on).
 * A context that is ending (its slot closing, or a primary release under
 * way) cannot be asked, and may itself wait for the caller's use of c to
 * end; a marked record is made only when no capture is live in its
 * context, and the thread that captures may be one that waits for that
 * use, or for the caller, too: once only such contexts or records have
 * held the wait back for CD_FAR_GIVE_UP_NS, it returns CD_FAR_HELD, or
 * CD_FAR_CAPTURED when at the last look only marked records held it back,
 * each in a context where the waiter found a capture live (cd_fence_fill_held).
 * With deadline (cd_now_ns; 0: none), it returns CD_FAR_LATE once the
 * deadline has passed first. In the relaxed capture mode, or inside the
 * gate. */
enum cd_far_wait cd_fence_far_wait(struct cd_ctx *c, uint64_t far, uint64_t deadline);
/* Destroys the events of c's ring that no record uses (up to CD_FAR_RING
 * stay made between flushes: cudefer_flush leaves none). c entered. Does
 * not wait. */
void cd_fence_trim(struct cd_ctx *c);
/* Makes c's marked records (fence.c): c entered, its context current,
 * inside the capture gate. Returns whether any context still has one (the
 * waiter calls it for every context it visits, and looks again soon while
 * this says so). Does not wait. */
bool cd_fence_fill(struct cd_ctx *c);
/* The waiter could not make c's marked records: a capture is live in c.
 * Until cd_fence_fill runs for c again, a far wait held back by them may
 * return CD_FAR_CAPTURED. Does not wait. */
void cd_fence_fill_held(struct cd_ctx *c);
/* Whether any context has a marked record. */
bool cd_fence_marked(void);
/* c's slot is torn down: no fence waits for its context any more (its
 * work ended with it); its ring's events are destroyed (with alive) or
 * forgotten. */
void cd_fence_forget(struct cd_ctx *c, bool alive);
/* Forgets the numbering (a forked child). */
void cd_fence_reset(void);

/* Before driver 12.5: the streams of the program, for the fences; owner is
 * the stream's own context (a green context's CUcontext for its streams). */
void cd_fence_stream_added(struct cd_ctx *c, CUstream s, CUcontext owner);
void cd_fence_stream_removed(struct cd_ctx *c, CUstream s);
/* Before a capture of s begins (the capture gate shut, fences drained): a
 * record of the work before it, which a destruction of s during the
 * capture leaves as its final record. Does not wait. */
void cd_fence_stream_capturing(struct cd_ctx *c, CUstream s);
/* Before owner (a green context) is destroyed, which ends its streams
 * without their destroy calls but not their work: c's private stream waits
 * for their last work, and their streams and final events are dropped.
 * Does not wait on the host. */
void cd_fence_owner_ending(struct cd_ctx *c, CUcontext owner);
/* Drops final events of destroyed streams that have completed (waiter). */
void cd_fence_prune(struct cd_ctx *c);

#endif
