/* primary_unseen.c - check 14: a release of the primary context that does
 * not end it must not make cudefer tear the context down.
 *
 * The primary context is retained more often than it is released, so that
 * after the release it stays alive in the driver; cudefer must agree (a
 * count of its own that missed a retain, or that a reset zeroed, would make
 * it tear down its state for a live context: its blocks would then be
 * answered as freed, its queue dropped). Afterwards the memory allocated
 * before the release is freed, and a new allocation, a kernel writing it and
 * cuCtxSynchronize must work. Each call's code is printed; with cudefer
 * every one must be the driver's.
 *
 * usage: primary_unseen <variant>
 *   twice   retain, retain, allocate (a device block; a pinned block freed
 *           at once, so that something is queued), release
 *   reset   retain, cuDevicePrimaryCtxReset, retain, allocate (as above),
 *           release
 *
 * prints:
 *   RESULT primary_unseen variant=<v> retain_rc=<code> reset_rc=<code|->
 *          retain2_rc=<code> alloc_rc=<code> free_host_rc=<code>
 *          release_rc=<code> state_rc=<code> active=<0|1> free_rc=<code>
 *          alloc2_rc=<code> launch_rc=<code> sync_rc=<code> cudefer=<0|1>
 *          simulated=<0|1>
 * (active: cuDevicePrimaryCtxGetState after the release).
 */
#include "gpu.h"

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "twice") != 0 && strcmp(argv[1], "reset") != 0))
        gc_die("usage: primary_unseen <twice|reset>");
    bool reset = strcmp(argv[1], "reset") == 0;

    CUdevice dev;
    CUcontext ctx, ctx2;
    GC_CHECK(cuInit(0));
    GC_CHECK(cuDeviceGet(&dev, 0));
    CUresult retain = cuDevicePrimaryCtxRetain(&ctx, dev);
    GC_CHECK(retain);
    GC_CHECK(cuCtxSetCurrent(ctx));
    CUresult reset_rc = CUDA_SUCCESS;
    if (reset)
        reset_rc = cuDevicePrimaryCtxReset(dev);
    CUresult retain2 = cuDevicePrimaryCtxRetain(&ctx2, dev);
    GC_CHECK(retain2);
    GC_CHECK(cuCtxSetCurrent(ctx2));

    struct gc_kernels kernels;
    gc_load_kernels(&kernels);
    CUdeviceptr d = 0;
    void *pinned = NULL;
    CUresult alloc = cuMemAlloc(&d, GC_MIB);
    CUresult free_host = cuMemAllocHost(&pinned, GC_MIB);
    if (free_host == CUDA_SUCCESS)
        free_host = cuMemFreeHost(pinned);

    CUresult release = cuDevicePrimaryCtxRelease(dev);
    unsigned flags = 0;
    int active = -1;
    CUresult state = cuDevicePrimaryCtxGetState(dev, &flags, &active);

    CUresult free_rc = alloc == CUDA_SUCCESS ? cuMemFree(d) : alloc;
    CUdeviceptr e = 0;
    CUresult alloc2 = cuMemAlloc(&e, GC_MIB);
    CUresult launch = gc_touch(&kernels, NULL, alloc2 == CUDA_SUCCESS ? e : 0,
                               alloc2 == CUDA_SUCCESS ? 16 : 0);
    CUresult sync = cuCtxSynchronize();

    printf("RESULT primary_unseen variant=%s retain_rc=%s reset_rc=%s retain2_rc=%s", argv[1],
           gc_rc(retain), reset ? gc_rc(reset_rc) : "-", gc_rc(retain2));
    printf(" alloc_rc=%s free_host_rc=%s release_rc=%s state_rc=%s active=%d", gc_rc(alloc),
           gc_rc(free_host), gc_rc(release), gc_rc(state), active);
    printf(" free_rc=%s alloc2_rc=%s launch_rc=%s sync_rc=%s cudefer=%d simulated=%d\n",
           gc_rc(free_rc), gc_rc(alloc2), gc_rc(launch), gc_rc(sync), gc_cudefer_loaded(),
           gc_test_driver());
    fflush(stdout);
    return 0;
}
