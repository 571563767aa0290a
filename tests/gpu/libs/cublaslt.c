/* cublaslt.c - the libs check for cuBLASLt (lib=cublaslt): after one
 * cublasLtMatmul with a workspace, the destruction of its matmul
 * descriptor, its preference, a matrix layout, and the handle.
 *
 * usage: libs_cublaslt        prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>

#define N 256
#define WORKSPACE_BYTES (4 * GC_MIB)

struct lt {
    float *a, *b, *c;
    void *workspace;
    cublasLtHandle_t handle;
    cublasLtMatmulDesc_t op;
    cublasLtMatmulPreference_t pref;
    cublasLtMatrixLayout_t la, lb, lc;
};

/* cublasGetStatusName is cuBLAS's, not cuBLASLt's: codes by number. */
static const char *lt_rc(int rc)
{
    return rc == CUBLAS_STATUS_SUCCESS ? "ok" : libs_numbered("cublasStatus", rc);
}

static bool lt_ok(cublasStatus_t rc, const char *call)
{
    return libs_ok(rc == CUBLAS_STATUS_SUCCESS, call, lt_rc(rc));
}

static bool lt_buffers(struct lt *m)
{
    size_t bytes = (size_t)N * N * sizeof(float);
    return libs_cuda_zeros((void **)&m->a, bytes) && libs_cuda_zeros((void **)&m->b, bytes) &&
           libs_cuda_zeros((void **)&m->c, bytes) &&
           libs_cuda_zeros(&m->workspace, WORKSPACE_BYTES);
}

/* The descriptors of C = A B (N x N floats, column-major). */
static bool lt_describe(struct lt *m)
{
    size_t ws = WORKSPACE_BYTES;
    return lt_ok(cublasLtMatmulDescCreate(&m->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate") &&
           lt_ok(cublasLtMatrixLayoutCreate(&m->la, CUDA_R_32F, N, N, N),
                 "cublasLtMatrixLayoutCreate") &&
           lt_ok(cublasLtMatrixLayoutCreate(&m->lb, CUDA_R_32F, N, N, N),
                 "cublasLtMatrixLayoutCreate") &&
           lt_ok(cublasLtMatrixLayoutCreate(&m->lc, CUDA_R_32F, N, N, N),
                 "cublasLtMatrixLayoutCreate") &&
           lt_ok(cublasLtMatmulPreferenceCreate(&m->pref), "cublasLtMatmulPreferenceCreate") &&
           lt_ok(cublasLtMatmulPreferenceSetAttribute(
                     m->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                 "cublasLtMatmulPreferenceSetAttribute");
}

/* A handle and its descriptors made and used once: the first algorithm of
 * the heuristic, one matmul on the default stream, the device synchronised. */
static bool lt_make(struct lt *m)
{
    const float one = 1.0f, zero = 0.0f;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    memset(&heur, 0, sizeof heur);
    if (!lt_ok(cublasLtCreate(&m->handle), "cublasLtCreate") || !lt_describe(m) ||
        !lt_ok(cublasLtMatmulAlgoGetHeuristic(m->handle, m->op, m->la, m->lb, m->lc, m->lc,
                                              m->pref, 1, &heur, &found),
               "cublasLtMatmulAlgoGetHeuristic"))
        return false;
    if (!libs_ok(found > 0, "cublasLtMatmulAlgoGetHeuristic", "no_algorithm"))
        return false;
    return lt_ok(cublasLtMatmul(m->handle, m->op, &one, m->a, m->la, m->b, m->lb, &zero, m->c,
                                m->lc, m->c, m->lc, &heur.algo, m->workspace, WORKSPACE_BYTES,
                                0),
                 "cublasLtMatmul") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_desc(void *m)
{
    return cublasLtMatmulDescDestroy(((struct lt *)m)->op);
}

static int destroy_pref(void *m)
{
    return cublasLtMatmulPreferenceDestroy(((struct lt *)m)->pref);
}

static int destroy_layout(void *m)
{
    return cublasLtMatrixLayoutDestroy(((struct lt *)m)->la);
}

static int destroy_handle(void *m)
{
    return cublasLtDestroy(((struct lt *)m)->handle);
}

/* What the measured round times, in the same order, untimed. */
static bool lt_destroy(struct lt *m)
{
    return lt_ok(destroy_desc(m), "cublasLtMatmulDescDestroy(warm-up)") &&
           lt_ok(destroy_pref(m), "cublasLtMatmulPreferenceDestroy(warm-up)") &&
           lt_ok(destroy_layout(m), "cublasLtMatrixLayoutDestroy(warm-up)") &&
           lt_ok(cublasLtMatrixLayoutDestroy(m->lb), "cublasLtMatrixLayoutDestroy(warm-up)") &&
           lt_ok(cublasLtMatrixLayoutDestroy(m->lc), "cublasLtMatrixLayoutDestroy(warm-up)") &&
           lt_ok(destroy_handle(m), "cublasLtDestroy(warm-up)");
}

int main(void)
{
    struct lt m;
    memset(&m, 0, sizeof m);
    libs_start("cublaslt");
    libs_info_int((long long)cublasLtGetVersion());
    if (!lt_buffers(&m) || !lt_make(&m) || !lt_destroy(&m) || !lt_make(&m))
        return libs_end();

    libs_baseline();
    libs_time("cublasLtMatmulDescDestroy", "teardown", destroy_desc, &m, lt_rc);
    libs_time("cublasLtMatmulPreferenceDestroy", "teardown", destroy_pref, &m, lt_rc);
    libs_time("cublasLtMatrixLayoutDestroy", "teardown", destroy_layout, &m, lt_rc);
    cublasLtMatrixLayoutDestroy(m.lb);
    cublasLtMatrixLayoutDestroy(m.lc);
    libs_time("cublasLtDestroy", "teardown", destroy_handle, &m, lt_rc);
    return libs_end();
}

#else
int main(void)
{
    return libs_no_header("cublaslt", "cublasLt.h");
}
#endif
