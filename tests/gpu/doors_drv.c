/* doors_drv.c - check 1(c): a driver-API program linked with -lcuda.
 *
 * It reaches the shim through its exported symbols (cuMemFree is the
 * header's cuMemFree_v2, and so on). Every allocation kind is used by a
 * kernel or a copy and released; its stdout is a list of checksums that
 * must be the same with and without the shim.
 */
#include "gpu.h"

#define WORDS 4096
#define BYTES (WORDS * 4)
#define ROUNDS 3

struct program {
    struct gc_kernels k;     /* from a module */
    CUlibrary library;
    CUfunction lib_touch;    /* cudefer_touch from the library */
    CUstream stream;
};

static void print_sum(const char *what, int round, const uint32_t *w, size_t n)
{
    printf("%s round %d: checksum %016llx\n", what, round, gc_checksum(w, n));
}

/* cuMemAlloc + kernel + copy into cuMemAllocHost memory. */
static void device_and_pinned(struct program *p, int round)
{
    CUdeviceptr d;
    void *h;
    GC_CHECK(cuMemAlloc(&d, BYTES));
    GC_CHECK(cuMemsetD8Async(d, 0xab, BYTES, p->stream));
    GC_CHECK(gc_touch(&p->k, p->stream, d, WORDS / 2 + (unsigned)round));
    GC_CHECK(cuMemAllocHost(&h, BYTES));
    GC_CHECK(cuStreamSynchronize(p->stream));
    GC_CHECK(cuMemcpyDtoH(h, d, BYTES));
    print_sum("device->cuMemAllocHost", round, h, WORDS);
    GC_CHECK(cuMemFree(d));
    GC_CHECK(cuMemFreeHost(h));
}

/* cuMemHostAlloc (mapped) written by a kernel through its device pointer. */
static void mapped_host(struct program *p, int round)
{
    void *h;
    CUdeviceptr d;
    GC_CHECK(cuMemHostAlloc(&h, BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
    memset(h, 0x5a, BYTES);
    GC_CHECK(cuMemHostGetDevicePointer(&d, h, 0));
    GC_CHECK(gc_touch(&p->k, p->stream, d, WORDS / 4 + (unsigned)round));
    GC_CHECK(cuStreamSynchronize(p->stream));
    print_sum("cuMemHostAlloc(mapped)", round, h, WORDS);
    GC_CHECK(cuMemFreeHost(h));
}

/* A registered malloc buffer as the target of a copy. */
static void registered(struct program *p, int round)
{
    CUdeviceptr d;
    uint32_t *h = gc_xpages(BYTES);
    GC_CHECK(cuMemHostRegister(h, BYTES, 0));
    GC_CHECK(cuMemAlloc(&d, BYTES));
    GC_CHECK(cuMemsetD32Async(d, 7u, WORDS, p->stream));
    GC_CHECK(gc_touch(&p->k, p->stream, d, 100 + (unsigned)round));
    GC_CHECK(cuStreamSynchronize(p->stream));
    GC_CHECK(cuMemcpyDtoH(h, d, BYTES));
    print_sum("device->cuMemHostRegister", round, h, WORDS);
    GC_CHECK(cuMemHostUnregister(h));
    GC_CHECK(cuMemFree(d));
    free(h);
}

/* Managed memory written by the library's kernel, read on the host. */
static void managed(struct program *p, int round)
{
    CUdeviceptr m;
    GC_CHECK(cuMemAllocManaged(&m, BYTES, CU_MEM_ATTACH_GLOBAL));
    memset((void *)(uintptr_t)m, 0x11, BYTES);
    GC_CHECK(gc_touch_with(p->lib_touch, p->stream, m, WORDS - (unsigned)round));
    GC_CHECK(cuCtxSynchronize());
    print_sum("cuMemAllocManaged", round, (const uint32_t *)(uintptr_t)m, WORDS);
    GC_CHECK(cuMemFree(m));
}

/* A 1D array: host -> array -> host. */
static void array(int round)
{
    static uint32_t in[WORDS], out[WORDS];
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR desc = {
        .Width = WORDS, .Height = 0, .Format = CU_AD_FORMAT_UNSIGNED_INT32, .NumChannels = 1};
    for (uint32_t i = 0; i < WORDS; i++)
        in[i] = i * 2654435761u + (uint32_t)round;
    GC_CHECK(cuArrayCreate(&a, &desc));
    GC_CHECK(cuMemcpyHtoA(a, 0, in, BYTES));
    GC_CHECK(cuMemcpyAtoH(out, a, 0, BYTES));
    print_sum("cuArray", round, out, WORDS);
    GC_CHECK(cuArrayDestroy(a));
}

/* A second module, loaded and unloaded each round. */
static void second_module(struct program *p, int round)
{
    CUmodule m;
    CUfunction f;
    CUdeviceptr d;
    uint32_t out[64] = {0};
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    GC_CHECK(cuModuleGetFunction(&f, m, "cudefer_touch"));
    GC_CHECK(cuMemAlloc(&d, sizeof out));
    GC_CHECK(cuMemsetD8Async(d, 0, sizeof out, p->stream));
    GC_CHECK(gc_touch_with(f, p->stream, d, 32 + (unsigned)round));
    GC_CHECK(cuStreamSynchronize(p->stream));
    GC_CHECK(cuMemcpyDtoH(out, d, sizeof out));
    print_sum("second module", round, out, 64);
    GC_CHECK(cuMemFree(d));
    GC_CHECK(cuModuleUnload(m));
}

int main(void)
{
    struct program p;
    CUkernel kernel;
    gc_init();
    gc_load_kernels(&p.k);
    GC_CHECK(cuLibraryLoadData(&p.library, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&kernel, p.library, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&p.lib_touch, kernel));
    GC_CHECK(cuStreamCreate(&p.stream, CU_STREAM_NON_BLOCKING));

    for (int round = 0; round < ROUNDS; round++) {
        device_and_pinned(&p, round);
        mapped_host(&p, round);
        registered(&p, round);
        managed(&p, round);
        array(round);
        second_module(&p, round);
    }

    GC_CHECK(cuCtxSynchronize());
    GC_CHECK(cuStreamDestroy(p.stream));
    GC_CHECK(cuLibraryUnload(p.library));
    GC_CHECK(cuModuleUnload(p.k.module));
    GC_CHECK(cuCtxSynchronize());
    gc_fini();
    printf("done\n");
    return 0;
}
