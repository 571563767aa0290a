/* engine.h - the release engine, as the doors call it.
 *
 * The engine decides what becomes of a release: a fenced stream-ordered
 * free, an entry kept for reuse, an entry on a context's deferred queue, or
 * the driver's own call. It knows nothing of how a call reached it
 * (exported symbol, dlsym, cuGetProcAddress).
 *
 * The life of a release, one verb each:
 *   track    an allocation is recorded (LIVE);
 *   retire   the program releases it: the engine takes the record (RETIRED);
 *   fence    the release is ordered behind all work submitted so far in
 *            every context, on the GPU, without waiting (fence.c);
 *   defer    the fenced release waits on its context's books (books.c);
 *   reuse    a deferred block whose fence has passed serves an allocation of
 *            the same kind, size and flags (cache.c);
 *   free     device memory goes to cuMemFreeAsync behind its fence, and the
 *            waiter settles it (waiter.c): the driver has it back;
 *   flush    deferred releases are made for real with the driver's own
 *            calls, at flush points (reclaim.c);
 *   reclaim  an allocation that failed for lack of memory takes back what
 *            the engine holds, first without waiting, then waiting;
 *   tear     a context goes away: what it freed is dropped (teardown.c).
 *
 * Which calls may wait for GPU work (the rule: a call that does not wait in
 * the driver does not wait here; DESIGN.md has the table of every call):
 *   - the releases do not wait, except cuMemHostUnregister, which waits for
 *     the work submitted before it (the pages are the program's again when
 *     it returns), and a release beyond the limits, which is the driver's own
 *     call and waits as it always did;
 *   - allocations do not wait, except: for a released block of their size,
 *     at most what an allocation of that kind and size was measured to take
 *     (CUDEFER_REUSE_WAIT), or, for managed memory, until the work before a
 *     block the same thread released while the GPU ran it has finished
 *     (the driver's release would have waited for it: cache.c); after an
 *     out-of-memory answer, once taking back what needs no waiting was not
 *     enough; a registration overlapping a range whose unregister is still
 *     pending;
 *   - cuCtxSynchronize waits (the program's own wait) and then flushes;
 *     cudefer_flush and context teardown wait.
 * Functions below say when they may wait.
 */
#ifndef CUDEFER_ENGINE_H
#define CUDEFER_ENGINE_H

#include "driver.h"
#include "kinds.h"
#include "options.h"

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the engine takes calls: CUDEFER_ENABLE, a usable driver, and not
 * past the exit handler (at exit the driver tears itself down; from then on
 * every call goes to it unchanged). */
static inline bool cd_engine_on(void)
{
    return cd_option_bool(CD_OPT_ENABLE) && cd_driver_in_use();
}

/* --- releases --------------------------------------------------------------
 * cd_release returns true when the engine took the release of the object
 * of class cls (CD_DEVICE for cuMemFree of device or managed memory) named
 * key, and stored the caller's answer in *rc; false means "make the
 * driver's own call", which is always correct: it is what the program
 * asked for. Does not wait, except for CD_REGISTERED (cuMemHostUnregister)
 * with CUDEFER_REGISTERED=wait, the default: it WAITS for the work submitted
 * before the call, then defers the driver's unregister. Past the limits
 * (CUDEFER_MAX_DEFERRED_*, soft) a release does not wait either. */
bool cd_release(enum cd_kind cls, uintptr_t key, CUresult *rc);
/* The driver's own release, made because cd_release returned false, gave
 * memory back: an allocation that ran out of memory meanwhile asks again
 * (cd_alloc_failed). Does not wait. */
void cd_release_passed(void);

/* The answer to cuMemHostUnregister(ptr) given the driver's answer rc: an
 * address the driver knows only because the engine holds the block the
 * program released around it gets the code for an unknown address
 * (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED). Does not wait. */
CUresult cd_unregister_answer(void *ptr, CUresult rc);

/* cuMemFreeAsync(ptr): a block the engine holds (released already) gets the
 * driver's answer for a freed one, in *rc (true); otherwise false: the
 * caller makes the driver's call, and after a success calls
 * cd_free_async_done, which forgets a tracked block (the program freed it
 * itself, stream-ordered). Do not wait. */
bool cd_free_async(CUdeviceptr ptr, CUresult *rc);
void cd_free_async_done(CUdeviceptr ptr);

/* The program made the blocks holding [ptr, ptr + bytes) differ from a new
 * allocation of the driver's in a way a reuse would hand on (bytes 0: the
 * block holding ptr): it exported one through IPC or as a dma-buf (another
 * process or device may map its pages), or set advice, a prefetch
 * location, a stream attachment or a pointer attribute on it, which the
 * driver answers as unset for a new allocation at the same address
 * (measured: DESIGN.md, section 1.4). Each such block cudefer tracks never
 * serves another allocation: once released it goes back to the driver,
 * fenced (one the program had released already too: the driver, which
 * still holds it, answered the call). Where ptr is not the start of a
 * block cudefer tracks, asks the driver where the allocation holding it
 * starts. Does not wait. */
void cd_block_altered(CUdeviceptr ptr, size_t bytes);

/* cuMemGetInfo succeeded with *free bytes free of total: adds the device
 * memory the program released in contexts of the current context's device
 * and cudefer still holds (on the books: kept for reuse, waiting for its
 * fence, or queued while a capture was live). The driver alone would count
 * it free once its own release had returned, and an allocation that runs
 * short of memory takes it back. Frees already handed to the driver that
 * the waiter has not synchronised yet are not added: the driver takes them
 * back at any host synchronisation that covers them, so counting them could
 * count them twice; until the waiter settles them the figure is low, never
 * high. Never more than total. Does not wait. */
void cd_mem_info(size_t *free, size_t total);

/* --- allocations --------------------------------------------------------- */

struct cd_alloc {
    enum cd_kind kind;
    size_t bytes;
    unsigned flags;     /* the call's flags; CD_FLAGS_ALLOC_HOST for cuMemAllocHost */
    uintptr_t max_key;  /* reuse only blocks below it (the 32-bit calls) */
    uint64_t start_ns;
    int level;          /* reclaims made so far */
    int rechecks;       /* retries made because memory went back meanwhile */
    uint64_t held_ns;   /* when ending contexts first held released memory back */
    unsigned long long seen; /* cd_registry_returned() before the last ask */
    int mem;            /* whose memory it takes: a device's ordinal, or CD_MEM_* */
    int remaps;         /* retries made after unregisters of unmapped pages */
    unsigned long long unregistered; /* cd_books_unregisters_done() at the last ask */
    const char *call;
};
#define CD_FLAGS_ALLOC_HOST 0x80000000u

/* Whose memory an allocation takes, besides a device's ordinal: what an
 * allocation short of memory may take back (cd_alloc_failed). */
#define CD_MEM_HOST (-1)    /* pinned host memory, shared by every device */
#define CD_MEM_ANY (-2)     /* not known: anything may serve it */
#define CD_MEM_CURRENT (-3) /* the current context's device, looked up once memory runs out */

/* Starts an allocating call of kind and bytes (bytes 0: unknown, no reuse).
 * narrow: the call returns a 32-bit address. Does not wait. */
void cd_alloc_start(struct cd_alloc *a, const char *call, enum cd_kind kind, size_t bytes,
                    unsigned flags, bool narrow);

/* Whose memory a takes when its kind does not say (cd_alloc_start guesses
 * from the kind: pinned host memory for CD_HOST and CD_REGISTERED,
 * CD_MEM_ANY for managed memory, the current context's device for the
 * others). Does not wait. */
static inline void cd_alloc_takes(struct cd_alloc *a, int mem)
{
    a->mem = mem;
}

/* Serves the allocation with a block the program released earlier in the
 * current context, once no work submitted before its release can use it.
 * MAY WAIT, bounded: for the oldest such block, for at most what a new
 * allocation of that kind and size was measured to take; for managed
 * memory, for a block this thread released while the GPU used it, until
 * that use has ended (10 s at most). Returns true and
 * the block in *key, or false: the caller asks the driver. */
bool cd_alloc_reuse(struct cd_alloc *a, uintptr_t *key);

/* After the driver's answer rc: true when the caller should ask again. On
 * an out-of-memory answer it first takes back what needs no waiting (device
 * blocks whose fence has passed, frees in flight that have completed); the
 * second time it MAY WAIT for everything the engine holds that can serve
 * it, whoever holds it, and says so at log level info. What can serve it
 * (a->mem): for a device's memory, what holds that device's memory (device
 * blocks, arrays, modules and libraries of its contexts; managed memory
 * anywhere only where the device cannot move managed pages out itself,
 * without concurrent managed access); for pinned host memory, pinned
 * blocks, registrations and managed memory, in every context; when not
 * known, everything. It answers false (the driver's out of
 * memory stands) once a round finds the engine holding nothing, or after
 * eight rounds once a second has passed since the allocation began: other
 * threads may take what a round gives back, and release more, before this
 * one asks again.
 * A pinned allocation answered CUDA_ERROR_ALREADY_MAPPED, or a managed one
 * CUDA_ERROR_INVALID_VALUE, may have landed on pages whose unregister the
 * engine holds and which the program has unmapped since (freed after its
 * cuMemHostUnregister): the driver refuses to map memory over a
 * registration it still has (measured, tests/gpu/facts.c unmapped). Those
 * unregisters are made, which MAY WAIT for their contexts' work as the
 * program's own unregisters would have, and the call is asked again. */
bool cd_alloc_failed(struct cd_alloc *a, CUresult rc);

/* The allocation's end: on success the object is tracked, and the time it
 * took the driver is noted (the bound of reuse waits). Does not wait. */
void cd_alloc_done(struct cd_alloc *a, CUresult rc, uintptr_t key);

/* An allocation the engine does not track (stream-ordered, virtual memory,
 * IPC, graph) returned key: a stale record of that address goes. */
void cd_alloc_untracked(uintptr_t key);

/* Before cuMemHostRegister of [ptr, ptr + bytes): really releases queued
 * unregisters that overlap it (MAY WAIT for them: the one exception for
 * registrations), so that the registration does not fail with
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. */
void cd_register_start(void *ptr, size_t bytes);

/* After a registration failed with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
 * releases the queued unregisters near the range (may wait for them), and
 * all of them only if one's range could not be noted. An overlap with a
 * registration the program holds gets the driver's answer at once. True
 * when the caller should retry. */
bool cd_register_failed(CUresult rc, void *ptr, size_t bytes);

/* --- streams and captures ------------------------------------------------- */

/* A stream the program created (successfully) / is about to destroy. */
void cd_stream_created(CUstream stream);
void cd_stream_destroying(CUstream stream);

/* Around cuStreamBeginCapture*: cd_capture_begin before the real call (it
 * waits for fences already in progress, which take microseconds, never for
 * the GPU), cd_capture_begun after it with its result; per_thread: the call
 * was a _ptsz one, where stream 0 is the per-thread default stream. */
void cd_capture_begin(void);
/* After cd_capture_begin, before a capture of a stream the program created
 * begins (before driver 12.5, fence.h): a record of its work so far. */
void cd_stream_capturing(CUstream stream);
void cd_capture_begun(CUstream stream, bool per_thread, CUresult rc);
/* After cuStreamEndCapture*, with the stream and the call's result. */
void cd_capture_ended(CUstream stream, bool per_thread, CUresult rc);

/* --- contexts ------------------------------------------------------------- */

/* After a successful cuCtxSynchronize (ctx NULL: the current one): makes
 * that context's deferred releases for real. MAY WAIT: the program waited
 * for the context's work already, but a fence may also cover other
 * contexts' work, and other threads may have launched since. */
void cd_context_synchronized(CUcontext ctx);

/* A context the program created (primary false: cuCtxCreate*) or retained
 * (primary true: cuDevicePrimaryCtxRetain): set up now, so that fences
 * cover it even if nothing is ever allocated in it. */
void cd_context_created(CUcontext ctx, bool primary);

/* Before cuCtxDestroy: everything held for the context goes (its
 * destruction frees it) and its private objects are destroyed; after it
 * (whatever it answered), cd_context_destroyed. An out-of-memory answer in
 * another thread meanwhile waits for the destruction to return. */
void cd_context_destroying(CUcontext ctx);
void cd_context_destroyed(void);

/* Around cuDevicePrimaryCtxRelease and cuDevicePrimaryCtxReset: the engine
 * stops using the primary context before the call, and after it asks the
 * driver whether the context is still active (a release the engine did not
 * see retained may end it, or not; a reset ends it): if so it goes on using
 * it, else what it held for it is dropped, without naming the dead context.
 * cd_primary_ending may wait for a flush under way in that context. */
void cd_primary_ending(CUdevice dev);
void cd_primary_ended(CUdevice dev);

/* After cuCtxFromGreenCtx: green's CUcontext is an alias of its device's
 * primary context. Around cuGreenCtxDestroy, which releases a reference on
 * the primary context: as for a primary release. */
void cd_green_seen(CUgreenCtx green, CUcontext ctx);
/* Before a stream is made in green (cuGreenCtxStreamCreate): its context
 * will name the green context, which must be known as an alias first. */
void cd_green_stream_created(CUgreenCtx green);
void cd_green_destroying(CUgreenCtx green);
void cd_green_destroyed(CUgreenCtx green);

/* cudefer_flush(): every context's deferred releases, for real, and the
 * device frees in flight, until the driver has everything back. WAITS. */
int cd_flush_all(void);

#endif
