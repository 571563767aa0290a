/* demo.c - cudefer-demo: what a release costs while a kernel runs.
 *
 * A 1 s kernel runs on a non-blocking stream. Meanwhile this thread frees a
 * device buffer the kernel does not use (cuMemFree) while another thread
 * launches a kernel on a stream of its own; then, under a second 1 s kernel,
 * it frees pinned host memory (cuMemFreeHost). The program prints how long
 * each call kept its thread waiting. Without cudefer each release waits for
 * the kernel and stalls the other thread's launch; with cudefer
 * (LD_PRELOAD=libcudefer.so) none does. scripts/cudefer runs it both ways.
 *
 * It also frees the buffer the first kernel keeps writing while that kernel
 * still runs, and checks at the end that every kernel finished cleanly: the
 * release must wait for the kernel on the GPU, not on the host.
 *
 * Over the real driver the kernel is cudefer_spin (kernels.h, loaded with
 * cuModuleLoadData). Over the test driver (tests/driver, recognised by its
 * testdrv_launch hook) it is a simulated kernel of the same length.
 *
 * Usage: cudefer-demo [--require-cudefer]
 * Exit status: 0 on success; 1 if a CUDA call failed or a kernel did not
 * finish cleanly; 2 if cudefer is loaded and a call waited for more than half
 * of the kernel's time, or --require-cudefer was given and cudefer is not
 * loaded.
 */
#include "kernels.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    KERNEL_MS = 1000,
    DEVICE_BYTES = 64 << 20,
    HOST_BYTES = 16 << 20,
    KERNEL_BUF_BYTES = 1 << 20,
    /* How long the other thread lets this one get into cuMemFree. */
    LAUNCH_DELAY_MS = 10,
};

/* The test driver's hooks (tests/driver/testdriver.h), found with dlsym:
 * testdrv_launch queues a simulated kernel of usec microseconds that touches
 * [ptr, ptr + bytes) as access says (SIM_NONE / SIM_WRITE are its
 * TESTDRV_NONE / TESTDRV_WRITE); testdrv_faults counts uses of freed memory. */
enum sim_access { SIM_NONE = 0, SIM_WRITE = 2 };
typedef CUresult (*simulate_fn)(CUstream s, unsigned usec, CUdeviceptr ptr, size_t bytes,
                                enum sim_access access);
typedef uint64_t (*faults_fn)(void);
typedef const char *(*version_fn)(void);

struct demo {
    CUcontext ctx;
    CUstream stream;        /* the long kernels' */
    CUstream other_stream;  /* the other thread's */
    CUmodule module;        /* real driver only */
    CUfunction spin;        /* real driver only */
    simulate_fn simulate;   /* test driver only */
    const char *cudefer;    /* cudefer's version, NULL when not loaded */
};

/* What the other thread measured. */
struct launcher {
    const struct demo *demo;
    sem_t go;
    double waited_ms;
};

static void check(CUresult r, const char *call, int line)
{
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "unknown error";
    fprintf(stderr, "cudefer-demo: line %d: %s failed: %s (%d)\n", line, call, name, (int)r);
    exit(1);
}
#define CHECK(call) check((call), #call, __LINE__)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

/* Queues a kernel of ms milliseconds on s that keeps writing
 * [buf, buf + bytes) when buf is not 0. */
static CUresult launch(const struct demo *d, CUstream s, unsigned ms, CUdeviceptr buf,
                       size_t bytes)
{
    if (d->simulate)
        return d->simulate(s, ms * 1000u, buf, bytes, buf ? SIM_WRITE : SIM_NONE);
    uint64_t ns = (uint64_t)ms * 1000000u;
    uint64_t words = buf ? bytes / 4 : 0;
    void *params[] = {&ns, &buf, &words};
    return cuLaunchKernel(d->spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static void *launcher_main(void *arg)
{
    struct launcher *l = arg;
    CHECK(cuCtxSetCurrent(l->demo->ctx));
    while (sem_wait(&l->go) != 0)
        ;
    sleep_ms(LAUNCH_DELAY_MS);
    double t0 = now_ms();
    CHECK(launch(l->demo, l->demo->other_stream, 0, 0, 0));
    l->waited_ms = now_ms() - t0;
    return NULL;
}

static void describe(const struct demo *d, CUdevice dev)
{
    char name[256] = "";
    int version = 0;
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuDriverGetVersion(&version));
    if (d->simulate)
        printf("Driver:  the cudefer test driver, a simulated GPU (driver API %d.%d)\n",
               version / 1000, version % 1000 / 10);
    else
        printf("Driver:  the CUDA driver %d.%d on %s\n", version / 1000, version % 1000 / 10,
               name);
    if (d->cudefer)
        printf("cudefer: loaded (version %s)\n", d->cudefer);
    else
        printf("cudefer: not loaded\n");
}

static void open_demo(struct demo *d)
{
    CUdevice dev;
    int count = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    if (count < 1) {
        fprintf(stderr, "cudefer-demo: the driver reports no device\n");
        exit(1);
    }
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&d->ctx, dev));
    CHECK(cuCtxSetCurrent(d->ctx));
    d->simulate = (simulate_fn)dlsym(RTLD_DEFAULT, "testdrv_launch");
    version_fn version = (version_fn)dlsym(RTLD_DEFAULT, "cudefer_version");
    d->cudefer = version ? version() : NULL;
    if (!d->simulate) {
        CHECK(cuModuleLoadData(&d->module, cudefer_kernels_ptx));
        CHECK(cuModuleGetFunction(&d->spin, d->module, "cudefer_spin"));
    }
    CHECK(cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&d->other_stream, CU_STREAM_NON_BLOCKING));
    describe(d, dev);
}

/* One-time costs (the first launch on each stream, the first release in the
 * context) are paid here, outside the measurements. */
static void warm_up(const struct demo *d)
{
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 4096));
    CHECK(launch(d, d->stream, 1, p, 4096));
    CHECK(launch(d, d->other_stream, 1, 0, 0));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemFree(p));
    CHECK(cuCtxSynchronize());
}

static void close_demo(struct demo *d)
{
    CHECK(cuStreamDestroy(d->other_stream));
    CHECK(cuStreamDestroy(d->stream));
    if (d->module)
        CHECK(cuModuleUnload(d->module));
    CUdevice dev;
    CHECK(cuCtxGetDevice(&dev));
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease(dev));
}

struct row {
    const char *what;
    double ms;
    const char *note;
};

static void print_rows(const struct row *rows, size_t n)
{
    printf("\nA %d ms kernel runs on a non-blocking stream; meanwhile:\n", KERNEL_MS);
    printf("  %-52s %s\n", "call", "returned after");
    for (size_t i = 0; i < n; i++)
        printf("  %-52s %9.2f ms%s%s\n", rows[i].what, rows[i].ms, rows[i].note ? "  " : "",
               rows[i].note ? rows[i].note : "");
}

/* Counts the rows that waited for more than half the kernel. */
static int count_blocked(const struct row *rows, size_t n)
{
    int blocked = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].ms > KERNEL_MS / 2.0) {
            fprintf(stderr, "cudefer-demo: FAIL: with cudefer loaded, %s waited %.2f ms"
                    " (more than half of the %d ms kernel)\n", rows[i].what, rows[i].ms,
                    KERNEL_MS);
            blocked++;
        }
    }
    return blocked;
}

int main(int argc, char **argv)
{
    bool require_cudefer = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--require-cudefer") == 0) {
            require_cudefer = true;
        } else {
            fprintf(stderr, "usage: %s [--require-cudefer]\n", argv[0]);
            return 1;
        }
    }

    /* Lines appear in order with what cudefer prints on stderr at exit. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct demo d = {0};
    open_demo(&d);
    if (require_cudefer && !d.cudefer) {
        fprintf(stderr, "cudefer-demo: FAIL: cudefer is not loaded (LD_PRELOAD=libcudefer.so)\n");
        return 2;
    }
    warm_up(&d);

    CUdeviceptr unused, written;
    void *host;
    CHECK(cuMemAlloc(&unused, DEVICE_BYTES));
    CHECK(cuMemAlloc(&written, KERNEL_BUF_BYTES));
    CHECK(cuMemAllocHost(&host, HOST_BYTES));
    memset(host, 1, HOST_BYTES);

    struct launcher other = {.demo = &d};
    if (sem_init(&other.go, 0, 0) != 0) {
        perror("cudefer-demo: sem_init");
        return 1;
    }
    pthread_t thread;
    if (pthread_create(&thread, NULL, launcher_main, &other) != 0) {
        fprintf(stderr, "cudefer-demo: pthread_create failed\n");
        return 1;
    }

    /* First kernel: a release of memory it does not use, and another
     * thread's launch. */
    struct row rows[4];
    CHECK(launch(&d, d.stream, KERNEL_MS, written, KERNEL_BUF_BYTES));
    sem_post(&other.go);
    double t0 = now_ms();
    CHECK(cuMemFree(unused));
    rows[0] = (struct row){"cuMemFree of a buffer the kernel does not use", now_ms() - t0, NULL};
    pthread_join(thread, NULL);
    sem_destroy(&other.go);
    rows[1] = (struct row){"a launch from another thread, on its own stream", other.waited_ms,
                           NULL};

    /* The hazard cudefer must handle: freeing memory the kernel still writes. */
    CUresult running = cuStreamQuery(d.stream);
    if (running != CUDA_ERROR_NOT_READY)
        CHECK(running);
    t0 = now_ms();
    CHECK(cuMemFree(written));
    rows[2] = (struct row){"cuMemFree of the buffer the kernel keeps writing", now_ms() - t0,
                           running == CUDA_SUCCESS ? "(the kernel had already finished)"
                                                   : NULL};

    /* Second kernel: a release of pinned host memory. */
    CHECK(launch(&d, d.stream, KERNEL_MS, 0, 0));
    t0 = now_ms();
    CHECK(cuMemFreeHost(host));
    rows[3] = (struct row){"cuMemFreeHost of pinned host memory", now_ms() - t0, NULL};

    /* Every kernel must have finished cleanly; a buffer released under a
     * running kernel would show here as CUDA_ERROR_ILLEGAL_ADDRESS. */
    CHECK(cuCtxSynchronize());
    faults_fn faults = (faults_fn)dlsym(RTLD_DEFAULT, "testdrv_faults");
    if (faults && faults() != 0) {
        fprintf(stderr, "cudefer-demo: FAIL: the test driver saw %llu use(s) of freed memory\n",
                (unsigned long long)faults());
        return 1;
    }
    close_demo(&d);

    print_rows(rows, sizeof rows / sizeof rows[0]);
    printf("All kernels finished cleanly.\n\n");
    printf("cuMemFree returned after %.2f ms; another thread's launch waited %.2f ms.\n",
           rows[0].ms, rows[1].ms);
    if (d.cudefer && count_blocked(rows, sizeof rows / sizeof rows[0]) > 0)
        return 2;
    return 0;
}
