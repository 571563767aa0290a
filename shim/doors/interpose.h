/* interpose.h - the three doors through which programs reach the driver.
 *
 * 1. The shim's exported symbols, one per wrapped ELF name (exports.c).
 * 2. dlsym: a lookup that lands on a wrapped name in the driver gets the
 *    wrapper instead (interpose.c).
 * 3. cuGetProcAddress and cuGetProcAddress_v2: the real resolver answers,
 *    then the wrapper of the exact variant it returned replaces it.
 * Names the shim does not wrap cost nothing: the driver's own pointer.
 */
#ifndef CUDEFER_INTERPOSE_H
#define CUDEFER_INTERPOSE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

enum cd_door { CD_DOOR_EXPORT = 1, CD_DOOR_DLSYM = 2, CD_DOOR_PROCADDR = 4 };

/* The driver's function of one ELF name, looked up on first use. */
struct cd_real {
    const char *name;
    _Atomic(void *) fn;
    _Atomic unsigned doors;  /* doors the wrapper was handed out through */
    _Atomic bool called;     /* the wrapper has been called */
};

struct cd_wrapper {
    const char *name;
    void *fn; /* the shim's exported function of that name */
    struct cd_real *real;
};

extern const struct cd_wrapper cd_wrappers[];
extern const size_t cd_wrapper_count;

/* The driver's function for r, or NULL when the driver lacks it. */
void *cd_real_fn(struct cd_real *r);

/* Logs, once per name, the first call of a wrapper and the doors it was
 * reached through (at CUDEFER_LOG=debug). */
void cd_note_call(struct cd_real *r);

/* A wrapped name's driver function is missing: logged, and the caller
 * answers CUDA_ERROR_NOT_FOUND. */
int cd_missing(const char *name);

#endif
