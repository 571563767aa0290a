/* cublas.c - the libs check for cuBLAS (lib=cublas): cublasDestroy after an
 * sgemm, then the two probes of libs.h with a block of cuBLAS's workspace
 * size. cuBLAS documents that cublasDestroy synchronises the device; the
 * probes show the two halves of its wait apart (the workspace's cudaFree,
 * which cudefer defers, and cudaDeviceSynchronize, which waits by design).
 *
 * usage: libs_cublas          prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>

#define N 256

struct blas {
    float *a, *b, *c;
    cublasHandle_t handle;
};

static const char *blas_rc(int rc)
{
    return rc == CUBLAS_STATUS_SUCCESS ? "ok" : cublasGetStatusName((cublasStatus_t)rc);
}

static bool blas_ok(cublasStatus_t rc, const char *call)
{
    return libs_ok(rc == CUBLAS_STATUS_SUCCESS, call, blas_rc(rc));
}

static bool blas_buffers(struct blas *m)
{
    size_t bytes = (size_t)N * N * sizeof(float);
    return libs_cuda_zeros((void **)&m->a, bytes) && libs_cuda_zeros((void **)&m->b, bytes) &&
           libs_cuda_zeros((void **)&m->c, bytes);
}

/* A handle made and used once: one sgemm on the default stream, then the
 * device synchronised. */
static bool blas_make(struct blas *m)
{
    const float one = 1.0f, zero = 0.0f;
    return blas_ok(cublasCreate(&m->handle), "cublasCreate") &&
           blas_ok(cublasSgemm(m->handle, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, m->a, N, m->b,
                               N, &zero, m->c, N),
                   "cublasSgemm") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_handle(void *m)
{
    return cublasDestroy(((struct blas *)m)->handle);
}

int main(void)
{
    struct blas m = {0};
    void *block;
    int version = 0;
    libs_start("cublas");
    if (!blas_buffers(&m) || !blas_make(&m))
        return libs_end();
    if (blas_ok(cublasGetVersion(m.handle, &version), "cublasGetVersion"))
        libs_info_int(version);
    if (!blas_ok(cublasDestroy(m.handle), "cublasDestroy(warm-up)") || !blas_make(&m) ||
        !(block = libs_probe_block(LIBS_WORKSPACE_BYTES)))
        return libs_end();

    libs_baseline();
    libs_time("cublasDestroy", "teardown", destroy_handle, &m, blas_rc);
    libs_probes(block, LIBS_WORKSPACE_BYTES);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("cublas", "cublas_v2.h");
}
#endif
