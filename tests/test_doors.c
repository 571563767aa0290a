/* test_doors.c - every wrapped name, through each of the three doors,
 * reaches the shim's wrapper and then the driver's entry of the same name.
 *
 * Each wrapper is called with all-zero arguments: every wrapped function
 * takes only integer and pointer arguments, so on x86-64 the extra zeros are
 * ignored, and zeros make the driver answer with an error at once, without
 * the engine taking the call. The test driver counts calls per ELF name. */
#include "common.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifndef WRAPPED_NAMES
#error "WRAPPED_NAMES must name shim/doors/wrapped.h, the list of wrapped names"
#endif

typedef CUresult (*any_fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                           uintptr_t, uintptr_t);

#define MAX_NAMES 128
static char names[MAX_NAMES][64];
static int nnames;

/* The names of the list's CD_WRAP(name) lines. */
static void load_names(void)
{
    FILE *f = fopen(WRAPPED_NAMES, "r");
    cr_assert_not_null(f, "cannot open %s", WRAPPED_NAMES);
    char line[256];
    nnames = 0;
    while (nnames < MAX_NAMES && fgets(line, sizeof line, f))
        if (sscanf(line, "CD_WRAP(%63[A-Za-z0-9_])", names[nnames]) == 1)
            nnames++;
    fclose(f);
    cr_assert_gt(nnames, 50, "too few wrapped names listed");
}

static void *shim_handle(void)
{
    void *h = dlopen("libcudefer.so.0", RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "libcudefer.so.0 is not preloaded");
    return h;
}

static void *driver_handle(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    cr_assert_not_null(h, "cannot open the test driver: %s", dlerror());
    return h;
}

static bool in_shim(void *fn)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libcudefer.so");
}

/* Calls fn with zeros; asserts the driver's entry `name` ran exactly once. */
static void assert_reaches(const char *door, const char *name, void *fn)
{
    cr_assert(in_shim(fn), "%s: %s is not the shim's wrapper", door, name);
    uint64_t before = testdrv_calls(name);
    ((any_fn)fn)(0, 0, 0, 0, 0, 0, 0, 0);
    cr_expect_eq(testdrv_calls(name), before + 1, "%s: calling %s did not reach the driver's %s",
                 door, name, name);
}

Test(doors, exported_symbols)
{
    load_names();
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *shim = shim_handle();
    for (int i = 0; i < nnames; i++) {
        void *own = dlsym(shim, names[i]);
        cr_assert_not_null(own, "the shim does not export %s", names[i]);
        /* What a program linked with -lcuda binds to: the first definition
         * in the global scope, the preloaded shim's. */
        void *global = dlsym(RTLD_DEFAULT, names[i]);
        cr_expect_eq(global, own, "%s binds to something else than the shim", names[i]);
        assert_reaches("export", names[i], own);
    }
}

Test(doors, dlsym_on_the_driver_handle)
{
    load_names();
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *drv = driver_handle();
    void *shim = shim_handle();
    for (int i = 0; i < nnames; i++) {
        void *fn = dlsym(drv, names[i]);
        cr_expect_eq(fn, dlsym(shim, names[i]), "dlsym(driver, %s) is not the wrapper", names[i]);
        assert_reaches("dlsym", names[i], fn);
    }
}

Test(doors, unwrapped_names_cost_nothing)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *drv = driver_handle();
    /* Names the shim does not wrap: the driver's own functions. */
    const char *plain[] = {"cuMemcpyHtoD_v2", "cuEventRecord", "cuStreamQuery", "cuInit"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        void *fn = dlsym(drv, plain[i]);
        cr_assert_not_null(fn, "%s missing", plain[i]);
        cr_expect_not(in_shim(fn), "%s was substituted", plain[i]);
    }
    void *fn = NULL;
    cr_assert_eq(cuGetProcAddress_v2("cuEventRecord", &fn, 12000, 0, NULL), CUDA_SUCCESS);
    cr_expect_eq(fn, dlsym(drv, "cuEventRecord"));
    cr_expect_not(in_shim(fn));
}

Test(doors, dlsym_without_a_driver_symbol_is_untouched)
{
    /* A "cu" name that is not the driver's is never substituted. */
    cr_expect_null(dlsym(RTLD_DEFAULT, "cuNoSuchFunction"));
    cr_expect_eq(dlsym(RTLD_DEFAULT, "strlen"), (void *)strlen);
}

/* cuGetProcAddress: the wrapper of exactly the variant the driver picked. */
struct pick {
    const char *base;
    int version;
    cuuint64_t flags;
    const char *expect;
};

static const struct pick picks[] = {
    {"cuMemFree", 2000, 0, "cuMemFree"},
    {"cuMemFree", 3020, 0, "cuMemFree_v2"},
    {"cuMemFree", 13000, 0, "cuMemFree_v2"},
    {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
    {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2"},
    {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize"},
    {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
    {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
    {"cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"},
    {"cuStreamBeginCapture", 10010, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuStreamBeginCapture_v2_ptsz"},
    {"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
     "cuMemAllocAsync_ptsz"},
    {"cuStreamDestroy", 2000, 0, "cuStreamDestroy"},
    {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
    {"cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"},
    {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
};

Test(doors, proc_address_keeps_the_variant)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *shim = shim_handle();
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        const struct pick *p = &picks[i];
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        uint64_t resolver = testdrv_calls("cuGetProcAddress_v2");
        CUresult rc = cuGetProcAddress_v2(p->base, &fn, p->version, p->flags, &st);
        cr_assert_eq(rc, CUDA_SUCCESS, "%s@%d: %d", p->base, p->version, (int)rc);
        cr_expect_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
        cr_expect_eq(testdrv_calls("cuGetProcAddress_v2"), resolver + 1,
                     "the real resolver was not asked");
        cr_expect_eq(fn, dlsym(shim, p->expect), "%s@%d flags %llu: not the %s wrapper", p->base,
                     p->version, (unsigned long long)p->flags, p->expect);
    }
}

/* Every wrapped name is handed out by cuGetProcAddress for some version and
 * flag, and the wrapper handed out reaches the driver entry of its name. */
Test(doors, proc_address_every_wrapped_name)
{
    static const int versions[] = {2000, 2020, 3020, 4000, 5000, 6000, 6050, 7000, 10000,
                                   10010, 10020, 11000, 11020, 11030, 11040, 12000, 12030,
                                   12050, 13000};
    load_names();
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *shim = shim_handle();
    for (int i = 0; i < nnames; i++) {
        char base[64];
        snprintf(base, sizeof base, "%s", names[i]);
        cuuint64_t flags = 0;
        char *suffix = strstr(base, "_ptsz");
        if (suffix) {
            *suffix = 0;
            flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        }
        char *v = strrchr(base, '_');
        if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9')
            *v = 0;
        void *want = dlsym(shim, names[i]);
        bool found = false;
        for (size_t j = 0; j < sizeof versions / sizeof versions[0] && !found; j++) {
            void *fn = NULL;
            if (cuGetProcAddress_v2(base, &fn, versions[j], flags, NULL) == CUDA_SUCCESS)
                found = fn == want;
        }
        cr_expect(found, "cuGetProcAddress never hands out the %s wrapper", names[i]);
        if (found)
            assert_reaches("cuGetProcAddress", names[i], want);
    }
}

Test(doors, proc_address_edge_cases)
{
    cr_assert_eq(cuInit(0), CUDA_SUCCESS);
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st;
    cr_expect_neq(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, &st), CUDA_SUCCESS);
    cr_expect_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* The legacy four-argument resolver (cuda.h now maps the name to _v2)
     * substitutes too. */
    typedef CUresult (*resolver_v1)(const char *, void **, int, cuuint64_t);
    resolver_v1 v1 = (resolver_v1)dlsym(RTLD_DEFAULT, "cuGetProcAddress");
    cr_assert_not_null(v1);
    fn = NULL;
    cr_assert_eq(v1("cuMemFree", &fn, 3020, 0), CUDA_SUCCESS);
    cr_expect_eq(fn, dlsym(shim_handle(), "cuMemFree_v2"));
}

/* RTLD_NEXT is relative to the caller of dlsym, also through the override:
 * from this program, the object after it is the preloaded shim. Were the
 * lookup made from inside the shim, the answer would be glibc's dlsym. */
Test(doors, rtld_next_is_relative_to_the_caller)
{
    void *next = dlsym(RTLD_NEXT, "dlsym");
    cr_expect_eq(next, dlsym(shim_handle(), "dlsym"),
                 "RTLD_NEXT was resolved from the shim, not from its caller");
}
