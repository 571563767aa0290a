/* cusolver.c - the libs check for cuSOLVER (lib=cusolver):
 * cusolverDnDestroy after a Cholesky factorisation (potrf, with its
 * workspace), then the two probes of libs.h: cusolverDnDestroy, like
 * cublasDestroy, frees its workspace and synchronises the device.
 *
 * usage: libs_cusolver        prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cusolverDn.h>)
#include <cusolverDn.h>

#define N 256

struct solver {
    float *a, *work;
    int *info;
    cusolverDnHandle_t handle;
};

/* cuSOLVER has no names for its codes. */
static const char *solver_rc(int rc)
{
    return rc == CUSOLVER_STATUS_SUCCESS ? "ok" : libs_numbered("cusolverStatus", rc);
}

static bool solver_ok(cusolverStatus_t rc, const char *call)
{
    return libs_ok(rc == CUSOLVER_STATUS_SUCCESS, call, solver_rc(rc));
}

/* A symmetric positive definite matrix: N + 1 on the diagonal, 1 elsewhere. */
static float matrix[N * N];

static bool solver_buffers(struct solver *s)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            matrix[i * N + j] = i == j ? (float)N + 1.0f : 1.0f;
    return libs_cuda_zeros((void **)&s->a, sizeof matrix) &&
           libs_cuda_zeros((void **)&s->info, sizeof(int));
}

/* A handle made and used once: the matrix copied in, potrf (lower) with a
 * workspace of the size it asks for, the device synchronised. */
static bool solver_make(struct solver *s)
{
    int lwork = 0;
    if (!libs_cuda_ok(cudaMemcpy(s->a, matrix, sizeof matrix, cudaMemcpyHostToDevice),
                      "cudaMemcpy") ||
        !solver_ok(cusolverDnCreate(&s->handle), "cusolverDnCreate") ||
        !solver_ok(cusolverDnSpotrf_bufferSize(s->handle, CUBLAS_FILL_MODE_LOWER, N, s->a, N,
                                               &lwork),
                   "cusolverDnSpotrf_bufferSize"))
        return false;
    if (!s->work && !libs_cuda_ok(cudaMalloc((void **)&s->work,
                                             (size_t)(lwork > 0 ? lwork : 1) * sizeof(float)),
                                  "cudaMalloc"))
        return false;
    return solver_ok(cusolverDnSpotrf(s->handle, CUBLAS_FILL_MODE_LOWER, N, s->a, N, s->work,
                                      lwork, s->info),
                     "cusolverDnSpotrf") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_handle(void *s)
{
    return cusolverDnDestroy(((struct solver *)s)->handle);
}

int main(void)
{
    struct solver s = {0};
    void *block;
    int version = 0;
    libs_start("cusolver");
    if (solver_ok(cusolverGetVersion(&version), "cusolverGetVersion"))
        libs_info_int(version);
    if (!solver_buffers(&s) || !solver_make(&s) ||
        !solver_ok(cusolverDnDestroy(s.handle), "cusolverDnDestroy(warm-up)") ||
        !solver_make(&s) || !(block = libs_probe_block(LIBS_WORKSPACE_BYTES)))
        return libs_end();

    libs_baseline();
    libs_time("cusolverDnDestroy", "teardown", destroy_handle, &s, solver_rc);
    libs_probes(block, LIBS_WORKSPACE_BYTES);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("cusolver", "cusolverDn.h");
}
#endif
