// doors_rt.cu - check 1(a) and 1(b): a CUDA runtime program.
//
// Built twice by scripts/gpu-check.sh: with nvcc's default static runtime
// and with -cudart shared. The runtime reaches the driver through
// cuGetProcAddress; the shim must answer there. Every allocation kind is
// used by a kernel or a copy and released; stdout is a list of checksums
// that must be the same with and without the shim.
#include "rt.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static const size_t kWords = 1 << 16;
static const size_t kBytes = kWords * sizeof(uint32_t);
static const int kRounds = 3;

__global__ void fill(uint32_t *out, size_t n, uint32_t seed)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        out[i] = x;
    }
}

__global__ void add(uint32_t *a, const uint32_t *b, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        a[i] += b[i];
}

static unsigned long long checksum(const uint32_t *w, size_t n)
{
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void print_sum(const char *what, int round, const uint32_t *w)
{
    printf("%s round %d: checksum %016llx\n", what, round, checksum(w, kWords));
}

static void launch_fill(uint32_t *out, uint32_t seed, cudaStream_t s)
{
    fill<<<(unsigned)((kWords + 255) / 256), 256, 0, s>>>(out, kWords, seed);
    CK(cudaGetLastError());
}

// cudaMalloc + kernels on a stream of our own + copy into cudaMallocHost.
static void device_and_pinned(int round)
{
    cudaStream_t s;
    uint32_t *a, *b, *h;
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc(&a, kBytes));
    CK(cudaMalloc(&b, kBytes));
    CK(cudaMallocHost(&h, kBytes));
    launch_fill(a, 1u + (uint32_t)round, s);
    launch_fill(b, 100u + (uint32_t)round, s);
    add<<<(unsigned)((kWords + 255) / 256), 256, 0, s>>>(a, b, kWords);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(h, a, kBytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    print_sum("cudaMalloc->cudaMallocHost", round, h);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFreeHost(h));
    CK(cudaStreamDestroy(s));
}

// A registered malloc buffer as the target of a copy.
static void registered(int round)
{
    uint32_t *d;
    void *r = aligned_alloc(4096, kBytes);
    if (!r) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    CK(cudaHostRegister(r, kBytes, cudaHostRegisterDefault));
    CK(cudaMalloc(&d, kBytes));
    launch_fill(d, 200u + (uint32_t)round, 0);
    CK(cudaMemcpy(r, d, kBytes, cudaMemcpyDeviceToHost));
    print_sum("cudaMalloc->cudaHostRegister", round, (const uint32_t *)r);
    CK(cudaHostUnregister(r));
    CK(cudaFree(d));
    free(r);
}

// Managed memory written by a kernel, read on the host.
static void managed(int round)
{
    uint32_t *m;
    CK(cudaMallocManaged(&m, kBytes));
    launch_fill(m, 300u + (uint32_t)round, 0);
    CK(cudaDeviceSynchronize());
    print_sum("cudaMallocManaged", round, m);
    CK(cudaFree(m));
}

// A 2D array: host -> array -> host.
static void array(int round)
{
    const size_t width = 256, height = kWords / 256;
    static uint32_t in[kWords], out[kWords];
    for (size_t i = 0; i < kWords; i++)
        in[i] = (uint32_t)i * 40503u + (uint32_t)round;
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<unsigned int>();
    cudaArray_t a;
    CK(cudaMallocArray(&a, &desc, width, height));
    CK(cudaMemcpy2DToArray(a, 0, 0, in, width * 4, width * 4, height, cudaMemcpyHostToDevice));
    CK(cudaMemcpy2DFromArray(out, width * 4, a, 0, 0, width * 4, height,
                             cudaMemcpyDeviceToHost));
    print_sum("cudaMallocArray", round, out);
    CK(cudaFreeArray(a));
}

int main()
{
    CK(cudaSetDevice(0));
    for (int round = 0; round < kRounds; round++) {
        device_and_pinned(round);
        registered(round);
        managed(round);
        array(round);
    }
    CK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
