/* cudnn.c - the libs check for cuDNN, in two processes:
 *
 *   libs_cudnn legacy    lib=cudnn: after one cudnnConvolutionForward, the
 *                        destruction of the output tensor descriptor, the
 *                        filter descriptor, the convolution descriptor, and
 *                        the handle (cudnnDestroy)
 *   libs_cudnn backend   lib=cudnn-backend: the same convolution through the
 *                        backend (graph) API that PyTorch and cudnn-frontend
 *                        use: after one cudnnBackendExecute, the
 *                        destruction of the execution plan, the operation
 *                        graph, and the handle
 *
 * The convolution: 1 x 8 x 32 x 32 floats (NCHW), 8 filters of 3 x 3,
 * padding 1, stride 1.
 *
 * usage: libs_cudnn [legacy|backend]     prints the RESULT lines of libs.h
 */
#include "libs.h"

#if __has_include(<cudnn.h>)
#include <cudnn.h>

#define BATCH 1
#define CHANNELS 8
#define SIDE 32
#define FILTERS 8
#define KERNEL 3
#define IMAGE_FLOATS (BATCH * CHANNELS * SIDE * SIDE)
#define FILTER_FLOATS (FILTERS * CHANNELS * KERNEL * KERNEL)
#define MAX_CONFIGS 8

enum { UID_X = 1, UID_W = 2, UID_Y = 3 };

/* The data, shared by every round. */
static float *x_data, *w_data, *y_data;

static const char *dnn_rc(int rc)
{
    return rc == CUDNN_STATUS_SUCCESS ? "ok" : cudnnGetErrorString((cudnnStatus_t)rc);
}

static bool dnn_ok(cudnnStatus_t rc, const char *call)
{
    return libs_ok(rc == CUDNN_STATUS_SUCCESS, call, dnn_rc(rc));
}

static bool dnn_data(void)
{
    return libs_cuda_zeros((void **)&x_data, IMAGE_FLOATS * sizeof(float)) &&
           libs_cuda_zeros((void **)&w_data, FILTER_FLOATS * sizeof(float)) &&
           libs_cuda_zeros((void **)&y_data, IMAGE_FLOATS * sizeof(float));
}

/* cudaMalloc of a workspace of the size cuDNN asked for (at least 4 bytes). */
static bool dnn_workspace(void **p, size_t bytes)
{
    return libs_cuda_ok(cudaMalloc(p, bytes ? bytes : 4), "cudaMalloc");
}

/* ---- legacy: descriptors and cudnnConvolutionForward -------------------------- */

struct legacy {
    cudnnHandle_t handle;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    void *workspace;
};

static bool legacy_describe(struct legacy *l)
{
    return dnn_ok(cudnnCreateTensorDescriptor(&l->xd), "cudnnCreateTensorDescriptor") &&
           dnn_ok(cudnnSetTensor4dDescriptor(l->xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, BATCH,
                                             CHANNELS, SIDE, SIDE),
                  "cudnnSetTensor4dDescriptor") &&
           dnn_ok(cudnnCreateTensorDescriptor(&l->yd), "cudnnCreateTensorDescriptor") &&
           dnn_ok(cudnnSetTensor4dDescriptor(l->yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, BATCH,
                                             FILTERS, SIDE, SIDE),
                  "cudnnSetTensor4dDescriptor") &&
           dnn_ok(cudnnCreateFilterDescriptor(&l->wd), "cudnnCreateFilterDescriptor") &&
           dnn_ok(cudnnSetFilter4dDescriptor(l->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, FILTERS,
                                             CHANNELS, KERNEL, KERNEL),
                  "cudnnSetFilter4dDescriptor") &&
           dnn_ok(cudnnCreateConvolutionDescriptor(&l->cd), "cudnnCreateConvolutionDescriptor") &&
           dnn_ok(cudnnSetConvolution2dDescriptor(l->cd, 1, 1, 1, 1, 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                  "cudnnSetConvolution2dDescriptor");
}

/* A handle and descriptors made and used once: one forward convolution
 * (implicit GEMM) on the default stream, the device synchronised. */
static bool legacy_make(struct legacy *l)
{
    const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    const float one = 1.0f, zero = 0.0f;
    size_t bytes = 0;
    return dnn_ok(cudnnCreate(&l->handle), "cudnnCreate") && legacy_describe(l) &&
           dnn_ok(cudnnGetConvolutionForwardWorkspaceSize(l->handle, l->xd, l->wd, l->cd, l->yd,
                                                          algo, &bytes),
                  "cudnnGetConvolutionForwardWorkspaceSize") &&
           (l->workspace || dnn_workspace(&l->workspace, bytes)) &&
           dnn_ok(cudnnConvolutionForward(l->handle, &one, l->xd, x_data, l->wd, w_data, l->cd,
                                          algo, l->workspace, bytes, &zero, l->yd, y_data),
                  "cudnnConvolutionForward") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static int destroy_tensor(void *l)
{
    return cudnnDestroyTensorDescriptor(((struct legacy *)l)->yd);
}

static int destroy_filter(void *l)
{
    return cudnnDestroyFilterDescriptor(((struct legacy *)l)->wd);
}

static int destroy_convolution(void *l)
{
    return cudnnDestroyConvolutionDescriptor(((struct legacy *)l)->cd);
}

static int destroy_legacy_handle(void *l)
{
    return cudnnDestroy(((struct legacy *)l)->handle);
}

/* What the measured round times, in the same order, untimed. */
static bool legacy_destroy(struct legacy *l)
{
    return dnn_ok(destroy_tensor(l), "cudnnDestroyTensorDescriptor(warm-up)") &&
           dnn_ok(cudnnDestroyTensorDescriptor(l->xd), "cudnnDestroyTensorDescriptor(warm-up)") &&
           dnn_ok(destroy_filter(l), "cudnnDestroyFilterDescriptor(warm-up)") &&
           dnn_ok(destroy_convolution(l), "cudnnDestroyConvolutionDescriptor(warm-up)") &&
           dnn_ok(destroy_legacy_handle(l), "cudnnDestroy(warm-up)");
}

static int run_legacy(void)
{
    struct legacy l;
    memset(&l, 0, sizeof l);
    if (!dnn_data() || !legacy_make(&l) || !legacy_destroy(&l) || !legacy_make(&l))
        return libs_end();

    libs_baseline();
    libs_time("cudnnDestroyTensorDescriptor", "teardown", destroy_tensor, &l, dnn_rc);
    cudnnDestroyTensorDescriptor(l.xd);
    libs_time("cudnnDestroyFilterDescriptor", "teardown", destroy_filter, &l, dnn_rc);
    libs_time("cudnnDestroyConvolutionDescriptor", "teardown", destroy_convolution, &l, dnn_rc);
    libs_time("cudnnDestroy", "teardown", destroy_legacy_handle, &l, dnn_rc);
    return libs_end();
}

/* ---- backend: an operation graph, an execution plan, cudnnBackendExecute ---- */

struct backend {
    cudnnHandle_t handle;
    cudnnBackendDescriptor_t x, w, y, conv, op, graph, heur, plan, pack;
    cudnnBackendDescriptor_t configs[MAX_CONFIGS];
    int64_t n_configs;
    void *workspace;
    int64_t workspace_bytes;
};

static bool bk_create(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d,
                      const char *what)
{
    char call[96];
    snprintf(call, sizeof call, "cudnnBackendCreateDescriptor(%s)", what);
    return dnn_ok(cudnnBackendCreateDescriptor(type, d), call);
}

static bool bk_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value)
{
    char call[96];
    snprintf(call, sizeof call, "cudnnBackendSetAttribute(%d)", (int)name);
    return dnn_ok(cudnnBackendSetAttribute(d, name, type, count, value), call);
}

static bool bk_finalize(cudnnBackendDescriptor_t d, const char *what)
{
    char call[96];
    snprintf(call, sizeof call, "cudnnBackendFinalize(%s)", what);
    return dnn_ok(cudnnBackendFinalize(d), call);
}

/* A packed NCHW float tensor. */
static bool bk_tensor(cudnnBackendDescriptor_t *t, int64_t uid, int64_t n, int64_t c,
                      int64_t h, int64_t w)
{
    const int64_t dims[4] = {n, c, h, w};
    const int64_t strides[4] = {c * h * w, h * w, w, 1};
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const int64_t align = 16;
    return bk_create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t, "tensor") &&
           bk_set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type) &&
           bk_set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) &&
           bk_set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides) &&
           bk_set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) &&
           bk_set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align) &&
           bk_finalize(*t, "tensor");
}

static bool bk_convolution(struct backend *b)
{
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, ones[2] = {1, 1}, pads[2] = {1, 1};
    return bk_create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &b->conv, "convolution") &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1,
                  &mode) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, ones) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, ones) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads) &&
           bk_set(b->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads) &&
           bk_finalize(b->conv, "convolution");
}

/* The tensors, the forward convolution operation and its graph. */
static bool bk_graph(struct backend *b)
{
    const float one = 1.0f, zero = 0.0f;
    return bk_tensor(&b->x, UID_X, BATCH, CHANNELS, SIDE, SIDE) &&
           bk_tensor(&b->w, UID_W, FILTERS, CHANNELS, KERNEL, KERNEL) &&
           bk_tensor(&b->y, UID_Y, BATCH, FILTERS, SIDE, SIDE) && bk_convolution(b) &&
           bk_create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &b->op,
                     "convolution_forward") &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->x) &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->w) &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->y) &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->conv) &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                  &one) &&
           bk_set(b->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1,
                  &zero) &&
           bk_finalize(b->op, "convolution_forward") &&
           bk_create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &b->graph, "operation_graph") &&
           bk_set(b->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &b->op) &&
           bk_set(b->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->handle) &&
           bk_finalize(b->graph, "operation_graph");
}

/* The engine configurations that the heuristics of mode propose, in
 * b->configs. Quiet: the caller reports a failure once every mode failed. */
static cudnnStatus_t bk_heuristics(struct backend *b, cudnnBackendHeurMode_t mode)
{
    b->n_configs = 0;
    cudnnStatus_t rc = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &b->heur);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendSetAttribute(b->heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->graph);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendSetAttribute(b->heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE,
                                      1, &mode);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendFinalize(b->heur);
    for (int i = 0; rc == CUDNN_STATUS_SUCCESS && i < MAX_CONFIGS; i++)
        rc = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &b->configs[i]);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendGetAttribute(b->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CONFIGS, &b->n_configs,
                                      b->configs);
    return rc;
}

/* Destroys the heuristics and their configurations (NULL ones are skipped). */
static void bk_drop_heuristics(struct backend *b)
{
    for (int i = 0; i < MAX_CONFIGS; i++)
        if (b->configs[i])
            cudnnBackendDestroyDescriptor(b->configs[i]);
    memset(b->configs, 0, sizeof b->configs);
    if (b->heur)
        cudnnBackendDestroyDescriptor(b->heur);
    b->heur = NULL;
    b->n_configs = 0;
}

/* An execution plan of config in b->plan; none when it does not finalize. */
static cudnnStatus_t bk_try_plan(struct backend *b, cudnnBackendDescriptor_t config)
{
    cudnnStatus_t rc =
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &b->plan);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendSetAttribute(b->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                      CUDNN_TYPE_HANDLE, 1, &b->handle);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendSetAttribute(b->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    if (rc == CUDNN_STATUS_SUCCESS)
        rc = cudnnBackendFinalize(b->plan);
    if (rc != CUDNN_STATUS_SUCCESS && b->plan) {
        cudnnBackendDestroyDescriptor(b->plan);
        b->plan = NULL;
    }
    return rc;
}

/* The plan of the first configuration that finalizes, from heuristics mode
 * A, else the fallback mode. The heuristics stay until bk_drop_rest. */
static bool bk_plan(struct backend *b)
{
    const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    const char *step = "engine_heuristics";
    cudnnStatus_t rc = CUDNN_STATUS_NOT_SUPPORTED;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        cudnnStatus_t heur = bk_heuristics(b, modes[m]);
        if (heur != CUDNN_STATUS_SUCCESS)
            rc = heur;
        for (int64_t i = 0; heur == CUDNN_STATUS_SUCCESS && i < b->n_configs; i++) {
            step = "cudnnBackendFinalize(execution_plan)";
            rc = bk_try_plan(b, b->configs[i]);
            if (rc == CUDNN_STATUS_SUCCESS)
                return true;
        }
        bk_drop_heuristics(b);
    }
    return dnn_ok(rc, step);
}

/* A workspace of at least bytes, kept from round to round. */
static bool bk_workspace(struct backend *b, int64_t bytes)
{
    if (b->workspace && bytes <= b->workspace_bytes)
        return true;
    if (b->workspace && !libs_cuda_ok(cudaFree(b->workspace), "cudaFree"))
        return false;
    b->workspace_bytes = bytes;
    return dnn_workspace(&b->workspace, (size_t)bytes);
}

/* The plan run once on the default stream, the device synchronised. */
static bool bk_execute(struct backend *b)
{
    void *pointers[3] = {x_data, w_data, y_data};
    const int64_t uids[3] = {UID_X, UID_W, UID_Y};
    int64_t bytes = 0, count = 0;
    if (!dnn_ok(cudnnBackendGetAttribute(b->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &count, &bytes),
                "cudnnBackendGetAttribute(workspace_size)") ||
        !bk_workspace(b, bytes))
        return false;
    return bk_create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &b->pack, "variant_pack") &&
           bk_set(b->pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                  pointers) &&
           bk_set(b->pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids) &&
           bk_set(b->pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                  &b->workspace) &&
           bk_finalize(b->pack, "variant_pack") &&
           dnn_ok(cudnnBackendExecute(b->handle, b->plan, b->pack), "cudnnBackendExecute") &&
           libs_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static bool backend_make(struct backend *b)
{
    void *workspace = b->workspace;
    int64_t workspace_bytes = b->workspace_bytes;
    memset(b, 0, sizeof *b);
    b->workspace = workspace;
    b->workspace_bytes = workspace_bytes;
    return dnn_ok(cudnnCreate(&b->handle), "cudnnCreate") && bk_graph(b) && bk_plan(b) &&
           bk_execute(b);
}

static int destroy_plan(void *b)
{
    return cudnnBackendDestroyDescriptor(((struct backend *)b)->plan);
}

static int destroy_graph(void *b)
{
    return cudnnBackendDestroyDescriptor(((struct backend *)b)->graph);
}

static int destroy_backend_handle(void *b)
{
    return cudnnDestroy(((struct backend *)b)->handle);
}

/* The descriptors no row times, once the plan and the graph are gone. */
static void bk_drop_rest(struct backend *b)
{
    cudnnBackendDestroyDescriptor(b->pack);
    bk_drop_heuristics(b);
    cudnnBackendDestroyDescriptor(b->op);
    cudnnBackendDestroyDescriptor(b->conv);
    cudnnBackendDestroyDescriptor(b->x);
    cudnnBackendDestroyDescriptor(b->w);
    cudnnBackendDestroyDescriptor(b->y);
}

/* What the measured round times, in the same order, untimed. */
static bool backend_destroy(struct backend *b)
{
    if (!dnn_ok(destroy_plan(b), "cudnnBackendDestroyDescriptor(warm-up)") ||
        !dnn_ok(destroy_graph(b), "cudnnBackendDestroyDescriptor(warm-up)"))
        return false;
    bk_drop_rest(b);
    return dnn_ok(destroy_backend_handle(b), "cudnnDestroy(warm-up)");
}

static int run_backend(void)
{
    struct backend b;
    memset(&b, 0, sizeof b);
    if (!dnn_data() || !backend_make(&b) || !backend_destroy(&b) || !backend_make(&b))
        return libs_end();

    libs_baseline();
    libs_time("cudnnBackendDestroyDescriptor(execution_plan)", "teardown", destroy_plan, &b,
              dnn_rc);
    libs_time("cudnnBackendDestroyDescriptor(operation_graph)", "teardown", destroy_graph, &b,
              dnn_rc);
    bk_drop_rest(&b);
    libs_time("cudnnDestroy", "teardown", destroy_backend_handle, &b, dnn_rc);
    return libs_end();
}

int main(int argc, char **argv)
{
    bool backend = argc > 1 && strcmp(argv[1], "backend") == 0;
    if (argc > 1 && !backend && strcmp(argv[1], "legacy") != 0)
        gc_die("usage: libs_cudnn [legacy|backend]");
    libs_start(backend ? "cudnn-backend" : "cudnn");
    libs_info_int((long long)cudnnGetVersion());
    return backend ? run_backend() : run_legacy();
}

#else
int main(int argc, char **argv)
{
    bool backend = argc > 1 && strcmp(argv[1], "backend") == 0;
    return libs_no_header(backend ? "cudnn-backend" : "cudnn", "cudnn.h");
}
#endif
