/* facts.c - measures the driver behaviour that cudefer and its test driver
 * rely on, where the driver documentation is silent or vague. One fact per
 * subcommand, one process each (a dead green context can crash the next
 * call). Run without cudefer: these are facts about the driver.
 *
 * usage: facts <name>
 *   green        green contexts: handles, what a record on the primary and
 *                on the green context covers, who owns memory allocated in
 *                one, what its destruction waits for and frees, and the
 *                primary context's state around it
 *   green-dead   calls that name a destroyed green context's CUcontext
 *   register     whether a context's destruction undoes a registration
 *   managed      64 MiB managed blocks touched in full by a kernel: first
 *                touch, touch of a block touched before, and loops
 *   pinned       64 MiB pinned blocks: allocation, release, full touch, loops
 *   fence        what one fence costs on the host
 *   freed        what the driver answers for memory already freed: a second
 *                release, stream-ordered or not, and pointer queries
 *   query        what a pointer query costs on live memory (what an exact
 *                answer for blocks cudefer holds would add to each)
 *   vmm          what the virtual memory calls (cuMemAddressReserve,
 *                cuMemCreate, cuMemMap, cuMemSetAccess; cuMemUnmap,
 *                cuMemRelease, cuMemAddressFree) cost on an idle GPU, and
 *                whether the releasing ones wait for a kernel that runs on
 *                another stream (cuMemFree beside them, which does)
 *   capture      which of the engine's calls, made by a thread in the
 *                relaxed capture mode, invalidate another thread's global
 *                capture: in the capturing context and in another context
 *                of the same device (a write of a host-mapped word behind
 *                a fence among them, and the making of such a word)
 *   beside       whether a call that returns at once (cuGreenCtxDestroy, a
 *                cuDevicePrimaryCtxRelease that is not the last,
 *                cuStreamQuery) waits while another thread's cuMemFreeHost
 *                waits for a 300 ms kernel of the primary context
 *   word         a number the GPU writes into a host-mapped word after a
 *                fence (cuStreamWaitEvent, cuStreamWriteValue32 on a stream
 *                of its own): the calls' cost, and how long after the
 *                fence's event the host sees it (never before)
 *   sizes        from which size a cuMemFree of cuMemAlloc memory waits for
 *                a kernel that runs on another stream (and does not touch
 *                the block): each size alone, and beside a live block of
 *                the same size allocated just before it
 *   hostpool     pinned host memory from a pool (cuMemPoolCreate, location
 *                HOST) beside cuMemAllocHost's and cuMemHostAlloc's: every
 *                query, copy and kernel access on each (the conformance
 *                table a pool behind cuMemAllocHost would have to answer
 *                for), the pool's reuse attributes, and whether a block
 *                freed behind a running kernel comes back, on the same
 *                stream or another, while that kernel still writes it
 *   xctx         whether a kernel of another context of the same device can
 *                write memory of the primary context: pages registered
 *                there (DEVICEMAP, with and without PORTABLE), pageable
 *                pages never registered, cuMemAllocHost and cuMemAlloc
 *                memory; and whether the driver's cuMemHostUnregister of
 *                PORTABLE pages waits for another context's kernel that
 *                writes them (what an unregister must wait for)
 *   evict        whether device memory that managed blocks occupy serves a
 *                cuMemAlloc that fits only without them (the driver moving
 *                managed pages out), and whether their contents survive
 *   unmapped     pages registered and then unmapped by the program before
 *                the driver's unregister (what a program that frees its
 *                buffer after cuMemHostUnregister does while cudefer holds
 *                that unregister): what the driver answers and where a
 *                kernel's writes land when the program maps new pages at
 *                the same address, and when cuMemAllocHost hands that
 *                address out
 *
 * prints RESULT lines (bench/gpu.h).
 */
#include "gpu.h"

#include <pthread.h>
#include <sys/mman.h>
#include <stdbool.h>

static struct gc_kernels kernels;
static CUfunction fill; /* cudefer_fill(u64 buf, u64 words), every thread */

static void load_kernels(void)
{
    gc_load_kernels(&kernels);
    GC_CHECK(cuModuleGetFunction(&fill, kernels.module, "cudefer_fill"));
}

/* Writes every word of buf once, with 264 x 256 threads. */
static CUresult fill_all(CUstream s, CUdeviceptr buf, size_t bytes)
{
    unsigned long long words = bytes / 4;
    void *args[] = {&buf, &words};
    return cuLaunchKernel(fill, 264, 1, 1, 256, 1, 1, 0, s, args, NULL);
}

static double event_wait_ms(CUevent ev)
{
    double t0 = gc_now_ms();
    GC_CHECK(cuEventSynchronize(ev));
    return gc_now_ms() - t0;
}

/* ---- green contexts ------------------------------------------------------ */

static CUgreenCtx make_green(CUdevice dev)
{
    CUdevResource all, groups[2], rest;
    unsigned n = 1;
    GC_CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    GC_CHECK(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0,
                                         all.sm.smCount / 4 ? all.sm.smCount / 4 : 1));
    CUdevResourceDesc desc;
    GC_CHECK(cuDevResourceGenerateDesc(&desc, groups, 1));
    CUgreenCtx g;
    GC_CHECK(cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    return g;
}

static void primary_state(const char *when, CUdevice dev)
{
    unsigned flags = 0;
    int active = -1;
    CUresult rc = cuDevicePrimaryCtxGetState(dev, &flags, &active);
    printf("RESULT green_primary_state when=%s rc=%s active=%d\n", when, gc_rc(rc), active);
}

static int fact_green(void)
{
    CUcontext primary = gc_init();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    load_kernels();
    primary_state("before_green", dev);
    CUgreenCtx g = make_green(dev);
    primary_state("after_create", dev);
    CUcontext gctx = NULL;
    GC_CHECK(cuCtxFromGreenCtx(&gctx, g));
    CUcontext gctx2 = NULL;
    GC_CHECK(cuCtxFromGreenCtx(&gctx2, g));
    unsigned ver_p = 0, ver_g = 0;
    cuCtxGetApiVersion(primary, &ver_p);
    cuCtxGetApiVersion(gctx, &ver_g);
    printf("RESULT green_handles same_as_primary=%d stable=%d api_primary=%u api_green=%u\n",
           gctx == primary, gctx == gctx2, ver_p, ver_g);

    CUstream gs, ps;
    GC_CHECK(cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
    GC_CHECK(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
    CUcontext of_gs = NULL;
    CUresult rc = cuStreamGetCtx(gs, &of_gs);
    printf("RESULT green_stream_ctx rc=%s is_green=%d is_primary=%d\n", gc_rc(rc),
           of_gs == gctx, of_gs == primary);

    /* Memory allocated with the green context current. */
    GC_CHECK(cuCtxSetCurrent(gctx));
    CUcontext cur = NULL;
    cuCtxGetCurrent(&cur);
    CUdeviceptr d = 0, d2 = 0;
    GC_CHECK(cuMemAlloc(&d, GC_MIB));
    GC_CHECK(cuMemAlloc(&d2, GC_MIB));
    void *h = NULL;
    GC_CHECK(cuMemAllocHost(&h, GC_MIB));
    CUcontext owner = NULL;
    rc = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d);
    printf("RESULT green_alloc current_is_green=%d owner_rc=%s owner_is_green=%d "
           "owner_is_primary=%d\n", cur == gctx, gc_rc(rc), owner == gctx, owner == primary);
    CUevent ev;
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

    /* A kernel of the primary context's module, on a green stream. */
    rc = gc_spin(&kernels, gs, 1.0, 0, 0);
    printf("RESULT green_launch_primary_module rc=%s\n", gc_rc(rc));
    GC_CHECK(cuCtxSynchronize());

    /* Record on the primary while a green stream runs 400 ms. */
    GC_CHECK(cuCtxSetCurrent(primary));
    GC_CHECK(gc_spin(&kernels, gs, 400.0, 0, 0));
    gc_sleep_ms(20);
    rc = cuCtxRecordEvent(primary, ev);
    double ms = rc == CUDA_SUCCESS ? event_wait_ms(ev) : -1;
    printf("RESULT green_record_primary_covers_green rc=%s wait_ms=%.1f\n", gc_rc(rc), ms);
    GC_CHECK(cuCtxSynchronize());

    /* Record on the green context while a primary stream runs 400 ms. */
    GC_CHECK(gc_spin(&kernels, ps, 400.0, 0, 0));
    gc_sleep_ms(20);
    GC_CHECK(cuEventDestroy(ev));
    GC_CHECK(cuCtxSetCurrent(gctx));
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    rc = cuCtxRecordEvent(gctx, ev);
    ms = rc == CUDA_SUCCESS ? event_wait_ms(ev) : -1;
    printf("RESULT green_record_green_covers_primary rc=%s wait_ms=%.1f\n", gc_rc(rc), ms);
    CUevent ev2;
    GC_CHECK(cuEventCreate(&ev2, CU_EVENT_DISABLE_TIMING));
    rc = cuGreenCtxRecordEvent(g, ev2);
    ms = rc == CUDA_SUCCESS ? event_wait_ms(ev2) : -1;
    printf("RESULT green_greenrecord_covers_primary rc=%s wait_ms=%.1f\n", gc_rc(rc), ms);
    GC_CHECK(cuCtxSetCurrent(primary));
    GC_CHECK(cuCtxSynchronize());

    /* Green record covering green work. */
    GC_CHECK(gc_spin(&kernels, gs, 300.0, 0, 0));
    gc_sleep_ms(20);
    GC_CHECK(cuCtxSetCurrent(gctx));
    rc = cuCtxRecordEvent(gctx, ev);
    ms = rc == CUDA_SUCCESS ? event_wait_ms(ev) : -1;
    printf("RESULT green_record_green_covers_green rc=%s wait_ms=%.1f\n", gc_rc(rc), ms);
    GC_CHECK(cuCtxSetCurrent(primary));
    GC_CHECK(cuCtxSynchronize());

    /* cuMemFree of green-allocated memory while a green kernel runs, and
     * a launch on a primary stream meanwhile. */
    GC_CHECK(gc_spin(&kernels, gs, 400.0, 0, 0));
    gc_sleep_ms(20);
    double t0 = gc_now_ms();
    rc = cuMemFree(d2);
    printf("RESULT green_free_under_green_kernel rc=%s ms=%.1f\n", gc_rc(rc),
           gc_now_ms() - t0);
    GC_CHECK(cuCtxSynchronize());

    /* Destroying the green context while its kernel runs. */
    GC_CHECK(gc_spin(&kernels, gs, 400.0, 0, 0));
    gc_sleep_ms(20);
    GC_CHECK(cuStreamDestroy(gs));
    t0 = gc_now_ms();
    rc = cuGreenCtxDestroy(g);
    printf("RESULT green_destroy_under_kernel rc=%s ms=%.1f\n", gc_rc(rc), gc_now_ms() - t0);
    primary_state("after_destroy", dev);
    GC_CHECK(cuCtxSynchronize());

    /* The green-allocated memory after the green context is gone. */
    rc = cuMemsetD8(d, 7, GC_MIB);
    CUresult sync = cuCtxSynchronize();
    owner = NULL;
    CUresult orc = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d);
    size_t free_before = 0, free_after = 0, total = 0;
    cuMemGetInfo(&free_before, &total);
    CUresult frc = cuMemFree(d);
    CUresult hrc = cuMemFreeHost(h);
    cuMemGetInfo(&free_after, &total);
    printf("RESULT green_memory_after_destroy memset_rc=%s sync_rc=%s owner_rc=%s "
           "owner_is_primary=%d free_rc=%s freehost_rc=%s\n", gc_rc(rc), gc_rc(sync),
           gc_rc(orc), owner == primary, gc_rc(frc), gc_rc(hrc));

    /* A green context holds a reference on the primary context. */
    GC_CHECK(cuCtxSetCurrent(NULL));
    CUgreenCtx g2 = make_green(dev);
    GC_CHECK(cuDevicePrimaryCtxRelease(dev));
    primary_state("program_released_green_alive", dev);
    CUcontext g2ctx = NULL;
    GC_CHECK(cuCtxFromGreenCtx(&g2ctx, g2));
    GC_CHECK(cuCtxSetCurrent(g2ctx));
    CUdeviceptr d3 = 0;
    rc = cuMemAlloc(&d3, GC_MIB);
    printf("RESULT green_alloc_without_program_primary rc=%s\n", gc_rc(rc));
    GC_CHECK(cuCtxSetCurrent(NULL));
    rc = cuGreenCtxDestroy(g2);
    printf("RESULT green_destroy_last rc=%s\n", gc_rc(rc));
    primary_state("after_last_green", dev);
    return 0;
}

static int fact_green_dead(void)
{
    CUcontext primary = gc_init();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    CUgreenCtx g = make_green(dev);
    CUcontext gctx = NULL;
    GC_CHECK(cuCtxFromGreenCtx(&gctx, g));
    CUevent ev;
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(cuGreenCtxDestroy(g));
    fflush(stdout);
    CUresult rc = cuCtxRecordEvent(gctx, ev);
    printf("RESULT green_dead_record rc=%s\n", gc_rc(rc));
    fflush(stdout);
    unsigned v = 0;
    rc = cuCtxGetApiVersion(gctx, &v);
    printf("RESULT green_dead_api_version rc=%s\n", gc_rc(rc));
    fflush(stdout);
    rc = cuCtxPushCurrent(gctx);
    printf("RESULT green_dead_push rc=%s\n", gc_rc(rc));
    CUcontext popped;
    if (rc == CUDA_SUCCESS)
        cuCtxPopCurrent(&popped);
    (void)primary;
    return 0;
}

/* ---- registrations and context destruction -------------------------------- */

static int fact_register(void)
{
    GC_CHECK(cuInit(0));
    CUdevice dev;
    GC_CHECK(cuDeviceGet(&dev, 0));
    void *buf = gc_xpages(4 * GC_MIB);
    CUcontext a, b;
    GC_CHECK(cuCtxCreate(&a, NULL, 0, dev));
    GC_CHECK(cuMemHostRegister(buf, 4 * GC_MIB, CU_MEMHOSTREGISTER_DEVICEMAP));
    GC_CHECK(cuCtxDestroy(a));
    GC_CHECK(cuCtxCreate(&b, NULL, 0, dev));
    CUresult un = cuMemHostUnregister(buf);
    CUresult re = cuMemHostRegister(buf, 4 * GC_MIB, CU_MEMHOSTREGISTER_DEVICEMAP);
    printf("RESULT register_after_ctx_destroy unregister_rc=%s register_again_rc=%s\n",
           gc_rc(un), gc_rc(re));
    if (re == CUDA_SUCCESS)
        cuMemHostUnregister(buf);
    GC_CHECK(cuCtxDestroy(b));

    /* The primary context, reset. */
    CUcontext p;
    GC_CHECK(cuDevicePrimaryCtxRetain(&p, dev));
    GC_CHECK(cuCtxSetCurrent(p));
    GC_CHECK(cuMemHostRegister(buf, 4 * GC_MIB, CU_MEMHOSTREGISTER_DEVICEMAP));
    GC_CHECK(cuDevicePrimaryCtxReset(dev));
    GC_CHECK(cuDevicePrimaryCtxRetain(&p, dev));
    GC_CHECK(cuCtxSetCurrent(p));
    re = cuMemHostRegister(buf, 4 * GC_MIB, CU_MEMHOSTREGISTER_DEVICEMAP);
    printf("RESULT register_after_primary_reset register_again_rc=%s\n", gc_rc(re));
    return 0;
}

/* ---- reclaim: managed and pinned 64 MiB ----------------------------------- */

#define BIG (64 * GC_MIB)
#define RING 6

/* Runs iters of: take a block (ring: wait for the event of its last use),
 * fill it on s, record its event. Returns us per iteration. */
static double ring_loop(CUstream s, CUdeviceptr *blocks, CUevent *evs, int nblocks, int iters)
{
    double t0 = gc_now_ms();
    for (int i = 0; i < iters; i++) {
        int k = i % nblocks;
        GC_CHECK(cuEventSynchronize(evs[k]));
        GC_CHECK(fill_all(s, blocks[k], BIG));
        GC_CHECK(cuEventRecord(evs[k], s));
    }
    GC_CHECK(cuCtxSynchronize());
    return (gc_now_ms() - t0) * 1e3 / iters;
}

static double one_fill_ms(CUstream s, CUdeviceptr d)
{
    double t0 = gc_now_ms();
    GC_CHECK(fill_all(s, d, BIG));
    GC_CHECK(cuStreamSynchronize(s));
    return gc_now_ms() - t0;
}

static int fact_managed(void)
{
    gc_init();
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    double t0 = gc_now_ms();
    GC_CHECK(cuMemAllocManaged(&d, BIG, CU_MEM_ATTACH_GLOBAL));
    double alloc_ms = gc_now_ms() - t0;
    double first = one_fill_ms(s, d), second = one_fill_ms(s, d), third = one_fill_ms(s, d);
    memset((void *)d, 1, 4096);
    double after_host = one_fill_ms(s, d);
    t0 = gc_now_ms();
    GC_CHECK(cuMemFree(d));
    double free_ms = gc_now_ms() - t0;
    printf("RESULT managed_block alloc_ms=%.2f fill_first_ms=%.2f fill_second_ms=%.2f "
           "fill_third_ms=%.2f fill_after_host_page_ms=%.2f free_idle_ms=%.2f\n", alloc_ms, first,
           second, third, after_host, free_ms);

    /* The driver's loop. */
    int iters = 20;
    t0 = gc_now_ms();
    for (int i = 0; i < iters; i++) {
        GC_CHECK(cuMemAllocManaged(&d, BIG, CU_MEM_ATTACH_GLOBAL));
        GC_CHECK(fill_all(s, d, BIG));
        GC_CHECK(cuMemFree(d));
    }
    GC_CHECK(cuCtxSynchronize());
    double driver_us = (gc_now_ms() - t0) * 1e3 / iters;

    /* Reuse of a ring of blocks, each waited for. */
    CUdeviceptr blocks[RING];
    CUevent evs[RING];
    for (int k = 0; k < RING; k++) {
        GC_CHECK(cuMemAllocManaged(&blocks[k], BIG, CU_MEM_ATTACH_GLOBAL));
        GC_CHECK(cuEventCreate(&evs[k], CU_EVENT_DISABLE_TIMING));
        GC_CHECK(cuEventRecord(evs[k], s));
    }
    double ring_cold = ring_loop(s, blocks, evs, RING, RING);
    double ring_warm = ring_loop(s, blocks, evs, RING, 60);
    printf("RESULT managed_loop driver_us=%.1f ring_first_pass_us=%.1f ring_warm_us=%.1f\n",
           driver_us, ring_cold, ring_warm);
    for (int k = 0; k < RING; k++)
        cuMemFree(blocks[k]);
    return 0;
}

static int fact_pinned(void)
{
    gc_init();
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *h;
    double t0 = gc_now_ms();
    GC_CHECK(cuMemAllocHost(&h, BIG));
    double alloc_ms = gc_now_ms() - t0;
    CUdeviceptr d;
    GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
    double first = one_fill_ms(s, d), second = one_fill_ms(s, d);
    t0 = gc_now_ms();
    GC_CHECK(cuMemFreeHost(h));
    double free_ms = gc_now_ms() - t0;
    void *small;
    t0 = gc_now_ms();
    GC_CHECK(cuMemAllocHost(&small, 4096));
    double alloc4k = (gc_now_ms() - t0) * 1e3;
    t0 = gc_now_ms();
    GC_CHECK(cuMemFreeHost(small));
    double free4k = (gc_now_ms() - t0) * 1e3;
    printf("RESULT pinned_block alloc_ms=%.2f fill_first_ms=%.2f fill_second_ms=%.2f "
           "free_idle_ms=%.2f alloc_4k_us=%.1f free_4k_idle_us=%.1f\n", alloc_ms, first, second,
           free_ms, alloc4k, free4k);

    int iters = 10;
    t0 = gc_now_ms();
    for (int i = 0; i < iters; i++) {
        GC_CHECK(cuMemAllocHost(&h, BIG));
        GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
        GC_CHECK(fill_all(s, d, BIG));
        GC_CHECK(cuMemFreeHost(h));
    }
    GC_CHECK(cuCtxSynchronize());
    double driver_us = (gc_now_ms() - t0) * 1e3 / iters;

    CUdeviceptr blocks[RING];
    CUevent evs[RING];
    void *hs[RING];
    for (int k = 0; k < RING; k++) {
        GC_CHECK(cuMemAllocHost(&hs[k], BIG));
        GC_CHECK(cuMemHostGetDevicePointer(&blocks[k], hs[k], 0));
        GC_CHECK(cuEventCreate(&evs[k], CU_EVENT_DISABLE_TIMING));
        GC_CHECK(cuEventRecord(evs[k], s));
    }
    double ring_cold = ring_loop(s, blocks, evs, RING, RING);
    double ring_warm = ring_loop(s, blocks, evs, RING, 40);
    printf("RESULT pinned_loop driver_us=%.1f ring_first_pass_us=%.1f ring_warm_us=%.1f\n",
           driver_us, ring_cold, ring_warm);
    for (int k = 0; k < RING; k++)
        cuMemFreeHost(hs[k]);
    return 0;
}

/* ---- what a fence costs --------------------------------------------------- */

static int fact_fence(void)
{
    CUcontext ctx = gc_init();
    load_kernels();
    CUstream priv, s;
    GC_CHECK(cuStreamCreate(&priv, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent fence, done[64];
    GC_CHECK(cuEventCreate(&fence, CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < 64; i++)
        GC_CHECK(cuEventCreate(&done[i], CU_EVENT_DISABLE_TIMING));
    GC_CHECK(gc_spin(&kernels, s, 200.0, 0, 0));
    int n = 20000;
    double t0 = gc_now_ms();
    for (int i = 0; i < n; i++) {
        GC_CHECK(cuCtxRecordEvent(ctx, fence));
        GC_CHECK(cuStreamWaitEvent(priv, fence, 0));
        GC_CHECK(cuEventRecord(done[i % 64], priv));
    }
    double fence_us = (gc_now_ms() - t0) * 1e3 / n;
    t0 = gc_now_ms();
    for (int i = 0; i < n; i++)
        (void)cuEventQuery(done[i % 64]);
    double query_us = (gc_now_ms() - t0) * 1e3 / n;
    GC_CHECK(cuCtxSynchronize());
    printf("RESULT fence_cost record_wait_record_us=%.3f event_query_us=%.3f\n", fence_us,
           query_us);
    return 0;
}

/* ---- answers for freed memory -------------------------------------------- */

static int fact_freed(void)
{
    gc_init();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, GC_MIB));
    GC_CHECK(cuMemFreeAsync(d, s));
    GC_CHECK(cuStreamSynchronize(s));
    CUresult again_async = cuMemFreeAsync(d, s);
    cuStreamSynchronize(s);
    CUresult again = cuMemFree(d);
    printf("RESULT freed_device_after_freeasync freeasync_rc=%s free_rc=%s\n", gc_rc(again_async),
           gc_rc(again));

    GC_CHECK(cuMemAlloc(&d, GC_MIB));
    GC_CHECK(cuMemFree(d));
    CUcontext owner = NULL;
    CUresult a = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d);
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = cuMemGetAddressRange(&base, &size, d + 16);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    unsigned memtype = 77;
    CUcontext c2 = (CUcontext)1;
    size_t rsize = 77;
    void *vals[] = {&memtype, &c2, &rsize};
    CUresult m = cuPointerGetAttributes(3, attrs, vals, d);
    printf("RESULT freed_device_queries attribute_rc=%s range_rc=%s attributes_rc=%s "
           "memtype=%u ctx_null=%d range_size=%zu\n", gc_rc(a), gc_rc(r), gc_rc(m), memtype,
           c2 == NULL, rsize);

    void *h;
    GC_CHECK(cuMemAllocHost(&h, GC_MIB));
    GC_CHECK(cuMemFreeHost(h));
    unsigned flags = 0;
    CUresult f = cuMemHostGetFlags(&flags, h);
    CUdeviceptr dp = 0;
    CUresult g = cuMemHostGetDevicePointer(&dp, h, 0);
    memtype = 77;
    CUresult t = cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       (CUdeviceptr)(uintptr_t)h);
    printf("RESULT freed_host_queries hostgetflags_rc=%s devptr_rc=%s memtype_rc=%s\n", gc_rc(f),
           gc_rc(g), gc_rc(t));
    return 0;
}

/* ---- what pointer queries cost -------------------------------------------- */

static int fact_query(void)
{
    gc_init();
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, GC_MIB));
    int n = 200000;
    CUdeviceptr base = 0;
    double t0 = gc_now_ms();
    for (int i = 0; i < n; i++)
        GC_CHECK(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 64));
    double range_ns = (gc_now_ms() - t0) * 1e6 / n;
    unsigned memtype = 0;
    t0 = gc_now_ms();
    for (int i = 0; i < n; i++)
        GC_CHECK(cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 64));
    double type_ns = (gc_now_ms() - t0) * 1e6 / n;
    size_t size = 0;
    t0 = gc_now_ms();
    for (int i = 0; i < n; i++)
        GC_CHECK(cuMemGetAddressRange(&base, &size, d + 64));
    double addr_ns = (gc_now_ms() - t0) * 1e6 / n;
    printf("RESULT query_cost range_start_ns=%.1f memory_type_ns=%.1f address_range_ns=%.1f\n",
           range_ns, type_ns, addr_ns);
    return 0;
}

/* ---- the virtual memory calls ---------------------------------------------- */

struct vmm_block {
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    size_t bytes;
};

/* One block as JAX's platform allocator makes it (jax 0.11): reserve,
 * create, map, give the device access. Adds each call's time to t[0..3]. */
static void vmm_make(struct vmm_block *b, CUdevice dev, size_t bytes, double t[4])
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
    CUmemAccessDesc access = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, dev},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    b->bytes = bytes;
    double t0 = gc_now_ms();
    GC_CHECK(cuMemAddressReserve(&b->va, bytes, 0, 0, 0));
    double t1 = gc_now_ms();
    GC_CHECK(cuMemCreate(&b->h, bytes, &prop, 0));
    double t2 = gc_now_ms();
    GC_CHECK(cuMemMap(b->va, bytes, 0, b->h, 0));
    double t3 = gc_now_ms();
    GC_CHECK(cuMemSetAccess(b->va, bytes, &access, 1));
    double t4 = gc_now_ms();
    t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2, t[3] += t4 - t3;
}

/* Its release, in the order JAX makes it: unmap, release, free the range.
 * Adds each call's time to t[0..2]. */
static void vmm_drop(struct vmm_block *b, double t[3])
{
    double t0 = gc_now_ms();
    GC_CHECK(cuMemUnmap(b->va, b->bytes));
    double t1 = gc_now_ms();
    GC_CHECK(cuMemRelease(b->h));
    double t2 = gc_now_ms();
    GC_CHECK(cuMemAddressFree(b->va, b->bytes));
    double t3 = gc_now_ms();
    t[0] += t1 - t0, t[1] += t2 - t1, t[2] += t3 - t2;
}

static int fact_vmm(void)
{
    gc_init();
    load_kernels();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, dev}};
    size_t gran = 0;
    GC_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUstream s, other;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    /* Idle: n blocks of the granularity made and dropped, each used by a
     * kernel that fills it. */
    enum { N = 200 };
    double make[4] = {0}, drop[3] = {0};
    for (int i = 0; i < N; i++) {
        struct vmm_block b;
        vmm_make(&b, dev, gran, make);
        GC_CHECK(fill_all(s, b.va, b.bytes));
        GC_CHECK(cuStreamSynchronize(s));
        vmm_drop(&b, drop);
    }
    printf("RESULT vmm_idle bytes=%zu reserve_us=%.2f create_us=%.2f map_us=%.2f access_us=%.2f "
           "unmap_us=%.2f release_us=%.2f address_free_us=%.2f\n", gran, make[0] * 1e3 / N,
           make[1] * 1e3 / N, make[2] * 1e3 / N, make[3] * 1e3 / N, drop[0] * 1e3 / N,
           drop[1] * 1e3 / N, drop[2] * 1e3 / N);
    /* Busy: a 300 ms kernel on another stream, which does not touch the
     * block; each release call timed while it runs. Then cuMemFree the
     * same way. */
    struct vmm_block b;
    double unused[4] = {0}, busy[3] = {0};
    vmm_make(&b, dev, gran, unused);
    GC_CHECK(fill_all(s, b.va, b.bytes));
    GC_CHECK(cuStreamSynchronize(s));
    GC_CHECK(gc_spin(&kernels, other, 300.0, 0, 0));
    gc_sleep_ms(20);
    vmm_drop(&b, busy);
    CUresult q = cuStreamQuery(other);
    GC_CHECK(cuCtxSynchronize());
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, gran));
    GC_CHECK(gc_spin(&kernels, other, 300.0, 0, 0));
    gc_sleep_ms(20);
    double t0 = gc_now_ms();
    GC_CHECK(cuMemFree(d));
    double free_ms = gc_now_ms() - t0;
    GC_CHECK(cuCtxSynchronize());
    printf("RESULT vmm_busy kernel_ms=300 unmap_ms=%.3f release_ms=%.3f address_free_ms=%.3f "
           "kernel_still_running=%d mem_free_ms=%.3f\n", busy[0], busy[1], busy[2],
           q == CUDA_ERROR_NOT_READY, free_ms);
    return 0;
}

/* ---- captures and the engine's calls ------------------------------------- */

enum cap_case {
    CAP_NOTHING,        /* control: nothing between begin and end */
    CAP_FREE_ASYNC,     /* cuMemFreeAsync on another non-blocking stream, then its sync */
    CAP_MEM_FREE,       /* cuMemFree */
    CAP_EVENT_OPS,      /* cuEventRecord on another non-blocking stream, query, wait */
    CAP_EVENT_SYNC,     /* cuEventSynchronize of an event recorded before the capture */
    CAP_CTX_RECORD,     /* cuCtxRecordEvent of the capturing context */
    CAP_CTX_RECORD_OTHER, /* cuCtxRecordEvent of another context of the device */
    CAP_FREE_ASYNC_OTHER, /* cuMemFreeAsync + sync in another context */
    CAP_WRITE_VALUE,    /* cuStreamWaitEvent of a context record, cuStreamWriteValue32 of a
                           host-mapped word, on another non-blocking stream */
    CAP_HOST_ALLOC,     /* cuMemHostAlloc(4 bytes, DEVICEMAP) and cuMemHostGetDevicePointer:
                           the fences' word of a context set up during a capture */
    CAP_CASES
};

static const char *const cap_names[CAP_CASES] = {
    "nothing", "free_async", "mem_free", "event_ops", "event_sync", "ctx_record",
    "ctx_record_other", "free_async_other", "write_value", "host_alloc",
};

static struct {
    CUcontext ctx, other;
    enum cap_case which;
    CUresult rc; /* the relaxed thread's call */
    CUevent before;               /* a context record made before the capture */
    volatile cuuint32_t *word;    /* a host-mapped word, and its device address */
    CUdeviceptr word_dev;
    void *host;                   /* host_alloc's block, freed after the capture */
} capf;

/* The relaxed thread: the case's calls while the main thread captures. */
static void *cap_relaxed(void *arg)
{
    (void)arg;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    bool other = capf.which == CAP_CTX_RECORD_OTHER || capf.which == CAP_FREE_ASYNC_OTHER;
    GC_CHECK(cuCtxSetCurrent(other ? capf.other : capf.ctx));
    GC_CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    CUstream s, s2;
    CUevent ev;
    CUdeviceptr d;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(cuMemAlloc(&d, GC_MIB));
    CUresult rc = CUDA_SUCCESS;
    switch (capf.which) {
    case CAP_NOTHING:
    case CAP_CASES:
        break;
    case CAP_FREE_ASYNC:
    case CAP_FREE_ASYNC_OTHER:
        rc = cuMemFreeAsync(d, s);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamSynchronize(s);
        d = 0;
        break;
    case CAP_MEM_FREE:
        rc = cuMemFree(d);
        d = 0;
        break;
    case CAP_EVENT_OPS:
        rc = cuEventRecord(ev, s);
        if (rc == CUDA_SUCCESS)
            (void)cuEventQuery(ev);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamWaitEvent(s2, ev, 0);
        break;
    case CAP_EVENT_SYNC:
        rc = cuEventSynchronize(ev); /* recorded before: never recorded, returns at once */
        break;
    case CAP_CTX_RECORD:
    case CAP_CTX_RECORD_OTHER:
        rc = cuCtxRecordEvent(other ? capf.other : capf.ctx, ev);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamWaitEvent(s2, ev, 0);
        break;
    case CAP_WRITE_VALUE: {
        /* A context record made before the capture began: the engine makes
         * its fences outside captures, and writes behind them. */
        rc = cuStreamWaitEvent(s2, capf.before, 0);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamWriteValue32(s2, capf.word_dev, 7, 0);
        if (rc == CUDA_SUCCESS)
            rc = cuStreamSynchronize(s2);
        if (rc == CUDA_SUCCESS && *capf.word != 7)
            rc = CUDA_ERROR_UNKNOWN;
        break;
    }
    case CAP_HOST_ALLOC: {
        CUdeviceptr dev = 0;
        rc = cuMemHostAlloc(&capf.host, 4, CU_MEMHOSTALLOC_DEVICEMAP);
        if (rc == CUDA_SUCCESS)
            rc = cuMemHostGetDevicePointer(&dev, capf.host, 0);
        break;
    }
    }
    capf.rc = rc;
    GC_CHECK(cuStreamSynchronize(s2));
    if (d)
        GC_CHECK(cuMemFree(d));
    GC_CHECK(cuEventDestroy(ev));
    GC_CHECK(cuStreamDestroy(s));
    GC_CHECK(cuStreamDestroy(s2));
    GC_CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    return NULL;
}

static int fact_capture(void)
{
    capf.ctx = gc_init();
    load_kernels();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    CUctxCreateParams params = {0};
    GC_CHECK(cuCtxCreate(&capf.other, &params, 0, dev));
    GC_CHECK(cuCtxSetCurrent(capf.ctx));
    CUstream cs;
    GC_CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    void *word;
    GC_CHECK(cuMemHostAlloc(&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    GC_CHECK(cuMemHostGetDevicePointer(&capf.word_dev, word, 0));
    capf.word = word;
    GC_CHECK(cuEventCreate(&capf.before, CU_EVENT_DISABLE_TIMING));
    for (int k = 0; k < CAP_CASES; k++) {
        capf.which = (enum cap_case)k;
        capf.rc = CUDA_ERROR_UNKNOWN;
        *capf.word = 0;
        GC_CHECK(cuCtxRecordEvent(capf.ctx, capf.before));
        CUresult begin = cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (begin == CUDA_SUCCESS)
            GC_CHECK(gc_spin(&kernels, cs, 1.0, 0, 0));
        pthread_t t;
        if (pthread_create(&t, NULL, cap_relaxed, NULL) != 0)
            gc_die("pthread_create failed");
        pthread_join(t, NULL);
        CUgraph g = NULL;
        CUresult end = begin == CUDA_SUCCESS ? cuStreamEndCapture(cs, &g) : begin;
        if (g)
            GC_CHECK(cuGraphDestroy(g));
        if (capf.host)
            GC_CHECK(cuMemFreeHost(capf.host));
        capf.host = NULL;
        printf("RESULT capture_fact case=%s relaxed_call_rc=%s begin_rc=%s end_rc=%s\n",
               cap_names[k], gc_rc(capf.rc), gc_rc(begin), gc_rc(end));
        fflush(stdout);
        GC_CHECK(cuCtxSynchronize());
    }
    GC_CHECK(cuStreamDestroy(cs));
    GC_CHECK(cuEventDestroy(capf.before));
    GC_CHECK(cuMemFreeHost(word));
    GC_CHECK(cuCtxDestroy(capf.other));
    return 0;
}

/* ---- a fence's passing written by the GPU into a host word ---------------- */

/* What a word that the GPU writes after a fence costs and how late the host
 * sees it (the reuse check of bench/RESULTS.md run 59): the two calls on
 * an idle GPU; then, behind a 50 ms kernel, the time from the fence's
 * event being seen passed (cuEventQuery, polled) to the word being seen
 * written, and the reverse order never happening (the word before the
 * event would mean a write ahead of the fence). */
static int fact_word(void)
{
    CUcontext ctx = gc_init();
    load_kernels();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    int memops = -1;
    (void)cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
    CUstream s, priv;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&priv, CU_STREAM_NON_BLOCKING));
    void *host;
    GC_CHECK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    volatile cuuint32_t *word = host;
    CUdeviceptr word_dev;
    GC_CHECK(cuMemHostGetDevicePointer(&word_dev, host, 0));
    CUevent ev;
    GC_CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    /* Idle: the pair of calls a release would add. */
    enum { N = 20000 };
    double t0 = gc_now_ms();
    for (cuuint32_t i = 1; i <= N; i++) {
        GC_CHECK(cuCtxRecordEvent(ctx, ev));
        GC_CHECK(cuStreamWaitEvent(priv, ev, 0));
        GC_CHECK(cuStreamWriteValue32(priv, word_dev, i, 0));
    }
    double idle_ns = (gc_now_ms() - t0) * 1e6 / N;
    GC_CHECK(cuStreamSynchronize(priv));
    bool idle_last = *word == N;
    /* Behind a kernel, five times. */
    double lag_max = 0, lag_sum = 0;
    int early = 0;
    for (int r = 0; r < 5; r++) {
        cuuint32_t v = 1000000 + (cuuint32_t)r;
        GC_CHECK(gc_spin(&kernels, s, 50.0, 0, 0));
        GC_CHECK(cuCtxRecordEvent(ctx, ev));
        GC_CHECK(cuStreamWaitEvent(priv, ev, 0));
        GC_CHECK(cuStreamWriteValue32(priv, word_dev, v, 0));
        double seen_event = 0, seen_word = 0;
        while (!seen_event || !seen_word) {
            double now = gc_now_ms();
            if (!seen_word && *word == v) {
                seen_word = now;
                if (!seen_event && cuEventQuery(ev) != CUDA_SUCCESS)
                    early++;
            }
            if (!seen_event && cuEventQuery(ev) == CUDA_SUCCESS)
                seen_event = now;
        }
        double lag = seen_word - seen_event;
        lag_sum += lag;
        if (lag > lag_max)
            lag_max = lag;
        GC_CHECK(cuCtxSynchronize());
    }
    printf("RESULT word stream_mem_ops_attr=%d idle_record_wait_write_ns=%.0f idle_last_seen=%d "
           "lag_mean_us=%.1f lag_max_us=%.1f word_before_event=%d\n", memops, idle_ns,
           idle_last, lag_sum * 1e3 / 5, lag_max * 1e3, early);
    /* Behind a 1 s kernel, each call timed alone: first after 50 ms of
     * sleep (a release in a program that does other things between, the
     * stall check's case), then ten times in a row. */
    for (int r = 0; r < 3; r++) {
        GC_CHECK(gc_spin(&kernels, s, 1000.0, 0, 0));
        for (int hot = 0; hot < 2; hot++) {
            double t_rec = 0, t_wait = 0, t_write = 0, t_query = 0;
            int n = hot ? 10 : 5;
            for (int i = 0; i < n; i++) {
                if (!hot)
                    gc_sleep_ms(50.0);
                double a = gc_now_ms();
                GC_CHECK(cuCtxRecordEvent(ctx, ev));
                double b = gc_now_ms();
                GC_CHECK(cuStreamWaitEvent(priv, ev, 0));
                double c = gc_now_ms();
                GC_CHECK(cuStreamWriteValue32(priv, word_dev, 2000000 + (cuuint32_t)i, 0));
                double d = gc_now_ms();
                (void)cuEventQuery(ev);
                double e = gc_now_ms();
                t_rec += b - a, t_wait += c - b, t_write += d - c, t_query += e - d;
            }
            printf("RESULT word_busy rep=%d way=%s record_us=%.1f wait_us=%.1f write_us=%.1f "
                   "query_us=%.1f\n", r, hot ? "in_a_row" : "after_50ms_sleep",
                   t_rec * 1e3 / n, t_wait * 1e3 / n, t_write * 1e3 / n, t_query * 1e3 / n);
        }
        GC_CHECK(cuCtxSynchronize());
    }
    GC_CHECK(cuEventDestroy(ev));
    GC_CHECK(cuMemFreeHost(host));
    GC_CHECK(cuStreamDestroy(priv));
    GC_CHECK(cuStreamDestroy(s));
    return 0;
}

/* ---- which cuMemFree waits: sizes ------------------------------------------ */

static int fact_sizes(void)
{
    static const size_t sizes[] = {4 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20,
                                   8 << 20};
    gc_init();
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int beside = 0; beside < 2; beside++) {
            CUdeviceptr keep = 0, d;
            if (beside)
                GC_CHECK(cuMemAlloc(&keep, sizes[i]));
            GC_CHECK(cuMemAlloc(&d, sizes[i]));
            GC_CHECK(fill_all(s, d, sizes[i]));
            GC_CHECK(cuStreamSynchronize(s));
            GC_CHECK(gc_spin(&kernels, s, 300.0, 0, 0));
            gc_sleep_ms(20.0);
            double t0 = gc_now_ms();
            GC_CHECK(cuMemFree(d));
            double free_ms = gc_now_ms() - t0;
            CUresult q = cuStreamQuery(s);
            GC_CHECK(cuCtxSynchronize());
            if (keep)
                GC_CHECK(cuMemFree(keep));
            printf("RESULT free_size bytes=%zu shape=%s kernel_ms=300 free_ms=%.3f "
                   "kernel_still_running=%d\n",
                   sizes[i], beside ? "beside_live_block" : "alone", free_ms,
                   q == CUDA_ERROR_NOT_READY);
            fflush(stdout);
        }
    }
    GC_CHECK(cuStreamDestroy(s));
    return 0;
}

/* ---- a call beside another thread's waiting release ---------------------- */

struct beside {
    CUcontext ctx;
    void *host;
    double release_ms;
};

static void *beside_release(void *arg)
{
    struct beside *b = arg;
    GC_CHECK(cuCtxSetCurrent(b->ctx));
    double t0 = gc_now_ms();
    GC_CHECK(cuMemFreeHost(b->host));
    b->release_ms = gc_now_ms() - t0;
    return NULL;
}

static int fact_beside(void)
{
    static const char *const cases[] = {"green_destroy", "primary_release_not_last",
                                        "stream_query"};
    CUcontext p = gc_init();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int k = 0; k < 3; k++) {
        CUgreenCtx g = NULL;
        CUcontext again;
        if (k == 0)
            g = make_green(dev);
        else if (k == 1)
            GC_CHECK(cuDevicePrimaryCtxRetain(&again, dev));
        GC_CHECK(cuCtxSetCurrent(p));
        struct beside b = {p, NULL, 0};
        GC_CHECK(cuMemAllocHost(&b.host, (size_t)1 << 20));
        GC_CHECK(gc_spin(&kernels, s, 300.0, 0, 0));
        pthread_t t;
        if (pthread_create(&t, NULL, beside_release, &b) != 0)
            gc_die("pthread_create failed");
        gc_sleep_ms(20.0);
        double t0 = gc_now_ms();
        CUresult rc = k == 0 ? cuGreenCtxDestroy(g)
                      : k == 1 ? cuDevicePrimaryCtxRelease(dev)
                               : cuStreamQuery(s);
        double call_ms = gc_now_ms() - t0;
        pthread_join(t, NULL);
        printf("RESULT beside_release case=%s rc=%s call_ms=%.3f release_ms=%.1f\n", cases[k],
               gc_rc(rc), call_ms, b.release_ms);
        fflush(stdout);
        GC_CHECK(cuCtxSynchronize());
    }
    GC_CHECK(cuStreamDestroy(s));
    GC_CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

/* ---- a host pool's blocks beside the driver's pinned ones ----------------- */

#define HP_BYTES (4 * GC_MIB)

static const struct {
    const char *name;
    CUpointer_attribute a;
} hp_attrs[] = {
    {"context", CU_POINTER_ATTRIBUTE_CONTEXT},
    {"memory_type", CU_POINTER_ATTRIBUTE_MEMORY_TYPE},
    {"device_pointer", CU_POINTER_ATTRIBUTE_DEVICE_POINTER},
    {"host_pointer", CU_POINTER_ATTRIBUTE_HOST_POINTER},
    {"sync_memops", CU_POINTER_ATTRIBUTE_SYNC_MEMOPS},
    {"buffer_id", CU_POINTER_ATTRIBUTE_BUFFER_ID},
    {"is_managed", CU_POINTER_ATTRIBUTE_IS_MANAGED},
    {"device_ordinal", CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL},
    {"legacy_ipc", CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE},
    {"range_start", CU_POINTER_ATTRIBUTE_RANGE_START_ADDR},
    {"range_size", CU_POINTER_ATTRIBUTE_RANGE_SIZE},
    {"mapped", CU_POINTER_ATTRIBUTE_MAPPED},
    {"handle_types", CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES},
    {"rdma", CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE},
    {"access_flags", CU_POINTER_ATTRIBUTE_ACCESS_FLAGS},
    {"mempool", CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE},
    {"mapping_size", CU_POINTER_ATTRIBUTE_MAPPING_SIZE},
    {"mapping_base", CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR},
    {"block_id", CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID},
    {"hw_decompress", CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE},
};

/* A value as the table prints it: "p" for the block's own address, "ctx"
 * for the current context, "pool" for the pool, "set" for an id (they
 * differ between blocks by nature), else the number. */
static void hp_value(char *out, size_t n, const char *attr, unsigned long long v, void *p,
                     CUcontext ctx, CUmemoryPool pool)
{
    if (v && v == (unsigned long long)(uintptr_t)p)
        snprintf(out, n, "p");
    else if (v && v == (unsigned long long)(uintptr_t)ctx)
        snprintf(out, n, "ctx");
    else if (v && pool && v == (unsigned long long)(uintptr_t)pool)
        snprintf(out, n, "pool");
    else if (v && (strcmp(attr, "buffer_id") == 0 || strcmp(attr, "block_id") == 0))
        snprintf(out, n, "set");
    else
        snprintf(out, n, "%llu", v);
}

/* Every query, copy and kernel access on the block p of HP_BYTES, tagged
 * blk: RESULT hostpool_query lines (rc and value). dev is a device block
 * of HP_BYTES for the copies; ref the words a touch wrote into a device
 * block (what the same touch must leave in p). */
static void hp_queries(const char *blk, void *p, CUcontext ctx, CUmemoryPool pool, CUstream s,
                       CUdeviceptr dev, const unsigned *ref)
{
    char val[64];
    for (size_t i = 0; i < sizeof hp_attrs / sizeof hp_attrs[0]; i++) {
        unsigned long long v = 0;
        CUresult rc = cuPointerGetAttribute(&v, hp_attrs[i].a, (CUdeviceptr)(uintptr_t)p);
        hp_value(val, sizeof val, hp_attrs[i].name, v, p, ctx, pool);
        printf("RESULT hostpool_query block=%s query=attr_%s rc=%s value=%s\n", blk,
               hp_attrs[i].name, gc_rc(rc), rc == CUDA_SUCCESS ? val : "-");
    }
    /* The same attributes in one call, as the runtime's cudaPointerGetAttributes
     * asks them. */
    CUpointer_attribute plural[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                    CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                    CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned long long pv[6] = {0};
    void *pd[6] = {&pv[0], &pv[1], &pv[2], &pv[3], &pv[4], &pv[5]};
    CUresult rc = cuPointerGetAttributes(6, plural, pd, (CUdeviceptr)(uintptr_t)p);
    printf("RESULT hostpool_query block=%s query=attributes rc=%s value=ctx:%s,type:%llu,"
           "dev:%s,host:%s,managed:%llu,ordinal:%llu\n", blk, gc_rc(rc),
           pv[0] == (unsigned long long)(uintptr_t)ctx ? "ctx" : (pv[0] ? "other" : "0"), pv[1],
           pv[2] == (unsigned long long)(uintptr_t)p ? "p" : (pv[2] ? "other" : "0"),
           pv[3] == (unsigned long long)(uintptr_t)p ? "p" : (pv[3] ? "other" : "0"), pv[4],
           pv[5]);
    unsigned flags = 0;
    rc = cuMemHostGetFlags(&flags, p);
    printf("RESULT hostpool_query block=%s query=host_get_flags rc=%s value=%#x\n", blk,
           gc_rc(rc), rc == CUDA_SUCCESS ? flags : 0);
    CUdeviceptr d = 0;
    rc = cuMemHostGetDevicePointer(&d, p, 0);
    printf("RESULT hostpool_query block=%s query=host_get_device_pointer rc=%s value=%s\n", blk,
           gc_rc(rc), rc != CUDA_SUCCESS ? "-" : d == (CUdeviceptr)(uintptr_t)p ? "p" : "other");
    CUdeviceptr base = 0;
    size_t size = 0;
    rc = cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p + 64);
    printf("RESULT hostpool_query block=%s query=address_range rc=%s value=%s/%zu\n", blk,
           gc_rc(rc), rc != CUDA_SUCCESS ? "-" : base == (CUdeviceptr)(uintptr_t)p ? "p" : "other",
           size);
    rc = cuMemHostRegister(p, 4096, 0);
    printf("RESULT hostpool_query block=%s query=host_register rc=%s value=-\n", blk, gc_rc(rc));
    if (rc == CUDA_SUCCESS)
        cuMemHostUnregister(p);
    CUipcMemHandle ipc;
    rc = cuIpcGetMemHandle(&ipc, (CUdeviceptr)(uintptr_t)p);
    printf("RESULT hostpool_query block=%s query=ipc_handle rc=%s value=-\n", blk, gc_rc(rc));

    /* Copies both ways, synchronous and on a stream, and a memset through
     * the device's view: each checked by the host. */
    unsigned *w = p;
    for (size_t i = 0; i < HP_BYTES / 4; i++)
        w[i] = (unsigned)i * 2654435761u;
    rc = cuMemcpyHtoD(dev, p, HP_BYTES);
    memset(p, 0, HP_BYTES);
    CUresult rc2 = rc == CUDA_SUCCESS ? cuMemcpyDtoH(p, dev, HP_BYTES) : rc;
    bool same = true;
    for (size_t i = 0; i < HP_BYTES / 4 && same; i++)
        same = w[i] == (unsigned)i * 2654435761u;
    printf("RESULT hostpool_query block=%s query=copy_sync rc=%s/%s value=%s\n", blk, gc_rc(rc),
           gc_rc(rc2), same ? "intact" : "DIFFERS");
    memset(p, 0, HP_BYTES);
    rc = cuMemcpyDtoHAsync(p, dev, HP_BYTES, s);
    rc2 = rc == CUDA_SUCCESS ? cuStreamSynchronize(s) : rc;
    same = true;
    for (size_t i = 0; i < HP_BYTES / 4 && same; i++)
        same = w[i] == (unsigned)i * 2654435761u;
    printf("RESULT hostpool_query block=%s query=copy_async rc=%s/%s value=%s\n", blk, gc_rc(rc),
           gc_rc(rc2), same ? "intact" : "DIFFERS");
    rc = cuMemsetD32((CUdeviceptr)(uintptr_t)p, 0x5a5a5a5a, HP_BYTES / 4);
    rc2 = rc == CUDA_SUCCESS ? cuCtxSynchronize() : rc;
    same = rc == CUDA_SUCCESS;
    for (size_t i = 0; i < HP_BYTES / 4 && same; i++)
        same = w[i] == 0x5a5a5a5au;
    printf("RESULT hostpool_query block=%s query=memset_uva rc=%s/%s value=%s\n", blk, gc_rc(rc),
           gc_rc(rc2), same ? "written" : "NOT-written");
    /* A kernel's touch through the block's own address (unified
     * addressing), as the device block got it. */
    memset(p, 0, HP_BYTES);
    rc = gc_touch(&kernels, s, (CUdeviceptr)(uintptr_t)p, 16);
    rc2 = rc == CUDA_SUCCESS ? cuStreamSynchronize(s) : rc;
    same = rc2 == CUDA_SUCCESS && memcmp(p, ref, 16 * sizeof *ref) == 0;
    printf("RESULT hostpool_query block=%s query=kernel_touch rc=%s/%s value=%s\n", blk,
           gc_rc(rc), gc_rc(rc2), same ? "written" : "NOT-written");
}

/* Frees a 4 KiB block of pool behind a 200 ms kernel that writes it on
 * stream a, then allocates 4 KiB from pool on stream b (a itself when
 * same): RESULT hostpool_reuse, whether the same block came back and
 * whether the kernel was still running then. With settle, a's kernel is
 * waited for before the allocation. */
static void hp_reuse(const char *tag, CUmemoryPool pool, CUstream a, CUstream b, bool settle)
{
    CUdeviceptr x, y;
    GC_CHECK(cuMemAllocFromPoolAsync(&x, 4096, pool, a));
    CUevent done;
    GC_CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    GC_CHECK(gc_spin(&kernels, a, 200.0, x, 16));
    GC_CHECK(cuEventRecord(done, a));
    GC_CHECK(cuMemFreeAsync(x, a));
    if (settle)
        GC_CHECK(cuStreamSynchronize(a));
    CUresult rc = cuMemAllocFromPoolAsync(&y, 4096, pool, b);
    CUresult running = cuEventQuery(done);
    printf("RESULT hostpool_reuse case=%s rc=%s same_block=%d kernel_running=%d\n", tag,
           gc_rc(rc), rc == CUDA_SUCCESS && y == x, running == CUDA_ERROR_NOT_READY);
    GC_CHECK(cuCtxSynchronize());
    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemFreeAsync(y, b));
    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuEventDestroy(done));
}

static int fact_hostpool(void)
{
    CUcontext ctx = gc_init();
    load_kernels();
    CUstream s, t;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
    CUdeviceptr dev;
    GC_CHECK(cuMemAlloc(&dev, HP_BYTES));
    GC_CHECK(cuMemsetD32(dev, 0, HP_BYTES / 4));
    GC_CHECK(gc_touch(&kernels, s, dev, 16));
    unsigned ref[16];
    GC_CHECK(cuMemcpyDtoH(ref, dev, sizeof ref));

    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_HOST, 0}};
    CUmemoryPool pool;
    CUresult rc = cuMemPoolCreate(&pool, &props);
    printf("RESULT hostpool_create rc=%s\n", gc_rc(rc));
    if (rc != CUDA_SUCCESS)
        return 1;
    static const struct {
        const char *name;
        CUmemPool_attribute a;
    } pattrs[] = {
        {"follow_event_dependencies", CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES},
        {"allow_opportunistic", CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC},
        {"allow_internal_dependencies", CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES},
    };
    for (size_t i = 0; i < 3; i++) {
        int v = -1;
        rc = cuMemPoolGetAttribute(pool, pattrs[i].a, &v);
        printf("RESULT hostpool_attr name=%s rc=%s default=%d\n", pattrs[i].name, gc_rc(rc), v);
    }
    CUmemAccessDesc access = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = cuMemPoolSetAccess(pool, &access, 1);
    printf("RESULT hostpool_set_access rc=%s\n", gc_rc(rc));

    void *h;
    GC_CHECK(cuMemAllocHost(&h, HP_BYTES));
    hp_queries("alloc_host", h, ctx, pool, s, dev, ref);
    void *m;
    GC_CHECK(cuMemHostAlloc(&m, HP_BYTES, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    hp_queries("host_alloc_mapped_portable", m, ctx, pool, s, dev, ref);
    CUdeviceptr q;
    GC_CHECK(cuMemAllocFromPoolAsync(&q, HP_BYTES, pool, s));
    GC_CHECK(cuStreamSynchronize(s));
    hp_queries("host_pool", (void *)(uintptr_t)q, ctx, pool, s, dev, ref);
    GC_CHECK(cuMemFreeHost(h));
    GC_CHECK(cuMemFreeHost(m));
    /* What the driver's own release answers for a pool block (the block is
     * given back stream-ordered afterwards when it refuses). */
    rc = cuMemFreeHost((void *)(uintptr_t)q);
    printf("RESULT hostpool_free_host rc=%s\n", gc_rc(rc));
    if (rc != CUDA_SUCCESS)
        GC_CHECK(cuMemFreeAsync(q, s));
    GC_CHECK(cuCtxSynchronize());

    /* Reuse while the kernel before the free still writes the block. */
    hp_reuse("defaults_same_stream", pool, s, s, false);
    hp_reuse("defaults_other_stream", pool, s, t, false);
    for (size_t i = 0; i < 3; i++) {
        int off = 0;
        GC_CHECK(cuMemPoolSetAttribute(pool, pattrs[i].a, &off));
    }
    hp_reuse("reuse_off_same_stream", pool, s, s, false);
    hp_reuse("reuse_off_other_stream", pool, s, t, false);
    hp_reuse("reuse_off_other_stream_after_sync", pool, s, t, true);
    GC_CHECK(cuMemPoolDestroy(pool));
    GC_CHECK(cuMemFree(dev));
    return 0;
}

/* ---- memory of one context written by another's kernel ------------------ */

/* A new context of device 0, its kernels loaded, left current. */
static CUcontext other_context(struct gc_kernels *k)
{
    CUdevice dev;
    CUcontext ctx;
    GC_CHECK(cuDeviceGet(&dev, 0));
    GC_CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    gc_load_kernels(k);
    return ctx;
}

/* A kernel of a new context writes 16 words at ptr; host (may be NULL) is
 * where the host sees them. Prints what the kernel's synchronisation
 * answered and how many words changed. The primary context is current
 * again afterwards. */
static void written_from_other(const char *what, CUcontext primary, CUdeviceptr ptr,
                               volatile uint32_t *host)
{
    if (host)
        for (int i = 0; i < 16; i++)
            host[i] = 0;
    struct gc_kernels k;
    CUcontext ctx = other_context(&k);
    CUresult launch = gc_touch(&k, NULL, ptr, 16);
    CUresult sync = cuCtxSynchronize();
    int changed = 0;
    for (int i = 0; host && i < 16; i++)
        changed += host[i] != 0;
    printf("RESULT xctx_write memory=%s launch_rc=%s sync_rc=%s words_changed=%d\n", what,
           gc_rc(launch), gc_rc(sync), host ? changed : -1);
    fflush(stdout);
    cuCtxDestroy(ctx);
    GC_CHECK(cuCtxSetCurrent(primary));
}

static int fact_xctx(void)
{
    CUcontext primary = gc_init();
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    static const struct {
        const char *name;
        CUdevice_attribute a;
    } attrs[] = {
        {"unified_addressing", CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING},
        {"pageable_memory_access", CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS},
        {"pageable_uses_host_page_tables",
         CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES},
        {"host_pointer_for_registered_mem",
         CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int v = -1;
        CUresult rc = cuDeviceGetAttribute(&v, attrs[i].a, dev);
        printf("RESULT xctx_attribute name=%s rc=%s value=%d\n", attrs[i].name, gc_rc(rc), v);
    }
    uint32_t *pages = gc_xpages(4 * 4096);
    static const struct {
        const char *name;
        unsigned flags;
    } regs[] = {
        {"registered", CU_MEMHOSTREGISTER_DEVICEMAP},
        {"registered_portable", CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE},
    };
    for (size_t i = 0; i < 2; i++) {
        uint32_t *page = pages + i * 1024;
        GC_CHECK(cuMemHostRegister(page, 4096, regs[i].flags));
        CUdeviceptr d = 0;
        GC_CHECK(cuMemHostGetDevicePointer(&d, page, 0));
        written_from_other(regs[i].name, primary, d, page);
        GC_CHECK(cuMemHostUnregister(page));
    }
    void *h;
    GC_CHECK(cuMemAllocHost(&h, 4096));
    written_from_other("alloc_host", primary, (CUdeviceptr)(uintptr_t)h, h);
    GC_CHECK(cuMemFreeHost(h));
    CUdeviceptr d;
    GC_CHECK(cuMemAlloc(&d, 4096));
    written_from_other("device", primary, d, NULL);
    GC_CHECK(cuMemFree(d));

    /* The driver's unregister in the primary context while a 300 ms kernel
     * of another context writes the PORTABLE pages. */
    uint32_t *page = pages + 3 * 1024;
    GC_CHECK(cuMemHostRegister(page, 4096,
                               CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    struct gc_kernels k;
    CUcontext ctx = other_context(&k);
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(gc_spin(&k, s, 300.0, (CUdeviceptr)(uintptr_t)page, 16));
    gc_sleep_ms(20);
    CUresult running = cuStreamQuery(s);
    GC_CHECK(cuCtxSetCurrent(primary));
    double t0 = gc_now_ms();
    CUresult un = cuMemHostUnregister(page);
    double un_ms = gc_now_ms() - t0;
    GC_CHECK(cuCtxSetCurrent(ctx));
    CUresult sync = cuCtxSynchronize();
    printf("RESULT xctx_unregister_beside_other_kernel kernel_running=%d unregister_rc=%s "
           "unregister_ms=%.3f other_sync_rc=%s\n", running == CUDA_ERROR_NOT_READY, gc_rc(un),
           un_ms, gc_rc(sync));
    cuCtxDestroy(ctx);
    GC_CHECK(cuCtxSetCurrent(primary));
    /* Last: a fault here ends every context of the device. */
    written_from_other("pageable", primary, (CUdeviceptr)(uintptr_t)(pages + 2 * 1024),
                       pages + 2 * 1024);
    return 0;
}

/* Whether device memory that managed blocks occupy serves cuMemAlloc: three
 * quarters of the free memory in managed blocks prefetched to the device,
 * then cuMemAlloc of half the free memory, which fits only if the driver
 * moves managed pages out. cuMemGetInfo before, after the prefetch and
 * after the allocation; the managed block's words checked afterwards. */
static int fact_evict(void)
{
    gc_init();
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdevice dev;
    GC_CHECK(cuCtxGetDevice(&dev));
    size_t free0 = 0, total = 0, free1 = 0, free2 = 0;
    GC_CHECK(cuMemGetInfo(&free0, &total));
    size_t grain = 2 * GC_MIB;
    size_t managed = free0 / 4 * 3 / grain * grain, want = free0 / 2 / grain * grain;
    CUdeviceptr m, d = 0;
    GC_CHECK(cuMemAllocManaged(&m, managed, CU_MEM_ATTACH_GLOBAL));
    CUmemLocation on_dev = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    double t0 = gc_now_ms();
    GC_CHECK(cuMemPrefetchAsync(m, managed, on_dev, 0, s));
    GC_CHECK(fill_all(s, m, managed));
    GC_CHECK(cuStreamSynchronize(s));
    double resident_ms = gc_now_ms() - t0;
    GC_CHECK(cuMemGetInfo(&free1, &total));
    t0 = gc_now_ms();
    CUresult rc = cuMemAlloc(&d, want);
    double alloc_ms = gc_now_ms() - t0;
    GC_CHECK(cuMemGetInfo(&free2, &total));
    unsigned word = 0;
    CUresult read = cuMemcpyDtoH(&word, m + managed / 2, sizeof word);
    printf("RESULT evict total_mib=%.0f free_mib=%.0f managed_mib=%.0f resident_ms=%.1f "
           "free_with_managed_mib=%.0f alloc_mib=%.0f alloc_rc=%s alloc_ms=%.2f "
           "free_after_alloc_mib=%.0f managed_word_rc=%s managed_word=%#x\n",
           total / 1048576.0, free0 / 1048576.0, managed / 1048576.0, resident_ms,
           free1 / 1048576.0, want / 1048576.0, gc_rc(rc), alloc_ms, free2 / 1048576.0,
           gc_rc(read), word);
    if (rc == CUDA_SUCCESS)
        GC_CHECK(cuMemFree(d));
    GC_CHECK(cuMemFree(m));
    return 0;
}

/* ---- registered pages unmapped before the driver's unregister ----------- */

#define UNMAPPED_BYTES (64 * GC_MIB)
#define PROBE_WORD 1000

/* bytes of new anonymous pages, at `at` exactly (NULL: anywhere), every
 * byte `fill`. */
static unsigned char *map_pages(void *at, unsigned char fill)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0);
    void *p = mmap(at, UNMAPPED_BYTES, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED || (at && p != at))
        gc_die("mmap at %p failed", at);
    memset(p, fill, UNMAPPED_BYTES);
    return p;
}

/* The host's word PROBE_WORD of host after a kernel fills every word of
 * the device pointer dptr with its index (PROBE_WORD if the write reached
 * those pages); the fill's result in *rc. */
static unsigned word_after_fill(CUstream s, CUdeviceptr dptr, const unsigned char *host,
                                CUresult *rc)
{
    *rc = fill_all(s, dptr, UNMAPPED_BYTES);
    if (*rc == CUDA_SUCCESS)
        *rc = cuStreamSynchronize(s);
    return ((const volatile unsigned *)host)[PROBE_WORD];
}

static int fact_unmapped(void)
{
    gc_init();
    load_kernels();
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const unsigned flags = CU_MEMHOSTREGISTER_DEVICEMAP;

    /* The program maps new pages at the address (as malloc after free). */
    unsigned char *p = map_pages(NULL, 0x11);
    CUdeviceptr dp = 0, dq = 0;
    GC_CHECK(cuMemHostRegister(p, UNMAPPED_BYTES, flags));
    GC_CHECK(cuMemHostGetDevicePointer(&dp, p, 0));
    munmap(p, UNMAPPED_BYTES);
    unsigned char *q = map_pages(p, 0x22);
    CUresult dq_rc = cuMemHostGetDevicePointer(&dq, q, 0), fill_rc;
    unsigned seen = word_after_fill(s, dp, q, &fill_rc);
    CUresult reg_rc = cuMemHostRegister(q, UNMAPPED_BYTES, flags);
    CUresult unreg_rc = cuMemHostUnregister(p);
    CUresult reg2_rc = cuMemHostRegister(q, UNMAPPED_BYTES, flags), fill2_rc = CUDA_ERROR_UNKNOWN;
    unsigned seen2 = 0;
    if (reg2_rc == CUDA_SUCCESS && cuMemHostGetDevicePointer(&dq, q, 0) == CUDA_SUCCESS)
        seen2 = word_after_fill(s, dq, q, &fill2_rc);
    printf("RESULT unmapped_remapped same_address=1 device_pointer_old=%#llx "
           "device_pointer_query_rc=%s device_pointer_new=%#llx fill_old_rc=%s "
           "word_seen_after_old_fill=%#x register_new_rc=%s unregister_old_rc=%s "
           "register_new_after_rc=%s fill_new_rc=%s word_seen_after_new_fill=%#x\n",
           (unsigned long long)dp, gc_rc(dq_rc), (unsigned long long)dq, gc_rc(fill_rc), seen,
           gc_rc(reg_rc), gc_rc(unreg_rc), gc_rc(reg2_rc), gc_rc(fill2_rc), seen2);
    if (reg2_rc == CUDA_SUCCESS)
        cuMemHostUnregister(q);
    munmap(q, UNMAPPED_BYTES);

    /* An allocation of the same size right after the unmapping, by each of
     * the calls that map host-visible memory: where it lands, and whether
     * it succeeds once the old registration is undone. */
    static const char *const how[] = {"cuMemAllocHost", "cuMemHostAlloc",
                                       "cuMemHostAlloc_portable_devicemap",
                                       "cuMemAllocManaged"};
    for (int k = 0; k < 4; k++) {
        unsigned char *r = map_pages(NULL, 0x11);
        GC_CHECK(cuMemHostRegister(r, UNMAPPED_BYTES, flags));
        munmap(r, UNMAPPED_BYTES);
        CUresult rc[2] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN}, unreg_rc = CUDA_ERROR_UNKNOWN;
        void *h[2] = {NULL, NULL};
        int overlap[2] = {0, 0};
        for (int round = 0; round < 2; round++) {
            CUdeviceptr m = 0;
            switch (k) {
            case 0: rc[round] = cuMemAllocHost(&h[round], UNMAPPED_BYTES); break;
            case 1: rc[round] = cuMemHostAlloc(&h[round], UNMAPPED_BYTES, 0); break;
            case 2:
                rc[round] = cuMemHostAlloc(&h[round], UNMAPPED_BYTES,
                                           CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
                break;
            default:
                rc[round] = cuMemAllocManaged(&m, UNMAPPED_BYTES, CU_MEM_ATTACH_GLOBAL);
                h[round] = (void *)(uintptr_t)m;
                break;
            }
            overlap[round] = h[round] && (unsigned char *)h[round] < r + UNMAPPED_BYTES &&
                             r < (unsigned char *)h[round] + UNMAPPED_BYTES;
            if (round == 0)
                unreg_rc = cuMemHostUnregister(r);
        }
        unsigned seen = 0;
        CUresult fill_rc = CUDA_ERROR_UNKNOWN;
        CUdeviceptr dh = 0;
        if (rc[1] == CUDA_SUCCESS && k < 3 &&
            cuMemHostGetDevicePointer(&dh, h[1], 0) == CUDA_SUCCESS) {
            memset(h[1], 0x22, UNMAPPED_BYTES);
            seen = word_after_fill(s, dh, h[1], &fill_rc);
        }
        printf("RESULT unmapped_then_%s registered=%p rc=%s at=%p overlap=%d "
               "unregister_old_rc=%s again_rc=%s again_at=%p again_overlap=%d fill_rc=%s "
               "word_seen=%#x\n",
               how[k], (void *)r, gc_rc(rc[0]), h[0], overlap[0], gc_rc(unreg_rc), gc_rc(rc[1]),
               h[1], overlap[1], gc_rc(fill_rc), seen);
        for (int round = 0; round < 2; round++)
            if (rc[round] == CUDA_SUCCESS)
                k < 3 ? cuMemFreeHost(h[round]) : cuMemFree((CUdeviceptr)(uintptr_t)h[round]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*fn)(void);
    } facts[] = {
        {"green", fact_green},     {"green-dead", fact_green_dead}, {"register", fact_register},
        {"managed", fact_managed}, {"pinned", fact_pinned},         {"fence", fact_fence},
        {"freed", fact_freed},     {"query", fact_query},       {"vmm", fact_vmm},
        {"capture", fact_capture}, {"beside", fact_beside},     {"word", fact_word},
        {"sizes", fact_sizes},     {"hostpool", fact_hostpool}, {"xctx", fact_xctx},
        {"evict", fact_evict},     {"unmapped", fact_unmapped},
    };
    if (argc == 2 && strcmp(argv[1], "list") == 0) {
        for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++)
            printf("%s\n", facts[i].name);
        return 0;
    }
    for (size_t i = 0; argc == 2 && i < sizeof facts / sizeof facts[0]; i++)
        if (strcmp(argv[1], facts[i].name) == 0)
            return facts[i].fn();
    gc_die("usage: facts list | facts <name>");
    return 2;
}
