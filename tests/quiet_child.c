/* quiet_child.c - a program of the kind frameworks make, for the quiet-exit
 * scenario of tests/test_scenarios.c: before its first CUDA call it
 * registers an exit handler that unloads its library, as a static object's
 * destructor does; the driver has torn itself down by the time that
 * handler runs. It reports the unload's answer on stderr ("unload at exit:
 * <code>") and exits 0, or exits 1 when a call before exit failed. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static CUlibrary library;

static void unload_at_exit(void)
{
    fprintf(stderr, "unload at exit: %d\n", (int)cuLibraryUnload(library));
}

int main(void)
{
    static const char image[] = "// the test driver accepts any image\n";
    atexit(unload_at_exit);
    CUdevice dev;
    CUcontext ctx;
    CUkernel kernel;
    CUfunction fn;
    CUdeviceptr d;
    void *h;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx))
        return 1;
    if (cuLibraryLoadData(&library, image, NULL, NULL, 0, NULL, NULL, 0) ||
        cuLibraryGetKernel(&kernel, library, "step") || cuKernelGetFunction(&fn, kernel))
        return 1;
    for (int i = 0; i < 4; i++) {
        if (cuMemAlloc(&d, 1 << 20) || cuMemAllocHost(&h, 1 << 20) ||
            cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) || cuMemFree(d) ||
            cuMemFreeHost(h))
            return 1;
    }
    return cuCtxSynchronize() == CUDA_SUCCESS ? 0 : 1;
}
