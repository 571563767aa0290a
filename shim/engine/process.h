/* process.h - the engine in its process: start, exit and fork.
 *
 * The engine starts with the first context it sets up: the waiter thread
 * and an exit handler. The exit handler runs before the CUDA runtime's own
 * (it is registered after it) and before the driver tears itself down:
 * from then on the engine takes no call, and nothing is released by it (the
 * process's end frees everything). A forked child starts with empty books
 * and no waiter: it has none of its parent's contexts.
 */
#ifndef CUDEFER_PROCESS_H
#define CUDEFER_PROCESS_H

#include <stdbool.h>

/* Starts the waiter and registers the exit handler, once per process (and
 * again in a forked child), before the first context is set up (contexts.c
 * calls it through the hook this module installs at load). Does not
 * wait. */
void cd_process_start(void);

#endif
