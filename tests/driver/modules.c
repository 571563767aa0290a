/* modules.c - modules, libraries, kernels and the launches (cuLaunchKernel,
 * cuLaunchKernelEx, cuLaunchCooperativeKernel and their _ptsz twins).
 *
 * Images are not parsed: any non-NULL image (or file name) loads, and any
 * function name resolves. A function is a no-op kernel of 10 us.
 *
 * Waiting behaviour (measured on an H200, DESIGN.md section 1):
 *  - cuModuleLoad* waits for every stream of the context while holding
 *    its launch lock, like cuMemFree (a load, but it stalls too);
 *  - cuModuleUnload waits for every stream but holds no launch lock;
 *  - cuLibraryUnload waits for every stream of each context the library
 *    was loaded into (cuLibraryGetModule, cuKernelGetFunction or a launch
 *    of one of its kernels) and holds the launch lock meanwhile (measured:
 *    bench/RESULTS.md, 2026-11-29, a launch on another thread blocked
 *    945 ms); it returns at once if the library was never loaded.
 * Libraries are context-independent: a context teardown drops only their
 * load into that context. Modules and library loads made while a green
 * context is current belong to its primary context, and their kernels run
 * on the streams of the primary and of every green context of it
 * (measured on an H200, driver 580.159.04, 2026-12-01, tests/gpu/facts.c
 * green: a kernel of the primary's module launched on a green stream). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define LAUNCH_USEC 10

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = td_xcalloc(n, 1);
    memcpy(d, s, n);
    return d;
}

/* ------------------------------------------------------------------ */
/* Modules and functions                                               */

static struct td_module *module_new(struct td_ctx *c, struct td_library *lib)
{
    struct td_module *m = td_xcalloc(1, sizeof *m);
    td_obj_register(&m->h, TD_OBJ_MODULE, c);
    m->lib = lib;
    return m;
}

/* The function called name in m (made on first request, then the same
 * handle). */
static struct td_function *module_function(struct td_module *m, const char *name)
{
    for (struct td_function *f = m->funcs; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    struct td_function *f = td_xcalloc(1, sizeof *f);
    td_obj_register(&f->h, TD_OBJ_FUNCTION, m->h.ctx);
    f->mod = m;
    f->name = xstrdup(name);
    f->next = m->funcs;
    m->funcs = f;
    return f;
}

/* Marks a module and its functions released. */
static void module_release(struct td_module *m)
{
    m->h.released = true;
    for (struct td_function *f = m->funcs; f; f = f->next)
        f->h.released = true;
}

/* cuModuleLoad*: a waiting call (see the file comment). */
static CUresult module_load(CUmodule *out, const void *image)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_ctx *c;
    if (!out)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if ((rc = td_cur_ctx_unsafe(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (!image)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    td_ctx_wait_idle(c, true);
    if (!c->alive)
        return td_leave(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    struct td_module *m = module_new(td_ctx_root(c), NULL);
    td_live_add(TESTDRV_MODULE, 1, 0);
    *out = (CUmodule)m;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    TD_COUNT(cuModuleLoad);
    return module_load(module, fname);
}

TD_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    TD_COUNT(cuModuleLoadData);
    return module_load(module, image);
}

TD_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                      CUjit_option *options, void **optionValues)
{
    TD_COUNT(cuModuleLoadDataEx);
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return module_load(module, image);
}

TD_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    TD_COUNT(cuModuleLoadFatBinary);
    return module_load(module, fatCubin);
}

TD_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    TD_COUNT(cuModuleGetFunction);
    struct td_obj *o;
    CUresult rc = td_enter_obj(hmod, TD_OBJ_MODULE, hfunc && name, &o);
    if (rc != CUDA_SUCCESS)
        return rc;
    *hfunc = (CUfunction)module_function((struct td_module *)o, name);
    return td_leave(CUDA_SUCCESS);
}

/* cuModuleUnload: waits for all streams of the module's context (no
 * launch lock). Modules owned by a library cannot be unloaded alone. A
 * module of a destroyed context is an unknown handle: INVALID_HANDLE
 * (measured on an H200, driver 580.159.04, 2026-11-29: tests/gpu/conform.c
 * cuModuleUnload(after_ctx_destroy)); the call is still counted as one
 * naming a dead context. No current context is needed (td_enter_release). */
TD_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    TD_COUNT(cuModuleUnload);
    struct td_ctx *c;
    struct td_obj *o;
    CUresult rc = td_enter_release(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_obj_get(hmod, TD_OBJ_MODULE, &o)) != CUDA_SUCCESS)
        return td_leave(rc == CUDA_ERROR_INVALID_CONTEXT ? CUDA_ERROR_INVALID_HANDLE : rc);
    struct td_module *m = (struct td_module *)o;
    if (m->lib)
        return td_leave(CUDA_ERROR_INVALID_HANDLE);
    module_release(m);
    struct td_ctx *wctx = m->h.ctx->alive ? m->h.ctx : c;
    if (wctx)
        td_ctx_wait_idle(wctx, false);
    td_live_add(TESTDRV_MODULE, -1, 0);
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* Libraries and kernels                                               */

/* The module of lib in context c, loading the library into c on first
 * use. */
static struct td_module *library_module(struct td_library *lib, struct td_ctx *c)
{
    for (struct td_libload *l = lib->loads; l; l = l->next)
        if (l->ctx == c)
            return l->mod;
    struct td_libload *l = td_xcalloc(1, sizeof *l);
    l->ctx = c;
    l->mod = module_new(c, lib);
    l->next = lib->loads;
    lib->loads = l;
    return l->mod;
}

void td_libraries_teardown_ctx(struct td_ctx *ctx)
{
    for (struct td_obj *o = td.all; o; o = o->all_next) {
        if (o->kind != TD_OBJ_LIBRARY)
            continue;
        struct td_library *lib = (struct td_library *)o;
        for (struct td_libload **pp = &lib->loads; *pp;) {
            struct td_libload *l = *pp;
            if (l->ctx == ctx) {
                *pp = l->next;
                free(l);
            } else {
                pp = &l->next;
            }
        }
    }
}

static CUresult library_load(CUlibrary *out, const void *code)
{
    CUresult rc = td_enter_args(out && code);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_library *lib = td_xcalloc(1, sizeof *lib);
    td_obj_register(&lib->h, TD_OBJ_LIBRARY, NULL);
    td_live_add(TESTDRV_LIBRARY, 1, 0);
    *out = (CUlibrary)lib;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code,
                                     CUjit_option *jitOptions, void **jitOptionsValues,
                                     unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                     void **libraryOptionValues, unsigned int numLibraryOptions)
{
    TD_COUNT(cuLibraryLoadData);
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    return library_load(library, code);
}

TD_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                         CUjit_option *jitOptions, void **jitOptionsValues,
                                         unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                                         void **libraryOptionValues, unsigned int numLibraryOptions)
{
    TD_COUNT(cuLibraryLoadFromFile);
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    return library_load(library, fileName);
}

/* cuLibraryUnload: waits for the streams of every live context the
 * library was loaded into, holding each one's launch lock meanwhile;
 * immediate if none. */
TD_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    TD_COUNT(cuLibraryUnload);
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    td_note_wait_call();
    struct td_obj *o;
    if ((rc = td_obj_get(library, TD_OBJ_LIBRARY, &o)) != CUDA_SUCCESS)
        return td_leave(rc);
    struct td_library *lib = (struct td_library *)o;
    lib->h.released = true;
    for (struct td_kernel *k = lib->kernels; k; k = k->next)
        k->h.released = true;
    while (lib->loads) {
        struct td_libload *l = lib->loads;
        lib->loads = l->next;
        module_release(l->mod);
        if (l->ctx->alive)
            td_ctx_wait_idle(l->ctx, true);
        free(l);
    }
    td_live_add(TESTDRV_LIBRARY, -1, 0);
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    TD_COUNT(cuLibraryGetKernel);
    struct td_obj *o;
    CUresult rc = td_enter_obj(library, TD_OBJ_LIBRARY, pKernel && name, &o);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_library *lib = (struct td_library *)o;
    struct td_kernel *k;
    for (k = lib->kernels; k; k = k->next)
        if (strcmp(k->name, name) == 0)
            break;
    if (!k) {
        k = td_xcalloc(1, sizeof *k);
        td_obj_register(&k->h, TD_OBJ_KERNEL, NULL);
        k->lib = lib;
        k->name = xstrdup(name);
        k->next = lib->kernels;
        lib->kernels = k;
    }
    *pKernel = (CUkernel)k;
    return td_leave(CUDA_SUCCESS);
}

TD_EXPORT CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    TD_COUNT(cuLibraryGetModule);
    struct td_obj *o;
    struct td_ctx *c;
    CUresult rc = td_enter_obj(library, TD_OBJ_LIBRARY, pMod != NULL, &o);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = td_cur_ctx_usable(&c)) != CUDA_SUCCESS)
        return td_leave(rc);
    *pMod = (CUmodule)library_module((struct td_library *)o, td_ctx_root(c));
    return td_leave(CUDA_SUCCESS);
}

/* The function of kernel k in the current context (loads its library
 * there). Lock held. */
static CUresult kernel_function(struct td_kernel *k, struct td_function **out)
{
    struct td_ctx *c;
    CUresult rc = td_cur_ctx_usable(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    *out = module_function(library_module(k->lib, td_ctx_root(c)), k->name);
    return CUDA_SUCCESS;
}

TD_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    TD_COUNT(cuKernelGetFunction);
    struct td_obj *o;
    struct td_function *f;
    CUresult rc = td_enter_obj(kernel, TD_OBJ_KERNEL, pFunc != NULL, &o);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = kernel_function((struct td_kernel *)o, &f)) != CUDA_SUCCESS)
        return td_leave(rc);
    *pFunc = (CUfunction)f;
    return td_leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ */
/* cuLaunchKernel                                                      */

/* Resolves what cuLaunchKernel got: a CUfunction, or a CUkernel (loaded
 * into the current context). Lock held. */
static CUresult launch_function(CUfunction h, struct td_function **out)
{
    if (!h)
        return CUDA_ERROR_INVALID_HANDLE;
    struct td_obj *o;
    if (td_obj_find(h, TD_OBJ_KERNEL)) {
        CUresult rc = td_obj_get(h, TD_OBJ_KERNEL, &o);
        return rc != CUDA_SUCCESS ? rc : kernel_function((struct td_kernel *)o, out);
    }
    CUresult rc = td_obj_get(h, TD_OBJ_FUNCTION, &o);
    if (rc == CUDA_SUCCESS)
        *out = (struct td_function *)o;
    return rc;
}

/* Blocks of a cooperative grid that can all be resident at once: an
 * H200's limits for a kernel using no shared memory and few registers
 * (32 blocks and 2048 threads per SM). */
static uint64_t cooperative_blocks_max(unsigned threads_per_block)
{
    uint64_t per_sm = 2048u / threads_per_block;
    return (uint64_t)TD_SM_COUNT * (per_sm < 32 ? per_sm : 32);
}

/* Every launch call: resolves the function, checks the dimensions (a
 * cooperative grid must fit on the device at once:
 * CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), then runs a 10 us no-op kernel
 * on hs, as cuLaunchKernel does. */
static CUresult launch_kernel(CUfunction h, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, CUstream hs, bool ptsz,
                              bool cooperative)
{
    CUresult rc = td_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct td_function *f;
    if ((rc = launch_function(h, &f)) != CUDA_SUCCESS)
        return td_leave(rc);
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return td_leave(CUDA_ERROR_INVALID_VALUE);
    if (cooperative && (uint64_t)gx * gy * gz > cooperative_blocks_max(bx * by * bz))
        return td_leave(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    struct td_op *op = td_op_new(TD_OP_KERNEL);
    op->u.kernel.usec = LAUNCH_USEC;
    return td_leave(td_launch_op(hs, ptsz, f->h.ctx, op));
}

TD_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void **kernelParams, void **extra)
{
    TD_COUNT(cuLaunchKernel);
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         hStream, false, false);
}

TD_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX,
                                       unsigned int blockDimY, unsigned int blockDimZ,
                                       unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams, void **extra)
{
    TD_COUNT(cuLaunchKernel_ptsz);
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         hStream, true, false);
}

/* cuLaunchKernelEx: the launch that config describes, on config->hStream;
 * its attributes are accepted and ignored (a NULL list with a count is
 * CUDA_ERROR_INVALID_VALUE). */
static CUresult launch_kernel_ex(const CUlaunchConfig *config, CUfunction f, bool ptsz)
{
    if (!config || (config->numAttrs && !config->attrs))
        return td_enter_args(false); /* the driver's state first, then the arguments */
    return launch_kernel(f, config->gridDimX, config->gridDimY, config->gridDimZ,
                         config->blockDimX, config->blockDimY, config->blockDimZ,
                         config->hStream, ptsz, false);
}

TD_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                    void **kernelParams, void **extra)
{
    TD_COUNT(cuLaunchKernelEx);
    (void)kernelParams, (void)extra;
    return launch_kernel_ex(config, f, false);
}

TD_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                         void **kernelParams, void **extra)
{
    TD_COUNT(cuLaunchKernelEx_ptsz);
    (void)kernelParams, (void)extra;
    return launch_kernel_ex(config, f, true);
}

TD_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                             unsigned int gridDimY, unsigned int gridDimZ,
                                             unsigned int blockDimX, unsigned int blockDimY,
                                             unsigned int blockDimZ, unsigned int sharedMemBytes,
                                             CUstream hStream, void **kernelParams)
{
    TD_COUNT(cuLaunchCooperativeKernel);
    (void)sharedMemBytes, (void)kernelParams;
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         hStream, false, true);
}

TD_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                  unsigned int gridDimY, unsigned int gridDimZ,
                                                  unsigned int blockDimX, unsigned int blockDimY,
                                                  unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void **kernelParams)
{
    TD_COUNT(cuLaunchCooperativeKernel_ptsz);
    (void)sharedMemBytes, (void)kernelParams;
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         hStream, true, true);
}
