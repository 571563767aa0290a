/* nvtx.h - cudefer's own work as ranges on an Nsight Systems timeline.
 *
 * Flushes, reclaims after an out-of-memory answer and every wait cudefer
 * makes itself show as NVTX ranges named "cudefer: ...". NVTX 3 is the
 * header-only library of the CUDA toolkit: with no tool attached a range
 * costs a call through a pointer that does nothing. Never called with a
 * lock held (a tool may call back into the driver).
 *
 * NVTX initialises itself at its first call, and a thread whose first call
 * comes while another thread initialises reads the function pointers that
 * the initialisation writes (a data race that ThreadSanitizer reported in
 * the property test). cd_range_init makes the first call once, under
 * pthread_once, before any range: every thread's later calls come after it.
 */
#ifndef CUDEFER_NVTX_H
#define CUDEFER_NVTX_H

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#define CUDEFER_HAVE_NVTX 1
#endif
#endif

/* NVTX's initialisation, once per process (log.c). */
void cd_range_init(void);

#ifdef CUDEFER_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
static inline void cd_range_push(const char *what)
{
    cd_range_init();
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
