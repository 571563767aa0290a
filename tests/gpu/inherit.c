/* inherit.c - check 18: a block allocated after a release carries nothing
 * the program set on the block it released.
 *
 * The driver hands out a new allocation with no advice, no stream
 * attachment and no pointer attribute set, even at the address of a block
 * just freed. cudefer may hand the released block itself out again (its
 * reuse); whatever the program set on it must not come with it. Each
 * variant sets something on a block, releases it, allocates the same size
 * and kind again at once (the GPU idle, so that a reuse can happen), and
 * asks the driver's queries on both. With cudefer every answer on the new
 * block must be the driver's alone.
 *
 * usage: inherit <variant>
 *   advise      2 MiB managed: cuMemAdvise READ_MOSTLY, PREFERRED_LOCATION
 *               (the host), ACCESSED_BY (device 0); cuMemRangeGetAttribute
 *               of the three
 *   prefetch    2 MiB managed: cuMemPrefetchAsync to device 0;
 *               cuMemRangeGetAttribute LAST_PREFETCH_LOCATION
 *   attach      2 MiB managed (CU_MEM_ATTACH_GLOBAL): cuStreamAttachMemAsync
 *               CU_MEM_ATTACH_HOST on a stream; the driver has no query of
 *               the attachment, so the new block is written by a kernel on
 *               another stream and read by the host, and the codes printed
 *   syncmemops  1 MiB device memory and 1 MiB of cuMemAllocHost:
 *               cuPointerSetAttribute SYNC_MEMOPS = 1; cuPointerGetAttribute
 *               SYNC_MEMOPS
 *   dmabuf      2 MiB device memory: cuMemGetHandleForAddressRange (a
 *               dma-buf, closed at once); the driver has no query of it, so
 *               the new block is exported too and both codes printed (the
 *               wrapper passes the call through; cudefer keeps an exported
 *               block out of its reuse)
 *
 * prints, per block kind:
 *   RESULT inherit variant=<v> kind=<managed|device|host> set_rc=<code>
 *          before=<answers on the first block> after=<answers on the new one>
 *          same_address=<0|1> cudefer=<0|1> simulated=<0|1>
 * (answers: name:value pairs joined by commas; a query that failed gives
 * its code as the value).
 */
#include "gpu.h"

#include <unistd.h>

#define MANAGED_BYTES (2 * GC_MIB)
#define DEVICE_BYTES (1 * GC_MIB)

static CUmemLocation device0(void)
{
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    return loc;
}

static void range_int(char *out, size_t n, const char *name, CUmem_range_attribute attr,
                      CUdeviceptr p, size_t bytes)
{
    int v = -100;
    CUresult rc = cuMemRangeGetAttribute(&v, sizeof v, attr, p, bytes);
    size_t used = strlen(out);
    if (rc == CUDA_SUCCESS)
        snprintf(out + used, n - used, "%s%s:%d", used ? "," : "", name, v);
    else
        snprintf(out + used, n - used, "%s%s:%s", used ? "," : "", name, gc_rc(rc));
}

static void advice_answers(char *out, size_t n, CUdeviceptr p)
{
    out[0] = '\0';
    range_int(out, n, "read_mostly", CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, MANAGED_BYTES);
    range_int(out, n, "preferred", CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, MANAGED_BYTES);
    range_int(out, n, "accessed_by", CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, p, MANAGED_BYTES);
}

static void prefetch_answers(char *out, size_t n, CUdeviceptr p)
{
    out[0] = '\0';
    range_int(out, n, "last_prefetch", CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p,
              MANAGED_BYTES);
}

static void sync_memops_answer(char *out, size_t n, CUdeviceptr p)
{
    int v = -100;
    CUresult rc = cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p);
    if (rc == CUDA_SUCCESS)
        snprintf(out, n, "sync_memops:%d", v);
    else
        snprintf(out, n, "sync_memops:%s", gc_rc(rc));
}

static void print_result(const char *variant, const char *kind, CUresult set, const char *before,
                         const char *after, bool same)
{
    printf("RESULT inherit variant=%s kind=%s set_rc=%s before=%s after=%s same_address=%d"
           " cudefer=%d simulated=%d\n",
           variant, kind, gc_rc(set), before, after, same, gc_cudefer_loaded(), gc_test_driver());
    fflush(stdout);
}

/* The GPU idle and a moment for a release's fence to be seen passed. */
static void settle(void)
{
    gc_sleep_ms(5);
}

/* A managed block that set() changes, its answers, its release, and the
 * answers of the next block of its size. */
static void managed_again(const char *variant, CUresult (*set)(CUdeviceptr p),
                          void (*answers)(char *out, size_t n, CUdeviceptr p))
{
    char before[256], after[256];
    CUdeviceptr p, q;
    GC_CHECK(cuMemAllocManaged(&p, MANAGED_BYTES, CU_MEM_ATTACH_GLOBAL));
    CUresult rc = set(p);
    answers(before, sizeof before, p);
    GC_CHECK(cuMemFree(p));
    settle();
    GC_CHECK(cuMemAllocManaged(&q, MANAGED_BYTES, CU_MEM_ATTACH_GLOBAL));
    answers(after, sizeof after, q);
    print_result(variant, "managed", rc, before, after, p == q);
    GC_CHECK(cuMemFree(q));
}

static CUresult advise(CUdeviceptr p)
{
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUresult rc = cuMemAdvise(p, MANAGED_BYTES, CU_MEM_ADVISE_SET_READ_MOSTLY, device0());
    if (rc == CUDA_SUCCESS)
        rc = cuMemAdvise(p, MANAGED_BYTES, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host);
    if (rc == CUDA_SUCCESS)
        rc = cuMemAdvise(p, MANAGED_BYTES, CU_MEM_ADVISE_SET_ACCESSED_BY, device0());
    return rc;
}

static void variant_advise(void)
{
    managed_again("advise", advise, advice_answers);
}

/* On a stream of its own, which is synchronised. */
static CUresult prefetch(CUdeviceptr p)
{
    CUstream s;
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUresult rc = cuMemPrefetchAsync(p, MANAGED_BYTES, device0(), 0, s);
    GC_CHECK(cuStreamSynchronize(s));
    GC_CHECK(cuStreamDestroy(s));
    return rc;
}

static void variant_prefetch(void)
{
    managed_again("prefetch", prefetch, prefetch_answers);
}

static void variant_attach(void)
{
    char before[64], after[128];
    struct gc_kernels k;
    CUdeviceptr p, q;
    CUstream s, other;
    gc_load_kernels(&k);
    GC_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    GC_CHECK(cuMemAllocManaged(&p, MANAGED_BYTES, CU_MEM_ATTACH_GLOBAL));
    CUresult set = cuStreamAttachMemAsync(s, p, 0, CU_MEM_ATTACH_HOST);
    GC_CHECK(cuStreamSynchronize(s));
    snprintf(before, sizeof before, "attached:%s", gc_rc(set));
    GC_CHECK(cuMemFree(p));
    settle();
    GC_CHECK(cuMemAllocManaged(&q, MANAGED_BYTES, CU_MEM_ATTACH_GLOBAL));
    volatile unsigned *words = (volatile unsigned *)(uintptr_t)q;
    words[1] = 0;
    CUresult touch = gc_touch(&k, other, q, 16);
    CUresult sync = cuStreamSynchronize(other);
    /* cudefer_touch writes each word's index. */
    unsigned word = sync == CUDA_SUCCESS ? words[1] : 0;
    snprintf(after, sizeof after, "touch:%s,sync:%s,word_written:%d", gc_rc(touch), gc_rc(sync),
             word == 1);
    print_result("attach", "managed", set, before, after, p == q);
    GC_CHECK(cuMemFree(q));
    GC_CHECK(cuStreamDestroy(s));
    GC_CHECK(cuStreamDestroy(other));
}

static void variant_sync_memops(void)
{
    char before[64], after[64];
    const int one = 1;
    CUdeviceptr p, q;
    GC_CHECK(cuMemAlloc(&p, DEVICE_BYTES));
    CUresult set = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p);
    sync_memops_answer(before, sizeof before, p);
    GC_CHECK(cuMemFree(p));
    settle();
    GC_CHECK(cuMemAlloc(&q, DEVICE_BYTES));
    sync_memops_answer(after, sizeof after, q);
    print_result("syncmemops", "device", set, before, after, p == q);
    GC_CHECK(cuMemFree(q));

    void *h, *g;
    GC_CHECK(cuMemAllocHost(&h, DEVICE_BYTES));
    set = cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)h);
    sync_memops_answer(before, sizeof before, (CUdeviceptr)(uintptr_t)h);
    GC_CHECK(cuMemFreeHost(h));
    settle();
    GC_CHECK(cuMemAllocHost(&g, DEVICE_BYTES));
    sync_memops_answer(after, sizeof after, (CUdeviceptr)(uintptr_t)g);
    print_result("syncmemops", "host", set, before, after, h == g);
    GC_CHECK(cuMemFreeHost(g));
}

static void variant_dmabuf(void)
{
    char before[64], after[64];
    CUdeviceptr p, q;
    int fd = -1;
    GC_CHECK(cuMemAlloc(&p, MANAGED_BYTES));
    CUresult set = cuMemGetHandleForAddressRange(&fd, p, MANAGED_BYTES,
                                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (fd >= 0)
        close(fd);
    snprintf(before, sizeof before, "exported:%s", gc_rc(set));
    GC_CHECK(cuMemFree(p));
    settle();
    GC_CHECK(cuMemAlloc(&q, MANAGED_BYTES));
    fd = -1;
    CUresult again = cuMemGetHandleForAddressRange(&fd, q, MANAGED_BYTES,
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (fd >= 0)
        close(fd);
    snprintf(after, sizeof after, "exported:%s", gc_rc(again));
    print_result("dmabuf", "device", set, before, after, p == q);
    GC_CHECK(cuMemFree(q));
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } variants[] = {
        {"advise", variant_advise},
        {"prefetch", variant_prefetch},
        {"attach", variant_attach},
        {"syncmemops", variant_sync_memops},
        {"dmabuf", variant_dmabuf},
    };
    for (size_t i = 0; argc == 2 && i < sizeof variants / sizeof variants[0]; i++) {
        if (strcmp(argv[1], variants[i].name) == 0) {
            gc_init();
            variants[i].run();
            GC_CHECK(cuCtxSynchronize());
            gc_fini();
            return 0;
        }
    }
    gc_die("usage: inherit <advise|prefetch|attach|syncmemops|dmabuf>");
    return 2;
}
