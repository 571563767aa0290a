/* robust_hide.c - a library preloaded before cudefer that hides glibc's
 * dlsym from it, to simulate platforms where cudefer's ways of finding it
 * fail (tests/test_robust.c).
 *
 * Built twice:
 *   librobust_noversions.so  dlvsym refuses the versions GLIBC_2.34 and
 *                            GLIBC_2.2.5 (x86-64's two versions of dlsym),
 *                            whatever the name; other lookups go to glibc's
 *                            dlvsym
 *   librobust_nolibs.so      (ROBUST_HIDE_ALL) dlvsym refuses everything and
 *                            dl_iterate_phdr reports no library: nothing can
 *                            be found
 */
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

#ifdef ROBUST_HIDE_ALL

EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
    (void)handle, (void)name, (void)version;
    return NULL;
}

EXPORT int dl_iterate_phdr(int (*callback)(struct dl_phdr_info *, size_t, void *), void *data)
{
    (void)callback, (void)data;
    return 0;
}

#else

typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlvsym_fn real;
/* volatile: glibc declares dlsym a leaf function (it never calls back into
 * this file), so the compiler would drop the store before the call. */
static _Thread_local volatile int resolving;

/* glibc's dlvsym, found with dlsym(RTLD_NEXT, ...). That dlsym is
 * cudefer's, which may itself be looking for glibc's dlsym with dlvsym (it
 * is on its first call): the lookups it makes meanwhile are refused, so
 * that nothing recurses, and it finds dlsym another way. */
static dlvsym_fn real_dlvsym(void)
{
    if (real || resolving)
        return real;
    resolving = 1;
    void *fn = dlsym(RTLD_NEXT, "dlvsym");
    resolving = 0;
    memcpy(&real, &fn, sizeof real);
    return real;
}

EXPORT void *dlvsym(void *handle, const char *name, const char *version)
{
    if (strcmp(version, "GLIBC_2.34") == 0 || strcmp(version, "GLIBC_2.2.5") == 0)
        return NULL;
    dlvsym_fn fn = real_dlvsym();
    /* RTLD_NEXT becomes relative to this library, which comes just before
     * cudefer: for cudefer's lookups the answer is the same (a versioned
     * lookup never finds cudefer's own, unversioned, dlsym). */
    return fn ? fn(handle, name, version) : NULL;
}

#endif
