/* libs.h - the measurement that the programs of the libs check share: how
 * long a CUDA library's handle or plan destruction blocks its caller, and
 * another thread's kernel launch, while unrelated GPU work runs.
 *
 * One program per library (tests/gpu/libs/<lib>.c), one process per run, so
 * that a library that is missing or crashes costs its own rows only. Each
 * program makes its library's objects and uses them once (so that the
 * library has made its allocations and loaded its kernels), destroys them
 * while the GPU is idle (the warm-up), makes and uses them again, and then
 * times each destruction, in the order a program would make them:
 *
 *   - a 1 s kernel (cudefer_spin, bench/kernels.h) runs on a non-blocking
 *     stream of its own, and the call starts at least LIBS_INTO_MS into it;
 *   - the call is timed on the calling thread (caller_ms);
 *   - another thread, LIBS_LAUNCH_DELAY_MS into the call, launches a tiny
 *     kernel (cudefer_touch) on a third stream and times its launch
 *     (launch_ms).
 *
 * Calls that return at once share one kernel: before each call the kernel
 * must still run and have started at most LIBS_FRESH_MS ago; otherwise the
 * program waits for it and starts another. A call that waits for the GPU
 * therefore shows at least LIBS_SPIN_MS - LIBS_FRESH_MS.
 *
 * Every finding is one line (values never contain spaces):
 *
 *   RESULT libs lib=<id> call=<function> stage=<stage> caller_ms=<ms>
 *          launch_ms=<ms> rc=<ok|the library's code> launch_rc=<CUresult>
 *          into_ms=<ms> spin_before=<0|1> spin_after=<0|1> simulated=<0|1>
 *   RESULT libs_info lib=<id> version=<the library's> shim_loaded=<0|1>
 *          simulated=<0|1>
 *   RESULT libs_done lib=<id>
 *
 * stage: teardown (a destruction of the library's), probe (cudaFree of a
 * block of a workspace's size, and cudaDeviceSynchronize: what a
 * destruction that frees its workspace and then synchronises the device is
 * made of), baseline (nothing called: launch_ms is the launch alone), setup
 * (a call before the measurement failed: caller_ms and launch_ms are "-"
 * and the program ends). spin_before / spin_after: the kernel still ran
 * just before / just after the call; spin_before=0 makes a row meaningless.
 * A program built without its library's header prints one setup line,
 * rc=no_header(<header>).
 *
 * The driver-API helpers come from bench/gpu.h (built with -I bench); the
 * libraries use the CUDA runtime, which takes the primary context that
 * libs_start makes current.
 */
#ifndef CUDEFER_TESTS_GPU_LIBS_H
#define CUDEFER_TESTS_GPU_LIBS_H

#include "gpu.h"

#include <cuda_runtime_api.h>

#include <ctype.h>

#define LIBS_SPIN_MS 1000.0
#define LIBS_INTO_MS 20.0
#define LIBS_FRESH_MS 200.0
#define LIBS_LAUNCH_DELAY_MS 5.0
/* cuBLAS's default workspace on Hopper (sm_90): the block probe (a) frees. */
#define LIBS_WORKSPACE_BYTES (32 * GC_MIB)

/* A call to time: makes the call with arg, returns the library's code. */
typedef int (*libs_call_fn)(void *arg);
/* The text of a library's code: "ok" for success. */
typedef const char *(*libs_rc_fn)(int rc);

/* The program's state: its library's id, the kernels, the streams, the
 * long kernel now running, and the launching thread. */
static struct {
    const char *lib;
    bool simulated;
    struct gc_kernels kernels;
    CUstream spin_stream, launch_stream;
    double spin_start_ms; /* when the long kernel was launched; < 0: none yet */
    CUcontext ctx;
    pthread_t thread;
    _Atomic int go;   /* the round to launch in */
    _Atomic int done; /* the last round launched */
    _Atomic bool quit;
    double delay_ms;
    double launch_ms;
    CUresult launch_rc;
} libs;

/* ---- text ------------------------------------------------------------------ */

/* s as one word of a RESULT line: blanks become '_'. The text lives in one
 * of four static buffers, so up to four may be used in one printf. */
static inline const char *libs_word(const char *s)
{
    static char ring[4][96];
    static int next;
    char *w = ring[next];
    next = (next + 1) % 4;
    if (!s || !*s)
        s = "-";
    size_t i = 0;
    for (; s[i] && i + 1 < sizeof ring[0]; i++)
        w[i] = isspace((unsigned char)s[i]) ? '_' : s[i];
    w[i] = '\0';
    return w;
}

/* "<type>_<rc>" ("cufftResult_5"), for libraries without names for codes. */
static inline const char *libs_numbered(const char *type, int rc)
{
    char text[96];
    snprintf(text, sizeof text, "%s_%d", type, rc);
    return libs_word(text);
}

static inline const char *libs_cuda_rc(int rc)
{
    return rc == cudaSuccess ? "ok" : cudaGetErrorName((cudaError_t)rc);
}

/* ---- set-up ------------------------------------------------------------------ */

/* A call before the measurement failed: one setup line. */
static inline void libs_setup_failed(const char *call, const char *rc)
{
    printf("RESULT libs lib=%s call=%s stage=setup caller_ms=- launch_ms=- rc=%s simulated=%d\n",
           libs.lib, libs_word(call), libs_word(rc), (int)libs.simulated);
    fflush(stdout);
}

/* ok, or a setup line for call with its code's text rc. */
static inline bool libs_ok(bool ok, const char *call, const char *rc)
{
    if (!ok)
        libs_setup_failed(call, rc);
    return ok;
}

static inline bool libs_cuda_ok(cudaError_t rc, const char *call)
{
    return libs_ok(rc == cudaSuccess, call, libs_cuda_rc(rc));
}

/* cudaMalloc of bytes, cleared; the device synchronised. */
static inline bool libs_cuda_zeros(void **p, size_t bytes)
{
    return libs_cuda_ok(cudaMalloc(p, bytes), "cudaMalloc") &&
           libs_cuda_ok(cudaMemset(*p, 0, bytes), "cudaMemset") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/* cudaMalloc of bytes filled from host, the device synchronised. */
static inline bool libs_cuda_copy(void **p, const void *host, size_t bytes)
{
    return libs_cuda_ok(cudaMalloc(p, bytes), "cudaMalloc") &&
           libs_cuda_ok(cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

/* The whole program of a build without the library's header. */
static inline int libs_no_header(const char *lib, const char *header)
{
    char rc[96];
    libs.lib = lib;
    snprintf(rc, sizeof rc, "no_header(%s)", header);
    libs_setup_failed("-", rc);
    printf("RESULT libs_done lib=%s\n", lib);
    return 0;
}

/* ---- the launching thread ------------------------------------------------------ */

/* Once a round, delay_ms after the round starts, one launch of the tiny
 * kernel on launch_stream, timed. */
static inline void *libs_launcher_main(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(libs.ctx));
    int round = 0;
    for (;;) {
        while (atomic_load(&libs.go) == round && !atomic_load(&libs.quit))
            gc_sleep_ms(0.02);
        if (atomic_load(&libs.quit))
            return NULL;
        round = atomic_load(&libs.go);
        gc_sleep_ms(libs.delay_ms);
        double t0 = gc_now_ms();
        libs.launch_rc = gc_touch(&libs.kernels, libs.launch_stream, 0, 0);
        libs.launch_ms = gc_now_ms() - t0;
        atomic_store(&libs.done, round);
    }
}

/* Starts a round of the launching thread; returns it for libs_launcher_wait. */
static inline int libs_launcher_round(void)
{
    int round = atomic_load(&libs.go) + 1;
    atomic_store(&libs.go, round);
    return round;
}

static inline void libs_launcher_wait(int round)
{
    while (atomic_load(&libs.done) != round)
        gc_sleep_ms(0.1);
}

/* ---- the long kernel ------------------------------------------------------------ */

static inline bool libs_spinning(void)
{
    return cuStreamQuery(libs.spin_stream) == CUDA_ERROR_NOT_READY;
}

/* Makes sure the long kernel runs, started between LIBS_INTO_MS and
 * LIBS_FRESH_MS ago; waits for the GPU when an older one still runs. */
static inline void libs_spin_ready(void)
{
    if (libs.spin_start_ms >= 0 && libs_spinning() &&
        gc_now_ms() - libs.spin_start_ms <= LIBS_FRESH_MS)
        return;
    GC_CHECK(cuStreamSynchronize(libs.spin_stream));
    GC_CHECK(gc_spin(&libs.kernels, libs.spin_stream, LIBS_SPIN_MS, 0, 0));
    libs.spin_start_ms = gc_now_ms();
    gc_sleep_ms(LIBS_INTO_MS);
}

/* ---- the program's frame ------------------------------------------------------------ */

/* Makes device 0's primary context current (the one the CUDA runtime takes),
 * loads the kernels, creates the streams and starts the launching thread,
 * each used once. Ends the program (status 2, no RESULT line) when the
 * driver fails here. */
static inline void libs_start(const char *lib)
{
    libs.lib = lib;
    libs.spin_start_ms = -1;
    libs.ctx = gc_init();
    libs.simulated = gc_test_driver();
    gc_load_kernels(&libs.kernels);
    GC_CHECK(cuStreamCreate(&libs.spin_stream, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&libs.launch_stream, CU_STREAM_NON_BLOCKING));
    libs.delay_ms = 0;
    if (pthread_create(&libs.thread, NULL, libs_launcher_main, NULL) != 0)
        gc_die("pthread_create failed");
    GC_CHECK(gc_spin(&libs.kernels, libs.spin_stream, 1.0, 0, 0));
    libs_launcher_wait(libs_launcher_round());
    GC_CHECK(cuCtxSynchronize());
    libs.delay_ms = LIBS_LAUNCH_DELAY_MS;
}

/* The library's version as it reports it (an int, or text). */
static inline void libs_info(const char *version)
{
    printf("RESULT libs_info lib=%s version=%s shim_loaded=%d simulated=%d\n", libs.lib,
           libs_word(version), gc_cudefer_loaded(), (int)libs.simulated);
    fflush(stdout);
}

static inline void libs_info_int(long long version)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", version);
    libs_info(text);
}

/* Waits for the GPU, stops the thread; the program's exit status (0: its
 * findings, setup lines included, are in its RESULT lines). */
static inline int libs_end(void)
{
    GC_CHECK(cuCtxSynchronize());
    atomic_store(&libs.quit, true);
    pthread_join(libs.thread, NULL);
    printf("RESULT libs_done lib=%s\n", libs.lib);
    fflush(stdout);
    return 0;
}

/* ---- one measurement ------------------------------------------------------------------ */

/* Times fn(arg) under the long kernel while the other thread launches, and
 * prints its line (stage: teardown, probe or baseline). */
static inline void libs_time(const char *call, const char *stage, libs_call_fn fn, void *arg,
                             libs_rc_fn rc_name)
{
    libs_spin_ready();
    bool before = libs_spinning();
    double into_ms = gc_now_ms() - libs.spin_start_ms;
    int round = libs_launcher_round();
    double t0 = gc_now_ms();
    int rc = fn(arg);
    double caller_ms = gc_now_ms() - t0;
    bool after = libs_spinning();
    libs_launcher_wait(round);
    printf("RESULT libs lib=%s call=%s stage=%s caller_ms=%.4f launch_ms=%.4f rc=%s", libs.lib,
           libs_word(call), stage, caller_ms, libs.launch_ms, libs_word(rc_name(rc)));
    printf(" launch_rc=%s into_ms=%.1f spin_before=%d spin_after=%d simulated=%d\n",
           gc_rc(libs.launch_rc), into_ms, (int)before, (int)after, (int)libs.simulated);
    fflush(stdout);
}

static inline int libs_nothing(void *arg)
{
    (void)arg;
    return cudaSuccess;
}

/* The launch alone, under the kernel, with nothing called: the baseline of
 * the launch_ms of the rows that follow. */
static inline void libs_baseline(void)
{
    libs_time("none", "baseline", libs_nothing, NULL, libs_cuda_rc);
}

/* ---- the probes (cuBLAS, cuSOLVER) ------------------------------------------------------ */

static inline int libs_cuda_free(void *block)
{
    return cudaFree(block);
}

static inline int libs_device_sync(void *arg)
{
    (void)arg;
    return cudaDeviceSynchronize();
}

/* The probes' block, made before the measurement: bytes allocated, freed
 * once while the GPU is idle (the warm-up of the free) and allocated again,
 * the device synchronised. NULL after a set-up failure (reported). */
static inline void *libs_probe_block(size_t bytes)
{
    void *block = NULL;
    if (!libs_cuda_zeros(&block, bytes) || !libs_cuda_ok(cudaFree(block), "cudaFree(warm-up)") ||
        !libs_cuda_zeros(&block, bytes))
        return NULL;
    return block;
}

/* The two halves of a destruction that frees a workspace and then
 * synchronises the device, timed apart: (a) cudaFree of block, of bytes
 * (from libs_probe_block; with cudefer it does not wait), (b)
 * cudaDeviceSynchronize (it waits for all work, by definition). */
static inline void libs_probes(void *block, size_t bytes)
{
    char call[64];
    snprintf(call, sizeof call, "cudaFree(%lluMiB)", (unsigned long long)(bytes / GC_MIB));
    libs_time(call, "probe", libs_cuda_free, block, libs_cuda_rc);
    libs_time("cudaDeviceSynchronize", "probe", libs_device_sync, NULL, libs_cuda_rc);
}

#endif
