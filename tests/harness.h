/* harness.h - what the plain-C harnesses over the test driver share
 * (tests/race.c, tests/property.c, tests/reuse.c): run parameters, a
 * per-thread random stream, a per-thread history of the last operations,
 * failure reports that can be replayed, the checks of a call's result and
 * of the invariants that hold after every operation, a watchdog, the
 * driver's entry points by name, a thread's pages for registrations and
 * their canaries, a worker's start, operation loop and end (race,
 * property), the choice of an object's event for a writer, and the table
 * of released memory whose writers may still run.
 *
 * The harnesses are plain C (no Criterion), so that they also run under
 * ThreadSanitizer. A failure report names the invariant, the seed and the
 * command that replays the run, and shows the last HX_SHOWN operations of
 * the thread that saw the failure (and fewer of every other thread: a
 * global invariant such as a dead-context call may have been broken by
 * another thread's call).
 */
#ifndef CUDEFER_TESTS_HARNESS_H
#define CUDEFER_TESTS_HARNESS_H

#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HX_MAX_THREADS 64
#define HX_HISTORY 32 /* operations remembered per thread */
#define HX_SHOWN 20   /* of which a report shows, for the failing thread */
#define HX_TEXT 160

/* ---- the run ----------------------------------------------------------- */

struct hx_run {
    const char *name;         /* "race", "property": prefix of every line */
    const char *env_prefix;   /* "RACE", "PROP" */
    const char *argv0;
    unsigned long long ops;   /* operations, all threads together */
    int threads;
    uint64_t seed;
    unsigned timeout_s;       /* the watchdog's limit */
    unsigned stall_s;         /* a call under way longer fails the run ('stall'); 0: none */
    bool keep_going;          /* report every failure, not only the first */
};

extern struct hx_run hx;

/* Reads OPS [THREADS [SEED]] from argv, else PREFIX_OPS, PREFIX_THREADS,
 * PREFIX_SEED from the environment, else the defaults; PREFIX_TIMEOUT
 * (seconds; default: the larger of 120 and ops / ops_per_s_floor),
 * PREFIX_STALL_S (seconds, 0 for none; default: hx.stall_s as the harness
 * set it before the call) and PREFIX_KEEP_GOING. Exits with status 2 on a
 * malformed value. */
void hx_parse(int argc, char **argv, const char *name, const char *env_prefix,
              unsigned long long default_ops, int default_threads,
              unsigned long long ops_per_s_floor);

/* ---- threads and their history ----------------------------------------- */

struct hx_entry {
    unsigned long long op;
    char text[HX_TEXT];
};

struct hx_thread {
    int index;
    uint64_t rng;
    unsigned long long ops;             /* this thread's share */
    _Atomic unsigned long long done;    /* operations finished */
    _Atomic(const char *) in_call;      /* the driver call under way, or NULL */
    _Atomic uint64_t call_start_ns;
    struct hx_entry hist[HX_HISTORY];
    _Atomic unsigned nhist;             /* entries written so far */
};

/* The threads, registered by hx_thread_init (index < HX_MAX_THREADS). */
extern struct hx_thread *hx_threads[HX_MAX_THREADS];

/* Sets up t as thread index, with its own random stream from the seed. */
void hx_thread_init(struct hx_thread *t, int index);

uint64_t hx_random(struct hx_thread *t);
/* A random number in [0, n). */
unsigned hx_below(struct hx_thread *t, unsigned n);

/* Starts a history entry for the next call (printf format) and marks the
 * call under way (for the watchdog's report). */
void hx_begin(struct hx_thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ends it with the call's result. */
void hx_end(struct hx_thread *t, CUresult rc);
/* Appends a note (no call) to the history. */
void hx_note(struct hx_thread *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The name of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or its number. */
const char *hx_rc(CUresult rc);

/* ---- failures ------------------------------------------------------------ */

/* Reports that invariant was broken (t: the thread that saw it, or NULL for
 * the main thread): the seed, the replay command, the message, and the
 * histories. Ends the process with status 1 unless hx.keep_going. */
void hx_fail(struct hx_thread *t, const char *invariant, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The driver alone would answer want: anything else fails invariant
 * "result" for t. Whether rc was want. */
bool hx_expect(struct hx_thread *t, const char *call, CUresult rc, CUresult want);

/* The invariants checked after every operation, and once more at the end
 * (t: the thread that checks, or NULL for the main thread): no kernel
 * touched memory that was not live ("fault"), no call named a destroyed
 * context ("dead-context"). The test driver's counts only grow: each new
 * count is reported once, by the thread that sees it first. */
void hx_check_always(struct hx_thread *t);

/* Failures reported so far, and a one-line list of the invariants. */
unsigned hx_failures(void);
const char *hx_failed_invariants(void);

/* ---- watchdog ------------------------------------------------------------ */

/* Starts a thread that aborts the run with a report (the call each thread
 * is in, and its history) if hx_watchdog_stop is not called within
 * hx.timeout_s seconds. phase names what the main thread is doing. */
void hx_watchdog_start(void);
void hx_watchdog_phase(const char *phase);
void hx_watchdog_stop(void);

/* ---- driver entry points ------------------------------------------------- */

/* dlsym(RTLD_DEFAULT, name): the preloaded shim's wrapper for a wrapped
 * name (the shim answers dlsym), the test driver's function otherwise.
 * hx_sym aborts the run if the name is missing; hx_sym_opt returns NULL. */
void *hx_sym(const char *name);
void *hx_sym_opt(const char *name);

/* What cudefer saved is gathered only where it is shown (CUDEFER_STATS=1
 * or a report): unless the environment sets one of CUDEFER_STATS,
 * CUDEFER_REPORT and CUDEFER_SAVINGS, even seeds write a report to
 * /dev/null, so that the releases' queries and the waiter's watches run
 * beside everything else, and odd seeds run the default path. Call before
 * the first CUDA call; returns a word for the run's header line. */
const char *hx_savings_by_seed(void);

/* Reuses read the fences' words (CUDEFER_FENCE_WORD=1, fence.h; the
 * default) unless the environment sets it, or the seed is a multiple of 3:
 * then they ask each fence's event, the fallback a word not there yet
 * takes. Call before the first CUDA call; returns a word for the run's
 * header line. */
const char *hx_word_by_seed(void);

/* cudefer_flush, found with dlsym; -1 if the shim is not loaded. */
int hx_flush(void);
bool hx_shim_loaded(void);

uint64_t hx_now_ns(void);

/* Nanoseconds the calling thread has spent runnable but waiting for a CPU
 * (the kernel's schedstat run delay, /proc/thread-self/schedstat), or 0
 * where the kernel does not say. A call that took long only because its
 * thread was kept off the CPU did not wait for anything. */
uint64_t hx_thread_run_delay_ns(void);

/* ---- contexts --------------------------------------------------------------- */

/* A context the harness works in. A correct program never uses the legacy
 * stream of a context while a blocking stream of it (a created one without
 * CU_STREAM_NON_BLOCKING, or a per-thread stream) captures: the driver
 * would invalidate the capture. The two counts, under one lock, keep them
 * apart: each enter returns false (and counts nothing) when the other kind
 * is in use. */
struct hx_ctx {
    const char *name;
    CUcontext h;
    CUgreenCtx green;
    int dev;
    int legacy_users, blocking_captures;
};

bool hx_legacy_enter(struct hx_ctx *c);
void hx_legacy_exit(struct hx_ctx *c);
bool hx_blocking_capture_enter(struct hx_ctx *c);
void hx_blocking_capture_exit(struct hx_ctx *c);

/* cuCtxCreate of the given version (1: cuCtxCreate ... 4: cuCtxCreate_v4),
 * reached by name. */
CUresult hx_ctx_create(unsigned version, CUcontext *h, CUdevice dev);

/* Green contexts, when the driver has them (found with dlsym). */
bool hx_green_available(void);
/* A green context of sms SMs of dev, and its CUcontext. */
CUresult hx_green_create(CUdevice dev, unsigned sms, CUgreenCtx *g, CUcontext *h);
CUresult hx_green_destroy(CUgreenCtx g);
CUresult hx_green_stream(CUstream *s, CUgreenCtx g);

/* ---- kernels that wait for the host --------------------------------------------- */

/* Sets a flag that testdrv_launch_spin kernels poll. The store is made
 * with process_vm_writev where it works (as the test driver writes its
 * stamps): the driver's poll is a plain read, which ThreadSanitizer would
 * otherwise report against the store. */
void hx_set_flag(volatile int *flag);
/* Clears it the same way (a late kernel of an earlier epoch may poll it). */
void hx_clear_flag(volatile int *flag);

/* ---- canaries of registered pages ------------------------------------------ */

/* Fills a page with the canary of its (thread, page) pair. */
void hx_canary_fill(unsigned char *page, size_t bytes, int thread, int index);
/* Offset of the first byte that differs from the canary, or -1. */
long hx_canary_check(const unsigned char *page, size_t bytes, int thread, int index);

#define HX_PAGE 4096
#define HX_REG_PAGES 16 /* pages a thread owns for registrations */

enum hx_page_state { HX_PAGE_FREE, HX_PAGE_REGISTERED, HX_PAGE_CANARY };

/* A thread's pages for registrations: free, registered, or holding the
 * canary they were given when their registration ended. */
struct hx_pages {
    unsigned char *base;
    enum hx_page_state state[HX_REG_PAGES];
};

/* Maps the pages (all free); false, after a line on stderr, if mmap
 * failed. */
bool hx_pages_map(struct hx_pages *p);
/* The program frees its buffer, as free does: when none of the pages is
 * registered, checks their canaries and unmaps them (the driver may then
 * hand their addresses out for pinned or managed memory; hx_pages_map
 * takes new ones). False when a page is registered. */
bool hx_pages_unmap(struct hx_thread *t, struct hx_pages *p);
unsigned char *hx_page_at(struct hx_pages *p, int page);
/* The first of a run of want pages none of which is registered, the
 * search beginning at a page drawn from t's stream; -1 if there is none. */
int hx_pages_free(struct hx_thread *t, struct hx_pages *p, int want);
/* After the end of the registration of [first, first + n) (unregister or
 * teardown) returned: fills them with t's canary. */
void hx_pages_set_canaries(struct hx_thread *t, struct hx_pages *p, int first, int n);
/* A page with its canary must still hold it: else fails "canary" for t
 * (the thread that owns the pages). */
void hx_page_check(struct hx_thread *t, struct hx_pages *p, int page);

/* ---- a worker's run -------------------------------------------------------- */

/* The start of a worker thread (t) of race or property: its capture mode
 * becomes RELAXED (so that only its own GLOBAL or THREAD_LOCAL captures
 * restrict it) and home becomes its current context. */
void hx_worker_enter(struct hx_thread *t, struct hx_ctx *home);
/* Its share of the operations: one_operation(w) t->ops times, each followed
 * by hx_check_always and counted in t->done (the watchdog's and the
 * reports' progress); then a note that the end begins. It waits wherever
 * the operations' driver calls wait. */
void hx_worker_ops(struct hx_thread *t, void (*one_operation)(void *w), void *w);
/* Its end, once it has released everything: every page of reg that holds
 * its canary still holds it, and the per-operation invariants hold once
 * more. */
void hx_worker_leave(struct hx_thread *t, struct hx_pages *reg);

/* ---- events recorded after writers ------------------------------------------ */

/* An object keeps n events, ev[i] recorded after its last writer on
 * streams[i] (NULL: a free slot). The slot for a writer on stream s: that
 * stream's, else a free one, else one whose writer has finished; -1 if
 * every writer still runs. */
int hx_event_slot(CUevent *ev, CUstream *streams, int n, CUstream s);

/* ---- memory released while its writers may still run ------------------------ */

/* The events recorded after the kernels that wrote a range before its
 * release, kept until an allocation returns memory overlapping it: then
 * every one of them must have completed (the invariant "reuse-early":
 * nothing submitted before a release may still write a block that an
 * allocation returns). One table for the process, under a lock of its own
 * (a leaf: it takes no other). */
#define HX_WRITERS 6     /* events kept of one released range */
#define HX_RELEASED 4096 /* ranges kept */

/* How the table destroys the events it drops (default cuEventDestroy).
 * Call before the threads start. */
void hx_released_destroy_with(void (*destroy)(CUevent));
/* [lo, hi) is released: the table takes the events of ev[0..n) that are not
 * NULL (n at most HX_WRITERS) and sets them to NULL; a range without one is
 * not kept. what names the range in a report. A full table first drops the
 * ranges whose events have all completed (no allocation can fail on them),
 * else one range, which goes unchecked. */
void hx_released_note(uintptr_t lo, uintptr_t hi, const char *what, CUevent *ev, int n);
/* An allocation returned [lo, hi) (returned names the call in a report):
 * checks every kept range that it overlaps, failing "reuse-early" for t
 * where a writer still runs, and drops it. Whether there was one. */
bool hx_released_check(struct hx_thread *t, uintptr_t lo, uintptr_t hi, const char *returned);
/* Drops every range, destroying its events. */
void hx_released_clear(void);
/* Allocations that returned memory of a kept range; ranges dropped
 * unchecked because the table was full of running writers. */
unsigned long long hx_released_checked(void);
unsigned long long hx_released_unchecked(void);

#endif
