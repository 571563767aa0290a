/* loops.c - cudefer-loops: what releases cost, without and with cudefer,
 * side by side, and beside the driver's own stream-ordered pools.
 *
 * Four sections, each measured in child processes of this same program:
 * one without cudefer ("none", the driver alone), one with it (LD_PRELOAD
 * of the shim) and, for the loops, one that uses the driver's
 * stream-ordered pool instead of the plain calls ("pool", no cudefer):
 *
 *  stall  Each release (cuMemFree of device and of managed memory,
 *         cuMemFreeHost of cuMemAllocHost and of cuMemHostAlloc memory,
 *         cuMemHostUnregister, cuArrayDestroy, cuModuleUnload,
 *         cuLibraryUnload after one of its kernels was loaded) made while a
 *         1 s cudefer_spin kernel runs on a non-blocking stream: the ms the
 *         caller was blocked, and the ms a cuLaunchKernel of a tiny kernel
 *         on a third stream, made by another thread 5 ms into the release,
 *         was blocked.
 *  loops  Allocate, touch with a kernel, release, with no synchronisation
 *         inside the loop and one cuCtxSynchronize after it (timed): us per
 *         iteration. Rows: device (cuMemAlloc / cuMemFree), pinned host
 *         (cuMemAllocHost / cuMemFreeHost, touched through
 *         cuMemHostGetDevicePointer), registered (one page-aligned malloc'd
 *         buffer per row, cuMemHostRegister(DEVICEMAP) /
 *         cuMemHostUnregister every iteration) and managed
 *         (cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL) / cuMemFree), each of
 *         4 KiB and of 64 MiB. Two touches: "light", cudefer_touch of 16
 *         words by one thread; "full", cudefer_fill by many blocks, every
 *         word of the block written. The pool child allocates with
 *         cuMemAllocAsync / cuMemAllocFromPoolAsync and frees with
 *         cuMemFreeAsync on the loop's stream, release threshold at the
 *         maximum: device memory from the device's default pool; pinned
 *         host memory from a pool of location type HOST (driver 12.6+;
 *         made accessible to the device with cuMemPoolSetAccess); managed
 *         memory from a managed pool (13.0+). A pool that cannot be made
 *         is reported as not available, with the driver's answer;
 *         registrations have no pool. Memory held at the peak: cudefer's
 *         peak_deferred_bytes + peak_cached_device_bytes (its JSON report,
 *         CUDEFER_REPORT); the pool's CU_MEMPOOL_ATTR_USED_MEM_HIGH and
 *         RESERVED_MEM_HIGH; 0 for the driver alone.
 *  cost   Calls with no GPU work: N cuMemAlloc of 4 KiB, then N cuMemFree
 *         and the cuCtxSynchronize right after them (and the same for
 *         cuMemAllocHost / cuMemFreeHost); calls cudefer
 *         does not wrap (cuCtxGetCurrent) through the linked symbol, a
 *         cuGetProcAddress pointer and a dlsym pointer; the wrapped no-op
 *         cuMemFree(0); and cuLaunchKernel of an empty kernel, which
 *         cudefer wraps, through the linked symbol and a cuGetProcAddress
 *         pointer: ns per call.
 *  live   cudefer's bookkeeping as the number of live blocks grows: the
 *         child allocates N device blocks of 256 bytes (N = 10^3, 10^5,
 *         10^6, 3*10^6, 10^7), keeps them, and at each N times a loop of
 *         cuMemAlloc / cuMemFree pairs of one more block: ns per pair. It
 *         stops growing when the next N would not fit in --live-budget
 *         seconds of allocation (the child with cudefer gets twice the
 *         time, and the largest N the child without it reached), or when
 *         less than a quarter of the device memory is free. The blocks are
 *         left to the end of the process.
 *
 * Every figure is the median of --runs runs (default 5), with the spread
 * (min-max). The parent process makes no CUDA call: it runs the children
 * (this program again, with --child), reads their "R ..." lines and prints
 * markdown tables, then a table of the goals (--goals FILE writes them as
 * tab-separated lines too: goal, measured, verdict). The children without
 * cudefer get LD_PRELOAD without the shim (stripped if the parent had it
 * preloaded); the child with cudefer gets the shim first in LD_PRELOAD,
 * CUDEFER_REPORT set to a temporary file, read after it exits, and
 * CUDEFER_SAVINGS=0: what cudefer saved, which nothing gathers by default,
 * is not gathered for the report either.
 *
 * Over the cudefer test driver (tests/driver, found by its testdrv_launch
 * hook) no PTX runs: the spin, touch and fill kernels are simulated with
 * testdrv_launch, and --smoke makes every count tiny. The timings then mean
 * nothing; the run checks that every measurement ran and every CUDA call
 * succeeded.
 *
 * Usage: cudefer-loops [--shim PATH] [--runs N] [--quick] [--smoke]
 *                      [--only stall,loops,cost,live] [--rows ID,...] [--log FILE]
 *                      [--goals FILE] [--live-budget S] [--budget S] [--cpus N]
 *                      [--rounds N]
 *   --shim PATH      libcudefer.so (default: $CUDEFER_SHIM, else the one
 *                    this process has preloaded)
 *   --runs N         runs per figure (default 5; 2 with --smoke)
 *   --quick          a 200 ms kernel in the stall section instead of 1 s
 *   --smoke          tiny counts, for the test driver
 *   --only LIST      sections to run (default all)
 *   --rows LIST      loop rows to run, by id (dev4k, dev64m, host4k, host64m,
 *                    reg4k, reg64m, man4k, man64m; default all): repeated
 *                    runs of a few rows show how far they move between runs
 *   --log FILE       every child line and every cudefer report, for the
 *                    record
 *   --goals FILE     the goals and their verdicts, one a line
 *   --live-budget S  seconds of allocation the live section's child
 *                    without cudefer may spend growing (default 12; 2 with
 *                    --smoke)
 *   --budget S       start no child after S seconds, and end a child still
 *                    running then (its measurements are reported missing):
 *                    the tables are printed in any case
 *   --cpus N         pin every child to the same N CPUs, the first N this
 *                    process may run on (default 4; 0: no pinning); the
 *                    CPUs are printed. Two children running the same code
 *                    differed by 27% placed freely (bench/RESULTS.md, run
 *                    79) and still by 47% pinned (run 82)
 *   --rounds N       run the loop section's children N times over (default
 *                    1; at most 16), one round after the other, every mode
 *                    of a row side by side in each: the tables are round
 *                    1's, and a table of rounds gives each round's ratios,
 *                    their median over the rounds, and how far the pool's
 *                    (or the driver's) own time moved between rounds. The
 *                    loop goals are judged by that median, since two
 *                    children running the same code differ by more than
 *                    some goals' margins (runs 117-121)
 * Exit status: 0 when every child ran to completion; 1 when one failed (a
 * CUDA call failed, a kernel faulted, a child crashed or timed out, or a
 * line was missing); 2 for bad usage. A goal not met is not a failure.
 */
#include "gpu.h"
#include "kernels.h"
#include "release_cases.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)

/* ======================================================================== */
/* Common                                                                   */
/* ======================================================================== */

static struct {
    int runs;
    bool runs_given;
    bool quick;
    bool smoke;
    const char *shim;
    const char *only;
    const char *rows;   /* --rows: loop rows to run (NULL: all) */
    const char *log;
    const char *goals;
    double live_budget_s; /* 0: the default */
    double budget_s;      /* parent: no child started after this many s (0: none) */
    int cpus;             /* parent: children pinned to this many CPUs (0: not) */
    int rounds;           /* parent: rounds of the loop section's children */
    /* child only */
    const char *child;  /* "stall", "loop:<row>:<touch>", "cost" or "live" */
    const char *mode;   /* "none", "cudefer", "keep" or "pool" */
    long live_max;      /* live: the largest N to reach (0: no limit) */
} opt = {.runs = 5, .cpus = 4, .rounds = 1};

/* The CPUs every child runs on (--cpus), chosen once by the parent. */
static cpu_set_t child_cpus;
static bool pin_children;

/* Chooses the first opt.cpus CPUs this process may run on, and prints
 * them. */
static void choose_cpus(void)
{
    cpu_set_t allowed;
    if (opt.cpus == 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return;
    CPU_ZERO(&child_cpus);
    char list[256] = "";
    size_t len = 0;
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < opt.cpus; cpu++) {
        if (!CPU_ISSET(cpu, &allowed))
            continue;
        CPU_SET(cpu, &child_cpus);
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", n ? "," : "", cpu);
        n++;
    }
    pin_children = n > 0;
    printf("Children pinned to CPUs %s.\n\n", list);
}

/* The children: the driver alone, with cudefer, and (loops only) the
 * driver's stream-ordered pool without cudefer, and cudefer with
 * CUDEFER_KEEP at KEEP_BYTES, which keeps its blocks across the loop's
 * synchronisations as the pool at its maximum release threshold does. The
 * stall, cost and live sections run the first two (N_PAIR). */
enum { MODE_NONE, MODE_CUDEFER, MODE_POOL, MODE_KEEP, MODE_POOL0, N_MODES };
#define MAX_ROUNDS 16 /* --rounds */
#define N_PAIR 2
#define KEEP_BYTES "1T"
static const char *const mode_names[N_MODES] = {"none", "cudefer", "pool", "keep", "pool0"};

/* The pool children: at the maximum release threshold ("pool"), which
 * keeps every block across synchronisations, and at the driver's default,
 * 0 ("pool0"), which gives them back at each: the policy of cudefer's own
 * default, as the first is that of CUDEFER_KEEP. */
static bool mode_is_pool(int mode)
{
    return mode == MODE_POOL || mode == MODE_POOL0;
}

/* Whether name is an item of the comma-separated list (no list: all). */
static bool listed(const char *list, const char *name)
{
    if (!list)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
            return true;
    return false;
}


static bool mode_has_shim(int mode)
{
    return mode == MODE_CUDEFER || mode == MODE_KEEP;
}

/* The mode named name, or -1. */
static int mode_of(const char *name)
{
    for (int m = 0; name && m < N_MODES; m++)
        if (strcmp(name, mode_names[m]) == 0)
            return m;
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double live_budget(void)
{
    return opt.live_budget_s > 0 ? opt.live_budget_s : opt.smoke ? 2.0 : 12.0;
}

/* ======================================================================== */
/* Child: the GPU side                                                      */
/* ======================================================================== */

/* The test driver's hooks (tests/driver/testdriver.h), found with dlsym:
 * testdrv_launch queues a simulated kernel of usec microseconds that touches
 * [ptr, ptr + bytes) as access says (SIM_NONE / SIM_WRITE are its
 * TESTDRV_NONE / TESTDRV_WRITE); testdrv_faults counts uses of freed memory. */
enum sim_access { SIM_NONE = 0, SIM_WRITE = 2 };
typedef CUresult (*simulate_fn)(CUstream s, unsigned usec, CUdeviceptr ptr, size_t bytes,
                                enum sim_access access);
typedef uint64_t (*faults_fn)(void);
typedef const char *(*version_fn)(void);
typedef int (*flush_fn)(void);

static struct gpu {
    CUcontext ctx;
    CUdevice dev;
    CUmodule module;
    CUfunction spin, touch, fill;
    simulate_fn simulate; /* the test driver's kernel hook, NULL on a GPU */
    faults_fn faults;
    flush_fn flush;       /* cudefer_flush, NULL without cudefer */
    const char *cudefer;  /* cudefer's version, NULL without cudefer */
} gpu;

/* The 1-thread spin kernel: ms milliseconds, writing [buf, buf + bytes)
 * meanwhile when buf is not 0. */
static CUresult k_spin(CUstream s, double ms, CUdeviceptr buf, size_t bytes)
{
    if (gpu.simulate)
        return gpu.simulate(s, (unsigned)(ms * 1000.0), buf, bytes,
                            buf ? SIM_WRITE : SIM_NONE);
    unsigned long long ns = (unsigned long long)(ms * 1e6);
    unsigned long long words = buf ? bytes / 4 : 0;
    void *args[] = {&ns, &buf, &words};
    return gc_launch(gpu.spin, s, args);
}

/* cudefer_touch of the first `words` words of buf. */
static CUresult k_touch(CUstream s, CUdeviceptr buf, unsigned long long words)
{
    if (gpu.simulate)
        return gpu.simulate(s, 0, buf, (size_t)words * 4, SIM_WRITE);
    return gc_touch_with(gpu.touch, s, buf, words);
}

/* cudefer_fill of every word of [buf, buf + bytes): one thread per word up
 * to 1,056 blocks of 256 threads (8 per SM of an H200), then a grid-stride
 * loop. */
static CUresult k_fill(CUstream s, CUdeviceptr buf, size_t bytes)
{
    if (gpu.simulate)
        return gpu.simulate(s, 0, buf, bytes, SIM_WRITE);
    unsigned long long words = bytes / 4;
    unsigned long long blocks = (words + 255) / 256;
    if (blocks > 1056)
        blocks = 1056;
    if (blocks < 1)
        blocks = 1;
    void *args[] = {&buf, &words};
    return cuLaunchKernel(gpu.fill, (unsigned)blocks, 1, 1, 256, 1, 1, 0, s, args, NULL);
}

static void out_token(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < n; i++)
        dst[i] = (src[i] == ' ' || src[i] == '=' || src[i] < 0x20) ? '_' : src[i];
    dst[i] = 0;
}

static void gpu_open(void)
{
    int count = 0, version = 0;
    GC_CHECK(cuInit(0));
    GC_CHECK(cuDeviceGetCount(&count));
    if (count < 1)
        gc_die("the driver reports no device");
    GC_CHECK(cuDeviceGet(&gpu.dev, 0));
    GC_CHECK(cuDevicePrimaryCtxRetain(&gpu.ctx, gpu.dev));
    GC_CHECK(cuCtxSetCurrent(gpu.ctx));
    GC_CHECK(cuDriverGetVersion(&version));

    *(void **)&gpu.simulate = dlsym(RTLD_DEFAULT, "testdrv_launch");
    *(void **)&gpu.faults = dlsym(RTLD_DEFAULT, "testdrv_faults");
    version_fn cudefer_version;
    *(void **)&cudefer_version = dlsym(RTLD_DEFAULT, "cudefer_version");
    *(void **)&gpu.flush = dlsym(RTLD_DEFAULT, "cudefer_flush");
    gpu.cudefer = cudefer_version ? cudefer_version() : NULL;

    bool wants_shim = mode_has_shim(mode_of(opt.mode));
    if (wants_shim && !gpu.cudefer)
        gc_die("cudefer is not loaded in the child that should have it (LD_PRELOAD=%s)",
               getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    if (!wants_shim && gpu.cudefer)
        gc_die("cudefer is loaded in the child that should run without it");

    /* Over the test driver the image is not parsed; the functions are
     * no-op kernels used for the other thread's launch. */
    GC_CHECK(cuModuleLoadData(&gpu.module, cudefer_kernels_ptx));
    GC_CHECK(cuModuleGetFunction(&gpu.spin, gpu.module, "cudefer_spin"));
    GC_CHECK(cuModuleGetFunction(&gpu.touch, gpu.module, "cudefer_touch"));
    GC_CHECK(cuModuleGetFunction(&gpu.fill, gpu.module, "cudefer_fill"));

    char name[256] = "", tok[256];
    GC_CHECK(cuDeviceGetName(name, sizeof name, gpu.dev));
    out_token(tok, sizeof tok, name);
    printf("R info sim=%d cudefer=%s driver=%d device=%s\n", gpu.simulate ? 1 : 0,
           gpu.cudefer ? gpu.cudefer : "-", version, tok);
}

/* Everything queued has finished, and cudefer (if loaded) has released
 * what it deferred and handed freed device memory back to the driver. */
static void gpu_settle(void)
{
    GC_CHECK(cuCtxSynchronize());
    if (gpu.flush)
        gpu.flush();
}

static void gpu_close(void)
{
    gpu_settle();
    if (gpu.faults && gpu.faults() != 0)
        gc_die("the test driver saw %llu use(s) of freed memory", (unsigned long long)gpu.faults());
    GC_CHECK(cuModuleUnload(gpu.module));
    GC_CHECK(cuCtxSetCurrent(NULL));
    GC_CHECK(cuDevicePrimaryCtxRelease(gpu.dev));
}

/* A driver entry point by name through cuGetProcAddress, NULL when the
 * driver has none (the test driver lacks some). */
static void *driver_proc(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    if (cuGetProcAddress(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
            CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;
    return p;
}

/* ------------------------------------------------------------------------ */
/* Child section: stall                                                     */
/* ------------------------------------------------------------------------ */

/* The cases (release_cases), the streams and the other thread (launcher)
 * are release_cases.h's, shared with the check tests/gpu/stall.c;
 * this program uses each case's id and label. */

static double stall_kernel_ms(void)
{
    return opt.smoke ? 50.0 : opt.quick ? 200.0 : 1000.0;
}

struct stall_sample {
    double release_ms, launch_ms;
    bool running; /* the long kernel was still running just before the release */
};

static struct stall_sample stall_measure(const struct release_case *c, double spin_ms,
                                         double settle_ms)
{
    struct object o = {0};
    struct stall_sample s;

    c->prepare(&o);
    GC_CHECK(k_spin(spin_stream, spin_ms, 0, 0));
    gc_sleep_ms(settle_ms);

    CUresult q = cuStreamQuery(spin_stream);
    if (q != CUDA_ERROR_NOT_READY)
        GC_CHECK(q);
    s.running = q == CUDA_ERROR_NOT_READY;
    int round = launcher_start_round();
    double t0 = gc_now_ms();
    CUresult rc = c->release(&o);
    s.release_ms = gc_now_ms() - t0;
    if (rc != CUDA_SUCCESS)
        gc_fail(c->label, rc, __FILE__, __LINE__);
    launcher_wait(round);
    s.launch_ms = launcher.launch_ms;
    if (launcher.rc != CUDA_SUCCESS)
        gc_fail("cuLaunchKernel (other thread, during the release)", launcher.rc, __FILE__,
                __LINE__);

    GC_CHECK(cuCtxSynchronize());
    if (c->after)
        c->after(&o);
    return s;
}

static void child_stall(void)
{
    double kernel_ms = stall_kernel_ms();
    double settle_ms = kernel_ms >= 500 ? 50.0 : kernel_ms / 10;

    /* Warm-up: first launches, every release once under a short kernel
     * (cudefer's one-time set-up of a context included); the other thread
     * launches at once. */
    release_start(gpu.ctx, gpu.touch);
    for (size_t i = 0; i < N_RELEASE_CASES; i++)
        stall_measure(&release_cases[i], 2.0, 0);
    gpu_settle();

    printf("R stall_setup kernel_ms=%.0f settle_ms=%.1f launch_delay_ms=%.1f object_bytes=%zu\n",
           kernel_ms, settle_ms, RELEASE_LAUNCH_DELAY_MS, (size_t)RELEASE_OBJECT_BYTES);
    launcher.delay_ms = RELEASE_LAUNCH_DELAY_MS;
    for (size_t i = 0; i < N_RELEASE_CASES; i++) {
        for (int run = 1; run <= opt.runs; run++) {
            struct stall_sample s = stall_measure(&release_cases[i], kernel_ms, settle_ms);
            printf("R stall case=%s run=%d release_ms=%.4f launch_ms=%.4f running=%d\n",
                   release_cases[i].id, run, s.release_ms, s.launch_ms, (int)s.running);
            fflush(stdout);
        }
        gpu_settle();
    }

    release_stop();
}

/* ------------------------------------------------------------------------ */
/* Child section: loops                                                     */
/* ------------------------------------------------------------------------ */

enum loop_kind { L_DEVICE, L_HOST, L_REGISTERED, L_MANAGED };
enum touch { T_LIGHT, T_FULL, N_TOUCH };
static const char *const touch_names[N_TOUCH] = {"light", "full"};

struct loop_row {
    const char *id;
    const char *label;
    enum loop_kind kind;
    size_t bytes;
    const char *calls;  /* the calls the driver and cudefer children make */
    int iters[N_TOUCH]; /* a run without cudefer: about 0.1-0.3 s on an H200 */
    int smoke_iters;
};

/* The driver alone, per iteration on an H200 (bench/RESULTS.md, DESIGN.md):
 * device 4 KiB 75-90 us; pinned 4 KiB 900 us, 64 MiB 31 ms (light) and
 * 41-45 ms (full); registered 4 KiB 100 us, 64 MiB 3-5 ms; managed 4 KiB
 * 75 us, 64 MiB 0.1 ms (light) and 10 ms (full). */
#define C_DEV "cuMemAlloc / cuMemFree"
#define C_HOST "cuMemAllocHost / cuMemFreeHost"
#define C_REG "cuMemHostRegister / cuMemHostUnregister"
#define C_MAN "cuMemAllocManaged / cuMemFree"
static const struct loop_row loop_rows[] = {
    {"dev4k", "device 4 KiB", L_DEVICE, 4 * KIB, C_DEV, {2000, 2000}, 20},
    {"dev64m", "device 64 MiB", L_DEVICE, 64 * MIB, C_DEV, {200, 200}, 6},
    {"host4k", "pinned host 4 KiB", L_HOST, 4 * KIB, C_HOST, {200, 200}, 20},
    {"host64m", "pinned host 64 MiB", L_HOST, 64 * MIB, C_HOST, {10, 6}, 4},
    {"reg4k", "registered 4 KiB", L_REGISTERED, 4 * KIB, C_REG, {1000, 1000}, 20},
    {"reg64m", "registered 64 MiB", L_REGISTERED, 64 * MIB, C_REG, {30, 20}, 4},
    {"man4k", "managed 4 KiB", L_MANAGED, 4 * KIB, C_MAN, {1500, 1500}, 20},
    {"man64m", "managed 64 MiB", L_MANAGED, 64 * MIB, C_MAN, {100, 16}, 4},
};
#define N_LOOP_ROWS (sizeof loop_rows / sizeof loop_rows[0])
#define TOUCH_WORDS 16ull
#define MEM_SAMPLES 50

static const struct loop_row *find_row(const char *id)
{
    for (size_t i = 0; i < N_LOOP_ROWS; i++)
        if (strcmp(loop_rows[i].id, id) == 0)
            return &loop_rows[i];
    return NULL;
}

/* --rows: the loop rows to run (all by default). */
static bool row_wanted(const struct loop_row *r)
{
    return listed(opt.rows, r->id);
}

static int row_iters(const struct loop_row *r, enum touch t)
{
    return opt.smoke ? r->smoke_iters : r->iters[t];
}

static bool row_has_pool(const struct loop_row *r)
{
    return r->kind != L_REGISTERED;
}

static unsigned long long light_words(const struct loop_row *r)
{
    return r->bytes / 4 < TOUCH_WORDS ? r->bytes / 4 : TOUCH_WORDS;
}

/* The row's use of a block: the light or the full touch. */
static CUresult k_use(const struct loop_row *r, enum touch t, CUstream s, CUdeviceptr d)
{
    return t == T_FULL ? k_fill(s, d, r->bytes) : k_touch(s, d, light_words(r));
}

/* A note as one token of an "R" line: spaces become '~' (note_untoken
 * turns them back), '=' and control characters '_'. */
static void note_token(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < n; i++)
        dst[i] = src[i] == ' ' ? '~' : (src[i] == '=' || src[i] < 0x20) ? '_' : src[i];
    dst[i] = 0;
}

static void note_untoken(char *s)
{
    for (; *s; s++)
        if (*s == '~')
            *s = ' ';
}

/* The pool child's pool. */
struct loop_pool {
    CUmemoryPool pool;
    bool is_default; /* the device's default pool: cuMemAllocAsync */
    bool owned;      /* made here: cuMemPoolDestroy at the end */
    char note[160];  /* how it was made, or why there is none */
};

typedef CUresult (*pool_access_fn)(CUmemoryPool, const CUmemAccessDesc *, size_t);
typedef CUresult (*default_pool_fn)(CUmemoryPool *, CUmemLocation *, CUmemAllocationType);

/* Makes r's pool; false (and why in p->note) when there is none. */
static bool loop_pool_open(const struct loop_row *r, cuuint64_t threshold, struct loop_pool *p)
{
    CUresult rc;
    CUmemPoolProps props;
    memset(p, 0, sizeof *p);
    memset(&props, 0, sizeof props);
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    switch (r->kind) {
    case L_DEVICE:
        rc = cuDeviceGetDefaultMemPool(&p->pool, gpu.dev);
        if (rc != CUDA_SUCCESS) {
            snprintf(p->note, sizeof p->note, "cuDeviceGetDefaultMemPool: %s", gc_rc(rc));
            return false;
        }
        p->is_default = true;
        snprintf(p->note, sizeof p->note, "the device's default pool, cuMemAllocAsync");
        break;
    case L_HOST:
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_HOST;
        props.location.id = 0;
        rc = cuMemPoolCreate(&p->pool, &props);
        if (rc != CUDA_SUCCESS) {
            snprintf(p->note, sizeof p->note,
                     "cuMemPoolCreate(PINNED, location HOST): %s", gc_rc(rc));
            return false;
        }
        p->owned = true;
        pool_access_fn set_access;
        *(void **)&set_access = driver_proc("cuMemPoolSetAccess");
        if (set_access) {
            CUmemAccessDesc desc;
            memset(&desc, 0, sizeof desc);
            desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            desc.location.id = (int)gpu.dev;
            desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            rc = set_access(p->pool, &desc, 1);
            if (rc != CUDA_SUCCESS) {
                snprintf(p->note, sizeof p->note, "cuMemPoolSetAccess(device 0, READWRITE): %s",
                         gc_rc(rc));
                cuMemPoolDestroy(p->pool);
                return false;
            }
            snprintf(p->note, sizeof p->note,
                     "cuMemPoolCreate(PINNED, location HOST), cuMemPoolSetAccess(device 0)");
        } else {
            snprintf(p->note, sizeof p->note,
                     "cuMemPoolCreate(PINNED, location HOST); the driver has no "
                     "cuMemPoolSetAccess");
        }
        break;
    case L_MANAGED:
        props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = (int)gpu.dev;
        rc = cuMemPoolCreate(&p->pool, &props);
        if (rc == CUDA_SUCCESS) {
            p->owned = true;
            snprintf(p->note, sizeof p->note, "cuMemPoolCreate(MANAGED, location device 0)");
            break;
        }
        /* The managed default pool of the device (13.0), where a pool of
         * one's own cannot be made. */
        default_pool_fn get_default;
        *(void **)&get_default = driver_proc("cuMemGetDefaultMemPool");
        CUresult rc2 = get_default ? get_default(&p->pool, &props.location,
                                                 CU_MEM_ALLOCATION_TYPE_MANAGED)
                                   : CUDA_ERROR_NOT_FOUND;
        if (rc2 != CUDA_SUCCESS) {
            snprintf(p->note, sizeof p->note,
                     "cuMemPoolCreate(MANAGED, location device 0): %s; "
                     "cuMemGetDefaultMemPool(device 0, MANAGED): %s",
                     gc_rc(rc), get_default ? gc_rc(rc2) : "not in this driver");
            return false;
        }
        snprintf(p->note, sizeof p->note,
                 "cuMemGetDefaultMemPool(device 0, MANAGED) (cuMemPoolCreate: %s)", gc_rc(rc));
        break;
    case L_REGISTERED:
        snprintf(p->note, sizeof p->note, "registrations have no pool");
        return false;
    }
    rc = cuMemPoolSetAttribute(p->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    if (rc != CUDA_SUCCESS) {
        size_t used = strlen(p->note);
        snprintf(p->note + used, sizeof p->note - used, "; release threshold not set: %s",
                 gc_rc(rc));
    }
    return true;
}

/* A pool attribute of 64 bits, -1 when the driver will not say. */
static long long pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 0;
    return cuMemPoolGetAttribute(pool, attr, &v) == CUDA_SUCCESS ? (long long)v : -1;
}

/* One iteration: allocate, use, release. `reg` is the row's buffer for
 * registrations; `pool` is set in the pool child. */
static void loop_once(const struct loop_row *r, enum touch t, CUstream s, void *reg,
                      const struct loop_pool *pool)
{
    CUdeviceptr d;
    void *h;
    if (pool) {
        if (pool->is_default)
            GC_CHECK(cuMemAllocAsync(&d, r->bytes, s));
        else
            GC_CHECK(cuMemAllocFromPoolAsync(&d, r->bytes, pool->pool, s));
        GC_CHECK(k_use(r, t, s, d));
        GC_CHECK(cuMemFreeAsync(d, s));
        return;
    }
    switch (r->kind) {
    case L_DEVICE:
        GC_CHECK(cuMemAlloc(&d, r->bytes));
        GC_CHECK(k_use(r, t, s, d));
        GC_CHECK(cuMemFree(d));
        break;
    case L_HOST:
        GC_CHECK(cuMemAllocHost(&h, r->bytes));
        GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
        GC_CHECK(k_use(r, t, s, d));
        GC_CHECK(cuMemFreeHost(h));
        break;
    case L_REGISTERED:
        GC_CHECK(cuMemHostRegister(reg, r->bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
        GC_CHECK(cuMemHostGetDevicePointer(&d, reg, 0));
        GC_CHECK(k_use(r, t, s, d));
        GC_CHECK(cuMemHostUnregister(reg));
        break;
    case L_MANAGED:
        GC_CHECK(cuMemAllocManaged(&d, r->bytes, CU_MEM_ATTACH_GLOBAL));
        GC_CHECK(k_use(r, t, s, d));
        GC_CHECK(cuMemFree(d));
        break;
    }
}

static size_t mem_used(void)
{
    size_t free_b = 0, total_b = 0;
    GC_CHECK(cuMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
}

/* spec: "<row>:<touch>" */
static void child_loop(const char *spec)
{
    char id[32];
    const char *colon = strchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof id)
        gc_die("bad loop section %s", spec);
    memcpy(id, spec, (size_t)(colon - spec));
    id[colon - spec] = 0;
    const struct loop_row *r = find_row(id);
    if (!r)
        gc_die("no loop row %s", id);
    enum touch t;
    if (strcmp(colon + 1, "light") == 0)
        t = T_LIGHT;
    else if (strcmp(colon + 1, "full") == 0)
        t = T_FULL;
    else
        gc_die("no touch %s", colon + 1);

    struct loop_pool pool_state, *pool = NULL;
    int mode = mode_of(opt.mode);
    if (mode_is_pool(mode)) {
        if (!loop_pool_open(r, mode == MODE_POOL ? UINT64_MAX : 0, &pool_state)) {
            char note[200];
            note_token(note, sizeof note, pool_state.note);
            printf("R loop_na row=%s touch=%s why=%s\n", r->id, touch_names[t], note);
            return;
        }
        pool = &pool_state;
    }

    int iters = row_iters(r, t);
    int every = iters / MEM_SAMPLES > 0 ? iters / MEM_SAMPLES : 1;
    void *reg = r->kind == L_REGISTERED ? gc_xpages(r->bytes) : NULL;
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* Warm-up: a twentieth of a run, at least two iterations. Between runs
     * the context is synchronised as a program would, not flushed: cudefer
     * then keeps across it what CUDEFER_KEEP says, as the pool keeps what
     * its release threshold says. */
    int warm = iters / 20 > 2 ? iters / 20 : 2;
    for (int i = 0; i < warm; i++)
        loop_once(r, t, s, reg, pool);
    GC_CHECK(cuCtxSynchronize());

    printf("R loop_setup row=%s touch=%s iters=%d bytes=%zu touch_bytes=%llu mem_every=%d "
           "warm=%d\n",
           r->id, touch_names[t], iters, r->bytes,
           t == T_FULL ? (unsigned long long)r->bytes : light_words(r) * 4, every, warm);
    if (pool) {
        char note[200];
        note_token(note, sizeof note, pool->note);
        printf("R loop_pool_setup row=%s touch=%s how=%s\n", r->id, touch_names[t], note);
    }
    for (int run = 1; run <= opt.runs; run++) {
        GC_CHECK(cuCtxSynchronize());
        size_t base = mem_used(), peak = base;
        double t0 = gc_now_ms();
        for (int i = 0; i < iters; i++) {
            loop_once(r, t, s, reg, pool);
            if ((i + 1) % every == 0) {
                size_t u = mem_used();
                if (u > peak)
                    peak = u;
            }
        }
        double t1 = gc_now_ms();
        GC_CHECK(cuCtxSynchronize());
        double t2 = gc_now_ms();
        size_t u = mem_used();
        if (u > peak)
            peak = u;
        printf("R loop row=%s touch=%s run=%d iters=%d us_per_iter=%.3f sync_ms=%.3f "
               "peak_dev_bytes=%zu\n",
               r->id, touch_names[t], run, iters, (t2 - t0) * 1e3 / iters, t2 - t1,
               peak > base ? peak - base : 0);
        fflush(stdout);
    }

    gpu_settle();
    if (pool) {
        printf("R loop_pool row=%s touch=%s used_high=%lld reserved_high=%lld\n", r->id,
               touch_names[t], pool_attr(pool->pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH),
               pool_attr(pool->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH));
        if (pool->owned)
            GC_CHECK(cuMemPoolDestroy(pool->pool));
    }
    GC_CHECK(cuStreamDestroy(s));
    free(reg);
}

/* ------------------------------------------------------------------------ */
/* Child section: cost                                                      */
/* ------------------------------------------------------------------------ */

typedef CUresult (*get_current_fn)(CUcontext *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

/* 1 when the pointer is inside the driver, not inside cudefer. */
static int driver_own(void *fn)
{
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname)
        return -1;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return strncmp(base, "libcudefer", 10) != 0;
}

static double time_get_current(get_current_fn fn, long n)
{
    CUcontext c = NULL;
    double t0 = gc_now_ms();
    for (long i = 0; i < n; i++)
        if (fn(&c) != CUDA_SUCCESS)
            gc_die("cuCtxGetCurrent failed");
    double t1 = gc_now_ms();
    if (c != gpu.ctx)
        gc_die("cuCtxGetCurrent returned another context");
    return (t1 - t0) * 1e6 / (double)n;
}

/* ns per launch of cudefer_touch with nothing to write (an empty kernel),
 * timed in batches of 500 with the stream synchronised between batches
 * (not timed), so that the launch queue never fills. */
static double time_launch(launch_fn fn, CUstream s, long n)
{
    CUdeviceptr buf = 0;
    unsigned long long words = 0;
    void *args[] = {&buf, &words};
    double total = 0;
    for (long done = 0; done < n;) {
        long batch = n - done < 500 ? n - done : 500;
        double t0 = gc_now_ms();
        for (long i = 0; i < batch; i++) {
            CUresult rc = fn(gpu.touch, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
            if (rc != CUDA_SUCCESS)
                gc_fail("cuLaunchKernel (cost)", rc, __FILE__, __LINE__);
        }
        total += gc_now_ms() - t0;
        GC_CHECK(cuStreamSynchronize(s));
        done += batch;
    }
    return total * 1e6 / (double)n;
}

static void child_cost(void)
{
    int n_dev = opt.smoke ? 50 : 2000;
    int n_host = opt.smoke ? 10 : 200;
    long n_calls = opt.smoke ? 10000 : 1000000;
    long n_free0 = opt.smoke ? 1000 : 200000;
    long n_launch = opt.smoke ? 1000 : 20000;

    CUdeviceptr *d = calloc((size_t)n_dev, sizeof *d);
    void **h = calloc((size_t)n_host, sizeof *h);
    if (!d || !h)
        gc_die("out of host memory");
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* The unwrapped call, three ways; the wrapped launch, two ways. */
    get_current_fn direct = cuCtxGetCurrent, procaddr = NULL, viadlsym = NULL;
    launch_fn launch_direct = cuLaunchKernel, launch_procaddr = NULL;
    void *p = driver_proc("cuCtxGetCurrent");
    if (!p)
        gc_die("cuGetProcAddress(cuCtxGetCurrent) found nothing");
    memcpy(&procaddr, &p, sizeof p);
    void *procaddr_p = p;
    void *lp = driver_proc("cuLaunchKernel");
    if (!lp)
        gc_die("cuGetProcAddress(cuLaunchKernel) found nothing");
    memcpy(&launch_procaddr, &lp, sizeof lp);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        gc_die("dlopen(libcuda.so.1, RTLD_NOLOAD): %s", dlerror());
    p = dlsym(lib, "cuCtxGetCurrent");
    if (!p)
        gc_die("dlsym(libcuda.so.1, cuCtxGetCurrent): %s", dlerror());
    memcpy(&viadlsym, &p, sizeof p);
    void *launch_direct_p;
    memcpy(&launch_direct_p, &launch_direct, sizeof launch_direct_p);
    printf("R cost_setup n_dev=%d n_host=%d n_calls=%ld n_free0=%ld n_launch=%ld\n", n_dev,
           n_host, n_calls, n_free0, n_launch);
    printf("R cost_ptrs procaddr_driver_own=%d dlsym_driver_own=%d same=%d "
           "launch_linked_driver_own=%d launch_procaddr_driver_own=%d\n",
           driver_own(procaddr_p), driver_own(p), procaddr_p == p, driver_own(launch_direct_p),
           driver_own(lp));

    /* Warm-up. */
    for (int i = 0; i < 4; i++) {
        GC_CHECK(cuMemAlloc(&d[i], 4 * KIB));
        GC_CHECK(cuMemAllocHost(&h[i], 4 * KIB));
    }
    for (int i = 0; i < 4; i++) {
        GC_CHECK(cuMemFree(d[i]));
        GC_CHECK(cuMemFreeHost(h[i]));
    }
    time_get_current(direct, n_calls / 10);
    time_get_current(procaddr, n_calls / 10);
    time_get_current(viadlsym, n_calls / 10);
    time_launch(launch_direct, s, n_launch / 10);
    time_launch(launch_procaddr, s, n_launch / 10);

    for (int run = 1; run <= opt.runs; run++) {
        gpu_settle();
        double t0 = gc_now_ms();
        for (int i = 0; i < n_dev; i++)
            GC_CHECK(cuMemAlloc(&d[i], 4 * KIB));
        double t1 = gc_now_ms();
        GC_CHECK(cuCtxSynchronize());
        double t2 = gc_now_ms();
        for (int i = 0; i < n_dev; i++)
            GC_CHECK(cuMemFree(d[i]));
        double t3 = gc_now_ms();
        /* What cudefer deferred is done at the next synchronisation (or
         * by its waiter meanwhile): timed too, so that "added" shows
         * where the work went. */
        GC_CHECK(cuCtxSynchronize());
        double t3s = gc_now_ms();
        gpu_settle();

        double t4 = gc_now_ms();
        for (int i = 0; i < n_host; i++)
            GC_CHECK(cuMemAllocHost(&h[i], 4 * KIB));
        double t5 = gc_now_ms();
        GC_CHECK(cuCtxSynchronize());
        double t6 = gc_now_ms();
        for (int i = 0; i < n_host; i++)
            GC_CHECK(cuMemFreeHost(h[i]));
        double t7 = gc_now_ms();
        GC_CHECK(cuCtxSynchronize());
        double t7s = gc_now_ms();
        gpu_settle();

        double ns_direct = time_get_current(direct, n_calls);
        double ns_procaddr = time_get_current(procaddr, n_calls);
        double ns_dlsym = time_get_current(viadlsym, n_calls);

        double t8 = gc_now_ms();
        for (long i = 0; i < n_free0; i++)
            GC_CHECK(cuMemFree(0));
        double t9 = gc_now_ms();

        double ns_launch = time_launch(launch_direct, s, n_launch);
        double ns_launch_pa = time_launch(launch_procaddr, s, n_launch);

        printf("R cost run=%d alloc_ns=%.1f free_ns=%.1f allochost_ns=%.1f freehost_ns=%.1f "
               "freesync_ns=%.1f freehostsync_ns=%.1f getcurrent_direct_ns=%.3f getcurrent_procaddr_ns=%.3f getcurrent_dlsym_ns=%.3f "
               "free0_ns=%.3f launch_direct_ns=%.1f launch_procaddr_ns=%.1f\n",
               run, (t1 - t0) * 1e6 / n_dev, (t3 - t2) * 1e6 / n_dev, (t5 - t4) * 1e6 / n_host,
               (t7 - t6) * 1e6 / n_host, (t3s - t3) * 1e6 / n_dev, (t7s - t7) * 1e6 / n_host,
               ns_direct, ns_procaddr, ns_dlsym,
               (t9 - t8) * 1e6 / (double)n_free0, ns_launch, ns_launch_pa);
        fflush(stdout);
    }
    gpu_settle();
    GC_CHECK(cuStreamDestroy(s));
    dlclose(lib);
    free(d);
    free(h);
}

/* ------------------------------------------------------------------------ */
/* Child section: live                                                      */
/* ------------------------------------------------------------------------ */

#define LIVE_BYTES 256

/* Grows the set of live blocks level by level; at each level times pairs
 * of cuMemAlloc / cuMemFree of one more block. Ends the process itself
 * (_exit), leaving the live blocks to the driver's clean-up of a process:
 * releasing ten million blocks one by one would take longer than making
 * them. */
static void child_live(void)
{
    static const long gpu_levels[] = {1000, 100000, 1000000, 3000000, 10000000};
    static const long smoke_levels[] = {1000, 10000};
    const long *levels = opt.smoke ? smoke_levels : gpu_levels;
    size_t n_levels = opt.smoke ? sizeof smoke_levels / sizeof smoke_levels[0]
                                : sizeof gpu_levels / sizeof gpu_levels[0];
    long pairs = opt.smoke ? 200 : 20000;
    double budget_ms = live_budget() * 1e3;

    long cap = 0, n = 0;
    CUdeviceptr *blocks = NULL;
    double grow_ms = 0;      /* time spent allocating live blocks */
    double rate_ms = 0;      /* ms per allocation in the last level's growth */
    size_t free_b = 0, total_b = 0;

    /* Warm-up: pairs with nothing live. */
    for (long i = 0; i < pairs / 10 + 2; i++) {
        CUdeviceptr d;
        GC_CHECK(cuMemAlloc(&d, LIVE_BYTES));
        GC_CHECK(cuMemFree(d));
    }
    gpu_settle();
    printf("R live_setup bytes=%d pairs=%ld budget_s=%.1f max=%ld\n", LIVE_BYTES, pairs,
           budget_ms / 1e3, opt.live_max);

    for (size_t li = 0; li < n_levels; li++) {
        long level = levels[li];
        if (opt.live_max > 0 && level > opt.live_max) {
            printf("R live_stop level=%ld why=above_the_other_child's_largest\n", level);
            break;
        }
        double predicted = (double)(level - n) * (rate_ms > 0 ? rate_ms : 0.005);
        if (grow_ms + predicted > budget_ms) {
            printf("R live_stop level=%ld why=time predicted_s=%.1f spent_s=%.1f\n", level,
                   predicted / 1e3, grow_ms / 1e3);
            break;
        }
        GC_CHECK(cuMemGetInfo(&free_b, &total_b));
        if (free_b < total_b / 4) {
            printf("R live_stop level=%ld why=memory free_bytes=%zu total_bytes=%zu\n", level,
                   free_b, total_b);
            break;
        }
        if (level > cap) {
            blocks = realloc(blocks, (size_t)level * sizeof *blocks);
            if (!blocks)
                gc_die("out of host memory for %ld block pointers", level);
            cap = level;
        }
        long from = n;
        bool oom = false, late = false;
        double t0 = gc_now_ms();
        for (; n < level; n++) {
            CUresult rc = cuMemAlloc(&blocks[n], LIVE_BYTES);
            if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
                oom = true;
                break;
            }
            if (rc != CUDA_SUCCESS)
                gc_fail("cuMemAlloc (live block)", rc, __FILE__, __LINE__);
            /* Allocation slower than the prediction: give up the level at
             * one and a half times the budget. */
            if ((n & 0xffff) == 0 && grow_ms + gc_now_ms() - t0 > 1.5 * budget_ms) {
                late = true;
                n++;
                break;
            }
        }
        double t1 = gc_now_ms();
        grow_ms += t1 - t0;
        if (n > from)
            rate_ms = (t1 - t0) / (double)(n - from);
        if (oom || late) {
            printf("R live_stop level=%ld why=%s live=%ld\n", level,
                   oom ? "out_of_memory" : "time_(slower_than_predicted)", n);
            break;
        }
        printf("R live_grow level=%ld ns_per_alloc=%.1f grow_s=%.2f\n", level, rate_ms * 1e6,
               grow_ms / 1e3);
        gpu_settle();
        for (int run = 1; run <= opt.runs; run++) {
            CUdeviceptr d;
            double p0 = gc_now_ms();
            for (long i = 0; i < pairs; i++) {
                GC_CHECK(cuMemAlloc(&d, LIVE_BYTES));
                GC_CHECK(cuMemFree(d));
            }
            double p1 = gc_now_ms();
            printf("R live level=%ld run=%d ns_per_pair=%.1f\n", level, run,
                   (p1 - p0) * 1e6 / (double)pairs);
            fflush(stdout);
        }
    }
    GC_CHECK(cuCtxSynchronize());
    if (gpu.faults && gpu.faults() != 0)
        gc_die("the test driver saw %llu use(s) of freed memory", (unsigned long long)gpu.faults());
    printf("R live_end live=%ld\n", n);
    printf("R done section=live\n");
    fflush(stdout);
    fflush(stderr);
    _exit(0);
}

static int child_main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mode_of(opt.mode) < 0)
        gc_die("--mode none|cudefer|keep|pool is required with --child");
    gpu_open();
    if (strcmp(opt.child, "stall") == 0)
        child_stall();
    else if (strncmp(opt.child, "loop:", 5) == 0)
        child_loop(opt.child + 5);
    else if (strcmp(opt.child, "cost") == 0)
        child_cost();
    else if (strcmp(opt.child, "live") == 0)
        child_live();
    else
        gc_die("unknown child section %s", opt.child);
    gpu_close();
    printf("R done section=%s\n", opt.child);
    return 0;
}

/* ======================================================================== */
/* Parent: runs the children, prints the tables                            */
/* ======================================================================== */

struct job {
    char section[64]; /* the --child argument */
    int mode;
    char **lines;     /* "R ..." lines */
    size_t n_lines, cap_lines;
    bool ok;
    char why[256];    /* when not ok */
    char *report;     /* cudefer's JSON report, NULL if none */
    bool ran;         /* run_job was called */
    long live_max;    /* live: --live-max for the child (0: none) */
    double live_budget_s;
};

static char self_exe[PATH_MAX];
static double parent_start_ms; /* when the parent started its first child */
static char shim_path[PATH_MAX];
static FILE *log_file;
static bool any_failure;

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n);
    if (!p)
        gc_die("out of memory");
    return p;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        gc_die("out of memory");
    return d;
}

static void job_add_line(struct job *j, const char *line)
{
    if (log_file)
        fprintf(log_file, "[%s %s] %s\n", mode_names[j->mode], j->section, line);
    if (strncmp(line, "R ", 2) != 0)
        return;
    if (j->n_lines == j->cap_lines) {
        j->cap_lines = j->cap_lines ? 2 * j->cap_lines : 64;
        j->lines = xrealloc(j->lines, j->cap_lines * sizeof *j->lines);
    }
    j->lines[j->n_lines++] = xstrdup(line);
}

/* True for an LD_PRELOAD entry that is cudefer. */
static bool is_shim_entry(const char *e)
{
    const char *base = strrchr(e, '/');
    base = base ? base + 1 : e;
    if (strncmp(base, "libcudefer", 10) == 0)
        return true;
    char real[PATH_MAX];
    return realpath(e, real) && strcmp(real, shim_path) == 0;
}

/* LD_PRELOAD of the parent without cudefer, space-separated; "" if none. */
static char *preload_without_shim(void)
{
    const char *cur = getenv("LD_PRELOAD");
    char *copy = xstrdup(cur ? cur : "");
    char *out = calloc(1, strlen(copy) + 1);
    if (!out)
        gc_die("out of memory");
    char *save = NULL;
    for (char *e = strtok_r(copy, ": ", &save); e; e = strtok_r(NULL, ": ", &save)) {
        if (is_shim_entry(e))
            continue;
        if (*out)
            strcat(out, " ");
        strcat(out, e);
    }
    free(copy);
    return out;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = xrealloc(NULL, cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0)
            buf = xrealloc(buf, cap *= 2);
    }
    fclose(f);
    buf[n] = 0;
    if (n == 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The child's argument vector. */
static char **child_argv(const struct job *j)
{
    static char runs[16], live_max[32], live_budget_s[32];
    static char *argv[24];
    int a = 0;
    snprintf(runs, sizeof runs, "%d", opt.runs);
    argv[a++] = self_exe;
    argv[a++] = "--child";
    argv[a++] = (char *)j->section;
    argv[a++] = "--mode";
    argv[a++] = (char *)mode_names[j->mode];
    argv[a++] = "--runs";
    argv[a++] = runs;
    if (opt.quick)
        argv[a++] = "--quick";
    if (opt.smoke)
        argv[a++] = "--smoke";
    if (j->live_max > 0) {
        snprintf(live_max, sizeof live_max, "%ld", j->live_max);
        argv[a++] = "--live-max";
        argv[a++] = live_max;
    }
    if (j->live_budget_s > 0) {
        snprintf(live_budget_s, sizeof live_budget_s, "%.1f", j->live_budget_s);
        argv[a++] = "--live-budget";
        argv[a++] = live_budget_s;
    }
    argv[a] = NULL;
    return argv;
}

static double job_timeout_s(const struct job *j)
{
    if (strcmp(j->section, "stall") == 0)
        return (double)N_RELEASE_CASES * (opt.runs + 1) * (stall_kernel_ms() + 500.0) / 1e3 + 60;
    if (strcmp(j->section, "live") == 0)
        return 2.5 * (j->live_budget_s > 0 ? j->live_budget_s : live_budget()) + 120;
    return 120 + 20.0 * opt.runs;
}

/* When --budget was given: the ms left of it (at least 0), else -1. */
static double budget_left_ms(void)
{
    if (opt.budget_s <= 0)
        return -1;
    double left = opt.budget_s * 1e3 - (gc_now_ms() - parent_start_ms);
    return left > 0 ? left : 0;
}

static void run_job(struct job *j)
{
    j->ran = true;
    double left = budget_left_ms();
    if (left >= 0 && left < 1000) {
        snprintf(j->why, sizeof j->why, "not run: the --budget of %.0f s was spent", opt.budget_s);
        j->ok = false;
        any_failure = true;
        fprintf(stderr, "cudefer-loops: %-8s %-20s %s\n", mode_names[j->mode], j->section, j->why);
        return;
    }
    char report[] = "/tmp/cudefer-loops-report-XXXXXX";
    int rfd = -1;
    if (mode_has_shim(j->mode)) {
        rfd = mkstemp(report);
        if (rfd < 0)
            gc_die("mkstemp: %s", strerror(errno));
        close(rfd);
    }
    char *preload = preload_without_shim();
    int fds[2];
    if (pipe(fds) != 0)
        gc_die("pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    if (log_file)
        fflush(log_file);
    double t0 = gc_now_ms();
    pid_t pid = fork();
    if (pid < 0)
        gc_die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        if (dup2(fds[1], STDOUT_FILENO) < 0)
            _exit(126);
        close(fds[1]);
        if (mode_has_shim(j->mode)) {
            size_t n = strlen(shim_path) + strlen(preload) + 2;
            char *v = malloc(n);
            if (!v)
                _exit(126);
            snprintf(v, n, "%s%s%s", shim_path, *preload ? " " : "", preload);
            setenv("LD_PRELOAD", v, 1);
            setenv("CUDEFER_REPORT", report, 1);
            /* The report for the memory held; without what cudefer saved,
             * which nothing gathers by default (it costs a release an
             * event query or two): the figures are the default's. */
            setenv("CUDEFER_SAVINGS", "0", 1);
            if (j->mode == MODE_KEEP)
                setenv("CUDEFER_KEEP", KEEP_BYTES, 1);
            else
                unsetenv("CUDEFER_KEEP");
        } else {
            if (*preload)
                setenv("LD_PRELOAD", preload, 1);
            else
                unsetenv("LD_PRELOAD");
            unsetenv("CUDEFER_REPORT");
        }
        if (pin_children && sched_setaffinity(0, sizeof child_cpus, &child_cpus) != 0)
            fprintf(stderr, "cudefer-loops: sched_setaffinity: %s; not pinned\n",
                    strerror(errno));
        execv(self_exe, child_argv(j));
        fprintf(stderr, "cudefer-loops: exec %s: %s\n", self_exe, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    free(preload);

    double limit_ms = job_timeout_s(j) * 1e3;
    if (left >= 0 && limit_ms > left)
        limit_ms = left;
    bool timed_out = false;
    size_t cap = 1 << 16, n = 0;
    char *buf = xrealloc(NULL, cap);
    for (;;) {
        double left = limit_ms - (gc_now_ms() - t0);
        if (left <= 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int pr = poll(&pfd, 1, left > 1000 ? 1000 : (int)left + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            gc_die("poll: %s", strerror(errno));
        if (pr == 0)
            continue;
        if (n + 4096 > cap)
            buf = xrealloc(buf, cap *= 2);
        ssize_t got = read(fds[0], buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (size_t)got;
        buf[n] = 0;
        char *start = buf, *nl;
        while ((nl = strchr(start, '\n')) != NULL) {
            *nl = 0;
            job_add_line(j, start);
            start = nl + 1;
        }
        n = (size_t)(buf + n - start);
        memmove(buf, start, n);
        buf[n] = 0;
    }
    if (n > 0) {
        buf[n] = 0;
        job_add_line(j, buf);
    }
    free(buf);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    double secs = (gc_now_ms() - t0) / 1e3;

    bool done = j->n_lines > 0 && strncmp(j->lines[j->n_lines - 1], "R done", 6) == 0;
    if (timed_out)
        snprintf(j->why, sizeof j->why, "timed out after %.0f s", secs);
    else if (WIFSIGNALED(status))
        snprintf(j->why, sizeof j->why, "killed by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        snprintf(j->why, sizeof j->why, "exit status %d", WEXITSTATUS(status));
    else if (!done)
        snprintf(j->why, sizeof j->why, "no \"R done\" line");
    j->ok = !j->why[0];
    if (!j->ok)
        any_failure = true;

    if (mode_has_shim(j->mode)) {
        j->report = read_file(report);
        unlink(report);
        if (log_file)
            fprintf(log_file, "[%s %s] cudefer report: %s\n", mode_names[j->mode], j->section,
                    j->report ? j->report : "(none)\n");
    }
    if (log_file) {
        fprintf(log_file, "[%s %s] %s after %.2f s\n", mode_names[j->mode], j->section,
                j->ok ? "ok" : j->why, secs);
        fflush(log_file);
    }
    fprintf(stderr, "cudefer-loops: %-8s %-20s %s (%.1f s)\n", mode_names[j->mode], j->section,
            j->ok ? "ok" : j->why, secs);
}

/* ---- reading the lines -------------------------------------------------- */

/* The value of key=value in line, into out; false if absent. */
static bool field(const char *line, const char *key, char *out, size_t n)
{
    size_t k = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += k) {
        if ((p == line || p[-1] == ' ') && p[k] == '=') {
            const char *v = p + k + 1;
            size_t len = strcspn(v, " ");
            if (len >= n)
                len = n - 1;
            memcpy(out, v, len);
            out[len] = 0;
            return true;
        }
    }
    return false;
}

static bool line_is(const char *line, const char *tag)
{
    size_t n = strlen(tag);
    return strncmp(line + 2, tag, n) == 0 && line[2 + n] == ' ';
}

/* Values of `key` over the lines tagged `tag` whose field `sel` is `val`. */
struct series {
    double v[64];
    int n;
};

static struct series collect(const struct job *j, const char *tag, const char *sel,
                             const char *val, const char *key)
{
    struct series s = {.n = 0};
    char buf[128];
    for (size_t i = 0; i < j->n_lines; i++) {
        const char *l = j->lines[i];
        if (!line_is(l, tag))
            continue;
        if (sel && (!field(l, sel, buf, sizeof buf) || strcmp(buf, val) != 0))
            continue;
        if (field(l, key, buf, sizeof buf) && s.n < 64)
            s.v[s.n++] = strtod(buf, NULL);
    }
    return s;
}

static bool stats(struct series s, double *med, double *lo, double *hi)
{
    if (s.n == 0)
        return false;
    qsort(s.v, (size_t)s.n, sizeof s.v[0], cmp_double);
    *med = s.n % 2 ? s.v[s.n / 2] : (s.v[s.n / 2 - 1] + s.v[s.n / 2]) / 2;
    *lo = s.v[0];
    *hi = s.v[s.n - 1];
    return true;
}

static void fmt_num(char *out, size_t n, double v)
{
    double a = v < 0 ? -v : v;
    if (a >= 1000)
        snprintf(out, n, "%.0f", v);
    else if (a >= 100)
        snprintf(out, n, "%.1f", v);
    else if (a >= 10)
        snprintf(out, n, "%.2f", v);
    else if (a >= 1)
        snprintf(out, n, "%.3f", v);
    else
        snprintf(out, n, "%.4f", v);
}

/* "median (min–max)", or "-" */
static void fmt_cell(char *out, size_t n, struct series s)
{
    double med, lo, hi;
    if (!stats(s, &med, &lo, &hi)) {
        snprintf(out, n, "-");
        return;
    }
    char a[32], b[32], c[32];
    fmt_num(a, sizeof a, med);
    fmt_num(b, sizeof b, lo);
    fmt_num(c, sizeof c, hi);
    if (s.n == 1)
        snprintf(out, n, "%s", a);
    else
        snprintf(out, n, "%s (%s–%s)", a, b, c);
}

/* num/den of the medians, "-" when either is missing. */
static void fmt_ratio(char *out, size_t n, struct series num, struct series den)
{
    double a, b, lo, hi;
    if (!stats(num, &a, &lo, &hi) || !stats(den, &b, &lo, &hi) || b <= 0) {
        snprintf(out, n, "-");
        return;
    }
    double r = a / b;
    if (r >= 100)
        snprintf(out, n, "%.0f×", r);
    else if (r >= 10)
        snprintf(out, n, "%.1f×", r);
    else
        snprintf(out, n, "%.2f×", r);
}

static void fmt_bytes(char *out, size_t n, double b)
{
    if (b < 0)
        snprintf(out, n, "-");
    else if (b >= (double)(1u << 30))
        snprintf(out, n, "%.2f GiB", b / (double)(1u << 30));
    else if (b >= (double)MIB)
        snprintf(out, n, "%.1f MiB", b / (double)MIB);
    else if (b >= (double)KIB)
        snprintf(out, n, "%.1f KiB", b / (double)KIB);
    else
        snprintf(out, n, "%.0f B", b);
}

/* A number after "key": in the report; -1 if absent. */
static double report_number(const char *report, const char *key)
{
    if (!report)
        return -1;
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(report, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The sum of the numbers in the object after "key": {...}; and the
 * non-zero members as "name n, ..." into list. -1 if absent. */
static double report_object(const char *report, const char *key, char *list, size_t n)
{
    if (list && n)
        list[0] = 0;
    if (!report)
        return -1;
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\": {", key);
    const char *p = strstr(report, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    const char *end = strchr(p, '}');
    if (!end)
        return -1;
    double sum = 0;
    while (p < end) {
        const char *q = strchr(p, '"');
        if (!q || q >= end)
            break;
        const char *qe = strchr(q + 1, '"');
        if (!qe || qe >= end)
            break;
        const char *colon = strchr(qe, ':');
        if (!colon || colon >= end)
            break;
        char *after;
        double v = strtod(colon + 1, &after);
        sum += v;
        if (list && v != 0) {
            size_t used = strlen(list);
            snprintf(list + used, n - used, "%s%.*s %.0f", used ? ", " : "", (int)(qe - q - 1),
                     q + 1, v);
        }
        p = after;
    }
    return sum;
}

static const char *mode_status(const struct job *j)
{
    return j->ok || !j->ran ? "" : " **FAILED**";
}
static void print_info(const struct job *j)
{
    char sim[8] = "?", dev[256] = "?", drv[16] = "?", ver[32] = "?";
    for (size_t i = 0; i < j->n_lines; i++) {
        if (!line_is(j->lines[i], "info"))
            continue;
        field(j->lines[i], "sim", sim, sizeof sim);
        field(j->lines[i], "device", dev, sizeof dev);
        field(j->lines[i], "driver", drv, sizeof drv);
        field(j->lines[i], "cudefer", ver, sizeof ver);
        break;
    }
    int v = atoi(drv);
    printf("- %s child: %s, driver API %d.%d, cudefer %s%s\n", mode_names[j->mode],
           strcmp(sim, "1") == 0 ? "the cudefer TEST DRIVER (simulated GPU; timings mean nothing)"
                                 : dev,
           v / 1000, v % 1000 / 10, strcmp(ver, "-") == 0 ? "not loaded" : ver, mode_status(j));
}


static void print_stall(struct job *jobs)
{
    struct job *none = &jobs[MODE_NONE], *cd = &jobs[MODE_CUDEFER];
    char kms[32] = "?";
    for (size_t i = 0; i < none->n_lines; i++)
        if (line_is(none->lines[i], "stall_setup"))
            field(none->lines[i], "kernel_ms", kms, sizeof kms);
    printf("\n### Stall: one release while a %s ms kernel runs on another non-blocking stream\n\n",
           kms);
    printf("ms, median of %d runs (min–max). \"caller\": how long the releasing call blocked; "
           "\"launch\": how long a cuLaunchKernel made by another thread %.0f ms into the "
           "release (tiny kernel, third stream) blocked. Ratio: without / with cudefer.\n\n",
           opt.runs, RELEASE_LAUNCH_DELAY_MS);
    printf("| release | caller, no cudefer | caller, cudefer | ratio | launch, no cudefer | "
           "launch, cudefer | ratio |\n|---|---|---|---|---|---|---|\n");
    int not_running = 0;
    for (size_t i = 0; i < N_RELEASE_CASES; i++) {
        const char *id = release_cases[i].id;
        struct series rn = collect(none, "stall", "case", id, "release_ms");
        struct series rc = collect(cd, "stall", "case", id, "release_ms");
        struct series ln = collect(none, "stall", "case", id, "launch_ms");
        struct series lc = collect(cd, "stall", "case", id, "launch_ms");
        for (int m = 0; m < N_PAIR; m++) {
            struct series run = collect(&jobs[m], "stall", "case", id, "running");
            for (int k = 0; k < run.n; k++)
                not_running += run.v[k] == 0;
        }
        char a[160], b[160], c[32], d[160], e[160], f[32];
        fmt_cell(a, sizeof a, rn);
        fmt_cell(b, sizeof b, rc);
        fmt_ratio(c, sizeof c, rn, rc);
        fmt_cell(d, sizeof d, ln);
        fmt_cell(e, sizeof e, lc);
        fmt_ratio(f, sizeof f, ln, lc);
        printf("| %s | %s | %s | %s | %s | %s | %s |\n", release_cases[i].label, a, b, c, d, e, f);
    }
    for (size_t i = 0; i < N_RELEASE_CASES; i++)
        if (release_cases[i].waits_for_prior)
            printf("\n%s waits, with cudefer too, for the work submitted before it (the "
                   "program may unmap the pages once it returns); only another thread's "
                   "launch must not wait.\n", release_cases[i].label);
    if (not_running)
        printf("\nWARNING: in %d measurement(s) the long kernel had already finished before the "
               "release (see the log).\n", not_running);
    for (int m = 0; m < N_PAIR; m++)
        if (!jobs[m].ok)
            printf("\n%s child FAILED: %s\n", mode_names[m], jobs[m].why);
}

/* ---- goals -------------------------------------------------------------- */

struct goal {
    char what[240];
    char measured[240];
    char verdict[40];
};
static struct goal goals[64];
static int n_goals;
static bool simulated; /* a child ran over the test driver: no verdict means anything */

static void add_goal(const char *verdict, const char *measured, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add_goal(const char *verdict, const char *measured, const char *fmt, ...)
{
    if (n_goals == (int)(sizeof goals / sizeof goals[0]))
        return;
    struct goal *g = &goals[n_goals++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->what, sizeof g->what, fmt, ap);
    va_end(ap);
    snprintf(g->measured, sizeof g->measured, "%s", measured);
    snprintf(g->verdict, sizeof g->verdict, "%s", simulated ? "– (test driver)" : verdict);
}

static void print_goals(void)
{
    if (n_goals == 0)
        return;
    printf("\n### Goals (cudefer-loops)\n\n| goal | measured | verdict |\n|---|---|---|\n");
    for (int i = 0; i < n_goals; i++)
        printf("| %s | %s | %s |\n", goals[i].what, goals[i].measured, goals[i].verdict);
    if (!opt.goals)
        return;
    FILE *f = fopen(opt.goals, "w");
    if (!f) {
        fprintf(stderr, "cudefer-loops: cannot write %s: %s\n", opt.goals, strerror(errno));
        any_failure = true;
        return;
    }
    for (int i = 0; i < n_goals; i++)
        fprintf(f, "%s\t%s\t%s\n", goals[i].what, goals[i].measured, goals[i].verdict);
    fclose(f);
}

static double median_of(struct series s)
{
    double med, lo, hi;
    return stats(s, &med, &lo, &hi) ? med : -1;
}

/* The first line tagged tag in j, or NULL. */
static const char *first_line(const struct job *j, const char *tag)
{
    for (size_t i = 0; i < j->n_lines; i++)
        if (line_is(j->lines[i], tag))
            return j->lines[i];
    return NULL;
}

/* ---- loops -------------------------------------------------------------- */

/* The goal of a row: cudefer at most `limit` times the pool (or, for
 * registrations, the driver). */
static double row_goal(const struct loop_row *r)
{
    if (!row_has_pool(r))
        return 1.0;
    return r->bytes <= 4 * KIB ? 1.2 : 1.5;
}

/* cudefer's memory held at the peak: peak_deferred_bytes +
 * peak_cached_device_bytes of its report, -1 without a report. */
static double cudefer_held(const struct job *cd)
{
    double deferred = report_number(cd->report, "peak_deferred_bytes");
    double cached = report_number(cd->report, "peak_cached_device_bytes");
    if (deferred < 0)
        return -1;
    return deferred + (cached > 0 ? cached : 0);
}

/* The verdict of a loop that took us against ref_us of the one it is
 * compared with (whom: "the pool", "the driver"), limit times at most, and
 * the measured text ("1.23× the pool (x vs y µs)"). */
static const char *against(double us, double ref_us, double limit, const char *whom, char *text,
                           size_t size)
{
    char a[32], b[32];
    fmt_num(a, sizeof a, us);
    fmt_num(b, sizeof b, ref_us);
    snprintf(text, size, "%.2f× %s (%s vs %s µs)", us / ref_us, whom, a, b);
    return us <= limit * ref_us ? "met" : "NOT met";
}

/* The pool child's "used / reserved high" cell, or why there is none. */
static void pool_held(char *out, size_t size, struct job *pl, const struct loop_row *r)
{
    if (!row_has_pool(r) || first_line(pl, "loop_na") || !pl->ran) {
        snprintf(out, size, "–");
        return;
    }
    char used[16] = "-1", resv[16] = "-1", u[32], v[32];
    const char *l = first_line(pl, "loop_pool");
    if (l) {
        field(l, "used_high", used, sizeof used);
        field(l, "reserved_high", resv, sizeof resv);
    }
    fmt_bytes(u, sizeof u, strtod(used, NULL));
    fmt_bytes(v, sizeof v, strtod(resv, NULL));
    snprintf(out, size, "%s / %s", u, v);
}

/* Each policy against the pool's of the same kind: cudefer at its default
 * (everything back at a synchronisation) against the pool at its default
 * release threshold, 0; CUDEFER_KEEP against the pool at the maximum. */
static void print_like_for_like(struct job (*jobs)[N_TOUCH][N_MODES], enum touch t)
{
    bool any = false;
    for (size_t i = 0; i < N_LOOP_ROWS; i++)
        any |= row_has_pool(&loop_rows[i]) && row_wanted(&loop_rows[i]);
    if (!any)
        return;
    printf("\nLike for like, %s touch: cudefer at its default against the pool at its default "
           "release threshold (0: the pool gives its memory back at each synchronisation, as "
           "cudefer does), and cudefer with CUDEFER_KEEP against the pool at the maximum "
           "(both keep it). µs per iteration, median (min–max); held as above.\n\n",
           touch_names[t]);
    printf("| loop | cudefer µs | pool at 0 µs | held (used / reserved high) | cudefer / pool at 0 "
           "| keep / pool at max |\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        const struct loop_row *r = &loop_rows[i];
        if (!row_has_pool(r) || !row_wanted(r))
            continue;
        struct job *p0 = &jobs[i][t][MODE_POOL0];
        struct series tc = collect(&jobs[i][t][MODE_CUDEFER], "loop", "row", r->id,
                                   "us_per_iter");
        struct series t0 = collect(p0, "loop", "row", r->id, "us_per_iter");
        struct series tp = collect(&jobs[i][t][MODE_POOL], "loop", "row", r->id, "us_per_iter");
        struct series tk = collect(&jobs[i][t][MODE_KEEP], "loop", "row", r->id, "us_per_iter");
        char c[160], z[160], held[80], r0[32], rk[32];
        fmt_cell(c, sizeof c, tc);
        if (first_line(p0, "loop_na") || !p0->ran)
            snprintf(z, sizeof z, "n/a");
        else
            fmt_cell(z, sizeof z, t0);
        pool_held(held, sizeof held, p0, r);
        fmt_ratio(r0, sizeof r0, tc, t0);
        fmt_ratio(rk, sizeof rk, tk, tp);
        printf("| %s%s | %s | %s | %s | %s | %s |\n", r->label, mode_status(p0), c, z, held, r0,
               rk);
    }
}

static void print_loops(struct job (*jobs)[N_TOUCH][N_MODES], enum touch t)
{
    printf("\n### Loops, %s touch: allocate, touch with a kernel, release, no synchronisation "
           "inside\n\n",
           touch_names[t]);
    if (t == T_LIGHT)
        printf("Touch: cudefer_touch of %llu words (one thread) on a non-blocking stream. ",
               TOUCH_WORDS);
    else
        printf("Touch: cudefer_fill of every word of the block (one thread per word, up to "
               "1,056 blocks of 256 threads, grid-stride beyond) on a non-blocking stream. ");
    printf("µs per iteration, median of %d runs (min–max), the cuCtxSynchronize after the loop "
           "included. \"driver\": the plain calls without cudefer; \"cudefer\": the same "
           "program with cudefer; \"keep\": cudefer with CUDEFER_KEEP=" KEEP_BYTES ", which "
           "keeps its blocks across the synchronisations between runs as the pool does; "
           "\"pool\": the driver's stream-ordered pool without cudefer "
           "(cuMemAllocAsync / cuMemAllocFromPoolAsync and cuMemFreeAsync on the loop's "
           "stream, release threshold at the maximum). \"held\": memory kept at the peak over "
           "the child (warm-up and all runs) — the driver holds 0 after each free; cudefer: "
           "peak_deferred_bytes + peak_cached_device_bytes of its report; pool: "
           "CU_MEMPOOL_ATTR_USED_MEM_HIGH / RESERVED_MEM_HIGH. Goal: cudefer at most 1.2× "
           "the pool at 4 KiB and 1.5× at 64 MiB; registrations (no pool) never slower than "
           "the driver.\n\n",
           opt.runs);
    printf("| loop | iterations | driver µs | held | cudefer µs | held | keep µs | held | pool µs "
           "| held (used / reserved high) | cudefer / pool | keep / pool | cudefer / driver "
           "| goal | met | met with keep |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        const struct loop_row *r = &loop_rows[i];
        if (!row_wanted(r))
            continue;
        struct job *none = &jobs[i][t][MODE_NONE], *cd = &jobs[i][t][MODE_CUDEFER];
        struct job *pl = &jobs[i][t][MODE_POOL], *kp = &jobs[i][t][MODE_KEEP];
        struct series tn = collect(none, "loop", "row", r->id, "us_per_iter");
        struct series tc = collect(cd, "loop", "row", r->id, "us_per_iter");
        struct series tp = collect(pl, "loop", "row", r->id, "us_per_iter");
        struct series tk = collect(kp, "loop", "row", r->id, "us_per_iter");
        char a[160], b[160], c[160], k[160], held_c[32], held_k[32], held_p[80], rp[32], rk[32],
            rd[32], goal[48];
        const char *met = "–", *met_k = "–";
        fmt_cell(a, sizeof a, tn);
        fmt_cell(b, sizeof b, tc);
        fmt_bytes(held_c, sizeof held_c, cd->ran ? cudefer_held(cd) : -1);
        if (kp->ran) {
            fmt_cell(k, sizeof k, tk);
            fmt_bytes(held_k, sizeof held_k, cudefer_held(kp));
        } else {
            snprintf(k, sizeof k, "–");
            snprintf(held_k, sizeof held_k, "–");
        }
        bool na = first_line(pl, "loop_na") != NULL;
        if (!row_has_pool(r)) {
            snprintf(c, sizeof c, "no pool");
            snprintf(held_p, sizeof held_p, "–");
        } else if (na || !pl->ran) {
            snprintf(c, sizeof c, "n/a");
            snprintf(held_p, sizeof held_p, "–");
        } else {
            fmt_cell(c, sizeof c, tp);
            pool_held(held_p, sizeof held_p, pl, r);
        }
        fmt_ratio(rp, sizeof rp, tc, tp);
        fmt_ratio(rk, sizeof rk, tk, tp);
        fmt_ratio(rd, sizeof rd, tc, tn);
        double limit = row_goal(r);
        double mc = median_of(tc), mn = median_of(tn), mp = median_of(tp), mk = median_of(tk);
        char measured[200];
        if (!row_has_pool(r)) {
            snprintf(goal, sizeof goal, "≤ 1.00× driver");
            if (mc > 0 && mn > 0)
                met = against(mc, mn, 1.0, "the driver", measured, sizeof measured);
        } else {
            snprintf(goal, sizeof goal, "≤ %.1f× pool", limit);
            if (mc > 0 && mp > 0)
                met = against(mc, mp, limit, "the pool", measured, sizeof measured);
            else if (na)
                met = "no pool";
            if (mk > 0 && mp > 0 && opt.rounds == 1) {
                char mk_text[200];
                met_k = against(mk, mp, limit, "the pool", mk_text, sizeof mk_text);
                add_goal(met_k, mk_text, "loops, %s touch, %s: cudefer with CUDEFER_KEEP %s",
                         touch_names[t], r->label, goal);
            }
        }
        /* With rounds, the goals are judged over them (print_rounds). */
        if (opt.rounds == 1) {
            if (strcmp(met, "met") == 0 || strcmp(met, "NOT met") == 0)
                add_goal(met, measured, "loops, %s touch, %s: cudefer %s", touch_names[t],
                         r->label, goal);
            else
                add_goal("not measured", na ? "the pool could not be made" : "–",
                         "loops, %s touch, %s: cudefer %s", touch_names[t], r->label, goal);
        }
        printf("| %s: %s%s%s%s%s | %d | %s | 0 | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
               "| %s | %s |\n",
               r->label, r->calls, mode_status(none), mode_status(cd), mode_status(pl),
               mode_status(kp), row_iters(r, t), a, b, held_c, k, held_k, c, held_p, rp,
               kp->ran ? rk : "–", rd, goal, met, met_k);
    }

    print_like_for_like(jobs, t);

    /* What the pools were, and why some are missing. */
    printf("\nPools:\n\n");
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        struct job *pl = &jobs[i][t][MODE_POOL];
        char how[200] = "";
        const char *na = first_line(pl, "loop_na"), *l;
        if (na)
            field(na, "why", how, sizeof how);
        else if ((l = first_line(pl, "loop_pool_setup")) != NULL)
            field(l, "how", how, sizeof how);
        if (!how[0])
            continue;
        note_untoken(how);
        printf("- %s: %s%s\n", loop_rows[i].id, na ? "not available: " : "", how);
    }

    /* Details: cudefer's counters and the sampled device memory. */
    printf("\nDetails (cudefer's counters over the child; device memory in use at the sampled "
           "peak, cuMemGetInfo %d times a run, above the level before the loop, largest over "
           "the runs: driver / cudefer / pool / keep / pool at threshold 0; under cudefer "
           "cuMemGetInfo counts the device blocks cudefer holds for reuse as free, so its "
           "two figures are what the program is told, and \"held\" above is what cudefer "
           "holds):\n\n",
           MEM_SAMPLES);
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        const struct loop_row *r = &loop_rows[i];
        if (!row_wanted(r))
            continue;
        struct job *cd = &jobs[i][t][MODE_CUDEFER];
        char flushes[256], mem[N_MODES][32];
        double reused = report_object(cd->report, "reused", NULL, 0);
        if (report_object(cd->report, "flushes", flushes, sizeof flushes) < 0)
            snprintf(flushes, sizeof flushes, "-");
        else if (!flushes[0])
            snprintf(flushes, sizeof flushes, "none");
        for (int m = 0; m < N_MODES; m++) {
            double med, lo, hi;
            struct series s = collect(&jobs[i][t][m], "loop", "row", r->id, "peak_dev_bytes");
            fmt_bytes(mem[m], sizeof mem[m], stats(s, &med, &lo, &hi) ? hi : -1);
        }
        char reused_s[32] = "-", looks[224] = "-";
        if (reused >= 0)
            snprintf(reused_s, sizeof reused_s, "%.0f", reused);
        /* How its looks at released blocks were answered, and its waits
         * for one (where the reuse's time goes). */
        double words = report_number(cd->report, "reuse_word_answers");
        double queries = report_number(cd->report, "reuse_fence_queries");
        double lags = report_number(cd->report, "reuse_word_lags");
        double waits = report_number(cd->report, "reuse_waits");
        double wait_ms = report_number(cd->report, "reuse_wait_ms");
        if (words >= 0 && queries >= 0 && lags >= 0 && waits >= 0 && wait_ms >= 0)
            snprintf(looks, sizeof looks, "%.0f by the fences' words, %.0f by an event query, "
                     "%.0f by a new block (the bin grew); %.0f waits for a block "
                     "(%.3f ms)", words, queries, lags, waits, wait_ms);
        printf("- %s: cudefer reused %s blocks (looks answered: %s), flushes: %s; device memory "
               "%s / %s / %s / %s / %s\n",
               r->id, reused_s, looks, flushes, mem[MODE_NONE], mem[MODE_CUDEFER],
               mem[MODE_POOL], mem[MODE_KEEP], mem[MODE_POOL0]);
    }
    for (size_t i = 0; i < N_LOOP_ROWS; i++)
        for (int m = 0; m < N_MODES; m++)
            if (jobs[i][t][m].ran && !jobs[i][t][m].ok)
                printf("\n%s, %s touch: %s child FAILED: %s\n", loop_rows[i].id, touch_names[t],
                       mode_names[m], jobs[i][t][m].why);
}

/* ---- rounds ------------------------------------------------------------- */

/* One mode's median in each round of a row (-1 where a round has none). */
static void round_medians(struct job (*jobs)[N_LOOP_ROWS][N_TOUCH][N_MODES], size_t row,
                          enum touch t, int mode, double *out)
{
    for (int k = 0; k < opt.rounds; k++) {
        const struct job *j = &jobs[k][row][t][mode];
        out[k] = j->ran ? median_of(collect(j, "loop", "row", loop_rows[row].id, "us_per_iter"))
                        : -1;
    }
}

/* num[k] / den[k] over the rounds where both were measured: the ratios as
 * text ("1.02, 1.31, -"), their series, and how many met limit. */
static struct series round_ratios(const double *num, const double *den, double limit,
                                  char *text, size_t size, int *met)
{
    struct series s = {.n = 0};
    size_t used = 0;
    *met = 0;
    text[0] = 0;
    for (int k = 0; k < opt.rounds; k++) {
        char one[16] = "-";
        if (num[k] > 0 && den[k] > 0) {
            double r = num[k] / den[k];
            snprintf(one, sizeof one, "%.2f", r);
            s.v[s.n++] = r;
            *met += r <= limit;
        }
        int w = snprintf(text + used, size - used, "%s%s", k ? ", " : "", one);
        if (w > 0 && (size_t)w < size - used)
            used += (size_t)w;
    }
    return s;
}

/* max / min of one mode's medians over the rounds: how far the same code
 * moved between processes; -1 with fewer than two. */
static double round_spread(const double *v)
{
    struct series s = {.n = 0};
    for (int k = 0; k < opt.rounds; k++)
        if (v[k] > 0)
            s.v[s.n++] = v[k];
    double med, lo, hi;
    return s.n >= 2 && stats(s, &med, &lo, &hi) ? hi / lo : -1;
}

/* --rounds: each round's ratios, their median, and the loop goals judged
 * by it. */
static void print_rounds(struct job (*jobs)[N_LOOP_ROWS][N_TOUCH][N_MODES], enum touch t)
{
    printf("\nRounds, %s touch: the loop children ran in %d rounds, one after the other, "
           "every mode of a row side by side in each. Each round's ratio of medians (as in "
           "the table above, which is round 1's); their median over the rounds (min–max); "
           "\"moved\": the largest over the smallest of one mode's medians across the rounds "
           "(the same code in another process). The goals are judged by the median over the "
           "rounds.\n\n",
           touch_names[t], opt.rounds);
    printf("| loop | cudefer / pool (or driver), each round | median | rounds met | keep / pool, "
           "each round | median | pool (or driver) moved | cudefer moved | keep moved | goal "
           "| met | met with keep |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        const struct loop_row *r = &loop_rows[i];
        if (!row_wanted(r))
            continue;
        bool pool = row_has_pool(r);
        double ref[MAX_ROUNDS], cd[MAX_ROUNDS], kp[MAX_ROUNDS];
        round_medians(jobs, i, t, pool ? MODE_POOL : MODE_NONE, ref);
        round_medians(jobs, i, t, MODE_CUDEFER, cd);
        for (int k = 0; k < opt.rounds; k++)
            kp[k] = -1;
        if (pool)
            round_medians(jobs, i, t, MODE_KEEP, kp);
        double limit = row_goal(r);
        char rc_text[200], rk_text[200], goal[48], med_c[64] = "-", med_k[64] = "-";
        char moved_r[16] = "-", moved_c[16] = "-", moved_k[16] = "-";
        int met_c, met_k;
        struct series sc = round_ratios(cd, ref, limit, rc_text, sizeof rc_text, &met_c);
        struct series sk = round_ratios(kp, ref, limit, rk_text, sizeof rk_text, &met_k);
        double m, lo, hi;
        const char *verdict = "not measured", *verdict_k = "–";
        if (pool)
            snprintf(goal, sizeof goal, "≤ %.1f× pool", limit);
        else
            snprintf(goal, sizeof goal, "≤ 1.00× driver");
        char measured[200] = "–";
        if (stats(sc, &m, &lo, &hi)) {
            snprintf(med_c, sizeof med_c, "%.2f× (%.2f–%.2f×)", m, lo, hi);
            verdict = m <= limit ? "met" : "NOT met";
            snprintf(measured, sizeof measured,
                     "median %.2f× %s over %d rounds (%.2f–%.2f×; %d of %d rounds within)", m,
                     pool ? "the pool" : "the driver", sc.n, lo, hi, met_c, sc.n);
        }
        int with_cd = 0;
        for (int k = 0; k < opt.rounds; k++)
            with_cd += cd[k] > 0;
        if (with_cd < opt.rounds) {
            fprintf(stderr, "cudefer-loops: %s, %s touch: cudefer measured in %d of %d rounds\n",
                    r->id, touch_names[t], with_cd, opt.rounds);
            any_failure = true;
        }
        add_goal(verdict, measured, "loops, %s touch, %s: cudefer %s (median over rounds)",
                 touch_names[t], r->label, goal);
        if (pool && stats(sk, &m, &lo, &hi)) {
            snprintf(med_k, sizeof med_k, "%.2f× (%.2f–%.2f×)", m, lo, hi);
            verdict_k = m <= limit ? "met" : "NOT met";
            char mk_text[200];
            snprintf(mk_text, sizeof mk_text,
                     "median %.2f× the pool over %d rounds (%.2f–%.2f×; %d of %d rounds within)",
                     m, sk.n, lo, hi, met_k, sk.n);
            add_goal(verdict_k, mk_text,
                     "loops, %s touch, %s: cudefer with CUDEFER_KEEP %s (median over rounds)",
                     touch_names[t], r->label, goal);
        }
        double v;
        if ((v = round_spread(ref)) > 0)
            snprintf(moved_r, sizeof moved_r, "%.2f×", v);
        if ((v = round_spread(cd)) > 0)
            snprintf(moved_c, sizeof moved_c, "%.2f×", v);
        if ((v = round_spread(kp)) > 0)
            snprintf(moved_k, sizeof moved_k, "%.2f×", v);
        char met_text[32];
        snprintf(met_text, sizeof met_text, "%d of %d", met_c, sc.n);
        printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r->label,
               rc_text, med_c, met_text, pool ? rk_text : "–", med_k, moved_r, moved_c,
               pool ? moved_k : "–", goal, verdict, verdict_k);
    }
}

/* ---- cost --------------------------------------------------------------- */

static void print_cost(struct job *jobs)
{
    struct job *none = &jobs[MODE_NONE], *cd = &jobs[MODE_CUDEFER];
    static const struct {
        const char *key, *label;
    } rows[] = {
        {"free_ns", "cuMemFree of a 4 KiB device block, idle GPU"},
        {"freehost_ns", "cuMemFreeHost of a 4 KiB cuMemAllocHost block, idle GPU"},
        {"freesync_ns", "cuCtxSynchronize right after the cuMemFree calls, per block"},
        {"freehostsync_ns", "cuCtxSynchronize right after the cuMemFreeHost calls, per block"},
        {"alloc_ns", "cuMemAlloc 4 KiB (for reference)"},
        {"allochost_ns", "cuMemAllocHost 4 KiB (for reference)"},
        {"free0_ns", "cuMemFree(0) (wrapped, nothing to do)"},
        {"getcurrent_direct_ns", "cuCtxGetCurrent (not wrapped), linked symbol"},
        {"getcurrent_procaddr_ns", "cuCtxGetCurrent, cuGetProcAddress pointer"},
        {"getcurrent_dlsym_ns", "cuCtxGetCurrent, dlsym(libcuda.so.1) pointer"},
        {"launch_direct_ns", "cuLaunchKernel of an empty kernel (wrapped), linked symbol"},
        {"launch_procaddr_ns", "cuLaunchKernel of an empty kernel, cuGetProcAddress pointer"},
    };
    char n_dev[16] = "?", n_host[16] = "?", n_calls[16] = "?", n_launch[16] = "?";
    const char *setup = first_line(none, "cost_setup");
    if (setup) {
        field(setup, "n_dev", n_dev, sizeof n_dev);
        field(setup, "n_host", n_host, sizeof n_host);
        field(setup, "n_calls", n_calls, sizeof n_calls);
        field(setup, "n_launch", n_launch, sizeof n_launch);
    }
    printf("\n### Cost of a call with no GPU work\n\n");
    printf("ns per call, median of %d runs (min–max): %s cuMemAlloc then %s cuMemFree, %s "
           "cuMemAllocHost then %s cuMemFreeHost (each batch after a cuCtxSynchronize, so the "
           "GPU is idle), %s calls of each cuCtxGetCurrent pointer, %s launches of each "
           "cuLaunchKernel pointer (batches of 500, the stream synchronised between batches, "
           "not timed). \"added\": cudefer's median minus the driver's.\n\n",
           opt.runs, n_dev, n_dev, n_host, n_host, n_calls, n_launch);
    printf("| call | driver (ns) | cudefer (ns) | added by cudefer (ns) | ratio |\n"
           "|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct series sn = collect(none, "cost", NULL, NULL, rows[i].key);
        struct series sc = collect(cd, "cost", NULL, NULL, rows[i].key);
        char a[160], b[160], c[32], d[40] = "-";
        fmt_cell(a, sizeof a, sn);
        fmt_cell(b, sizeof b, sc);
        fmt_ratio(c, sizeof c, sc, sn);
        double mn = median_of(sn), mc = median_of(sc);
        if (mn >= 0 && mc >= 0) {
            char num[32];
            fmt_num(num, sizeof num, mc - mn);
            snprintf(d, sizeof d, "%s%s", mc - mn >= 0 ? "+" : "", num);
        }
        printf("| %s | %s | %s | %s | %s |\n", rows[i].label, a, b, d, c);
    }
    for (int m = 0; m < N_PAIR; m++) {
        char pa[8] = "?", dl[8] = "?", same[8] = "?", ll[8] = "?", lp[8] = "?";
        const char *l = first_line(&jobs[m], "cost_ptrs");
        if (l) {
            field(l, "procaddr_driver_own", pa, sizeof pa);
            field(l, "dlsym_driver_own", dl, sizeof dl);
            field(l, "same", same, sizeof same);
            field(l, "launch_linked_driver_own", ll, sizeof ll);
            field(l, "launch_procaddr_driver_own", lp, sizeof lp);
        }
#define YN(v) (strcmp(v, "1") == 0 ? "the driver's" : strcmp(v, "0") == 0 ? "cudefer's" : v)
        printf("\n%s: cuCtxGetCurrent through cuGetProcAddress is %s, through dlsym %s (the "
               "same pointer: %s); cuLaunchKernel, linked: %s, through cuGetProcAddress: "
               "%s.%s%s",
               mode_names[m], YN(pa), YN(dl), strcmp(same, "1") == 0 ? "yes" : same, YN(ll),
               YN(lp), jobs[m].ok ? "" : " FAILED: ", jobs[m].ok ? "" : jobs[m].why);
#undef YN
    }
    printf("\n");
}

/* ---- live blocks -------------------------------------------------------- */

static void print_live(struct job *jobs)
{
    struct job *none = &jobs[MODE_NONE], *cd = &jobs[MODE_CUDEFER];
    char bytes[16] = "?", pairs[16] = "?", budget_n[16] = "?", budget_c[16] = "?";
    const char *l = first_line(none, "live_setup");
    if (l) {
        field(l, "bytes", bytes, sizeof bytes);
        field(l, "pairs", pairs, sizeof pairs);
        field(l, "budget_s", budget_n, sizeof budget_n);
    }
    if ((l = first_line(cd, "live_setup")) != NULL)
        field(l, "budget_s", budget_c, sizeof budget_c);

    /* The levels, in the order the child without cudefer reached them,
     * then any only the other reached. */
    long levels[16];
    int n_levels = 0;
    for (int m = 0; m < N_PAIR; m++)
        for (size_t i = 0; i < jobs[m].n_lines; i++) {
            char v[32];
            if (!line_is(jobs[m].lines[i], "live_grow") ||
                !field(jobs[m].lines[i], "level", v, sizeof v))
                continue;
            long lv = atol(v);
            bool seen = false;
            for (int k = 0; k < n_levels; k++)
                seen |= levels[k] == lv;
            if (!seen && n_levels < 16)
                levels[n_levels++] = lv;
        }

    printf("\n### Bookkeeping as live blocks grow: one more block's cuMemAlloc / cuMemFree "
           "pair, N blocks live\n\n");
    printf("N device blocks of %s bytes are allocated and kept; then %s pairs of cuMemAlloc "
           "and cuMemFree of one more block, idle GPU: ns per pair, median of %d runs "
           "(min–max). \"difference\": cudefer's median minus the driver's (what the shim "
           "adds to a pair). The children grow N while the next level fits in %s s of "
           "allocation (cudefer's: %s s, up to the driver child's largest N). Issue 16's "
           "goal: at most 200 ns more than the driver at 10,000,000 live blocks.\n\n",
           bytes, pairs, opt.runs, budget_n, budget_c);
    printf("| live blocks N | driver (ns per pair) | cudefer (ns per pair) | difference (ns) | "
           "cuMemAlloc while growing, driver / cudefer (ns) |\n|---|---|---|---|---|\n");
    long top = 0;
    double top_diff = 0;
    bool top_ok = false;
    for (int k = 0; k < n_levels; k++) {
        char lv[32], a[160], b[160], d[40] = "-", gn[32] = "-", gc[32] = "-";
        snprintf(lv, sizeof lv, "%ld", levels[k]);
        struct series sn = collect(none, "live", "level", lv, "ns_per_pair");
        struct series sc = collect(cd, "live", "level", lv, "ns_per_pair");
        fmt_cell(a, sizeof a, sn);
        fmt_cell(b, sizeof b, sc);
        double mn = median_of(sn), mc = median_of(sc);
        if (mn >= 0 && mc >= 0) {
            char num[32];
            fmt_num(num, sizeof num, mc - mn);
            snprintf(d, sizeof d, "%s%s", mc - mn >= 0 ? "+" : "", num);
            if (levels[k] > top) {
                top = levels[k];
                top_diff = mc - mn;
                top_ok = true;
            }
        }
        struct series grn = collect(none, "live_grow", "level", lv, "ns_per_alloc");
        struct series grc = collect(cd, "live_grow", "level", lv, "ns_per_alloc");
        if (grn.n)
            fmt_num(gn, sizeof gn, grn.v[0]);
        if (grc.n)
            fmt_num(gc, sizeof gc, grc.v[0]);
        printf("| %ld | %s | %s | %s | %s / %s |\n", levels[k], a, b, d, gn, gc);
    }
    char stops[2][200] = {"", ""};
    for (int m = 0; m < N_PAIR; m++) {
        const char *s = first_line(&jobs[m], "live_stop");
        if (s) {
            char lv[32] = "?", why[64] = "?";
            field(s, "level", lv, sizeof lv);
            field(s, "why", why, sizeof why);
            for (char *p = why; *p; p++)
                if (*p == '_')
                    *p = ' ';
            snprintf(stops[m], sizeof stops[m], "did not grow to %s (%s)", lv, why);
        } else {
            snprintf(stops[m], sizeof stops[m], "reached every level");
        }
        printf("\n%s child: %s%s%s", mode_names[m], stops[m], jobs[m].ok ? "." : "; FAILED: ",
               jobs[m].ok ? "" : jobs[m].why);
    }
    printf("\n");

    char measured[240];
    if (!top_ok) {
        add_goal("not measured", "–",
                 "live blocks: a cuMemAlloc/cuMemFree pair at most 200 ns above the driver at "
                 "10^7 live blocks");
        return;
    }
    snprintf(measured, sizeof measured, "%+.0f ns at N = %ld%s", top_diff, top,
             top >= 10000000 ? "" : " (the largest N both children reached)");
    add_goal(top_diff <= 200 ? (top >= 10000000 ? "met" : "met at the largest N measured")
                             : "NOT met",
             measured,
             "live blocks: a cuMemAlloc/cuMemFree pair at most 200 ns above the driver at "
             "10^7 live blocks");
}

static bool section_wanted(const char *name)
{
    return listed(opt.only, name);
}

/* Checks that a job printed what it should have. */
static void expect_lines(struct job *j, const char *tag, int want)
{
    int got = 0;
    for (size_t i = 0; i < j->n_lines; i++)
        got += line_is(j->lines[i], tag);
    if (got != want && j->ok) {
        j->ok = false;
        any_failure = true;
        snprintf(j->why, sizeof j->why, "%d \"R %s\" lines instead of %d", got, tag, want);
        fprintf(stderr, "cudefer-loops: %s %s: %s\n", mode_names[j->mode], j->section, j->why);
    }
}

static void find_shim(void)
{
    const char *p = opt.shim ? opt.shim : getenv("CUDEFER_SHIM");
    Dl_info info;
    void *v = dlsym(RTLD_DEFAULT, "cudefer_version");
    if ((!p || !*p) && v && dladdr(v, &info) && info.dli_fname)
        p = info.dli_fname;
    if (!p || !*p)
        gc_die("where is libcudefer.so? Pass --shim PATH or set CUDEFER_SHIM");
    if (!realpath(p, shim_path))
        gc_die("the shim %s: %s", p, strerror(errno));
}


static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--shim PATH] [--runs N] [--quick] [--smoke] "
            "[--only stall,loops,cost,live] [--rows ID,...] [--log FILE] [--goals FILE] "
            "[--live-budget S] [--budget S] [--cpus N] [--rounds N]\n",
            argv0);
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        char *end;
        if (strcmp(a, "--shim") == 0 && has)
            opt.shim = argv[++i];
        else if (strcmp(a, "--runs") == 0 && has) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 64)
                usage(argv[0]);
            opt.runs = (int)v;
            opt.runs_given = true;
        } else if (strcmp(a, "--quick") == 0)
            opt.quick = true;
        else if (strcmp(a, "--smoke") == 0)
            opt.smoke = true;
        else if (strcmp(a, "--only") == 0 && has)
            opt.only = argv[++i];
        else if (strcmp(a, "--rows") == 0 && has)
            opt.rows = argv[++i];
        else if (strcmp(a, "--log") == 0 && has)
            opt.log = argv[++i];
        else if (strcmp(a, "--goals") == 0 && has)
            opt.goals = argv[++i];
        else if (strcmp(a, "--budget") == 0 && has) {
            double v = strtod(argv[++i], &end);
            if (*end || v <= 0)
                usage(argv[0]);
            opt.budget_s = v;
        } else if (strcmp(a, "--rounds") == 0 && has) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MAX_ROUNDS)
                usage(argv[0]);
            opt.rounds = (int)v;
        } else if (strcmp(a, "--cpus") == 0 && has) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1024)
                usage(argv[0]);
            opt.cpus = (int)v;
        }
        else if (strcmp(a, "--live-budget") == 0 && has) {
            double v = strtod(argv[++i], &end);
            if (*end || v <= 0 || v > 3600)
                usage(argv[0]);
            opt.live_budget_s = v;
        } else if (strcmp(a, "--live-max") == 0 && has) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0)
                usage(argv[0]);
            opt.live_max = v;
        } else if (strcmp(a, "--child") == 0 && has)
            opt.child = argv[++i];
        else if (strcmp(a, "--mode") == 0 && has)
            opt.mode = argv[++i];
        else
            usage(argv[0]);
    }
    for (const char *p = opt.rows; p && *p;) {
        size_t n = strcspn(p, ",");
        char id[32];
        if (n == 0 || n >= sizeof id)
            usage(argv[0]);
        memcpy(id, p, n);
        id[n] = 0;
        if (!find_row(id)) {
            fprintf(stderr, "cudefer-loops: no loop row %s\n", id);
            usage(argv[0]);
        }
        p += n + (p[n] == ',');
    }
    if (opt.smoke && !opt.runs_given)
        opt.runs = 2;
}

/* The largest level the live child reached, 0 if none. */
static long live_reached(const struct job *j)
{
    long top = 0;
    for (size_t i = 0; i < j->n_lines; i++) {
        char v[32];
        if (line_is(j->lines[i], "live_grow") && field(j->lines[i], "level", v, sizeof v) &&
            atol(v) > top)
            top = atol(v);
    }
    return top;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    /* A failure (gc_die, GC_CHECK) names the program, and the child, and
     * exits with 1. */
    if (opt.child)
        snprintf(gc_failure.prefix, sizeof gc_failure.prefix, "cudefer-loops (child %s, %s): ",
                 opt.child, opt.mode ? opt.mode : "?");
    else
        snprintf(gc_failure.prefix, sizeof gc_failure.prefix, "cudefer-loops: ");
    gc_failure.status = 1;
    if (opt.child)
        return child_main();

    setvbuf(stdout, NULL, _IOLBF, 0);
    find_shim();
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0)
        gc_die("readlink /proc/self/exe: %s", strerror(errno));
    self_exe[n] = 0;
    if (opt.log) {
        log_file = fopen(opt.log, "w");
        if (!log_file)
            gc_die("cannot write %s: %s", opt.log, strerror(errno));
    }

    bool want_stall = section_wanted("stall"), want_loops = section_wanted("loops");
    bool want_cost = section_wanted("cost"), want_live = section_wanted("live");
    if (!want_stall && !want_loops && !want_cost && !want_live)
        usage(argv[0]);

    static struct job stall[N_PAIR], loops[MAX_ROUNDS][N_LOOP_ROWS][N_TOUCH][N_MODES],
        cost[N_PAIR], live[N_PAIR];
    for (int m = 0; m < N_MODES; m++) {
        if (m < N_PAIR) {
            snprintf(stall[m].section, sizeof stall[m].section, "stall");
            snprintf(cost[m].section, sizeof cost[m].section, "cost");
            snprintf(live[m].section, sizeof live[m].section, "live");
            stall[m].mode = cost[m].mode = live[m].mode = m;
        }
        for (int k = 0; k < opt.rounds; k++)
            for (size_t i = 0; i < N_LOOP_ROWS; i++)
                for (int t = 0; t < N_TOUCH; t++) {
                    struct job *j = &loops[k][i][t][m];
                    snprintf(j->section, sizeof j->section, "loop:%s:%s", loop_rows[i].id,
                             touch_names[t]);
                    j->mode = m;
                }
    }

    char started[64];
    time_t now = time(NULL);
    strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    double t_start = gc_now_ms();
    parent_start_ms = t_start;
    fprintf(stderr, "cudefer-loops: shim %s; %d run(s) per figure%s%s\n", shim_path, opt.runs,
            opt.quick ? "; quick" : "", opt.smoke ? "; smoke" : "");
    choose_cpus();
    const struct job *info[N_MODES] = {NULL};
    double secs[4] = {0, 0, 0, 0};
    if (want_stall) {
        double t0 = gc_now_ms();
        for (int m = 0; m < N_PAIR; m++) {
            run_job(&stall[m]);
            expect_lines(&stall[m], "stall", (int)N_RELEASE_CASES * opt.runs);
            if (!info[m])
                info[m] = &stall[m];
        }
        secs[0] = (gc_now_ms() - t0) / 1e3;
    }
    if (want_loops) {
        double t0 = gc_now_ms();
        for (int k = 0; k < opt.rounds; k++)
            for (int t = 0; t < N_TOUCH; t++)
                for (size_t i = 0; i < N_LOOP_ROWS; i++)
                    for (int m = 0; m < N_MODES; m++) {
                        struct job *j = &loops[k][i][t][m];
                        if (!row_wanted(&loop_rows[i]) ||
                            ((mode_is_pool(m) || m == MODE_KEEP) &&
                             !row_has_pool(&loop_rows[i])))
                            continue;
                        run_job(j);
                        if (!first_line(j, "loop_na"))
                            expect_lines(j, "loop", opt.runs);
                        if (!info[m])
                            info[m] = j;
                    }
        secs[1] = (gc_now_ms() - t0) / 1e3;
    }
    if (want_cost) {
        double t0 = gc_now_ms();
        for (int m = 0; m < N_PAIR; m++) {
            run_job(&cost[m]);
            expect_lines(&cost[m], "cost", opt.runs);
            if (!info[m])
                info[m] = &cost[m];
        }
        secs[2] = (gc_now_ms() - t0) / 1e3;
    }
    if (want_live) {
        double t0 = gc_now_ms();
        live[MODE_NONE].live_budget_s = live_budget();
        run_job(&live[MODE_NONE]);
        live[MODE_CUDEFER].live_budget_s = 2 * live_budget();
        live[MODE_CUDEFER].live_max = live_reached(&live[MODE_NONE]);
        run_job(&live[MODE_CUDEFER]);
        for (int m = 0; m < N_PAIR; m++)
            if (!info[m])
                info[m] = &live[m];
        secs[3] = (gc_now_ms() - t0) / 1e3;
    }

    printf("## cudefer-loops\n\n");
    printf("- date: %s\n", started);
    printf("- command: `");
    for (int i = 0; i < argc; i++)
        printf("%s%s", i ? " " : "", argv[i]);
    printf("`\n- shim: %s\n", shim_path);
    printf("- runs per figure: %d%s%s\n", opt.runs, opt.quick ? " (--quick)" : "",
           opt.smoke ? " (--smoke: tiny counts)" : "");
    printf("- seconds per section: stall %.0f, loops %.0f, cost %.0f, live %.0f (all %.0f)\n",
           secs[0], secs[1], secs[2], secs[3], (gc_now_ms() - t_start) / 1e3);
    for (int m = 0; m < N_MODES; m++)
        if (info[m]) {
            print_info(info[m]);
            const char *l = first_line(info[m], "info");
            char sim[8] = "0";
            if (l && field(l, "sim", sim, sizeof sim) && strcmp(sim, "1") == 0)
                simulated = true;
        }
    if (want_stall)
        print_stall(stall);
    if (want_loops)
        for (int t = 0; t < N_TOUCH; t++) {
            print_loops(loops[0], (enum touch)t);
            if (opt.rounds > 1)
                print_rounds(loops, (enum touch)t);
        }
    if (want_cost)
        print_cost(cost);
    if (want_live)
        print_live(live);
    if (any_failure)
        printf("\n**Some measurements FAILED** (see stderr%s).\n", opt.log ? " and the log" : "");
    print_goals();
    if (log_file)
        fclose(log_file);
    return any_failure ? 1 : 0;
}
