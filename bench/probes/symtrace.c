/* symtrace.c - a probe, built and run by hand: which driver calls a program
 * makes, how often, and how long each took. Preloaded (before the shim, if
 * both), it hands out a counting trampoline for each name of `names` that
 * the program looks up with dlsym or cuGetProcAddress (the ways frameworks
 * reach the driver; a call through a linked symbol is not seen), and at
 * exit prints one line per name called on stderr:
 *   SYMTRACE <name> <calls> calls <total> us total <mean> us each
 * Only functions of at most six integer or pointer arguments can be
 * counted this way (the trampolines forward six registers).
 *
 *   gcc -shared -fPIC -O1 -o /tmp/symtrace.so bench/probes/symtrace.c -ldl
 *   LD_PRELOAD=/tmp/symtrace.so python3 bench/programs/jax_mlp.py
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdatomic.h>
typedef void *(*dlsym_fn)(void *, const char *);
typedef long (*f6)(long, long, long, long, long, long);
static dlsym_fn real_dlsym;
static const char *names[] = {
    "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2", "cuMemCreate", "cuMemRelease",
    "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree",
    "cuMemHostAlloc", "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemHostRegister",
    "cuMemHostRegister_v2", "cuMemHostUnregister", "cuCtxSynchronize", "cuStreamSynchronize",
    "cuEventSynchronize", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync",
    "cuStreamWaitEvent", "cuEventRecord", "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyHtoD",
    "cuMemcpyHtoD_v2", "cuStreamQuery", "cuEventQuery", "cuModuleLoadData", "cuModuleUnload",
    "cuGraphLaunch", "cuMemcpyAsync", "cuEventCreate", "cuEventDestroy", "cuEventDestroy_v2",
    "cuMemsetD8Async", "cuMemsetD32Async", "cuStreamCreate", "cuStreamDestroy", "cuStreamDestroy_v2",
    "cuMemGetInfo", "cuMemGetInfo_v2", "cuPointerGetAttribute", "cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2",
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuStreamAddCallback", "cuLaunchHostFunc",
};
#define N (sizeof names / sizeof names[0])
static f6 reals[64];
static _Atomic long counts[64], nanos[64];
static long now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}
#define T(i)                                                                      \
    static long t##i(long a, long b, long c, long d, long e, long f)              \
    {                                                                             \
        long s = now();                                                           \
        long r = reals[i](a, b, c, d, e, f);                                      \
        atomic_fetch_add(&counts[i], 1);                                          \
        atomic_fetch_add(&nanos[i], now() - s);                                   \
        return r;                                                                 \
    }
T(0) T(1) T(2) T(3) T(4) T(5) T(6) T(7) T(8) T(9) T(10) T(11) T(12) T(13) T(14) T(15) T(16) T(17)
T(18) T(19) T(20) T(21) T(22) T(23) T(24) T(25) T(26) T(27) T(28) T(29) T(30) T(31) T(32) T(33)
T(34) T(35) T(36) T(37) T(38) T(39) T(40) T(41) T(42) T(43) T(44) T(45) T(46) T(47) T(48) T(49)
T(50) T(51) T(52) T(53) T(54) T(55) T(56) T(57) T(58) T(59)
static f6 tramps[] = {t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16,
                      t17, t18, t19, t20, t21, t22, t23, t24, t25, t26, t27, t28, t29, t30, t31,
                      t32, t33, t34, t35, t36, t37, t38, t39, t40, t41, t42, t43, t44, t45, t46,
                      t47, t48, t49, t50, t51, t52, t53, t54, t55, t56, t57, t58, t59};
_Static_assert(sizeof tramps / sizeof tramps[0] >= N, "slots");
static void *wrap(const char *n, void *fn)
{
    if (!fn || !n)
        return fn;
    for (unsigned i = 0; i < N; i++)
        if (!strcmp(n, names[i])) {
            if (!reals[i])
                reals[i] = (f6)fn;
            return reals[i] == (f6)fn ? (void *)tramps[i] : fn;
        }
    return fn;
}
typedef int (*gpa_fn)(const char *, void **, int, uint64_t, void *);
static gpa_fn real_gpa;
static int my_gpa(const char *s, void **p, int v, uint64_t f, void *st)
{
    int rc = real_gpa(s, p, v, f, st);
    if (rc == 0 && p && !(f & 2)) /* not the per-thread-stream variant */
        *p = wrap(s, *p);
    return rc;
}
void *dlsym(void *h, const char *n)
{
    if (!real_dlsym)
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    void *r = real_dlsym(h, n);
    if (r && n[0] == 'c' && n[1] == 'u') {
        if (!strcmp(n, "cuGetProcAddress_v2") || !strcmp(n, "cuGetProcAddress")) {
            real_gpa = (gpa_fn)r;
            return (void *)my_gpa;
        }
        return wrap(n, r);
    }
    return r;
}
__attribute__((destructor)) static void report(void)
{
    for (unsigned i = 0; i < N; i++)
        if (counts[i])
            fprintf(stderr, "SYMTRACE %-28s %8ld calls %10.1f us total %8.2f us each\n", names[i],
                    counts[i], nanos[i] / 1e3, nanos[i] / 1e3 / counts[i]);
}
