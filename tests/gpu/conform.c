/* conform.c - check 6: the return codes of releases given bad input.
 *
 * Each case runs in a process of its own (some may break the context, or
 * the driver may crash on them); the script runs every case with and
 * without the shim and compares the codes.
 *
 * usage: conform list        prints the case names, one a line
 *        conform <case>      runs one case
 *
 * prints, per call whose code is the finding:
 *   RESULT conform case=<name> rc=<code>
 * (the capture case reports two calls: <name> and <name>.end_capture).
 * A set-up call that fails ends the program with status 2 and no RESULT.
 */
#include "gpucheck.h"

#define BYTES (1 * GC_MIB)

static const char *current_case;

static void report(const char *suffix, CUresult rc)
{
    printf("RESULT conform case=%s%s rc=%s\n", current_case, suffix, gc_rc(rc));
    fflush(stdout);
}

static CUdeviceptr device_alloc(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAlloc(&p, BYTES));
    return p;
}

/* ---- cuMemFree ----------------------------------------------------------- */

static void free_null(void)
{
    report("", cuMemFree(0));
}

static void free_never_allocated(void)
{
    report("", cuMemFree((CUdeviceptr)0xdead0000ull));
}

static void free_interior(void)
{
    CUdeviceptr p = device_alloc();
    report("", cuMemFree(p + 256));
}

static void free_double(void)
{
    CUdeviceptr p = device_alloc();
    GC_CHECK(cuMemFree(p));
    report("", cuMemFree(p));
}

static void free_managed_double(void)
{
    CUdeviceptr p;
    GC_CHECK(cuMemAllocManaged(&p, BYTES, CU_MEM_ATTACH_GLOBAL));
    GC_CHECK(cuMemFree(p));
    report("", cuMemFree(p));
}

static void free_malloc_ptr(void)
{
    void *h = gc_xmalloc(BYTES);
    report("", cuMemFree((CUdeviceptr)(uintptr_t)h));
    free(h);
}

static void free_alloc_host_ptr(void)
{
    void *h;
    GC_CHECK(cuMemAllocHost(&h, BYTES));
    report("", cuMemFree((CUdeviceptr)(uintptr_t)h));
}

static void free_no_context(void)
{
    CUdeviceptr p = device_alloc();
    CUcontext popped;
    GC_CHECK(cuCtxPopCurrent(&popped));
    report("", cuMemFree(p));
}

/* cuMemFree inside a global-mode capture on this thread. */
static void free_in_capture(void)
{
    struct gc_kernels k;
    CUstream s;
    CUgraph g = NULL;
    gc_load_kernels(&k);
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p = device_alloc(), q = device_alloc();
    GC_CHECK(gc_touch(&k, s, q, 16));
    GC_CHECK(cuStreamSynchronize(s));

    GC_CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    GC_CHECK(gc_touch(&k, s, q, 16));
    report("", cuMemFree(p));
    CUresult end = cuStreamEndCapture(s, &g);
    report(".end_capture", end);
    if (end == CUDA_SUCCESS && g)
        GC_CHECK(cuGraphDestroy(g));
}

/* ---- cuMemFreeHost --------------------------------------------------------- */

static void free_host_malloc_ptr(void)
{
    void *h = gc_xmalloc(BYTES);
    report("", cuMemFreeHost(h));
    free(h);
}

static void free_host_device_ptr(void)
{
    CUdeviceptr p = device_alloc();
    report("", cuMemFreeHost((void *)(uintptr_t)p));
}

static void free_host_double(void)
{
    void *h;
    GC_CHECK(cuMemAllocHost(&h, BYTES));
    GC_CHECK(cuMemFreeHost(h));
    report("", cuMemFreeHost(h));
}

/* ---- cuMemHostUnregister ----------------------------------------------------- */

static void unregister_never_registered(void)
{
    void *h = gc_xpages(BYTES);
    report("", cuMemHostUnregister(h));
    free(h);
}

static void unregister_double(void)
{
    void *h = gc_xpages(BYTES);
    GC_CHECK(cuMemHostRegister(h, BYTES, 0));
    GC_CHECK(cuMemHostUnregister(h));
    report("", cuMemHostUnregister(h));
    free(h);
}

/* ---- arrays, modules, libraries ---------------------------------------------- */

static void array_destroy_double(void)
{
    CUarray a;
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = 64, .Height = 64, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    GC_CHECK(cuArrayCreate(&a, &d));
    GC_CHECK(cuArrayDestroy(a));
    report("", cuArrayDestroy(a));
}

static void module_unload_double(void)
{
    CUmodule m;
    GC_CHECK(cuModuleLoadData(&m, cudefer_kernels_ptx));
    GC_CHECK(cuModuleUnload(m));
    report("", cuModuleUnload(m));
}

static void library_unload_double(void)
{
    CUlibrary l;
    CUkernel k;
    CUfunction f;
    GC_CHECK(cuLibraryLoadData(&l, cudefer_kernels_ptx, NULL, NULL, 0, NULL, NULL, 0));
    GC_CHECK(cuLibraryGetKernel(&k, l, "cudefer_touch"));
    GC_CHECK(cuKernelGetFunction(&f, k));
    GC_CHECK(cuLibraryUnload(l));
    report("", cuLibraryUnload(l));
}

/* ---- the table ------------------------------------------------------------------ */

struct conform_case {
    const char *name;
    void (*run)(void);
};

static const struct conform_case cases[] = {
    {"cuMemFree(0)", free_null},
    {"cuMemFree(never_allocated)", free_never_allocated},
    {"cuMemFree(interior_pointer)", free_interior},
    {"cuMemFree(double)", free_double},
    {"cuMemFree(managed_double)", free_managed_double},
    {"cuMemFree(malloc_pointer)", free_malloc_ptr},
    {"cuMemFree(cuMemAllocHost_pointer)", free_alloc_host_ptr},
    {"cuMemFree(no_current_context)", free_no_context},
    {"cuMemFreeHost(malloc_pointer)", free_host_malloc_ptr},
    {"cuMemFreeHost(device_pointer)", free_host_device_ptr},
    {"cuMemFreeHost(double)", free_host_double},
    {"cuMemHostUnregister(never_registered)", unregister_never_registered},
    {"cuMemHostUnregister(double)", unregister_double},
    {"cuArrayDestroy(double)", array_destroy_double},
    {"cuModuleUnload(double)", module_unload_double},
    {"cuLibraryUnload(double)", library_unload_double},
    {"cuMemFree(in_global_capture)", free_in_capture},
};

int main(int argc, char **argv)
{
    size_t n = sizeof cases / sizeof cases[0];
    if (argc != 2)
        gc_die("usage: conform list | conform <case>");
    if (strcmp(argv[1], "list") == 0) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cases[i].name) == 0) {
            current_case = cases[i].name;
            gc_init();
            cases[i].run();
            return 0;
        }
    }
    gc_die("unknown case '%s' (conform list names them)", argv[1]);
}
