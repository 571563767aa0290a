/* cudefer.h - the public API of cudefer.
 *
 * cudefer is preloaded (LD_PRELOAD=libcudefer.so) into a CUDA program and
 * keeps the program's threads from waiting for the GPU when they release
 * GPU resources. Programs need not call anything; these functions are for
 * programs that want to control when deferred releases really happen.
 *
 * Programs that should also run without cudefer look the functions up at
 * run time instead of linking against them:
 *
 *     int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cudefer_flush");
 *     if (flush)
 *         flush();
 */
#ifndef CUDEFER_H
#define CUDEFER_H

#ifdef __cplusplus
extern "C" {
#endif

#define CUDEFER_VERSION_STRING "0.1.0"

/* Really releases everything cudefer has deferred, in every context, and
 * waits until device memory freed through it is back with the driver.
 * May wait for the GPU. Returns 0. */
int cudefer_flush(void);

/* The version of the loaded cudefer, e.g. "0.1.0". */
const char *cudefer_version(void);

#ifdef __cplusplus
}
#endif

#endif
