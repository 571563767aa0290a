/* sticky.c - check 15: releases made before a kernel fault, the context
 * destroyed with its error sticky, and the same memory registered again.
 *
 * In a context made with cuCtxCreate: a 1 MiB page-aligned buffer is
 * registered (CU_MEMHOSTREGISTER_DEVICEMAP) and a library loaded, one of
 * its kernels run. While a 300 ms kernel runs the library is unloaded and
 * the buffer unregistered (cudefer queues what it can). Then a kernel
 * faults: it keeps writing a device block that a bare cuMemFreeAsync on
 * another stream gives back under it (the unsafe control of hazard.c), and
 * cuCtxSynchronize answers CUDA_ERROR_ILLEGAL_ADDRESS, for good. The
 * context is destroyed; in a new context the same range is registered
 * again (nothing left registered or leaked by what was queued), and the
 * program must end normally. On the H200 no new context can be made after
 * a fault (cuCtxCreate answers CUDA_ERROR_ILLEGAL_ADDRESS, measured): then
 * that is what both modes must answer, and the registration is not tried.
 *
 * usage: sticky
 *
 * prints:
 *   RESULT sticky unload_rc=<code> unregister_rc=<code> kernel_running=<0|1>
 *          fault_rc=<code> fault=<0|1> destroy_rc=<code> again_rc=<code of the new
 *          context's creation> register_again_rc=<code, or - when not tried>
 *          unregister_again_rc=<code> destroy_again_rc=<code> cudefer=<0|1>
 *          simulated=<0|1>
 * (kernel_running: the 300 ms kernel still ran when the library was
 * unloaded; fault: cuCtxSynchronize failed, which the check needs).
 */
#include "gpu.h"

#define BUFFER_BYTES (1 * GC_MIB)
#define KERNEL_MS 300.0
#define SETTLE_MS 30.0

static CUcontext new_context(CUdevice dev)
{
    CUcontext ctx;
    GC_CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    return ctx;
}

static const char *rc_or_not_tried(CUresult rc, bool tried)
{
    return tried ? gc_rc(rc) : "-";
}

/* A library one of whose kernels was loaded into the context and ran. */
static CUlibrary used_library(CUstream s)
{
    CUlibrary lib;
    CUkernel k;
    CUfunction f;
    GC_CHECK(cuLibraryLoadData(&lib, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&k, lib, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&f, k));
    GC_CHECK(gc_touch_with(f, s, 0, 0));
    GC_CHECK(cuStreamSynchronize(s));
    return lib;
}

/* The writer faults: its block goes back under it. */
static CUresult fault(const struct gc_kernels *k, CUstream writer_stream)
{
    CUstream other;
    CUdeviceptr d;
    GC_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuMemAlloc(&d, BUFFER_BYTES));
    GC_CHECK(gc_spin(k, writer_stream, KERNEL_MS, d, BUFFER_BYTES / 4));
    gc_sleep_ms(SETTLE_MS);
    CUresult rc = cuMemFreeAsync(d, other);
    if (rc == CUDA_SUCCESS)
        rc = cuStreamSynchronize(other);
    if (rc != CUDA_SUCCESS)
        return rc;
    return cuCtxSynchronize();
}

int main(void)
{
    CUdevice dev;
    GC_CHECK(cuInit(0));
    GC_CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx = new_context(dev);
    struct gc_kernels kernels;
    gc_load_kernels(&kernels);
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(gc_spin(&kernels, s, 1.0, 0, 0));
    GC_CHECK(cuStreamSynchronize(s));

    void *buffer = gc_xpages(BUFFER_BYTES);
    GC_CHECK(cuMemHostRegister(buffer, BUFFER_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUlibrary lib = used_library(s);

    GC_CHECK(gc_spin(&kernels, s, KERNEL_MS, 0, 0));
    gc_sleep_ms(SETTLE_MS);
    bool running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
    CUresult unload = cuLibraryUnload(lib);
    CUresult unregister = cuMemHostUnregister(buffer);

    CUresult fault_rc = fault(&kernels, s);
    CUresult destroy = cuCtxDestroy(ctx);

    CUcontext again = NULL;
    CUresult again_rc = cuCtxCreate(&again, NULL, 0, dev);
    bool tried = again_rc == CUDA_SUCCESS;
    CUresult register_again = CUDA_ERROR_NOT_READY, unregister_again = CUDA_ERROR_NOT_READY;
    CUresult destroy_again = CUDA_ERROR_NOT_READY;
    if (tried) {
        register_again = cuMemHostRegister(buffer, BUFFER_BYTES, CU_MEMHOSTREGISTER_DEVICEMAP);
        unregister_again =
            register_again == CUDA_SUCCESS ? cuMemHostUnregister(buffer) : register_again;
        destroy_again = cuCtxDestroy(again);
    }

    printf("RESULT sticky unload_rc=%s unregister_rc=%s kernel_running=%d fault_rc=%s fault=%d",
           gc_rc(unload), gc_rc(unregister), (int)running, gc_rc(fault_rc),
           fault_rc != CUDA_SUCCESS);
    printf(" destroy_rc=%s again_rc=%s", gc_rc(destroy), gc_rc(again_rc));
    printf(" register_again_rc=%s unregister_again_rc=%s destroy_again_rc=%s",
           rc_or_not_tried(register_again, tried), rc_or_not_tried(unregister_again, tried),
           rc_or_not_tried(destroy_again, tried));
    printf(" cudefer=%d simulated=%d\n", gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
    return 0;
}
