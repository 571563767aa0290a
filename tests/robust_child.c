/* robust_child.c - a plain program for tests/test_robust.c: what a CUDA
 * program does, run as a process of its own over the test driver, with the
 * shim preloaded (and, for some modes, a helper library preloaded before
 * it). Its own messages go to stdout, so that its stderr holds only what
 * cudefer (or the test driver) wrote.
 *
 * usage: robust_child MODE [ARG]
 *   release      a pinned release is deferred (the driver still holds the
 *                block), the dlsym door hands out the wrapper, and
 *                cudefer_flush gives the block back
 *   passthrough  every call works and every release reaches the driver at
 *                once (cudefer disabled, or stepping aside)
 *   drivers      every call works, and the program's own driver (the one it
 *                is linked with) answers them
 *   fd2-close FILE, fd2-dup2 FILE
 *                the program closes its stderr and opens FILE (which becomes
 *                descriptor 2), or dup2's FILE onto it, then works (a
 *                release, a flush) and exits; it writes its own lines to
 *                FILE: "data N"
 *   environ      after cuInit, the program's first CUDA call, writes over
 *                the bytes of every environment string (as process-title
 *                libraries do), then works and exits
 *   environ-late the same, after a wrapped call (a context retained)
 *   waiter       a 200 MB device block freed under a 100 ms kernel, with
 *                no synchronisation: prints "back_ms=T" (from the kernel's
 *                end to the moment the driver holds neither the block nor
 *                its bytes), or "back_ms=never" after 5 s
 *   contexts     200 contexts, up to 100 alive at once, each with a device
 *                and a pinned release; all destroyed
 *   captures     300 stream captures live at once, all ended; then a device
 *                release behind a kernel is fenced (no wait) and its block
 *                serves the next allocation of its size
 * Exit status 0 when all went as it should; otherwise a message on stdout
 * and status 1 (2: bad usage, 3: a call failed).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "own.h"
#include "testdriver.h"

#define BYTES (64u << 10)

extern char **environ;

static int failures;

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        printf("robust_child: %s failed with %d\n", what, (int)rc);
        fflush(stdout);
        exit(3);
    }
}

static void expect(bool ok, const char *what)
{
    if (!ok) {
        printf("robust_child: %s\n", what);
        failures++;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUcontext primary(void)
{
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    return ctx;
}

static int flush(void)
{
    int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    if (!fn) {
        printf("robust_child: cudefer_flush is not there\n");
        return -1;
    }
    return fn();
}

static bool in_shim(void *fn)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libcudefer");
}

/* A pinned block freed while a kernel runs: deferred, the driver keeps it. */
static void release_deferred(void)
{
    CUstream s;
    void *h;
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuMemAllocHost(&h, BYTES), "cuMemAllocHost");
    check(testdrv_launch(s, 20000, (CUdeviceptr)(uintptr_t)h, BYTES, TESTDRV_WRITE),
          "testdrv_launch");
    uint64_t frees = testdrv_calls("cuMemFreeHost");
    check(cuMemFreeHost(h), "cuMemFreeHost");
    expect(program_live(TESTDRV_HOST) == 1, "the pinned release was not deferred (block gone)");
    expect(testdrv_calls("cuMemFreeHost") == frees,
           "the pinned release reached the driver at once");
    check(cuStreamDestroy(s), "cuStreamDestroy");
}

static int mode_release(void)
{
    primary();
    release_deferred();
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    expect(drv != NULL, "libcuda.so.1 is not loaded");
    if (drv)
        expect(in_shim(dlsym(drv, "cuMemFree_v2")),
               "dlsym(driver, \"cuMemFree_v2\") is not cudefer's wrapper");
    expect(flush() == 0, "cudefer_flush failed");
    expect(program_live(TESTDRV_HOST) == 0, "cudefer_flush left the pinned block");
    expect(testdrv_faults() == 0, "a kernel touched freed memory");
    return failures != 0;
}

/* In the primary context: a device and a pinned block, the device one
 * released while a kernel on the stream returned writes it, then the
 * pinned one. */
static CUstream releases_under_a_kernel(void)
{
    primary();
    CUstream s;
    CUdeviceptr d;
    void *h;
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuMemAlloc(&d, BYTES), "cuMemAlloc");
    check(cuMemAllocHost(&h, BYTES), "cuMemAllocHost");
    check(testdrv_launch(s, 10000, d, BYTES, TESTDRV_WRITE), "testdrv_launch");
    check(cuMemFree(d), "cuMemFree");
    check(cuMemFreeHost(h), "cuMemFreeHost");
    return s;
}

/* Every call works; releases are the driver's own. */
static int mode_passthrough(void)
{
    CUstream s = releases_under_a_kernel();
    expect(program_live(TESTDRV_DEVICE) == 0, "the device block is still the driver's");
    expect(program_live(TESTDRV_HOST) == 0, "the pinned block is still the driver's");
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    check(cuStreamDestroy(s), "cuStreamDestroy");
    expect(testdrv_faults() == 0, "a kernel touched freed memory");
    return failures != 0;
}

/* Every call works, answered by the driver the program is linked with. */
static int mode_drivers(void)
{
    uint64_t allocs = testdrv_calls("cuMemAlloc_v2"), hosts = testdrv_calls("cuMemAllocHost_v2");
    CUstream s = releases_under_a_kernel();
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    check(cuStreamDestroy(s), "cuStreamDestroy");
    expect(testdrv_calls("cuMemAlloc_v2") > allocs,
           "the program's driver did not see cuMemAlloc_v2");
    expect(testdrv_calls("cuMemAllocHost_v2") > hosts,
           "the program's driver did not see cuMemAllocHost_v2");
    flush();
    for (enum testdrv_kind k = TESTDRV_DEVICE; k <= TESTDRV_LIBRARY; k++)
        if (program_live(k))
            expect(false, "an object is left in the program's driver");
    expect(testdrv_faults() == 0, "a kernel touched freed memory");
    return failures != 0;
}

/* Descriptor 2 becomes the program's data file, then cudefer has things to
 * say: a warning for a bad option (read at the first wrapped call), the
 * options and a flush at info level, the statistics at exit. */
static int mode_fd2(const char *how, const char *file)
{
    if (strcmp(how, "fd2-close") == 0) {
        close(STDERR_FILENO);
        int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd != STDERR_FILENO) {
            printf("robust_child: %s opened as %d, not 2\n", file, fd);
            return 3;
        }
    } else {
        int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) != STDERR_FILENO) {
            printf("robust_child: cannot put %s on descriptor 2\n", file);
            return 3;
        }
        close(fd);
    }
    dprintf(STDERR_FILENO, "data 1\n");
    primary();
    release_deferred();
    check(cuCtxSynchronize(), "cuCtxSynchronize");
    expect(program_live(TESTDRV_HOST) == 0, "cuCtxSynchronize left the pinned block");
    dprintf(STDERR_FILENO, "data 2\n");
    return failures != 0;
}

/* Writes over every environment string, keeping its length. */
static void scribble_environment(void)
{
    for (char **e = environ; *e; e++)
        memset(*e, 'x', strlen(*e));
}

static int mode_environ(bool late)
{
    check(cuInit(0), "cuInit");
    if (!late)
        scribble_environment();
    primary();
    if (late)
        scribble_environment();
    release_deferred();
    expect(flush() == 0, "cudefer_flush failed");
    return failures != 0;
}

static int mode_waiter(void)
{
    const size_t bytes = 200u << 20;
    const unsigned kernel_us = 100000;
    primary();
    CUstream s;
    CUdeviceptr d;
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuMemAlloc(&d, bytes), "cuMemAlloc");
    /* The waiter has nothing to do: it sleeps until work is posted. */
    usleep(50000);
    uint64_t waits = testdrv_thread_wait_calls();
    double launched = now_s();
    check(testdrv_launch(s, kernel_us, d, bytes, TESTDRV_WRITE), "testdrv_launch");
    check(cuMemFree(d), "cuMemFree");
    expect(testdrv_thread_wait_calls() == waits, "cuMemFree waited");
    double end = launched + kernel_us / 1e6, back = 0;
    while (now_s() < end + 5.0) {
        if (program_live(TESTDRV_DEVICE) == 0 && testdrv_pending_free_bytes() == 0) {
            back = now_s();
            break;
        }
        usleep(500);
    }
    if (back == 0.0)
        printf("back_ms=never\n");
    else
        printf("back_ms=%.1f\n", (back - end) * 1e3);
    expect(testdrv_faults() == 0, "the kernel touched freed memory");
    return failures != 0;
}

#define CONTEXTS 200
#define ALIVE 100

static int mode_contexts(void)
{
    CUdevice dev;
    CUcontext ctx[CONTEXTS];
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    size_t alive = 0;
    int not_deferred = 0;
    for (int i = 0; i < CONTEXTS; i++) {
        CUdeviceptr d;
        void *h;
        CUcontext popped;
        check(cuCtxCreate(&ctx[i], NULL, 0, dev), "cuCtxCreate");
        alive++;
        check(cuMemAlloc(&d, BYTES), "cuMemAlloc");
        check(cuMemAllocHost(&h, BYTES), "cuMemAllocHost");
        uint64_t frees = testdrv_calls("cuMemFree_v2"), waits = testdrv_thread_wait_calls();
        check(cuMemFree(d), "cuMemFree");
        check(cuMemFreeHost(h), "cuMemFreeHost");
        if (program_live(TESTDRV_HOST) != alive || testdrv_calls("cuMemFree_v2") != frees ||
            testdrv_thread_wait_calls() != waits) {
            if (!not_deferred++)
                printf("robust_child: context %d (%zu alive): a release was not deferred\n",
                       i + 1, alive);
        }
        check(cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
        if (i >= ALIVE - 1) {
            check(cuCtxDestroy(ctx[i - (ALIVE - 1)]), "cuCtxDestroy");
            alive--;
        }
    }
    if (not_deferred) {
        printf("robust_child: %d of %d contexts did not defer a release\n", not_deferred,
               CONTEXTS);
        failures++;
    }
    for (int i = CONTEXTS - (ALIVE - 1); i < CONTEXTS; i++)
        check(cuCtxDestroy(ctx[i]), "cuCtxDestroy");
    for (enum testdrv_kind k = TESTDRV_DEVICE; k < TESTDRV_KIND_COUNT; k++)
        if (program_live(k)) {
            printf("robust_child: kind %d: %zu objects left\n", (int)k, program_live(k));
            failures++;
        }
    expect(testdrv_dead_context_calls() == 0, "a call named a destroyed context");
    expect(testdrv_faults() == 0, "a kernel touched freed memory");
    return failures != 0;
}

#define CAPTURES 300

static int mode_captures(void)
{
    static CUstream streams[CAPTURES];
    primary();
    for (int i = 0; i < CAPTURES; i++) {
        check(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        check(cuStreamBeginCapture(streams[i], CU_STREAM_CAPTURE_MODE_GLOBAL),
              "cuStreamBeginCapture");
        check(testdrv_launch(streams[i], 1000, 0, 0, TESTDRV_NONE), "a captured launch");
    }
    for (int i = 0; i < CAPTURES; i++) {
        CUgraph g;
        check(cuStreamEndCapture(streams[i], &g), "cuStreamEndCapture");
        check(cuGraphDestroy(g), "cuGraphDestroy");
    }
    expect(testdrv_invalidated_captures() == 0, "a capture was invalidated");

    CUstream s;
    CUdeviceptr d, again;
    check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(cuMemAlloc(&d, BYTES), "cuMemAlloc");
    check(testdrv_launch(s, 50000, d, BYTES, TESTDRV_WRITE), "testdrv_launch");
    uint64_t waits = testdrv_thread_wait_calls(), frees = testdrv_calls("cuMemFree_v2");
    check(cuMemFree(d), "cuMemFree");
    expect(testdrv_thread_wait_calls() == waits, "cuMemFree waited");
    expect(testdrv_calls("cuMemFree_v2") == frees, "cuMemFree went to the driver");
    check(cuStreamSynchronize(s), "cuStreamSynchronize");
    /* The fence's event follows on cudefer's own stream a moment later. */
    usleep(200000);
    uint64_t allocs = testdrv_calls("cuMemAlloc_v2");
    check(cuMemAlloc(&again, BYTES), "cuMemAlloc");
    if (again != d || testdrv_calls("cuMemAlloc_v2") != allocs)
        printf("robust_child: freed %#llx, got %#llx; driver allocations %llu -> %llu\n",
               (unsigned long long)d, (unsigned long long)again, (unsigned long long)allocs,
               (unsigned long long)testdrv_calls("cuMemAlloc_v2"));
    expect(again == d && testdrv_calls("cuMemAlloc_v2") == allocs,
           "the released block did not serve the next allocation of its size");
    check(cuMemFree(again), "cuMemFree");
    expect(flush() == 0, "cudefer_flush failed");
    for (int i = 0; i < CAPTURES; i++)
        check(cuStreamDestroy(streams[i]), "cuStreamDestroy");
    check(cuStreamDestroy(s), "cuStreamDestroy");
    expect(testdrv_faults() == 0, "a kernel touched freed memory");
    expect(testdrv_invalidated_captures() == 0, "a capture was invalidated");
    return failures != 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2)
        return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "release") == 0)
        return mode_release();
    if (strcmp(mode, "passthrough") == 0)
        return mode_passthrough();
    if (strcmp(mode, "drivers") == 0)
        return mode_drivers();
    if (strncmp(mode, "fd2-", 4) == 0 && argc == 3)
        return mode_fd2(mode, argv[2]);
    if (strcmp(mode, "environ") == 0)
        return mode_environ(false);
    if (strcmp(mode, "environ-late") == 0)
        return mode_environ(true);
    if (strcmp(mode, "waiter") == 0)
        return mode_waiter();
    if (strcmp(mode, "contexts") == 0)
        return mode_contexts();
    if (strcmp(mode, "captures") == 0)
        return mode_captures();
    return 2;
}
