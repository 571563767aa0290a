/* nvtx.h - cudefer's own work as ranges on an Nsight Systems timeline.
 *
 * Flushes, reclaims after an out-of-memory answer and every wait cudefer
 * makes itself show as NVTX ranges named "cudefer: ...". NVTX 3 is the
 * header-only library of the CUDA toolkit: with no tool attached a range
 * costs a call through a pointer that does nothing. Never called with a
 * lock held (a tool may call back into the driver).
 */
#ifndef CUDEFER_NVTX_H
#define CUDEFER_NVTX_H

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#define CUDEFER_HAVE_NVTX 1
#endif
#endif

#ifdef CUDEFER_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
static inline void cd_range_push(const char *what)
{
    nvtxRangePushA(what);
}
static inline void cd_range_pop(void)
{
    nvtxRangePop();
}
#else
static inline void cd_range_push(const char *what)
{
    (void)what;
}
static inline void cd_range_pop(void)
{
}
#endif

#endif
