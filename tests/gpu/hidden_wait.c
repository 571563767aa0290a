/* hidden_wait.c - check 9: an allocation must not wait for the GPU on
 * behalf of releases made earlier.
 *
 * Releases are made while the GPU is idle (with cudefer they are then
 * queued or cached, their fences passed); then a cudefer_wait_flag kernel
 * starts, which spins until a host flag is set; then the same thread
 * allocates, and only then sets the flag. If the allocation waited for the
 * GPU (a flush of the queue that really releases pinned memory waits for
 * every kernel of the context) it would wait for the kernel, which waits
 * for this thread: a watchdog sets the flag after 5 s so that the program
 * ends either way, and reports whether it had to. The driver alone
 * allocates in about 0.3 ms.
 *
 * usage: hidden_wait <case>
 *   pinned          two 160 MiB cuMemAllocHost blocks freed (with cudefer
 *                   320 MiB queued, over the default 256 MiB limit of
 *                   CUDEFER_MAX_DEFERRED_BYTES); then cuMemAlloc(1 MiB)
 *   device-cache    a 64 MiB cuMemAlloc block freed (kept in cudefer's
 *                   device cache); then cuMemAlloc(48 MiB), another size
 *   second-context  as pinned in the primary context; then cuMemAlloc(1 MiB)
 *                   in a second context (cuCtxCreate'd before the kernel)
 *   other-context-sync
 *                   the flag kernel runs in a second context; the primary
 *                   context, idle, releases a 1 MiB device block, and the
 *                   measured call is its cuCtxSynchronize (alloc_ms is that
 *                   call's time): the driver's waits for the primary
 *                   context's work only, and cudefer's fence of the release
 *                   (which covers every context it knows) must not make it
 *                   wait for the other context's kernel
 *   register-over   the second context registers a page and unregisters it
 *                   while idle (with cudefer the unregister is pending),
 *                   then runs the flag kernel; the primary context
 *                   unregisters a page of its own and registers it again
 *                   (alloc_ms: that registration): cudefer makes that
 *                   page's pending unregister first, and must not make the
 *                   other context's, whose driver unregister waits for all
 *                   of that context's work, the flag kernel included
 *   oom-other       the flag kernel runs in the second context; the primary
 *                   context allocates a block of an eighth of the free
 *                   memory, then smaller blocks until the device is full,
 *                   and releases the first block (with cudefer its fence
 *                   has a record of the second context, behind the flag
 *                   kernel); the measured call is cuMemAlloc of half that
 *                   block's size: out of memory but for that block. The
 *                   driver freed it at its release (its own context was
 *                   idle); cudefer must give it back without waiting for
 *                   the other context's kernel for long
 *   oom-kind        a pinned block allocated while the GPU is idle; the flag
 *                   kernel starts; another thread frees the block (the
 *                   driver's cuMemFreeHost waits there for the kernel, which
 *                   waits for this thread); this thread asks cuMemAlloc for
 *                   twice the device's memory (alloc_rc must be
 *                   CUDA_ERROR_OUT_OF_MEMORY). Without cudefer that call
 *                   waits behind the other thread's cuMemFreeHost until the
 *                   watchdog (bench/RESULTS.md, run 98); with cudefer the
 *                   release returns at once, and pinned memory cannot serve
 *                   a device allocation, so the allocation must not wait for
 *                   that block's fence before answering
 *   oom-managed     as oom-kind with a 4 MiB managed block written by a
 *                   kernel: the H200 moves managed pages out of its memory
 *                   for a device allocation itself (run 99), so their
 *                   release cannot serve one either
 *
 * prints:
 *   RESULT hidden_wait case=<case> alloc_rc=<code> alloc_ms=<ms>
 *          kernel_waiting=<0|1> watchdog_fired=<0|1> sync_rc=<code>
 *          cudefer=<0|1> simulated=<0|1>
 * kernel_waiting: the flag kernel was running just before the allocation
 * (else the row means nothing).
 */
#include "gpu.h"

#define PINNED_BYTES (160 * GC_MIB)
#define CACHED_BYTES (64 * GC_MIB)
#define WATCHDOG_MS 5000.0

static struct gc_kernels kernels;
static struct gc_flag flag;
static CUstream stream; /* the flag kernel's, in the primary context */

/* Two pinned blocks freed while the GPU is idle. */
static void free_pinned_while_idle(void)
{
    void *a, *b;
    GC_CHECK(cuMemAllocHost(&a, PINNED_BYTES));
    GC_CHECK(cuMemAllocHost(&b, PINNED_BYTES));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuMemFreeHost(a));
    GC_CHECK(cuMemFreeHost(b));
}

/* A device block freed while the GPU is idle. */
static void free_device_while_idle(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAlloc(&p, CACHED_BYTES));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuMemFree(p));
}

/* A context of device 0 made and set up before the kernel (its first
 * allocation done and released), then popped: the primary is current. */
static CUcontext second_context(void)
{
    CUdevice dev;
    CUcontext ctx, popped;
    CUdeviceptr p;
    GC_CHECK(cuDeviceGet(&dev, 0));
    GC_CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    GC_CHECK(cuMemAlloc(&p, 2 * GC_MIB));
    GC_CHECK(cuMemFree(p));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuCtxPopCurrent(&popped));
    return ctx;
}

/* Starts the flag kernel on s; whether it is still running 20 ms later
 * (it waits for the flag). */
static bool start_flag_kernel(const struct gc_kernels *k, CUstream s)
{
    GC_CHECK(gc_wait_flag(k, s, flag.dev));
    gc_sleep_ms(20);
    return cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
}

/* The case's RESULT line; ms is the measured call's time. */
static void print_result(const char *name, CUresult rc, double ms, bool waiting, bool fired,
                         CUresult sync)
{
    printf("RESULT hidden_wait case=%s alloc_rc=%s alloc_ms=%.4f kernel_waiting=%d", name,
           gc_rc(rc), ms, (int)waiting);
    printf(" watchdog_fired=%d sync_rc=%s cudefer=%d simulated=%d\n", (int)fired, gc_rc(sync),
           gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
}

/* Pages of the register-over case. */
static char pages[2 * 4096] __attribute__((aligned(4096)));

/* The primary context's part of a case whose flag kernel runs in the
 * second context: what it does before the measured call, and that call. */
static void release_a_block(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAlloc(&p, GC_MIB));
    GC_CHECK(cuMemFree(p));
}

static CUresult synchronize(void)
{
    return cuCtxSynchronize();
}

static void unregister_mine(void)
{
    GC_CHECK(cuMemHostRegister(pages, 4096, 0));
    GC_CHECK(cuMemHostUnregister(pages));
}

static CUresult register_mine(void)
{
    return cuMemHostRegister(pages, 4096, 0);
}

/* The blocks that fill the device in oom-other, and the one it measures. */
#define FILLERS 512
static CUdeviceptr fillers[FILLERS], big;
static int nfillers;

static size_t big_bytes;

/* An eighth of the free memory (17 GiB on an H200), then blocks of a
 * quarter and a sixty-fourth of that until the device is full; the first
 * block released. */
static void fill_then_release(void)
{
    size_t free_bytes = 0, total = 0;
    GC_CHECK(cuMemGetInfo(&free_bytes, &total));
    size_t x_bytes = free_bytes / 8 / (2 * GC_MIB) * (2 * GC_MIB);
    big_bytes = x_bytes / 2;
    CUdeviceptr x;
    GC_CHECK(cuMemAlloc(&x, x_bytes));
    size_t sizes[] = {x_bytes / 4, x_bytes / 64};
    for (int k = 0; k < 2; k++)
        while (nfillers < FILLERS && cuMemAlloc(&fillers[nfillers], sizes[k]) == CUDA_SUCCESS)
            nfillers++;
    GC_CHECK(cuMemFree(x));
}

static CUresult allocate_big(void)
{
    return cuMemAlloc(&big, big_bytes);
}

/* What the measured calls left, once the flag kernel has ended. */
static void unregister_mine_again(CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemHostUnregister(pages));
}

static void free_big_and_fillers(CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemFree(big));
    while (nfillers > 0)
        GC_CHECK(cuMemFree(fillers[--nfillers]));
}

/* The second context's part of register-over, before its kernel: a page
 * unregistered while it is idle. */
static void unregister_theirs(void)
{
    GC_CHECK(cuMemHostRegister(pages + 4096, 4096, 0));
    GC_CHECK(cuMemHostUnregister(pages + 4096));
}

/* A case whose flag kernel, its flag and its stream are the second
 * context's: there, before the kernel starts, set_up (may be NULL); then in
 * the primary context prepare, the measured call, and once the kernel has
 * ended undo, given the call's result (may be NULL). */
struct other_case {
    void (*set_up)(void);
    void (*prepare)(void);
    CUresult (*measured)(void);
    void (*undo)(CUresult rc);
};

static const struct other_case other_context_sync = {NULL, release_a_block, synchronize, NULL};
static const struct other_case register_over = {unregister_theirs, unregister_mine,
                                                register_mine, unregister_mine_again};
static const struct other_case oom_other = {NULL, fill_then_release, allocate_big,
                                            free_big_and_fillers};

static int in_the_other_context(const char *name, CUcontext ctx2, const struct other_case *oc)
{
    CUcontext popped;
    struct gc_kernels k2;
    CUstream s2;
    GC_CHECK(cuCtxPushCurrent(ctx2));
    gc_load_kernels(&k2);
    GC_CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    if (oc->set_up)
        oc->set_up();
    gc_flag_init(&flag);
    bool waiting = start_flag_kernel(&k2, s2);
    GC_CHECK(cuCtxPopCurrent(&popped));

    oc->prepare();
    gc_flag_arm(&flag, WATCHDOG_MS);
    double t0 = gc_now_ms();
    CUresult rc = oc->measured();
    double ms = gc_now_ms() - t0;
    gc_flag_set(&flag);
    bool fired = gc_flag_disarm(&flag);

    GC_CHECK(cuCtxPushCurrent(ctx2));
    CUresult sync = cuCtxSynchronize();
    print_result(name, rc, ms, waiting, fired, sync);
    if (sync != CUDA_SUCCESS)
        return 0;
    gc_flag_free(&flag);
    GC_CHECK(cuStreamDestroy(s2));
    GC_CHECK(cuModuleUnload(k2.module));
    GC_CHECK(cuCtxPopCurrent(&popped));
    GC_CHECK(cuCtxDestroy(ctx2));
    if (oc->undo)
        oc->undo(rc);
    GC_CHECK(cuStreamDestroy(stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}

/* oom-kind's and oom-managed's other thread: frees the block in the
 * primary context. */
struct elsewhere_release {
    CUcontext ctx;
    void *pinned;
    CUdeviceptr managed;
};

static void *free_elsewhere(void *arg)
{
    struct elsewhere_release *er = arg;
    GC_CHECK(cuCtxSetCurrent(er->ctx));
    if (er->pinned)
        GC_CHECK(cuMemFreeHost(er->pinned));
    if (er->managed)
        GC_CHECK(cuMemFree(er->managed));
    return NULL;
}

/* Twice the device's memory: more than it can ever give. */
static size_t beyond_the_device(void)
{
    size_t free_bytes = 0, total = 0;
    GC_CHECK(cuMemGetInfo(&free_bytes, &total));
    return 2 * total;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        gc_die("usage: hidden_wait <pinned|device-cache|second-context|other-context-sync|"
               "register-over|oom-other|oom-kind|oom-managed>");
    const char *name = argv[1];
    bool pinned = strcmp(name, "pinned") == 0;
    bool cache = strcmp(name, "device-cache") == 0;
    bool other = strcmp(name, "second-context") == 0;
    bool xsync = strcmp(name, "other-context-sync") == 0;
    bool reg = strcmp(name, "register-over") == 0;
    bool oom = strcmp(name, "oom-other") == 0;
    bool managed = strcmp(name, "oom-managed") == 0;
    bool kind = strcmp(name, "oom-kind") == 0 || managed;
    if (!pinned && !cache && !other && !xsync && !reg && !oom && !kind)
        gc_die("unknown case '%s'", name);

    gc_init();
    gc_load_kernels(&kernels);
    GC_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (!xsync && !reg && !oom)
        gc_flag_init(&flag);
    /* Warm-up: the first launch on the stream, a first allocation. */
    CUdeviceptr warm;
    GC_CHECK(cuMemAlloc(&warm, GC_MIB));
    GC_CHECK(gc_touch(&kernels, stream, warm, 16));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuMemFree(warm));
    GC_CHECK(cuCtxSynchronize());

    CUcontext ctx2 = other || xsync || reg || oom ? second_context() : NULL;
    if (pinned || other)
        free_pinned_while_idle();
    if (cache)
        free_device_while_idle();
    struct elsewhere_release er = {NULL, NULL, 0};
    pthread_t releaser;
    if (kind) {
        GC_CHECK(cuCtxGetCurrent(&er.ctx));
        if (managed) {
            GC_CHECK(cuMemAllocManaged(&er.managed, 4 * GC_MIB, CU_MEM_ATTACH_GLOBAL));
            GC_CHECK(gc_fill(&kernels, stream, er.managed, 4 * GC_MIB));
        } else {
            GC_CHECK(cuMemAllocHost(&er.pinned, 4 * GC_MIB));
        }
        GC_CHECK(cuCtxSynchronize());
    }
    if (xsync || reg || oom)
        return in_the_other_context(name, ctx2,
                                    xsync ? &other_context_sync
                                    : reg ? &register_over
                                          : &oom_other);

    bool waiting = start_flag_kernel(&kernels, stream);
    gc_flag_arm(&flag, WATCHDOG_MS);
    if (other)
        GC_CHECK(cuCtxPushCurrent(ctx2));
    size_t bytes = cache ? 48 * GC_MIB : GC_MIB;
    if (kind) {
        bytes = beyond_the_device();
        if (pthread_create(&releaser, NULL, free_elsewhere, &er) != 0)
            gc_die("pthread_create failed");
        gc_sleep_ms(20); /* the release is made (or, without cudefer, waits) */
    }

    CUdeviceptr p = 0;
    double t0 = gc_now_ms();
    CUresult rc = cuMemAlloc(&p, bytes);
    double alloc_ms = gc_now_ms() - t0;
    gc_flag_set(&flag);
    bool fired = gc_flag_disarm(&flag);
    if (kind)
        pthread_join(releaser, NULL);

    if (other) {
        CUcontext popped;
        GC_CHECK(cuCtxPopCurrent(&popped));
    }
    CUresult sync = cuCtxSynchronize();
    print_result(name, rc, alloc_ms, waiting, fired, sync);
    if (sync != CUDA_SUCCESS)
        return 0;

    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemFree(p)); /* a block of ctx2 too: cuMemFree needs no current context */
    if (ctx2)
        GC_CHECK(cuCtxDestroy(ctx2));
    gc_flag_free(&flag);
    GC_CHECK(cuStreamDestroy(stream));
    GC_CHECK(cuModuleUnload(kernels.module));
    gc_fini();
    return 0;
}
