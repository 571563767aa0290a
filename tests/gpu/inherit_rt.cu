// inherit_rt.cu - check 18, through the CUDA runtime: a managed block
// allocated after a release carries no advice and no prefetch location
// that the program set on the released one.
//
// The runtime reaches the driver through cuGetProcAddress (nvcc's default
// static runtime); cudaMemAdvise and cudaMemPrefetchAsync must reach
// cudefer's wrappers there, or cudefer's reuse would hand the released
// block on with what was set (inherit.c shows it with the driver API).
//
// usage: inherit_rt <rt_advise|rt_prefetch>
// prints the lines of inherit.c (kind=managed; answers from
// cudaMemRangeGetAttribute).
#include "rt.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

static const size_t kBytes = 2u << 20;

static cudaMemLocation device0()
{
    cudaMemLocation loc = {};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = 0;
    return loc;
}

static void range_int(char *out, size_t n, const char *name, cudaMemRangeAttribute attr,
                      const void *p)
{
    int v = -100;
    cudaError_t e = cudaMemRangeGetAttribute(&v, sizeof v, attr, p, kBytes);
    size_t used = strlen(out);
    if (e == cudaSuccess)
        snprintf(out + used, n - used, "%s%s:%d", used ? "," : "", name, v);
    else
        snprintf(out + used, n - used, "%s%s:%s", used ? "," : "", name, cudaGetErrorName(e));
}

static void advice_answers(char *out, size_t n, const void *p)
{
    out[0] = '\0';
    range_int(out, n, "read_mostly", cudaMemRangeAttributeReadMostly, p);
    range_int(out, n, "preferred", cudaMemRangeAttributePreferredLocation, p);
    range_int(out, n, "accessed_by", cudaMemRangeAttributeAccessedBy, p);
}

static void prefetch_answers(char *out, size_t n, const void *p)
{
    out[0] = '\0';
    range_int(out, n, "last_prefetch", cudaMemRangeAttributeLastPrefetchLocation, p);
}

static cudaError_t advise(void *p)
{
    cudaMemLocation host = {};
    host.type = cudaMemLocationTypeHost;
    cudaError_t e = cudaMemAdvise(p, kBytes, cudaMemAdviseSetReadMostly, device0());
    if (e == cudaSuccess)
        e = cudaMemAdvise(p, kBytes, cudaMemAdviseSetPreferredLocation, host);
    if (e == cudaSuccess)
        e = cudaMemAdvise(p, kBytes, cudaMemAdviseSetAccessedBy, device0());
    return e;
}

static cudaError_t prefetch(void *p)
{
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t e = cudaMemPrefetchAsync(p, kBytes, device0(), 0, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    return e;
}

// As bench/gpu.h: cudefer preloaded; the project's test driver in place of
// the driver (a smoke run without a GPU).
static int cudefer_loaded()
{
    return dlsym(RTLD_DEFAULT, "cudefer_version") != nullptr;
}

static int simulated()
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    int found = cuda && dlsym(cuda, "testdrv_launch") != nullptr;
    if (cuda)
        dlclose(cuda);
    return found;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "rt_advise") != 0 && strcmp(argv[1], "rt_prefetch") != 0)) {
        fprintf(stderr, "usage: inherit_rt <rt_advise|rt_prefetch>\n");
        return 2;
    }
    bool adv = strcmp(argv[1], "rt_advise") == 0;
    char before[256], after[256];
    void *p, *q;
    cudaError_t e = cudaSetDevice(0);
    if (e != cudaSuccess && simulated()) {
        // The runtime asks for more than the test driver models.
        printf("RESULT inherit variant=%s kind=managed set_rc=%s before=- after=- "
               "same_address=0 cudefer=%d simulated=1\n", argv[1], cudaGetErrorName(e),
               cudefer_loaded());
        return 0;
    }
    CK(e);
    CK(cudaMallocManaged(&p, kBytes, cudaMemAttachGlobal));
    cudaError_t set = adv ? advise(p) : prefetch(p);
    (adv ? advice_answers : prefetch_answers)(before, sizeof before, p);
    CK(cudaFree(p));
    usleep(5000); // the GPU idle and a moment for the release's fence
    CK(cudaMallocManaged(&q, kBytes, cudaMemAttachGlobal));
    (adv ? advice_answers : prefetch_answers)(after, sizeof after, q);
    printf("RESULT inherit variant=%s kind=managed set_rc=%s before=%s after=%s "
           "same_address=%d cudefer=%d simulated=%d\n",
           argv[1], set == cudaSuccess ? "CUDA_SUCCESS" : cudaGetErrorName(set), before, after,
           p == q, cudefer_loaded(), simulated());
    CK(cudaFree(q));
    CK(cudaDeviceSynchronize());
    return 0;
}
