/* robust_next_a.c - the first of two libraries that define probe_target
 * (tests/robust_next.c). */
#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT char probe_target(void)
{
    return 'a';
}

/* What glibc's RTLD_NEXT finds from here: the next library's
 * probe_target, whichever dlsym the process binds to. Not a tail call
 * (glibc would then take this function's caller for the one asking). */
EXPORT void *probe_next(void)
{
    void *volatile found = dlsym(RTLD_NEXT, "probe_target");
    return found;
}
