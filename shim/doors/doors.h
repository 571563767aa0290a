/* doors.h - the three doors through which programs reach the driver.
 *
 * 1. The exported symbols, one per wrapped ELF name (exports.c): programs
 *    linked with -lcuda bind to them, cudefer being preloaded.
 * 2. dlsym: a lookup that lands on a wrapped name in the driver gets the
 *    wrapper instead (interpose.c).
 * 3. cuGetProcAddress and cuGetProcAddress_v2: the real resolver answers,
 *    then the wrapper of the exact variant it returned replaces it.
 * Names cudefer does not wrap cost nothing: the driver's own pointer.
 */
#ifndef CUDEFER_DOORS_H
#define CUDEFER_DOORS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

enum cd_wrapped {
#define CD_WRAP(name) CD_W_##name,
#include "wrapped.h"
#undef CD_WRAP
    CD_WRAPPED_COUNT
};

enum cd_door { CD_DOOR_EXPORT = 1, CD_DOOR_DLSYM = 2, CD_DOOR_PROCADDR = 4 };

/* The wrapper of each name (exports.c), and each name. */
extern void *const cd_wrappers[CD_WRAPPED_COUNT];
extern const char *const cd_wrapped_names[CD_WRAPPED_COUNT];

/* The driver's function of name w, looked up on first use; NULL when the
 * driver lacks it. Notes the first call (logged at debug with the doors it
 * came through) and that the process uses the driver. */
void *cd_real(enum cd_wrapped w);

/* The driver's function of a wrapper's own name, typed. */
#define REAL(name) ((__typeof__(&name))cd_real(CD_W_##name))

/* The driver lacks name w: logged, and the caller answers with the code
 * returned (CUDA_ERROR_NOT_FOUND). */
int cd_missing(enum cd_wrapped w);

/* The wrapper that stands for the driver function fn, found by address (so
 * that the variant a resolver picked is kept), or fn itself. */
void *cd_substitute(void *fn, const char *asked, enum cd_door door);

#endif
