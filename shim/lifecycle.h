/* lifecycle.h - the engine's own threads and process events. */
#ifndef CUDEFER_LIFECYCLE_H
#define CUDEFER_LIFECYCLE_H

/* Starts the waiter thread and the exit handler, once per process (again in
 * a forked child). Called when the first context is set up. */
void cd_lifecycle_start(void);

#endif
