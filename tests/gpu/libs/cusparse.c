/* cusparse.c - the libs check for cuSPARSE (lib=cusparse): after one SpMV
 * (with its buffer) and one triangular solve SpSV (analysis and solve, with
 * its buffer), the destruction of the SpSV descriptor (which holds the
 * analysis), the sparse matrix, a dense vector, and the handle.
 *
 * usage: libs_cusparse        prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cusparse.h>)
/* Its header marks its old types deprecated and then uses them itself, a
 * warning in every C program that includes it. */
#define DISABLE_CUSPARSE_DEPRECATED
#include <cusparse.h>

#define N 4096
#define NNZ (2 * N - 1) /* lower bidiagonal: 2 on the diagonal, -1 below */

struct sparse {
    int *rows, *cols; /* CSR on the device */
    float *vals, *x, *y;
    void *spmv_buffer, *spsv_buffer;
    cusparseHandle_t handle;
    cusparseSpMatDescr_t a;
    cusparseDnVecDescr_t vx, vy;
    cusparseSpSVDescr_t spsv;
};

static const char *sparse_rc(int rc)
{
    return rc == CUSPARSE_STATUS_SUCCESS ? "ok" : cusparseGetErrorName((cusparseStatus_t)rc);
}

static bool sparse_ok(cusparseStatus_t rc, const char *call)
{
    return libs_ok(rc == CUSPARSE_STATUS_SUCCESS, call, sparse_rc(rc));
}

/* The matrix (CSR, lower bidiagonal, so that it can be solved) and the
 * vectors, on the device. */
static bool sparse_data(struct sparse *s)
{
    static int rows[N + 1], cols[NNZ];
    static float vals[NNZ], ones[N];
    int k = 0;
    for (int i = 0; i < N; i++) {
        rows[i] = k;
        if (i > 0) {
            cols[k] = i - 1;
            vals[k++] = -1.0f;
        }
        cols[k] = i;
        vals[k++] = 2.0f;
        ones[i] = 1.0f;
    }
    rows[N] = k;
    return libs_cuda_copy((void **)&s->rows, rows, sizeof rows) &&
           libs_cuda_copy((void **)&s->cols, cols, sizeof cols) &&
           libs_cuda_copy((void **)&s->vals, vals, sizeof vals) &&
           libs_cuda_copy((void **)&s->x, ones, sizeof ones) &&
           libs_cuda_zeros((void **)&s->y, sizeof ones);
}

static bool sparse_describe(struct sparse *s)
{
    cusparseFillMode_t fill = CUSPARSE_FILL_MODE_LOWER;
    cusparseDiagType_t diag = CUSPARSE_DIAG_TYPE_NON_UNIT;
    return sparse_ok(cusparseCreateCsr(&s->a, N, N, NNZ, s->rows, s->cols, s->vals,
                                       CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                       CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F),
                     "cusparseCreateCsr") &&
           sparse_ok(cusparseSpMatSetAttribute(s->a, CUSPARSE_SPMAT_FILL_MODE, &fill, sizeof fill),
                     "cusparseSpMatSetAttribute") &&
           sparse_ok(cusparseSpMatSetAttribute(s->a, CUSPARSE_SPMAT_DIAG_TYPE, &diag, sizeof diag),
                     "cusparseSpMatSetAttribute") &&
           sparse_ok(cusparseCreateDnVec(&s->vx, N, s->x, CUDA_R_32F), "cusparseCreateDnVec") &&
           sparse_ok(cusparseCreateDnVec(&s->vy, N, s->y, CUDA_R_32F), "cusparseCreateDnVec");
}

/* cudaMalloc of a buffer of the size a library asked for (at least 4 bytes). */
static bool sparse_buffer(void **p, size_t bytes)
{
    return libs_cuda_ok(cudaMalloc(p, bytes ? bytes : 4), "cudaMalloc");
}

/* y = A x (SpMV), then A y = x solved (SpSV), each with its buffer. */
static bool sparse_use(struct sparse *s)
{
    const float one = 1.0f, zero = 0.0f;
    const cusparseOperation_t op = CUSPARSE_OPERATION_NON_TRANSPOSE;
    size_t spmv_bytes = 0, spsv_bytes = 0;
    return sparse_ok(cusparseSpMV_bufferSize(s->handle, op, &one, s->a, s->vx, &zero, s->vy,
                                             CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &spmv_bytes),
                     "cusparseSpMV_bufferSize") &&
           sparse_buffer(&s->spmv_buffer, spmv_bytes) &&
           sparse_ok(cusparseSpMV(s->handle, op, &one, s->a, s->vx, &zero, s->vy, CUDA_R_32F,
                                  CUSPARSE_SPMV_ALG_DEFAULT, s->spmv_buffer),
                     "cusparseSpMV") &&
           sparse_ok(cusparseSpSV_createDescr(&s->spsv), "cusparseSpSV_createDescr") &&
           sparse_ok(cusparseSpSV_bufferSize(s->handle, op, &one, s->a, s->vx, s->vy, CUDA_R_32F,
                                             CUSPARSE_SPSV_ALG_DEFAULT, s->spsv, &spsv_bytes),
                     "cusparseSpSV_bufferSize") &&
           sparse_buffer(&s->spsv_buffer, spsv_bytes) &&
           sparse_ok(cusparseSpSV_analysis(s->handle, op, &one, s->a, s->vx, s->vy, CUDA_R_32F,
                                           CUSPARSE_SPSV_ALG_DEFAULT, s->spsv, s->spsv_buffer),
                     "cusparseSpSV_analysis") &&
           sparse_ok(cusparseSpSV_solve(s->handle, op, &one, s->a, s->vx, s->vy, CUDA_R_32F,
                                        CUSPARSE_SPSV_ALG_DEFAULT, s->spsv),
                     "cusparseSpSV_solve") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static bool sparse_make(struct sparse *s)
{
    return sparse_ok(cusparseCreate(&s->handle), "cusparseCreate") && sparse_describe(s) &&
           sparse_use(s);
}

static int destroy_spsv(void *s)
{
    return cusparseSpSV_destroyDescr(((struct sparse *)s)->spsv);
}

static int destroy_matrix(void *s)
{
    return cusparseDestroySpMat(((struct sparse *)s)->a);
}

static int destroy_vector(void *s)
{
    return cusparseDestroyDnVec(((struct sparse *)s)->vx);
}

static int destroy_handle(void *s)
{
    return cusparseDestroy(((struct sparse *)s)->handle);
}

/* What the measured round times, in the same order, untimed; then the
 * buffers freed. */
static bool sparse_destroy(struct sparse *s)
{
    return sparse_ok(destroy_spsv(s), "cusparseSpSV_destroyDescr(warm-up)") &&
           sparse_ok(destroy_matrix(s), "cusparseDestroySpMat(warm-up)") &&
           sparse_ok(destroy_vector(s), "cusparseDestroyDnVec(warm-up)") &&
           sparse_ok(cusparseDestroyDnVec(s->vy), "cusparseDestroyDnVec(warm-up)") &&
           sparse_ok(destroy_handle(s), "cusparseDestroy(warm-up)") &&
           libs_cuda_ok(cudaFree(s->spmv_buffer), "cudaFree(warm-up)") &&
           libs_cuda_ok(cudaFree(s->spsv_buffer), "cudaFree(warm-up)");
}

int main(void)
{
    struct sparse s;
    int version = 0;
    memset(&s, 0, sizeof s);
    libs_start("cusparse");
    if (!sparse_data(&s) || !sparse_make(&s))
        return libs_end();
    if (sparse_ok(cusparseGetVersion(s.handle, &version), "cusparseGetVersion"))
        libs_info_int(version);
    if (!sparse_destroy(&s) || !sparse_make(&s))
        return libs_end();

    libs_baseline();
    libs_time("cusparseSpSV_destroyDescr", "teardown", destroy_spsv, &s, sparse_rc);
    libs_time("cusparseDestroySpMat", "teardown", destroy_matrix, &s, sparse_rc);
    libs_time("cusparseDestroyDnVec", "teardown", destroy_vector, &s, sparse_rc);
    cusparseDestroyDnVec(s.vy);
    libs_time("cusparseDestroy", "teardown", destroy_handle, &s, sparse_rc);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("cusparse", "cusparse.h");
}
#endif
