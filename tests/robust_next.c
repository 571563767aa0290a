/* robust_next.c - dlsym(RTLD_NEXT, ...) made by a library through cudefer's
 * dlsym override is relative to that library, not to cudefer, at every
 * optimisation level (the override's tail call to glibc's dlsym keeps the
 * caller).
 *
 * Linked with librobust_next_a.so then librobust_next_b.so, which both
 * define probe_target ('a' and 'b'); a's probe_next() returns
 * dlsym(RTLD_NEXT, "probe_target"), which must be b's. Were the lookup made
 * from cudefer (preloaded, so before a), it would find a's. Run with the
 * shim preloaded; prints what it found; exit status 0 when right.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

char probe_target(void);
char probe_b(void);
void *probe_next(void);

typedef char (*probe_fn)(void);

int main(void)
{
    void *shim = dlsym(RTLD_DEFAULT, "cudefer_flush");
    Dl_info info;
    if (!shim || !dladdr(shim, &info) || !strstr(info.dli_fname, "libcudefer")) {
        printf("robust_next: cudefer is not preloaded\n");
        return 1;
    }
    if (probe_target() != 'a' || probe_b() != 'b') {
        printf("robust_next: the libraries are not linked in the order a, b\n");
        return 1;
    }
    void *next = probe_next();
    probe_fn fn;
    memcpy(&fn, &next, sizeof fn);
    char got = fn ? fn() : '?';
    printf("robust_next: dlsym(RTLD_NEXT, \"probe_target\") from a found %c's (want b's)\n",
           got);
    return got == 'b' ? 0 : 1;
}
