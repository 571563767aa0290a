/* test_lifecycle.c - the process around the shim: fork, exit, exec, a driver
 * first used in a forked child, threads that exit with releases queued, and
 * contexts made and destroyed many times.
 *
 * Over the test driver with the shim preloaded. Each test runs in its own
 * process (Criterion forks); those that need a whole program of their own
 * (exit, exec) run tests/lifecycle_child. Remember the test driver's rules
 * (testdriver.h): the child of a process that initialised the driver gets
 * CUDA_ERROR_NOT_INITIALIZED from every call, and at exit the driver tears
 * itself down and reports on stderr any call made after that. */
#include "common.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BYTES (64u << 10)

static int cudefer_flush(void)
{
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
    cr_assert_not_null(flush, "cudefer_flush is not there: is the shim preloaded?");
    return flush();
}

static const char ptx[] = "// the test driver accepts any image\n";

/* ---- one release of each kind ------------------------------------------------ */

/* The kinds the shim defers, as the test driver counts them. */
static const enum testdrv_kind kinds[] = {
    TESTDRV_DEVICE, TESTDRV_HOST, TESTDRV_MANAGED, TESTDRV_REGISTERED,
    TESTDRV_ARRAY, TESTDRV_MODULE, TESTDRV_LIBRARY,
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

/* The driver's real releases, by the ELF names the shim calls. Device and
 * managed memory go back by cuMemFree_v2 or, for device memory, by the
 * shim's stream-ordered cuMemFreeAsync: counted together. */
static const char *const release_calls[] = {
    "cuMemFree_v2+cuMemFreeAsync", "cuMemFreeHost", "cuMemHostUnregister",
    "cuArrayDestroy", "cuModuleUnload", "cuLibraryUnload",
};
#define NRELEASES (sizeof release_calls / sizeof release_calls[0])

/* Releases per queue_one_of_each: device + managed, two pinned, one each
 * of the rest. */
static const uint64_t per_queue[NRELEASES] = {2, 2, 1, 1, 1, 1};

struct counts {
    uint64_t v[NRELEASES];
};

static struct counts release_counts(void)
{
    struct counts c;
    c.v[0] = testdrv_calls("cuMemFree_v2") + testdrv_calls("cuMemFreeAsync");
    for (size_t i = 1; i < NRELEASES; i++)
        c.v[i] = testdrv_calls(release_calls[i]);
    return c;
}

/* Makes the shim set the current context up (at its first allocation it
 * frees a block of its own), so that later counts are the program's. */
static void prime_the_shim(void)
{
    void *h;
    CU_OK(cuMemAllocHost(&h, BYTES));
    CU_OK(cuMemFreeHost(h));
    CU_OK(cuCtxSynchronize());
}

/* Allocates one object of every deferrable kind in the current context and
 * releases it: the device free waits behind a kernel that writes the
 * memory for usec, the rest stays queued. Objects: device, managed, two
 * pinned (cuMemAllocHost, cuMemHostAlloc), registered, array, module,
 * library. */
static void queue_one_of_each(CUstream s, unsigned usec)
{
    CUdeviceptr d, m;
    void *h, *ha, *r = aligned_alloc(4096, BYTES);
    CUarray a;
    CUmodule mod;
    CUlibrary lib;
    CUkernel k;
    CUfunction f;
    CUDA_ARRAY_DESCRIPTOR desc = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    CU_OK(cuMemAlloc(&d, BYTES));
    CU_OK(cuMemAllocManaged(&m, BYTES, CU_MEM_ATTACH_GLOBAL));
    CU_OK(cuMemAllocHost(&h, BYTES));
    CU_OK(cuMemHostAlloc(&ha, BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
    CU_OK(cuMemHostRegister(r, BYTES, 0));
    CU_OK(cuArrayCreate(&a, &desc));
    CU_OK(cuModuleLoadData(&mod, ptx));
    CU_OK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CU_OK(cuLibraryGetKernel(&k, lib, "k"));
    CU_OK(cuKernelGetFunction(&f, k));
    CU_OK(testdrv_launch(s, usec, d, BYTES, TESTDRV_WRITE));
    CU_OK(testdrv_launch(s, usec, m, BYTES, TESTDRV_WRITE));
    CU_OK(cuMemFree(d));
    CU_OK(cuMemFree(m));
    CU_OK(cuMemFreeHost(h));
    CU_OK(cuMemFreeHost(ha));
    CU_OK(cuMemHostUnregister(r));
    CU_OK(cuArrayDestroy(a));
    CU_OK(cuModuleUnload(mod));
    CU_OK(cuLibraryUnload(lib));
}

/* Waits (bounded) until the device frees in flight have completed. */
static void wait_device_frees(void)
{
    for (int i = 0; i < 2000 && (program_live(TESTDRV_DEVICE) || testdrv_pending_free_bytes());
         i++)
        usleep(1000);
}

static void expect_all_released(const char *when)
{
    wait_device_frees();
    for (size_t i = 0; i < NKINDS; i++)
        cr_expect_eq(program_live(kinds[i]), 0, "%s: kind %d: %zu objects left", when,
                     (int)kinds[i], program_live(kinds[i]));
    cr_expect_eq(testdrv_faults(), 0, "%s: a kernel touched released memory", when);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "%s: a call named a destroyed context", when);
}

/* ---- running a program ----------------------------------------------------------- */

struct run {
    int status;
    double secs;
    char err[8192]; /* its stderr, cut */
};

/* Runs argv (with this process's environment: the shim preloaded, plus
 * the NAME=value strings of extra, NULL-terminated, or NULL) and collects
 * its status, time and stderr. limit_s bounds the wait: past it the
 * program is killed (and the status says so). */
static struct run run_program(char *const argv[], char *const extra[], unsigned limit_s)
{
    struct run r = {0};
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    uint64_t t0 = now_ns();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(pipefd[1], STDERR_FILENO);
        close(pipefd[0]);
        close(pipefd[1]);
        for (size_t i = 0; extra && extra[i]; i++)
            putenv(extra[i]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    size_t len = 0;
    bool done = false;
    while (!done) {
        ssize_t n = read(pipefd[0], r.err + len, sizeof r.err - 1 - len);
        if (n > 0) {
            len += (size_t)n;
            if (len == sizeof r.err - 1)
                len = 0; /* keep reading; the tail matters less than not blocking */
        }
        if (waitpid(pid, &r.status, WNOHANG) == pid)
            done = true;
        else if (now_ns() - t0 > (uint64_t)limit_s * 1000 * MS)
            kill(pid, SIGKILL);
        else if (n <= 0)
            usleep(1000);
    }
    ssize_t n;
    while ((n = read(pipefd[0], r.err + len, sizeof r.err - 1 - len)) > 0)
        len += (size_t)n;
    r.err[len] = '\0';
    close(pipefd[0]);
    r.secs = (double)(now_ns() - t0) / 1e9;
    return r;
}

static void expect_clean_exit(const struct run *r, const char *what, double within_s)
{
    cr_expect(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0,
              "%s: %s %d; stderr:\n%s", what,
              WIFSIGNALED(r->status) ? "killed by signal" : "exit status",
              WIFSIGNALED(r->status) ? WTERMSIG(r->status) : WEXITSTATUS(r->status), r->err);
    cr_expect_lt(r->secs, within_s, "%s: took %.2f s", what, r->secs);
    cr_expect_null(strstr(r->err, "torn down"),
                   "%s: a driver call after the driver's exit-time teardown:\n%s", what, r->err);
    cr_expect_null(strstr(r->err, "cudefer: "), "%s: the shim logged an error:\n%s", what,
                   r->err);
}

/* ---- fork ---------------------------------------------------------------------- */

/* The child of a process with releases queued: its queues are empty, it
 * releases none of the parent's entries (not at a flush, not at
 * cuCtxSynchronize), and the parent's are still released, once each. */
Test(fork, child_never_releases_the_parents_entries, .timeout = 10)
{
    test_context();
    prime_the_shim();
    CUstream s = test_stream(CU_STREAM_NON_BLOCKING);
    struct counts base = release_counts();
    queue_one_of_each(s, 200000);
    struct counts before = release_counts();
    cr_assert_eq(program_live(TESTDRV_HOST), 2, "the releases were not deferred");

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int bad = 0;
        cudefer_flush();
        cuCtxSynchronize(); /* the driver refuses in a fork child; the shim must too */
        struct counts after = release_counts();
        for (size_t i = 0; i < NRELEASES; i++)
            if (after.v[i] != before.v[i])
                bad |= 1 << i;
        _exit(bad);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child crashed (signal %d)", WTERMSIG(status));
    for (size_t i = 0; i < NRELEASES; i++)
        cr_expect_eq(WEXITSTATUS(status) & (1 << i), 0, "the child called %s",
                     release_calls[i]);

    /* The parent's entries: released at its own flush point, once each. */
    CU_OK(cuCtxSynchronize());
    cr_expect_eq(cudefer_flush(), 0);
    expect_all_released("the parent after the fork");
    struct counts after = release_counts();
    for (size_t i = 0; i < NRELEASES; i++)
        cr_expect_eq(after.v[i] - base.v[i], per_queue[i],
                     "the parent: %s called %llu times for its releases", release_calls[i],
                     (unsigned long long)(after.v[i] - base.v[i]));
}

/* A program that first uses the driver in a forked child: the shim works
 * there (a deferred release, a fenced device free, a flush). */
Test(fork, driver_initialised_only_in_the_child, .timeout = 10)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int bad = 0;
        CUdevice dev;
        CUcontext ctx;
        if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
            cuCtxSetCurrent(ctx))
            _exit(64);
        CUstream s;
        CUdeviceptr d;
        void *h;
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuMemAlloc(&d, BYTES) ||
            cuMemAllocHost(&h, BYTES) || testdrv_launch(s, 100000, d, BYTES, TESTDRV_WRITE))
            _exit(65);
        uint64_t waits = testdrv_thread_wait_calls();
        if (cuMemFree(d) || cuMemFreeHost(h))
            bad |= 1;
        if (testdrv_thread_wait_calls() != waits || program_live(TESTDRV_HOST) != 1)
            bad |= 2; /* not deferred */
        int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
        if (!flush || flush() != 0)
            bad |= 4;
        if (program_live(TESTDRV_HOST) != 0 || program_live(TESTDRV_DEVICE) != 0)
            bad |= 8; /* the flush left something */
        if (testdrv_faults() != 0)
            bad |= 16;
        _exit(bad);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child crashed (signal %d)", WTERMSIG(status));
    int bad = WEXITSTATUS(status);
    cr_assert_lt(bad, 64, "the child could not set up a context (%d)", bad);
    cr_expect_eq(bad & 1, 0, "a release failed in the child");
    cr_expect_eq(bad & 2, 0, "a release in the child was not deferred");
    cr_expect_eq(bad & 4, 0, "cudefer_flush failed in the child");
    cr_expect_eq(bad & 8, 0, "the flush in the child left objects");
    cr_expect_eq(bad & 16, 0, "a kernel in the child touched freed memory");
}

/* ---- exit and exec ---------------------------------------------------------------- */

/* A program returns from main with a release of every kind queued and a
 * kernel still running for 5 s: it exits at once, with status 0, and
 * nothing reaches the driver after its teardown. */
Test(exit, with_entries_queued, .timeout = 20)
{
    char *argv[] = {LIFECYCLE_CHILD, "exit", NULL};
    struct run r = run_program(argv, NULL, 10);
    expect_clean_exit(&r, "lifecycle_child exit", 2.0);
}

/* The same with the device frees handed to the driver (no device block
 * kept for reuse): they are in flight behind the kernel at exit, and the
 * shim's waiter thread polls them; it must stop before the driver goes. */
Test(exit, with_device_frees_in_flight, .timeout = 20)
{
    char *extra[] = {"CUDEFER_DEVICE_CACHE=0", NULL};
    char *argv[] = {LIFECYCLE_CHILD, "exit", NULL};
    struct run r = run_program(argv, extra, 10);
    expect_clean_exit(&r, "lifecycle_child exit (CUDEFER_DEVICE_CACHE=0)", 2.0);
}

/* A program that loads the driver at run time (dlopen and dlsym, as the
 * CUDA runtime does) returns from main with releases queued and a kernel
 * running: the same quick, clean exit. */
Test(exit, driver_loaded_at_run_time, .timeout = 20)
{
    char *argv[] = {LIFECYCLE_DLOPEN, NULL};
    struct run r = run_program(argv, NULL, 10);
    expect_clean_exit(&r, "lifecycle_dlopen", 2.0);
    char *extra[] = {"CUDEFER_STATS=1", "CUDEFER_DEVICE_CACHE=0", NULL};
    r = run_program(argv, extra, 10);
    cr_expect(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_expect_lt(r.secs, 2.0, "took %.2f s", r.secs);
    cr_expect_null(strstr(r.err, "torn down"), "a driver call after the teardown:\n%s", r.err);
}

/* The same with the statistics printed at exit and a JSON report written:
 * the shim's own exit work must not touch the driver either. */
Test(exit, with_entries_queued_and_statistics, .timeout = 20)
{
    char path[] = "/tmp/cudefer-lifecycle-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char report[64];
    snprintf(report, sizeof report, "CUDEFER_REPORT=%s", path);
    char *extra[] = {"CUDEFER_STATS=1", report, NULL};
    char *argv[] = {LIFECYCLE_CHILD, "exit", NULL};
    struct run r = run_program(argv, extra, 10);
    cr_expect(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "status %d; stderr:\n%s",
              r.status, r.err);
    cr_expect_lt(r.secs, 2.0, "took %.2f s", r.secs);
    cr_expect_null(strstr(r.err, "torn down"), "a driver call after the teardown:\n%s", r.err);
    FILE *f = fopen(path, "r");
    char text[4096] = {0};
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    unlink(path);
    cr_expect_gt(n, 0, "no report written at exit");
    cr_expect_not_null(strstr(r.err, "cudefer: statistics"), "no statistics at exit:\n%s",
                       r.err);
}

/* A process with releases queued (and a kernel running) execs another
 * program: it runs normally. */
Test(exec, true_with_entries_queued, .timeout = 20)
{
    char *argv[] = {LIFECYCLE_CHILD, "exec", NULL};
    struct run r = run_program(argv, NULL, 10);
    expect_clean_exit(&r, "lifecycle_child exec (then /bin/true)", 2.0);
}

/* The same, from a Criterion process forked with the driver not yet used:
 * the child sets up a context, queues, and execs a program that uses the
 * shim again (queue, flush, every object gone). */
Test(exec, program_using_the_shim_with_entries_queued, .timeout = 20)
{
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        CUdevice dev;
        CUcontext ctx;
        CUstream s;
        void *h;
        if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
            cuCtxSetCurrent(ctx) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) ||
            cuMemAllocHost(&h, BYTES) || testdrv_launch(s, 5000000, 0, 0, TESTDRV_NONE) ||
            cuMemFreeHost(h) || program_live(TESTDRV_HOST) != 1)
            _exit(126);
        dup2(pipefd[1], STDERR_FILENO);
        execl(LIFECYCLE_CHILD, LIFECYCLE_CHILD, "flush", (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char err[4096] = {0};
    size_t len = 0;
    ssize_t n;
    while (len < sizeof err - 1 && (n = read(pipefd[0], err + len, sizeof err - 1 - len)) > 0)
        len += (size_t)n;
    close(pipefd[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "killed by signal %d; stderr:\n%s", WTERMSIG(status), err);
    cr_assert_neq(WEXITSTATUS(status), 126, "the child could not queue a release");
    cr_expect_eq(WEXITSTATUS(status), 0, "the exec'd program failed (%d):\n%s",
                 WEXITSTATUS(status), err);
}

/* ---- threads that exit ------------------------------------------------------------- */

struct leaver {
    CUcontext ctx;
    CUstream stream;
};

static void *queue_and_leave(void *arg)
{
    struct leaver *l = arg;
    if (cuCtxSetCurrent(l->ctx) != CUDA_SUCCESS)
        return (void *)1;
    queue_one_of_each(l->stream, 20000);
    return NULL; /* the thread ends with its releases queued */
}

struct syncer {
    CUcontext ctx;
    CUresult rc;
};

static void *synchronize_main(void *arg)
{
    struct syncer *sy = arg;
    sy->rc = cuCtxSetCurrent(sy->ctx);
    if (sy->rc == CUDA_SUCCESS)
        sy->rc = cuCtxSynchronize();
    return NULL;
}

#define LEAVERS 8

/* Threads queue releases and end; another thread's flush releases them
 * all, once each. */
Test(threads, releases_of_exited_threads_are_released, .timeout = 10)
{
    CUcontext ctx = test_context();
    prime_the_shim();
    struct counts before = release_counts();
    struct leaver l[LEAVERS];
    pthread_t t[LEAVERS];
    for (int i = 0; i < LEAVERS; i++) {
        l[i] = (struct leaver){ctx, test_stream(CU_STREAM_NON_BLOCKING)};
        cr_assert_eq(pthread_create(&t[i], NULL, queue_and_leave, &l[i]), 0);
    }
    for (int i = 0; i < LEAVERS; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_assert_null(ret, "thread %d could not set its context", i);
    }
    cr_expect_eq(program_live(TESTDRV_HOST), 2 * LEAVERS, "the releases were not deferred");
    cr_expect_eq(program_live(TESTDRV_ARRAY), LEAVERS);

    /* From a thread of its own, as a program's other thread would. */
    struct syncer sy = {ctx, CUDA_ERROR_UNKNOWN};
    pthread_t syncer;
    cr_assert_eq(pthread_create(&syncer, NULL, synchronize_main, &sy), 0);
    pthread_join(syncer, NULL);
    cr_expect_eq(sy.rc, CUDA_SUCCESS, "cuCtxSynchronize returned %d", (int)sy.rc);
    expect_all_released("after another thread's flush");
    struct counts after = release_counts();
    for (size_t i = 0; i < NRELEASES; i++)
        cr_expect_eq(after.v[i] - before.v[i], per_queue[i] * LEAVERS,
                     "%s called %llu times for %d threads", release_calls[i],
                     (unsigned long long)(after.v[i] - before.v[i]), LEAVERS);
}

/* ---- contexts made and destroyed many times ------------------------------------- */

#define ROUNDS 100 /* more than the shim's 64 context slots */

/* A context per round, a release deferred in it, the context destroyed:
 * slots are given back, so round 65 and later still defer. */
Test(contexts, created_and_destroyed_in_a_loop, .timeout = 20)
{
    CUdevice dev;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    for (int round = 0; round < ROUNDS; round++) {
        CUcontext ctx;
        void *h;
        CUdeviceptr d;
        CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));
        CU_OK(cuMemAllocHost(&h, BYTES));
        CU_OK(cuMemAlloc(&d, BYTES));
        uint64_t frees = testdrv_calls("cuMemFree_v2"), waits = testdrv_thread_wait_calls();
        CU_OK(cuMemFreeHost(h));
        CU_OK(cuMemFree(d));
        cr_assert_eq(program_live(TESTDRV_HOST), 1, "round %d: cuMemFreeHost was not deferred",
                     round + 1);
        cr_assert_eq(testdrv_calls("cuMemFree_v2"), frees,
                     "round %d: cuMemFree went to the driver", round + 1);
        cr_assert_eq(testdrv_thread_wait_calls(), waits, "round %d: a release waited",
                     round + 1);
        CU_OK(cuCtxDestroy(ctx));
        cr_assert_eq(program_live(TESTDRV_HOST), 0, "round %d: left after cuCtxDestroy",
                     round + 1);
    }
    cr_expect_eq(program_live(TESTDRV_CONTEXT), 0);
    cr_expect_eq(testdrv_dead_context_calls(), 0, "the shim called into a destroyed context");
}

/* The same with the primary context, retained and released each round (the
 * handle stays the same, the context does not). */
Test(contexts, primary_retained_and_released_in_a_loop, .timeout = 20)
{
    CUdevice dev;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    for (int round = 0; round < ROUNDS; round++) {
        CUcontext ctx;
        void *h;
        CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CU_OK(cuCtxSetCurrent(ctx));
        CU_OK(cuMemAllocHost(&h, BYTES));
        CU_OK(cuMemFreeHost(h));
        cr_assert_eq(program_live(TESTDRV_HOST), 1, "round %d: cuMemFreeHost was not deferred",
                     round + 1);
        CU_OK(cuDevicePrimaryCtxRelease(dev));
        cr_assert_eq(program_live(TESTDRV_HOST), 0, "round %d: left after the last release",
                     round + 1);
    }
    cr_expect_eq(testdrv_dead_context_calls(), 0, "the shim called into a destroyed context");
}
