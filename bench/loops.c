/* loops.c - cudefer-loops: what releases cost, without and with cudefer,
 * side by side.
 *
 * Three sections, each measured in child processes of this same program,
 * one without cudefer and one with it (LD_PRELOAD of the shim):
 *
 *  stall  Each release (cuMemFree of device and of managed memory,
 *         cuMemFreeHost of cuMemAllocHost and of cuMemHostAlloc memory,
 *         cuMemHostUnregister, cuArrayDestroy, cuModuleUnload,
 *         cuLibraryUnload after one of its kernels was loaded) made while a
 *         1 s cudefer_spin kernel runs on a non-blocking stream: the ms the
 *         caller was blocked, and the ms a cuLaunchKernel of a tiny kernel
 *         on a third stream, made by another thread 5 ms into the release,
 *         was blocked.
 *  loops  Allocate, touch with a kernel (cudefer_touch of 16 words, on a
 *         non-blocking stream), release, with no synchronisation inside the
 *         loop and one cuCtxSynchronize after it (timed): us per iteration;
 *         the peak of cudefer's deferred bytes (from its JSON report,
 *         CUDEFER_REPORT) and the peak device memory in use (cuMemGetInfo
 *         sampled about 50 times a run, above the level before the loop).
 *         Pinned host memory comes from cuMemAllocHost and is touched
 *         through cuMemHostGetDevicePointer; registered memory is a
 *         page-aligned malloc'd buffer, allocated once per row, registered
 *         with CU_MEMHOSTREGISTER_DEVICEMAP in every iteration; managed
 *         memory is cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL).
 *  cost   Release calls with no GPU work: N cuMemAlloc of 4 KiB, then N
 *         cuMemFree (and the same for cuMemAllocHost / cuMemFreeHost); and
 *         calls cudefer does not wrap (cuCtxGetCurrent) through the linked
 *         symbol, a cuGetProcAddress pointer and a dlsym pointer, plus the
 *         wrapped no-op cuMemFree(0).
 *
 * Every figure is the median of --runs runs (default 5), with the spread
 * (min-max). The parent process makes no CUDA call: it runs the children
 * (this program again, with --child), reads their "R ..." lines and prints
 * markdown tables. The child without cudefer gets LD_PRELOAD without the
 * shim (stripped if the parent had it preloaded); the child with cudefer
 * gets the shim first in LD_PRELOAD and CUDEFER_REPORT set to a temporary
 * file, read after it exits.
 *
 * Over the cudefer test driver (tests/driver, found by its testdrv_launch
 * hook) no PTX runs: the spin and touch kernels are simulated with
 * testdrv_launch, and --smoke makes every count tiny. The timings then mean
 * nothing; the run checks that every measurement ran and every CUDA call
 * succeeded.
 *
 * Usage: cudefer-loops [--shim PATH] [--runs N] [--quick] [--smoke]
 *                      [--only stall,loops,cost] [--log FILE]
 *   --shim PATH  libcudefer.so (default: $CUDEFER_SHIM, else the one this
 *                process has preloaded)
 *   --runs N     runs per figure (default 5; 2 with --smoke)
 *   --quick      a 200 ms kernel in the stall section instead of 1 s
 *   --smoke      tiny counts, for the test driver
 *   --only LIST  sections to run (default all)
 *   --log FILE   every child line and every cudefer report, for the record
 * Exit status: 0 when every child ran to completion; 1 when one failed (a
 * CUDA call failed, a kernel faulted, a child crashed or timed out, or a
 * line was missing); 2 for bad usage.
 */
#include "gpu.h"
#include "kernels.h"
#include "release_cases.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
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
    const char *log;
    /* child only */
    const char *child;  /* "stall", "loop:<row>" or "cost" */
    const char *mode;   /* "none" or "cudefer" */
} opt = {.runs = 5};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
    CUfunction spin, touch;
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

    if (strcmp(opt.mode, "cudefer") == 0 && !gpu.cudefer)
        gc_die("cudefer is not loaded in the child that should have it (LD_PRELOAD=%s)",
               getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    if (strcmp(opt.mode, "none") == 0 && gpu.cudefer)
        gc_die("cudefer is loaded in the child that should run without it");

    /* Over the test driver the image is not parsed; the functions are
     * no-op kernels used for the other thread's launch. */
    GC_CHECK(cuModuleLoadData(&gpu.module, cudefer_kernels_ptx));
    GC_CHECK(cuModuleGetFunction(&gpu.spin, gpu.module, "cudefer_spin"));
    GC_CHECK(cuModuleGetFunction(&gpu.touch, gpu.module, "cudefer_touch"));

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

struct loop_row {
    const char *id;
    const char *label;
    enum loop_kind kind;
    size_t bytes;
    int iters;       /* about 0.3-1 s per run without cudefer on an H200 */
    int smoke_iters;
};

static const struct loop_row loop_rows[] = {
    {"dev4k", "device 4 KiB: cuMemAlloc / cuMemFree", L_DEVICE, 4 * KIB, 8000, 20},
    {"host4k", "pinned host 4 KiB: cuMemAllocHost / cuMemFreeHost", L_HOST, 4 * KIB, 800, 20},
    {"host64m", "pinned host 64 MiB: cuMemAllocHost / cuMemFreeHost", L_HOST, 64 * MIB, 20, 6},
    {"reg4k", "registered 4 KiB: cuMemHostRegister / cuMemHostUnregister", L_REGISTERED,
     4 * KIB, 6000, 20},
    {"reg64m", "registered 64 MiB: cuMemHostRegister / cuMemHostUnregister", L_REGISTERED,
     64 * MIB, 120, 6},
    {"man4k", "managed 4 KiB: cuMemAllocManaged / cuMemFree", L_MANAGED, 4 * KIB, 6000, 20},
    {"man64m", "managed 64 MiB: cuMemAllocManaged / cuMemFree", L_MANAGED, 64 * MIB, 50, 6},
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

static int row_iters(const struct loop_row *r)
{
    return opt.smoke ? r->smoke_iters : r->iters;
}

/* One iteration: allocate, touch, release. `reg` is the row's buffer for
 * registrations. */
static void loop_once(const struct loop_row *r, CUstream s, void *reg)
{
    CUdeviceptr d;
    void *h;
    unsigned long long words = r->bytes / 4 < TOUCH_WORDS ? r->bytes / 4 : TOUCH_WORDS;
    switch (r->kind) {
    case L_DEVICE:
        GC_CHECK(cuMemAlloc(&d, r->bytes));
        GC_CHECK(k_touch(s, d, words));
        GC_CHECK(cuMemFree(d));
        break;
    case L_HOST:
        GC_CHECK(cuMemAllocHost(&h, r->bytes));
        GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
        GC_CHECK(k_touch(s, d, words));
        GC_CHECK(cuMemFreeHost(h));
        break;
    case L_REGISTERED:
        GC_CHECK(cuMemHostRegister(reg, r->bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
        GC_CHECK(cuMemHostGetDevicePointer(&d, reg, 0));
        GC_CHECK(k_touch(s, d, words));
        GC_CHECK(cuMemHostUnregister(reg));
        break;
    case L_MANAGED:
        GC_CHECK(cuMemAllocManaged(&d, r->bytes, CU_MEM_ATTACH_GLOBAL));
        GC_CHECK(k_touch(s, d, words));
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

static void child_loop(const char *id)
{
    const struct loop_row *r = find_row(id);
    if (!r)
        gc_die("no loop row %s", id);
    int iters = row_iters(r);
    int every = iters / MEM_SAMPLES > 0 ? iters / MEM_SAMPLES : 1;
    void *reg = r->kind == L_REGISTERED ? gc_xpages(r->bytes) : NULL;
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* Warm-up: a twentieth of a run. */
    int warm = iters / 20 > 2 ? iters / 20 : 2;
    for (int i = 0; i < warm; i++)
        loop_once(r, s, reg);
    gpu_settle();

    printf("R loop_setup row=%s iters=%d bytes=%zu touch_words=%llu mem_every=%d warm=%d\n", r->id,
           iters, r->bytes, r->bytes / 4 < TOUCH_WORDS ? r->bytes / 4 : TOUCH_WORDS, every, warm);
    for (int run = 1; run <= opt.runs; run++) {
        gpu_settle();
        size_t base = mem_used(), peak = base;
        double t0 = gc_now_ms();
        for (int i = 0; i < iters; i++) {
            loop_once(r, s, reg);
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
        printf("R loop row=%s run=%d iters=%d us_per_iter=%.3f sync_ms=%.3f peak_dev_bytes=%zu\n",
               r->id, run, iters, (t2 - t0) * 1e3 / iters, t2 - t1, peak - base);
        fflush(stdout);
    }

    gpu_settle();
    GC_CHECK(cuStreamDestroy(s));
    free(reg);
}

/* ------------------------------------------------------------------------ */
/* Child section: cost                                                      */
/* ------------------------------------------------------------------------ */

typedef CUresult (*get_current_fn)(CUcontext *);

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
    CUcontext c;
    double t0 = gc_now_ms();
    for (long i = 0; i < n; i++)
        if (fn(&c) != CUDA_SUCCESS)
            gc_die("cuCtxGetCurrent failed");
    double t1 = gc_now_ms();
    if (c != gpu.ctx)
        gc_die("cuCtxGetCurrent returned another context");
    return (t1 - t0) * 1e6 / (double)n;
}

static void child_cost(void)
{
    int n_dev = opt.smoke ? 50 : 2000;
    int n_host = opt.smoke ? 10 : 200;
    long n_calls = opt.smoke ? 10000 : 1000000;
    long n_free0 = opt.smoke ? 1000 : 200000;

    CUdeviceptr *d = calloc((size_t)n_dev, sizeof *d);
    void **h = calloc((size_t)n_host, sizeof *h);
    if (!d || !h)
        gc_die("out of host memory");

    /* The unwrapped call, three ways. */
    get_current_fn direct = cuCtxGetCurrent, procaddr = NULL, viadlsym = NULL;
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    GC_CHECK(cuGetProcAddress("cuCtxGetCurrent", &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
                              &status));
    if (status != CU_GET_PROC_ADDRESS_SUCCESS || !p)
        gc_die("cuGetProcAddress(cuCtxGetCurrent): status %d", (int)status);
    memcpy(&procaddr, &p, sizeof p);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        gc_die("dlopen(libcuda.so.1, RTLD_NOLOAD): %s", dlerror());
    p = dlsym(lib, "cuCtxGetCurrent");
    if (!p)
        gc_die("dlsym(libcuda.so.1, cuCtxGetCurrent): %s", dlerror());
    memcpy(&viadlsym, &p, sizeof p);
    void *procaddr_p;
    memcpy(&procaddr_p, &procaddr, sizeof procaddr_p);
    printf("R cost_setup n_dev=%d n_host=%d n_calls=%ld n_free0=%ld\n", n_dev, n_host, n_calls,
           n_free0);
    printf("R cost_ptrs procaddr_driver_own=%d dlsym_driver_own=%d same=%d\n",
           driver_own(procaddr_p), driver_own(p), procaddr_p == p);

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
        gpu_settle();

        double ns_direct = time_get_current(direct, n_calls);
        double ns_procaddr = time_get_current(procaddr, n_calls);
        double ns_dlsym = time_get_current(viadlsym, n_calls);

        double t8 = gc_now_ms();
        for (long i = 0; i < n_free0; i++)
            GC_CHECK(cuMemFree(0));
        double t9 = gc_now_ms();

        printf("R cost run=%d alloc_us=%.4f free_us=%.4f allochost_us=%.4f freehost_us=%.4f "
               "getcurrent_direct_ns=%.3f getcurrent_procaddr_ns=%.3f getcurrent_dlsym_ns=%.3f "
               "free0_ns=%.3f\n",
               run, (t1 - t0) * 1e3 / n_dev, (t3 - t2) * 1e3 / n_dev, (t5 - t4) * 1e3 / n_host,
               (t7 - t6) * 1e3 / n_host, ns_direct, ns_procaddr, ns_dlsym,
               (t9 - t8) * 1e6 / (double)n_free0);
        fflush(stdout);
    }
    gpu_settle();
    dlclose(lib);
    free(d);
    free(h);
}

static int child_main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!opt.mode || (strcmp(opt.mode, "none") != 0 && strcmp(opt.mode, "cudefer") != 0))
        gc_die("--mode none|cudefer is required with --child");
    gpu_open();
    if (strcmp(opt.child, "stall") == 0)
        child_stall();
    else if (strncmp(opt.child, "loop:", 5) == 0)
        child_loop(opt.child + 5);
    else if (strcmp(opt.child, "cost") == 0)
        child_cost();
    else
        gc_die("unknown child section %s", opt.child);
    gpu_close();
    printf("R done section=%s\n", opt.child);
    return 0;
}

/* ======================================================================== */
/* Parent: runs the children, prints the tables                            */
/* ======================================================================== */

enum { MODE_NONE, MODE_CUDEFER, N_MODES };
static const char *const mode_names[N_MODES] = {"none", "cudefer"};

struct job {
    char section[64]; /* the --child argument */
    int mode;
    char **lines;     /* "R ..." lines */
    size_t n_lines, cap_lines;
    bool ok;
    char why[256];    /* when not ok */
    char *report;     /* cudefer's JSON report, NULL if none */
};

static char self_exe[PATH_MAX];
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
    static char runs[16];
    static char *argv[16];
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
    argv[a] = NULL;
    return argv;
}

static double job_timeout_s(const struct job *j)
{
    if (strcmp(j->section, "stall") == 0)
        return (double)N_RELEASE_CASES * (opt.runs + 1) * (stall_kernel_ms() + 500.0) / 1e3 + 60;
    return 120 + 20.0 * opt.runs;
}

static void run_job(struct job *j)
{
    char report[] = "/tmp/cudefer-loops-report-XXXXXX";
    int rfd = -1;
    if (j->mode == MODE_CUDEFER) {
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
        if (j->mode == MODE_CUDEFER) {
            size_t n = strlen(shim_path) + strlen(preload) + 2;
            char *v = malloc(n);
            if (!v)
                _exit(126);
            snprintf(v, n, "%s%s%s", shim_path, *preload ? " " : "", preload);
            setenv("LD_PRELOAD", v, 1);
            setenv("CUDEFER_REPORT", report, 1);
        } else {
            if (*preload)
                setenv("LD_PRELOAD", preload, 1);
            else
                unsetenv("LD_PRELOAD");
            unsetenv("CUDEFER_REPORT");
        }
        execv(self_exe, child_argv(j));
        fprintf(stderr, "cudefer-loops: exec %s: %s\n", self_exe, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    free(preload);

    double limit_ms = job_timeout_s(j) * 1e3;
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

    if (j->mode == MODE_CUDEFER) {
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
    fprintf(stderr, "cudefer-loops: %-8s %-14s %s (%.1f s)\n", mode_names[j->mode], j->section,
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
    return j->ok ? "" : " **FAILED**";
}

/* ---- the tables --------------------------------------------------------- */

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
        for (int m = 0; m < N_MODES; m++) {
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
    for (int m = 0; m < N_MODES; m++)
        if (!jobs[m].ok)
            printf("\n%s child FAILED: %s\n", mode_names[m], jobs[m].why);
}

static void print_loops(struct job (*jobs)[N_MODES])
{
    printf("\n### Loops: allocate, touch with a kernel, release, no synchronisation inside\n\n");
    printf("µs per iteration, median of %d runs (min–max), cuCtxSynchronize after the loop "
           "included. Touch: cudefer_touch of %llu words on a non-blocking stream; pinned host "
           "memory from cuMemAllocHost, touched through cuMemHostGetDevicePointer; registered: "
           "one page-aligned malloc'd buffer per row, cuMemHostRegister(DEVICEMAP) each "
           "iteration. Speedup: without / with cudefer. Peak deferred: cudefer's "
           "peak_deferred_bytes over the child (warm-up and all runs). Peak device memory: "
           "cuMemGetInfo (total - free) sampled %d times a run, minus the level before the loop "
           "(largest over the runs). Reused and flushes: cudefer's counters over the child; the "
           "flushes include the benchmark's own (a cuCtxSynchronize after each run, "
           "cudefer_flush before each).\n\n",
           opt.runs, TOUCH_WORDS, MEM_SAMPLES);
    printf("| loop | iterations | no cudefer | cudefer | speedup | peak deferred | "
           "peak device mem, no cudefer | peak device mem, cudefer | cudefer reused | "
           "cudefer flushes |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_LOOP_ROWS; i++) {
        struct job *none = &jobs[i][MODE_NONE], *cd = &jobs[i][MODE_CUDEFER];
        const char *id = loop_rows[i].id;
        struct series tn = collect(none, "loop", "row", id, "us_per_iter");
        struct series tc = collect(cd, "loop", "row", id, "us_per_iter");
        struct series mn = collect(none, "loop", "row", id, "peak_dev_bytes");
        struct series mc = collect(cd, "loop", "row", id, "peak_dev_bytes");
        double med, lo, hi;
        char a[160], b[160], c[32], d[32], e[32], f[32], g[32], flushes[256];
        fmt_cell(a, sizeof a, tn);
        fmt_cell(b, sizeof b, tc);
        fmt_ratio(c, sizeof c, tn, tc);
        double peak = report_number(cd->report, "peak_deferred_bytes");
        fmt_bytes(d, sizeof d, peak);
        fmt_bytes(e, sizeof e, stats(mn, &med, &lo, &hi) ? hi : -1);
        fmt_bytes(f, sizeof f, stats(mc, &med, &lo, &hi) ? hi : -1);
        double reused = report_object(cd->report, "reused", NULL, 0);
        if (reused < 0)
            snprintf(g, sizeof g, "-");
        else
            snprintf(g, sizeof g, "%.0f", reused);
        if (report_object(cd->report, "flushes", flushes, sizeof flushes) < 0)
            snprintf(flushes, sizeof flushes, "-");
        else if (!flushes[0])
            snprintf(flushes, sizeof flushes, "0");
        printf("| %s%s%s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", loop_rows[i].label,
               mode_status(none), mode_status(cd), row_iters(&loop_rows[i]), a, b, c, d, e, f, g,
               flushes);
    }
    for (size_t i = 0; i < N_LOOP_ROWS; i++)
        for (int m = 0; m < N_MODES; m++)
            if (!jobs[i][m].ok)
                printf("\n%s: %s child FAILED: %s\n", loop_rows[i].id, mode_names[m],
                       jobs[i][m].why);
}

static void print_cost(struct job *jobs)
{
    struct job *none = &jobs[MODE_NONE], *cd = &jobs[MODE_CUDEFER];
    static const struct {
        const char *key, *label, *unit;
    } rows[] = {
        {"alloc_us", "cuMemAlloc 4 KiB", "µs"},
        {"free_us", "cuMemFree of it, idle GPU", "µs"},
        {"allochost_us", "cuMemAllocHost 4 KiB", "µs"},
        {"freehost_us", "cuMemFreeHost of it, idle GPU", "µs"},
        {"free0_ns", "cuMemFree(0) (wrapped, nothing to do)", "ns"},
        {"getcurrent_direct_ns", "cuCtxGetCurrent, linked symbol (not wrapped)", "ns"},
        {"getcurrent_procaddr_ns", "cuCtxGetCurrent via cuGetProcAddress pointer", "ns"},
        {"getcurrent_dlsym_ns", "cuCtxGetCurrent via dlsym(libcuda.so.1) pointer", "ns"},
    };
    char n_dev[16] = "?", n_host[16] = "?", n_calls[16] = "?";
    for (size_t i = 0; i < none->n_lines; i++)
        if (line_is(none->lines[i], "cost_setup")) {
            field(none->lines[i], "n_dev", n_dev, sizeof n_dev);
            field(none->lines[i], "n_host", n_host, sizeof n_host);
            field(none->lines[i], "n_calls", n_calls, sizeof n_calls);
        }
    printf("\n### Cost of a call with no GPU work\n\n");
    printf("Per call, median of %d runs (min–max): %s cuMemAlloc then %s cuMemFree, %s "
           "cuMemAllocHost then %s cuMemFreeHost, %s calls of each unwrapped pointer. "
           "Ratio: with / without cudefer.\n\n",
           opt.runs, n_dev, n_dev, n_host, n_host, n_calls);
    printf("| call | unit | no cudefer | cudefer | ratio |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct series sn = collect(none, "cost", NULL, NULL, rows[i].key);
        struct series sc = collect(cd, "cost", NULL, NULL, rows[i].key);
        char a[160], b[160], c[32];
        fmt_cell(a, sizeof a, sn);
        fmt_cell(b, sizeof b, sc);
        fmt_ratio(c, sizeof c, sc, sn);
        printf("| %s | %s | %s | %s | %s |\n", rows[i].label, rows[i].unit, a, b, c);
    }
    for (int m = 0; m < N_MODES; m++) {
        char pa[8] = "?", dl[8] = "?", same[8] = "?";
        for (size_t i = 0; i < jobs[m].n_lines; i++)
            if (line_is(jobs[m].lines[i], "cost_ptrs")) {
                field(jobs[m].lines[i], "procaddr_driver_own", pa, sizeof pa);
                field(jobs[m].lines[i], "dlsym_driver_own", dl, sizeof dl);
                field(jobs[m].lines[i], "same", same, sizeof same);
            }
        printf("\n%s: the cuGetProcAddress pointer is the driver's own: %s; the dlsym pointer: "
               "%s; the two are the same: %s.%s%s",
               mode_names[m], strcmp(pa, "1") == 0 ? "yes" : pa, strcmp(dl, "1") == 0 ? "yes" : dl,
               strcmp(same, "1") == 0 ? "yes" : same, jobs[m].ok ? "" : " FAILED: ",
               jobs[m].ok ? "" : jobs[m].why);
    }
    printf("\n");
}

static bool section_wanted(const char *name)
{
    if (!opt.only)
        return true;
    size_t n = strlen(name);
    for (const char *p = opt.only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == opt.only || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
            return true;
    return false;
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
            "usage: %s [--shim PATH] [--runs N] [--quick] [--smoke] [--only stall,loops,cost]"
            " [--log FILE]\n",
            argv0);
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (strcmp(a, "--shim") == 0 && has)
            opt.shim = argv[++i];
        else if (strcmp(a, "--runs") == 0 && has) {
            char *end;
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
        else if (strcmp(a, "--log") == 0 && has)
            opt.log = argv[++i];
        else if (strcmp(a, "--child") == 0 && has)
            opt.child = argv[++i];
        else if (strcmp(a, "--mode") == 0 && has)
            opt.mode = argv[++i];
        else
            usage(argv[0]);
    }
    if (opt.smoke && !opt.runs_given)
        opt.runs = 2;
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
    bool want_cost = section_wanted("cost");
    if (!want_stall && !want_loops && !want_cost)
        usage(argv[0]);

    static struct job stall[N_MODES], loops[N_LOOP_ROWS][N_MODES], cost[N_MODES];
    for (int m = 0; m < N_MODES; m++) {
        snprintf(stall[m].section, sizeof stall[m].section, "stall");
        snprintf(cost[m].section, sizeof cost[m].section, "cost");
        stall[m].mode = cost[m].mode = m;
        for (size_t i = 0; i < N_LOOP_ROWS; i++) {
            snprintf(loops[i][m].section, sizeof loops[i][m].section, "loop:%s",
                     loop_rows[i].id);
            loops[i][m].mode = m;
        }
    }

    fprintf(stderr, "cudefer-loops: shim %s; %d run(s) per figure%s%s\n", shim_path, opt.runs,
            opt.quick ? "; quick" : "", opt.smoke ? "; smoke" : "");
    struct job *first = NULL;
    if (want_stall) {
        for (int m = 0; m < N_MODES; m++) {
            run_job(&stall[m]);
            expect_lines(&stall[m], "stall", (int)N_RELEASE_CASES * opt.runs);
        }
        first = stall;
    }
    if (want_loops) {
        for (size_t i = 0; i < N_LOOP_ROWS; i++)
            for (int m = 0; m < N_MODES; m++) {
                run_job(&loops[i][m]);
                expect_lines(&loops[i][m], "loop", opt.runs);
            }
        if (!first)
            first = loops[0];
    }
    if (want_cost) {
        for (int m = 0; m < N_MODES; m++) {
            run_job(&cost[m]);
            expect_lines(&cost[m], "cost", opt.runs);
        }
        if (!first)
            first = cost;
    }

    printf("## cudefer-loops\n\n");
    printf("- shim: %s\n", shim_path);
    printf("- runs per figure: %d%s%s\n", opt.runs, opt.quick ? " (--quick)" : "",
           opt.smoke ? " (--smoke: tiny counts)" : "");
    for (int m = 0; m < N_MODES; m++)
        print_info(&first[m]);
    if (want_stall)
        print_stall(stall);
    if (want_loops)
        print_loops(loops);
    if (want_cost)
        print_cost(cost);
    if (any_failure)
        printf("\n**Some measurements FAILED** (see stderr%s).\n", opt.log ? " and the log" : "");
    if (log_file)
        fclose(log_file);
    return any_failure ? 1 : 0;
}
