// rt_hostloop.cu - a CUDA runtime program that allocates and releases
// host memory in a loop while another stream computes.
//
// A background kernel (a 1-thread spin of --bg-ms milliseconds) runs on a
// non-blocking stream of its own and is relaunched as soon as the previous
// one has finished (checked once per iteration, with cudaEventQuery), so
// the GPU is nearly always busy with work that the loop does not use. The
// loop, on a second non-blocking stream, does per iteration:
//
//   mallochost: cudaMallocHost, fill, cudaMemcpyAsync to a device buffer,
//               a kernel adds 1 to every word, cudaMemcpyAsync back,
//               cudaStreamSynchronize(loop stream), check, cudaFreeHost
//   register:   the same on one page-aligned malloc'd buffer (allocated once)
//               with cudaHostRegister / cudaHostUnregister around it
//
// Without cudefer cudaFreeHost and cudaHostUnregister wait for the
// background kernel, every iteration. Each run is timed from the first
// iteration to a cudaDeviceSynchronize after the last one (included).
//
// Prints per loop:
//   RESULT rt_hostloop loop=<name> us_per_iter=<median> min=<> max=<> runs=<>
//          iters=<> bytes=<> bg_ms=<> bg_kernels=<> checksum=<hex> errors=<n>
//          cudefer=<0|1>
// (and one "RUN ..." line per run). The checksum covers every word copied
// back, so it must be the same with and without cudefer.
//
// usage: rt_hostloop [--iters N] [--runs R] [--bytes B] [--bg-ms MS]
// Exit status: 0; 1 if a copied word was wrong; 2 if a CUDA call failed.
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#define CK(call)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) {                                                  \
            fflush(stdout);                                                       \
            fprintf(stderr, "rt_hostloop: %s:%d: %s failed: %s (%s)\n", __FILE__, \
                    __LINE__, #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
            exit(2);                                                              \
        }                                                                         \
    } while (0)

__global__ void spin(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

__global__ void add_one(uint32_t *w, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        w[i] += 1u;
}

static double now_ms()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static uint32_t pattern(long iter, size_t j)
{
    uint32_t x = (uint32_t)iter * 2654435761u ^ (uint32_t)j * 40503u;
    x ^= x >> 15;
    return x;
}

struct state {
    size_t bytes = 64 * 1024;
    int iters = 300;
    int runs = 5;
    double bg_ms = 2.0;

    cudaStream_t bg = nullptr, work = nullptr;
    cudaEvent_t bg_done = nullptr;
    uint32_t *dev = nullptr;
    long bg_kernels = 0;
    long errors = 0;
    unsigned long long sum = 1469598103934665603ull; // FNV-1a over copied words
};

// Relaunches the background kernel if the previous one has finished.
static void keep_busy(state &s)
{
    cudaError_t q = cudaEventQuery(s.bg_done);
    if (q == cudaErrorNotReady)
        return;
    CK(q);
    unsigned long long ns = (unsigned long long)(s.bg_ms * 1e6);
    void *args[] = {&ns};
    CK(cudaLaunchKernel((const void *)spin, dim3(1), dim3(1), args, 0, s.bg));
    CK(cudaEventRecord(s.bg_done, s.bg));
    s.bg_kernels++;
}

// Copies host -> device, adds 1 on the device, copies back, checks.
static void round_trip(state &s, uint32_t *host, long iter, bool record)
{
    size_t n = s.bytes / sizeof(uint32_t);
    for (size_t j = 0; j < n; j++)
        host[j] = pattern(iter, j);
    CK(cudaMemcpyAsync(s.dev, host, s.bytes, cudaMemcpyHostToDevice, s.work));
    uint32_t *d = s.dev;
    void *args[] = {&d, &n};
    CK(cudaLaunchKernel((const void *)add_one, dim3((unsigned)((n + 255) / 256)), dim3(256), args,
                        0, s.work));
    CK(cudaMemcpyAsync(host, s.dev, s.bytes, cudaMemcpyDeviceToHost, s.work));
    CK(cudaStreamSynchronize(s.work));
    for (size_t j = 0; j < n; j++) {
        uint32_t want = pattern(iter, j) + 1u;
        if (host[j] != want) {
            if (s.errors < 5)
                fprintf(stderr, "rt_hostloop: iteration %ld word %zu: %08x, expected %08x\n",
                        iter, j, host[j], want);
            s.errors++;
        }
        if (record) {
            s.sum ^= host[j];
            s.sum *= 1099511628211ull;
        }
    }
}

static void iter_mallochost(state &s, long iter, bool record, void *)
{
    keep_busy(s);
    uint32_t *h = nullptr;
    CK(cudaMallocHost(&h, s.bytes));
    round_trip(s, h, iter, record);
    CK(cudaFreeHost(h));
}

static void iter_register(state &s, long iter, bool record, void *buf)
{
    keep_busy(s);
    CK(cudaHostRegister(buf, s.bytes, cudaHostRegisterDefault));
    round_trip(s, (uint32_t *)buf, iter, record);
    CK(cudaHostUnregister(buf));
}

static void run_loop(state &s, const char *name, void (*iter)(state &, long, bool, void *),
                     void *buf, bool cudefer)
{
    s.bg_kernels = 0;
    s.errors = 0;
    s.sum = 1469598103934665603ull;

    // Warm-up: first calls of each kind, outside the timing.
    for (int i = 0; i < 20; i++)
        iter(s, -1 - i, false, buf);
    CK(cudaDeviceSynchronize());
    s.bg_kernels = 0;

    std::vector<double> us;
    for (int run = 1; run <= s.runs; run++) {
        double t0 = now_ms();
        for (int i = 0; i < s.iters; i++)
            iter(s, (long)i, run == 1, buf);
        CK(cudaDeviceSynchronize());
        double t1 = now_ms();
        double v = (t1 - t0) * 1e3 / s.iters;
        us.push_back(v);
        printf("RUN rt_hostloop loop=%s run=%d us_per_iter=%.3f\n", name, run, v);
        fflush(stdout);
    }
    std::vector<double> sorted = us;
    std::sort(sorted.begin(), sorted.end());
    size_t m = sorted.size();
    double med = m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
    printf("RESULT rt_hostloop loop=%s us_per_iter=%.3f min=%.3f max=%.3f runs=%d iters=%d "
           "bytes=%zu bg_ms=%.2f bg_kernels=%ld checksum=%016llx errors=%ld cudefer=%d\n",
           name, med, sorted.front(), sorted.back(), s.runs, s.iters, s.bytes, s.bg_ms,
           s.bg_kernels, s.sum, s.errors, cudefer ? 1 : 0);
    fflush(stdout);
}

static long arg_long(const char *v, long lo, long hi)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "rt_hostloop: bad value %s\n", v);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    state s;
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--iters") && has)
            s.iters = (int)arg_long(argv[++i], 1, 1000000);
        else if (!strcmp(argv[i], "--runs") && has)
            s.runs = (int)arg_long(argv[++i], 1, 100);
        else if (!strcmp(argv[i], "--bytes") && has)
            s.bytes = (size_t)arg_long(argv[++i], 4096, 1L << 30) & ~(size_t)4095;
        else if (!strcmp(argv[i], "--bg-ms") && has)
            s.bg_ms = (double)arg_long(argv[++i], 0, 10000);
        else {
            fprintf(stderr, "usage: %s [--iters N] [--runs R] [--bytes B] [--bg-ms MS]\n",
                    argv[0]);
            return 2;
        }
    }
    bool cudefer = dlsym(RTLD_DEFAULT, "cudefer_version") != nullptr;

    CK(cudaSetDevice(0));
    CK(cudaFree(0)); // creates the context
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    printf("rt_hostloop: %s, runtime %d, driver %d, cudefer %s\n", prop.name, rt, drv,
           cudefer ? "loaded" : "not loaded");

    CK(cudaStreamCreateWithFlags(&s.bg, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s.work, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&s.bg_done, cudaEventDisableTiming));
    CK(cudaEventRecord(s.bg_done, s.bg));
    CK(cudaMalloc(&s.dev, s.bytes));

    void *buf = aligned_alloc(4096, s.bytes);
    if (!buf) {
        fprintf(stderr, "rt_hostloop: out of host memory\n");
        return 2;
    }
    memset(buf, 0, s.bytes);

    long errors = 0;
    run_loop(s, "mallochost", iter_mallochost, nullptr, cudefer);
    errors += s.errors;
    run_loop(s, "register", iter_register, buf, cudefer);
    errors += s.errors;

    CK(cudaDeviceSynchronize());
    CK(cudaFree(s.dev));
    CK(cudaEventDestroy(s.bg_done));
    CK(cudaStreamDestroy(s.work));
    CK(cudaStreamDestroy(s.bg));
    free(buf);
    printf("rt_hostloop: %s\n", errors ? "DATA ERRORS" : "all copied data correct");
    return errors ? 1 : 0;
}
