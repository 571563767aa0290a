/* teardown_race.c - check 10: contexts made and destroyed while another
 * thread keeps flushing every context.
 *
 * Thread A loops until thread B is done: cuMemAlloc of more bytes than the
 * device has (each out-of-memory answer makes cudefer release the queues of
 * every context and retry) and cudefer_flush() (looked up with dlsym;
 * absent without cudefer). Thread B, 20 times: cuCtxCreate, 32 x
 * cuMemAllocHost(64 KiB), a short cudefer_touch kernel writing the first
 * block, 32 x cuMemFreeHost, cuCtxDestroy. A flush that still walks a
 * context B destroys, or teardown that races a flush, shows as a crash or
 * as an error of one of B's calls.
 *
 * usage: teardown_race
 *
 * prints:
 *   RESULT teardown_race rounds=<n> b_calls=<n> b_errors=<n>
 *          first_error=<call:code|-> a_allocs=<n> a_oom=<n> a_other=<n>
 *          a_flushes=<n> cudefer=<0|1> simulated=<0|1>
 */
#include "gpu.h"

#define ROUNDS 20
#define BLOCKS 32
#define BLOCK_BYTES (64 * GC_KIB)

static CUdevice device;
static CUcontext primary;
static CUkernel touch; /* of a library: loaded into each context at its first use */

static struct {
    _Atomic bool b_done;
    long allocs, oom, other, flushes;
} a;

static struct {
    long calls, errors;
    char first_error[96];
} b = {.first_error = "-"};

/* Thread A: out-of-memory answers and flushes until B is done. */
static void *thread_a(void *arg)
{
    (void)arg;
    GC_CHECK(cuCtxSetCurrent(primary));
    size_t total;
    GC_CHECK(cuDeviceTotalMem(&total, device));
    int (*flush)(void) = NULL;
    *(void **)&flush = dlsym(RTLD_DEFAULT, "cudefer_flush");
    while (!atomic_load(&a.b_done)) {
        CUdeviceptr p;
        CUresult rc = cuMemAlloc(&p, total + GC_GIB);
        a.allocs++;
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            a.oom++;
        else if (rc == CUDA_SUCCESS)
            GC_CHECK(cuMemFree(p));
        else
            a.other++;
        if (flush) {
            flush();
            a.flushes++;
        }
        gc_sleep_ms(0.5);
    }
    return NULL;
}

/* One call of B: counted, and the first error kept. */
static bool b_call(const char *what, CUresult rc)
{
    b.calls++;
    if (rc == CUDA_SUCCESS)
        return true;
    if (b.errors++ == 0)
        snprintf(b.first_error, sizeof b.first_error, "%s:%s", what, gc_rc(rc));
    return false;
}

static void b_round(void)
{
    CUcontext ctx;
    void *blocks[BLOCKS] = {0};
    if (!b_call("cuCtxCreate", cuCtxCreate(&ctx, NULL, 0, device)))
        return;
    for (int i = 0; i < BLOCKS; i++)
        b_call("cuMemAllocHost", cuMemAllocHost(&blocks[i], BLOCK_BYTES));
    CUdeviceptr dev = 0;
    CUfunction f;
    if (blocks[0] &&
        b_call("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer(&dev, blocks[0], 0)) &&
        b_call("cuKernelGetFunction", cuKernelGetFunction(&f, touch)))
        b_call("cuLaunchKernel", gc_touch_with(f, NULL, dev, 16));
    for (int i = 0; i < BLOCKS; i++)
        if (blocks[i])
            b_call("cuMemFreeHost", cuMemFreeHost(blocks[i]));
    b_call("cuCtxDestroy", cuCtxDestroy(ctx));
}

int main(void)
{
    primary = gc_init();
    GC_CHECK(cuCtxGetDevice(&device));
    CUlibrary lib;
    GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&touch, lib, "cudefer_touch"));

    pthread_t ta;
    if (pthread_create(&ta, NULL, thread_a, NULL) != 0)
        gc_die("pthread_create failed");
    for (int round = 0; round < ROUNDS; round++)
        b_round();
    atomic_store(&a.b_done, true);
    pthread_join(ta, NULL);

    printf("RESULT teardown_race rounds=%d b_calls=%ld b_errors=%ld first_error=%s", ROUNDS,
           b.calls, b.errors, b.first_error);
    printf(" a_allocs=%ld a_oom=%ld a_other=%ld a_flushes=%ld cudefer=%d simulated=%d\n",
           a.allocs, a.oom, a.other, a.flushes, gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);

    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuLibraryUnload(lib));
    gc_fini();
    return 0;
}
