/* internal.h - shared state and helpers of the test driver (not installed,
 * not seen by tests).
 *
 * Concurrency model, in one place:
 *  - One process-wide mutex, td.mu, guards every piece of driver state
 *    below. Every entry point takes it (td_enter) and drops it on return
 *    (td_leave). It is never held while user code runs (host functions,
 *    stream callbacks) nor while a simulated kernel sleeps.
 *  - One condition variable, td.cv, is broadcast whenever anything that a
 *    waiter could be waiting for changes: a stream op completed, a launch
 *    lock was dropped, a context was torn down. Host waits and stream
 *    workers waiting for dependencies sleep on it (condvar-driven, no
 *    polling). A stream worker waiting for new work sleeps on the stream's
 *    own condvar.
 *  - Each stream has a worker thread that runs its ops in order. An op may
 *    carry dependencies: (stream, seq) pairs that must have completed
 *    before it starts. Dependencies always name ops submitted earlier, so
 *    they cannot form a cycle.
 *  - Driver objects (contexts, streams, events, modules, ...) are never
 *    freed: a released handle stays recognisable, so using it again is
 *    reported exactly (CUDA_ERROR_INVALID_HANDLE) instead of crashing, and
 *    a worker or a dependency can still read a destroyed stream. This
 *    leaks a few hundred bytes per object, which a test double can afford.
 *  - Memory allocations live in a sorted registry; device addresses come
 *    from a PROT_NONE reservation and are never reused.
 */
#ifndef CUDEFER_TESTDRIVER_INTERNAL_H
#define CUDEFER_TESTDRIVER_INTERNAL_H

/* Declare every legacy, _v2 and _ptsz/_ptds prototype so that the compiler
 * checks each exported definition against the real one. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "testdriver.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_EXPORT __attribute__((visibility("default")))

/* SMs of a device (an H200's): CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
 * and the SM resource of cuDeviceGetDevResource. */
#define TD_SM_COUNT 132u

/* ------------------------------------------------------------------ */
/* Call counters (core.c)                                              */

enum td_ep {
#define TD_EP(name) TD_EP_##name,
#include "entrypoints.h"
#undef TD_EP
    TD_EP_COUNT
};

extern atomic_uint_fast64_t td_call_counts[TD_EP_COUNT];

/* Counts one call of the entry point with this exact ELF name. */
#define TD_COUNT(name) \
    atomic_fetch_add_explicit(&td_call_counts[TD_EP_##name], 1, memory_order_relaxed)

/* ------------------------------------------------------------------ */
/* Objects                                                             */

enum td_objkind {
    TD_OBJ_CTX,
    TD_OBJ_STREAM,
    TD_OBJ_EVENT,
    TD_OBJ_MODULE,
    TD_OBJ_FUNCTION,
    TD_OBJ_LIBRARY,
    TD_OBJ_KERNEL,
    TD_OBJ_ARRAY,
    TD_OBJ_MIPMAP,
    TD_OBJ_POOL,
    TD_OBJ_GRAPH,
    TD_OBJ_GRAPH_EXEC,
    TD_OBJ_VMM,
    TD_OBJ_GREEN,    /* a CUgreenCtx handle (its CUcontext is a td_ctx) */
    TD_OBJ_RESDESC,  /* a CUdevResourceDesc */
};

struct td_ctx;

/* Common header of every handle the driver gives out. */
struct td_obj {
    enum td_objkind kind;
    bool released;        /* destroyed by an explicit call */
    bool ctx_dead;        /* destroyed by its context's teardown */
    struct td_ctx *ctx;   /* owning context, NULL if context-independent */
    struct td_obj *all_next; /* list of every object ever made */
};

/* A point in a stream's op sequence: satisfied once s->completed >= seq. */
struct td_dep {
    struct td_stream *s;
    uint64_t seq;
};

/* A growable array of dependencies. */
struct td_deps {
    struct td_dep *v;
    size_t n, cap;
};

enum td_stype { TD_ST_LEGACY, TD_ST_PER_THREAD, TD_ST_USER };

struct td_capture;
struct td_op;

struct td_stream {
    struct td_obj h;
    enum td_stype type;
    unsigned flags;            /* CU_STREAM_NON_BLOCKING or 0 */
    int priority;
    pthread_t owner;           /* TD_ST_PER_THREAD: the thread it belongs to */
    uint64_t submitted;        /* seq of the last op queued */
    uint64_t completed;        /* seq of the last op finished */
    struct td_op *head, *tail; /* queued, unfinished ops (head runs next) */
    pthread_cond_t cv;         /* new work or closing */
    bool worker_running;
    bool closing;              /* destroyed: worker exits once drained */
    bool linked;               /* on its context's stream list */
    struct td_capture *capture; /* capture sequence this stream is in */
    struct td_stream *next;    /* context's stream list */
};

struct td_green;

/* A context: a user context, a device's primary context, or the CUcontext
 * of a green context. A green context (parent != NULL) has streams of its
 * own; everything else made while it is current (memory, events, modules,
 * arrays) belongs to its primary context, its root (td_ctx_root). */
struct td_ctx {
    struct td_obj h;           /* h.ctx == itself */
    int dev;
    unsigned flags;
    bool primary;
    bool alive;                /* false once destroyed / primary inactive */
    int refcount;              /* primary: the program's retains */
    int green_refs;            /* primary: live green contexts (a reference each) */
    struct td_ctx *parent;     /* green: the primary context of its device */
    struct td_ctx *greens;     /* primary: green contexts of this activation,
                                  dead ones included (their streams may drain) */
    struct td_ctx *green_next; /* green: next on parent->greens */
    struct td_green *green;    /* green: its CUgreenCtx handle */
    unsigned sm_count;         /* SMs of its resources (green: its share) */
    CUresult sticky;           /* CUDA_SUCCESS or the sticky error */
    int release_holds;         /* waiting releases holding the launch lock */
    struct td_stream *legacy;
    struct td_stream *streams; /* every stream of the context, incl. legacy,
                                  per-thread and destroyed-but-draining */
    struct td_deps wait_deps;  /* cuCtxWaitEvent: future work waits on these */
};

struct td_event {
    struct td_obj h;
    unsigned flags;
    struct td_deps deps;       /* work captured by the last record */
    uint64_t gen;              /* bumped by every record */
    bool recorded;
    uint64_t time_ns;          /* completion time of the last record, 0 if unknown */
    struct td_capture *capture; /* last recorded inside this capture, or NULL */
};

struct td_capture {
    uint64_t id;
    CUstreamCaptureMode mode;
    pthread_t thread;          /* thread that began it */
    struct td_ctx *ctx;
    struct td_stream *origin;
    struct td_graph *graph;    /* cuStreamBeginCaptureToGraph target or NULL */
    bool invalidated;
    bool ended;
    size_t nodes;              /* ops captured */
    struct td_capture *next;   /* list of live captures */
};

struct td_graph {
    struct td_obj h;
    size_t nodes;
};

/* An executable graph (cuGraphInstantiateWithFlags): a copy of its graph's
 * node count, owned by the context current at instantiation. */
struct td_graph_exec {
    struct td_obj h;
    size_t nodes;
};

/* A CUgreenCtx: a handle of its own (h.ctx NULL); cuCtxFromGreenCtx gives
 * ctx, the same td_ctx for its whole life. */
struct td_green {
    struct td_obj h;
    struct td_ctx *ctx;
};

/* A CUdevResourceDesc (never freed: the API has no call to destroy one). */
struct td_resdesc {
    struct td_obj h;
    int dev;
    unsigned sm_count;
};

struct td_library;

struct td_function {
    struct td_obj h;
    struct td_module *mod;
    char *name;
    struct td_function *next;
};

struct td_module {
    struct td_obj h;
    struct td_library *lib;    /* module of a library in one context, or NULL */
    struct td_function *funcs;
};

struct td_kernel {
    struct td_obj h;
    struct td_library *lib;
    char *name;
    struct td_kernel *next;
};

/* A library loaded into one context (by cuLibraryGetModule,
 * cuKernelGetFunction or a launch of one of its kernels). */
struct td_libload {
    struct td_ctx *ctx;
    struct td_module *mod;
    struct td_libload *next;
};

struct td_library {
    struct td_obj h;
    struct td_kernel *kernels;
    struct td_libload *loads;
};

struct td_array {
    struct td_obj h;
    size_t bytes;
    int cap;                   /* enum td_cap (declared below) */
    unsigned char *data;       /* its contents, made by the first copy into it */
};

/* What an allocation counts against: pinned host memory, shared by every
 * device, or one device's memory (TD_CAP_DEVICE + its ordinal). */
#define TD_MAX_DEVICES 64
enum td_cap { TD_CAP_HOST, TD_CAP_DEVICE, TD_CAP_COUNT = TD_CAP_DEVICE + TD_MAX_DEVICES };

static inline enum td_cap td_cap_dev(int dev)
{
    return (enum td_cap)(TD_CAP_DEVICE + dev);
}

static inline bool td_cap_is_device(enum td_cap cap)
{
    return cap >= TD_CAP_DEVICE;
}

struct td_pool {
    struct td_obj h;
    int dev;
    bool is_default;
    enum testdrv_kind kind;    /* TESTDRV_DEVICE, _HOST or _MANAGED */
    enum td_cap cap;
    size_t max_size;           /* 0: unlimited */
    uint64_t threshold;        /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */
    int reuse[3];              /* the three REUSE_* attributes */
    size_t used, used_high;    /* live allocations */
    size_t pending;            /* freed, passed, not yet synchronised */
    size_t idle;               /* freed and synchronised, kept reserved */
    size_t reserved_high;
};

struct td_vmm {
    struct td_obj h;
    size_t bytes;
    enum td_cap cap;
};

/* One allocation of memory (not an object: pointers are its handles). */
struct td_alloc {
    uintptr_t base;
    size_t size;               /* bytes asked for (what capacity counts) */
    size_t span;               /* bytes mapped / reserved at base */
    enum testdrv_kind kind;    /* DEVICE, HOST, MANAGED or REGISTERED */
    enum td_cap cap;
    struct td_ctx *ctx;        /* context it belongs to (attribute) */
    bool owned;                /* freed by the context's teardown */
    struct td_pool *pool;      /* stream-ordered pool, or NULL */
    unsigned flags;            /* cuMemHostAlloc / register / managed flags */
    bool low;                  /* from the 32-bit arena (cuMemAlloc v1) */
    bool host_backed;          /* real host memory at base */
    bool busy;                 /* a release of it is in progress */
    bool torn;                 /* its context died while a release waited */
    bool linked;               /* in the live registry */
    uint64_t id;
    /* What the program set on it since (advice.c); a new allocation has
     * none of it. */
    bool read_mostly;          /* cuMemAdvise */
    bool sync_memops;          /* cuPointerSetAttribute */
    bool attached;             /* managed: cuStreamAttachMemAsync made, with attach */
    unsigned attach;           /* its CU_MEM_ATTACH_* flags */
    int preferred;             /* a device, CU_DEVICE_CPU or CU_DEVICE_INVALID */
    int accessed_by;           /* the last device set, or CU_DEVICE_INVALID */
    int last_prefetch;         /* a device, CU_DEVICE_CPU or CU_DEVICE_INVALID */
    bool dmabuf;               /* cuMemGetHandleForAddressRange gave a dma-buf of it */
    /* Opened by cuIpcOpenMemHandle_v2: another process's memory, mapped
     * here (no capacity of this process); cuIpcCloseMemHandle unmaps it
     * when its opens are all closed. */
    bool imported;
    unsigned ipc_opens;
    uint64_t ipc_pid, ipc_id;  /* the exporter and its allocation's id */
};

/* ------------------------------------------------------------------ */
/* Global state (core.c)                                               */

struct td_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool initialized;
    bool forked;               /* child of an initialised process: poisoned */
    bool deinitialized;        /* torn down at process exit */
    bool deinit_reported;
    bool exit_handler;         /* TESTDRIVER_EXIT=atexit */
    int version;               /* cuDriverGetVersion */
    int ndevices;
    size_t cap_total[TD_CAP_COUNT];
    size_t cap_used[TD_CAP_COUNT];
    /* Managed memory of each device: allocated, and resident (counted in
     * cap_used; the rest was moved out to serve device allocations). */
    size_t managed_live[TD_CAP_COUNT], managed_resident[TD_CAP_COUNT];
    int managed_moves;         /* concurrent managed access: pages move out */
    size_t live[TESTDRV_KIND_COUNT];
    size_t live_bytes[TESTDRV_KIND_COUNT];
    size_t pending_bytes[TD_CAP_COUNT]; /* device frees passed, not synchronised */
    uint64_t faults;
    uint64_t foreign_syncs;    /* testdrv_foreign_syncs */
    uint64_t dead_calls;
    uint64_t invalidated;
    uint64_t next_id;
    struct td_obj *all;        /* every object ever made */
    struct td_ctx **primary;   /* per device */
    CUresult *dev_sticky;      /* per device: the sticky error of a fault in any of
                                  its contexts, which ends them all (td_ctx_set_sticky) */
    struct td_pool **default_pool; /* per device */
    struct td_capture *captures; /* live captures */
    struct td_capture *ended;    /* ended ones: events may still name them */
    unsigned alloc_cost_us[TESTDRV_KIND_COUNT]; /* testdrv_set_alloc_cost */
};

extern struct td_state td;

/* Per-thread state (core.c). */
struct td_tls {
    struct td_ctx **stack;     /* current-context stack, top = current */
    size_t depth, cap;
    CUstreamCaptureMode mode;  /* cuThreadExchangeStreamCaptureMode */
    uint64_t blocked_ns;
    uint64_t wait_calls;
    uint64_t kernel_waits; /* waits for work that held an unfinished kernel */
    uint64_t foreign_syncs;
};

extern _Thread_local struct td_tls td_tls;

/* A wait this long for td.mu, in a call, is noted (core.c). */
#define TD_LOCK_STALL_NS 1000000u
extern _Atomic uint64_t td_lock_stall_end;

/* ---- core.c ---- */

/* Checks that the driver is initialised (and not a poisoned fork child)
 * and takes td.mu. Returns CUDA_SUCCESS with the lock held, or an error
 * without it. */
CUresult td_enter(void);

/* Like td_enter, but works before cuInit (for calls the real driver
 * answers uninitialised). Fails only in a poisoned fork child
 * (CUDA_ERROR_NOT_INITIALIZED) or after the exit-time teardown
 * (CUDA_ERROR_DEINITIALIZED). */
CUresult td_enter_any(void);

/* td_enter, then the caller's check of its arguments: args_ok false ->
 * CUDA_ERROR_INVALID_VALUE. Like td_enter (and every td_enter_* helper):
 * CUDA_SUCCESS with td.mu held, or an error without it. */
CUresult td_enter_args(bool args_ok);

/* Registers the exit-time teardown as an exit handler (cuInit, with
 * TESTDRIVER_EXIT=atexit); without it the teardown runs when the library
 * is finalised. */
void td_exit_handler_install(void);

/* Drops td.mu and returns rc (for `return td_leave(rc);`). */
CUresult td_leave(CUresult rc);

/* td_leave for an allocating call of kind: after a success, sleeps the
 * allocation cost set by testdrv_set_alloc_cost, without td.mu and without
 * counting it as a wait (it is host work, not waiting for the GPU). */
CUresult td_leave_alloc(CUresult rc, enum testdrv_kind kind);

/* Monotonic clock in nanoseconds. */
uint64_t td_now_ns(void);

/* Sleeps ns nanoseconds (lock must not be held). */
void td_sleep_ns(uint64_t ns);

/* Blocks (td.mu held, dropped while waiting) until done(arg) is true,
 * re-checking after every broadcast of td.cv. Time spent blocked is added
 * to the calling thread's blocked_ns. */
void td_block_until(bool (*done)(void *arg), void *arg);

/* Counts one call of the calling thread that may wait for the GPU. */
void td_note_wait_call(void);

/* Counts a call that named a dead context or an object of one. */
void td_dead_call(void);

/* Registers a new (zeroed) object: sets kind and owner, links it on the
 * list of all objects and in the handle table. */
void td_obj_register(struct td_obj *o, enum td_objkind kind, struct td_ctx *ctx);

/* The object behind handle h if h was given out by this driver as an
 * object of that kind (live or not), else NULL. */
struct td_obj *td_obj_find(const void *h, enum td_objkind kind);

/* Looks up h as a live object of that kind. Returns CUDA_SUCCESS and sets
 * *out, or: NULL or unknown or released handle -> CUDA_ERROR_INVALID_HANDLE;
 * object of a destroyed context -> counts a dead call and returns
 * CUDA_ERROR_INVALID_CONTEXT, or CUDA_ERROR_CONTEXT_IS_DESTROYED for a
 * stream of a destroyed green context (cuda.h, cuGreenCtxDestroy). */
CUresult td_obj_get(const void *h, enum td_objkind kind, struct td_obj **out);

/* td_enter_args, then td_obj_get: the front of a call on one handle. */
CUresult td_enter_obj(const void *h, enum td_objkind kind, bool args_ok, struct td_obj **out);

/* Allocates zeroed memory or aborts (the driver does not survive malloc
 * failure; neither would a test). */
void *td_xcalloc(size_t n, size_t size);

/* Appends a dependency (merged with one on the same stream; kept even if
 * already satisfied, so a host sync knows everything it covered). */
void td_deps_add(struct td_deps *d, struct td_stream *s, uint64_t seq);
void td_deps_free(struct td_deps *d);
bool td_deps_done(const struct td_deps *d);

/* Blocks until every dependency in d has completed (td_block_until). */
void td_wait_deps(const struct td_deps *d);

/* A host synchronisation on d (may wait): waits for it (td_wait_deps),
 * gives back the stream-ordered frees it covers (td_pending_cover), then
 * frees d. */
void td_host_sync(struct td_deps *d);

/* Whether the unfinished work d stands for waits, through the dependencies
 * of its ops (stream waits, legacy-stream rules, cuCtxWaitEvent), for
 * unfinished work of a stream whose context's root is not root. Lock held. */
bool td_deps_reach_foreign(const struct td_deps *d, struct td_ctx *root);

/* Adds bytes to the live counters of a kind (negative to remove). */
void td_live_add(enum testdrv_kind kind, long count, long long bytes);

/* Reserves bytes of a capacity; false if they do not fit. */
bool td_cap_take(enum td_cap cap, size_t bytes);
void td_cap_give(enum td_cap cap, size_t bytes);
bool td_cap_take_managed(enum td_cap cap, size_t bytes);
void td_cap_give_managed(enum td_cap cap, size_t bytes);
/* Gives the capacity an allocation took back (none for an imported one). */
struct td_alloc;
void td_alloc_give_cap(struct td_alloc *a);

/* ---- devices.c ---- */

/* Reads the TESTDRIVER_* environment once (td.mu held). */
void td_config_ensure(void);

/* ---- contexts.c ---- */

/* The calling thread's current context: CUDA_ERROR_INVALID_CONTEXT if
 * none; CUDA_ERROR_CONTEXT_IS_DESTROYED (counted as a dead call) if it was
 * destroyed. Does not check the sticky error. */
CUresult td_cur_ctx(struct td_ctx **out);

/* td_cur_ctx, then the context's sticky error if it has one. */
CUresult td_cur_ctx_usable(struct td_ctx **out);

/* td_cur_ctx_usable, then td_capture_check_unsafe: the front of a
 * potentially unsafe call in the current context (allocations, synchronous
 * copies and memset, module loads, array creation). */
CUresult td_cur_ctx_unsafe(struct td_ctx **out);

/* td_enter, then td_cur_ctx_unsafe. CUDA_SUCCESS with td.mu held, or an
 * error without it. */
CUresult td_enter_unsafe(struct td_ctx **out);

/* td_enter, then the front of every waiting release (cuMemFree*,
 * cuMemFreeHost, cuMemHostUnregister, cuArrayDestroy,
 * cuMipmappedArrayDestroy, cuModuleUnload): counts the wait call, then the
 * current context - none is fine (measured on an H200, driver 580.159.04,
 * 2026-11-29: each of these releases with no current context releases the
 * object and returns CUDA_SUCCESS; the object names its context), a
 * destroyed or sticky one is not - then the capture rules. *c is NULL when
 * no context is current. CUDA_SUCCESS with td.mu held, or an error
 * without it. */
CUresult td_enter_release(struct td_ctx **c);

/* Validates a context handle passed explicitly (NULL means current):
 * unknown -> CUDA_ERROR_INVALID_CONTEXT; destroyed -> counted,
 * CUDA_ERROR_INVALID_CONTEXT. */
CUresult td_ctx_arg(CUcontext h, struct td_ctx **out);

/* The context that owns what is made while c is current: c itself, or the
 * primary context of a green context. */
struct td_ctx *td_ctx_root(struct td_ctx *c);

/* Creates a green context of dev with sm_count SMs (lock held): takes a
 * reference on the device's primary context, activating it if needed. */
struct td_ctx *td_green_ctx_new(int dev, unsigned sm_count);

/* Destroys a live green context at once (no wait: its queued work still
 * runs, and waiting releases of the primary context still wait for it),
 * then drops its reference on the primary context; the last reference
 * tears the primary context down (that waits). */
void td_green_ctx_destroy(struct td_ctx *g);

/* Sets the sticky error rc on c's root and every green context of it (a
 * fault spoils the whole device context). */
void td_ctx_set_sticky(struct td_ctx *c, CUresult rc);

/* ---- streams.c ---- */

/* Resolves a stream handle as an API call sees it. ptsz: the call is a
 * _ptsz/_ptds variant, so NULL means the per-thread default stream.
 * NULL/CU_STREAM_LEGACY/CU_STREAM_PER_THREAD need a current context.
 * Checks the owning context is alive but not its sticky error. */
CUresult td_stream_get(CUstream h, bool ptsz, struct td_stream **out);

/* td_enter_args, then td_stream_get: the front of a call on one stream. */
CUresult td_enter_stream(CUstream h, bool ptsz, bool args_ok, struct td_stream **out);

/* True for streams that synchronise with the legacy stream: blocking user
 * streams and per-thread default streams. */
bool td_stream_is_blocking(const struct td_stream *s);

enum td_opkind {
    TD_OP_NOP,       /* ordering point (waits, sync copies, memsets) */
    TD_OP_KERNEL,    /* timed kernel touching a range */
    TD_OP_SPIN,      /* kernel spinning on a host flag */
    TD_OP_RECORD,    /* event record */
    TD_OP_HOSTFN,    /* cuLaunchHostFunc */
    TD_OP_CALLBACK,  /* cuStreamAddCallback */
    TD_OP_FREE,      /* cuMemFreeAsync reaching its position */
    TD_OP_WRITE32,   /* cuStreamWriteValue32 */
    TD_OP_MEMSET,    /* cuMemsetD8Async, D16, D32 */
};

struct td_op {
    struct td_op *next;
    uint64_t seq;
    enum td_opkind kind;
    struct td_deps deps;
    union {
        struct { uint64_t usec; uintptr_t ptr; size_t bytes; int access; } kernel;
        struct { const volatile int *flag; } spin;
        struct { struct td_event *ev; uint64_t gen; } record;
        struct { CUhostFn fn; void *data; } hostfn;
        struct { CUstreamCallback fn; void *data; CUstream handle; } callback;
        struct { struct td_alloc *a; } free;
        struct { uintptr_t addr; uint32_t value; } write;
        struct { uintptr_t addr; uint32_t value; unsigned width; size_t count; } memset;
    } u;
};

/* Runs a TD_OP_WRITE32 op (td.mu held): the word is stored where the
 * memory is backed on the host (pinned, registered, managed); a word
 * outside live memory, or in read-only registered memory, faults the
 * context like a kernel's write. */
void td_write_value_run(struct td_stream *s, struct td_op *op);

/* Runs a TD_OP_MEMSET op (td.mu held): the range is filled where the
 * memory is backed on the host; a range not within one live allocation
 * when the stream reaches it faults the context like a kernel's write. */
void td_memset_run(struct td_stream *s, struct td_op *op);

/* A new op of that kind (zeroed, no dependencies). */
struct td_op *td_op_new(enum td_opkind kind);
void td_op_free(struct td_op *op);

/* Queues op on s (not capturing): adds the implicit dependencies (legacy
 * stream rules, cuCtxWaitEvent), gives it the next seq, wakes (or starts)
 * the worker. Returns CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY if no
 * worker thread could be started (op is freed then). */
CUresult td_stream_enqueue(struct td_stream *s, struct td_op *op);

/* The common front of every stream-ordered call: the context's sticky
 * error, legacy-stream capture conflicts
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), an invalidated capture
 * (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). Sets *captured when s is
 * capturing: the caller then records the op (td_capture_record) instead
 * of queueing it. */
CUresult td_stream_submit_check(struct td_stream *s, bool *captured);

/* Dependencies that cover all work submitted so far to s; for the legacy
 * stream also the blocking streams (a marker op on it would wait for
 * them). */
void td_stream_snapshot(struct td_stream *s, struct td_deps *out);

/* Dependencies covering all work submitted so far in ctx, all streams;
 * for a primary context also its green contexts' streams (as
 * cuCtxRecordEvent and cuCtxSynchronize cover them), for a green context
 * only its own. */
void td_ctx_snapshot(struct td_ctx *ctx, struct td_deps *out);

/* The waiting-release core: waits until every stream of ctx's root and of
 * its green contexts finished the work submitted before the call; with
 * hold_launch the root's launch lock is held meanwhile (other threads'
 * launches into the root or its green contexts stall). */
void td_ctx_wait_idle(struct td_ctx *ctx, bool hold_launch);

/* Stream for a launch: resolves h and, while a waiting release holds the
 * context's launch lock, blocks and resolves again (the stream may have
 * died meanwhile). */
CUresult td_launch_stream(CUstream h, bool ptsz, struct td_stream **out);

/* Marks a stream closed (destroyed); its worker exits once drained. */
void td_stream_close(struct td_stream *s);

/* Creates a stream of ctx (not registered with the program). */
struct td_stream *td_stream_new(struct td_ctx *ctx, enum td_stype type,
                                unsigned flags, int priority);

/* ---- green.c ---- */

/* Looks up a CUgreenCtx: unknown -> CUDA_ERROR_INVALID_CONTEXT;
 * destroyed -> counted as a dead call, CUDA_ERROR_CONTEXT_IS_DESTROYED;
 * else its context in *out. */
CUresult td_green_get(CUgreenCtx h, struct td_ctx **out);

/* False below driver version 12040 (no green contexts yet). Lock held. */
bool td_green_supported(void);

/* ---- capture.c ---- */

/* For a "potentially unsafe" call (synchronisations, allocations,
 * releases, module and array create/destroy): if the calling thread's
 * capture mode forbids it, invalidates the conflicting captures and
 * returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. */
CUresult td_capture_check_unsafe(void);

/* Captures of ctx that include a blocking stream: invalidates them and
 * returns CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (the legacy stream would
 * merge with them), else CUDA_SUCCESS. */
CUresult td_capture_check_legacy(struct td_ctx *ctx);

/* True if ctx has a stream in a live capture. */
bool td_capture_in_ctx(struct td_ctx *ctx);

/* Invalidates every live capture of ctx; returns how many. */
size_t td_capture_invalidate_ctx(struct td_ctx *ctx);

/* Invalidates one capture (counted once). */
void td_capture_invalidate(struct td_capture *c);

/* Records one op in s's capture (consumes op). */
void td_capture_record(struct td_stream *s, struct td_op *op);

/* Ends (invalidated) every capture of ctx, for teardown. */
void td_capture_end_ctx(struct td_ctx *ctx);

/* A stream in a capture is being destroyed: the capture is invalidated
 * (and ended if the stream began it). */
void td_capture_stream_destroyed(struct td_stream *s);

/* ---- memory.c ---- */

/* Live allocation whose base is exactly p, or NULL. */
struct td_alloc *td_alloc_at(uintptr_t p);

/* Live allocation containing [p, p + bytes) (bytes 0: just p), or NULL. */
struct td_alloc *td_alloc_covering(uintptr_t p, size_t bytes);
/* Live allocations of kind of exactly bytes (testdrv_live_sized); under
 * the lock. */
size_t td_live_sized(enum testdrv_kind kind, size_t bytes);

/* Fresh device-class address range (PROT_NONE reservation), 0 if the
 * arena is exhausted. low: below 4 GiB (for 32-bit CUdeviceptr). */
uintptr_t td_va_reserve(size_t bytes, bool low);

/* Maps fresh host memory (read/write), NULL on failure. */
void *td_host_map(size_t bytes);

/* Registers a new live allocation and accounts its kind (not capacity). */
struct td_alloc *td_alloc_add(uintptr_t base, size_t size, size_t span,
                              enum testdrv_kind kind, enum td_cap cap,
                              struct td_ctx *ctx);

/* Takes a out of the live registry (it is no longer touchable) and
 * removes it from the kind counters. Host-backed pages become PROT_NONE
 * (address kept reserved, a host dereference crashes). Capacity is not
 * touched. */
void td_alloc_unlink(struct td_alloc *a);

/* True if p lies in memory freed by a context teardown (a later use
 * counts a dead-context call). */
bool td_graveyard_has(uintptr_t p);

/* Teardown: frees every allocation ctx owns. */
void td_mem_teardown_ctx(struct td_ctx *ctx);

/* ---- pools.c ---- */

/* A TD_OP_FREE op reached its stream position: the memory stops being
 * live and its bytes become pending until a covering host sync. */
void td_pool_free_passed(struct td_alloc *a, struct td_stream *s, uint64_t seq);

/* A host synchronisation waited for deps: give back the pending frees it
 * covers. */
void td_pending_cover(const struct td_deps *deps);

/* Teardown: gives back every pending free made on ctx's streams. */
void td_pending_teardown_ctx(struct td_ctx *ctx);

/* Creates the default pool of each device (at cuInit). */
void td_pools_init(void);

/* cuMemFree of pool memory, after its wait: the bytes go back to the
 * pool (or capacity) at once, and a is destroyed. */
void td_pool_free_now(struct td_alloc *a);

/* ---- modules.c ---- */

/* Teardown: drops ctx from every library's loaded-in list. */
void td_libraries_teardown_ctx(struct td_ctx *ctx);

/* ---- kernels (hooks.c) ---- */

/* Queues a kernel op (already built; consumed) for a launch, td.mu held:
 * resolves the stream, waits at the launch gate, checks the function's
 * context fctx (NULL: any) against the stream's root, then captures or queues
 * the op. Returns what cuLaunchKernel would. */
CUresult td_launch_op(CUstream h, bool ptsz, struct td_ctx *fctx, struct td_op *op);

/* Runs one kernel or spin op on a worker (td.mu held; dropped while it
 * sleeps). */
void td_kernel_run(struct td_stream *s, struct td_op *op);

#endif
