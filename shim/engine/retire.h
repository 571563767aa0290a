/* retire.h - the release path's pieces that other engine files use. */
#ifndef CUDEFER_RETIRE_H
#define CUDEFER_RETIRE_H

#include "contexts.h"

/* Device blocks kept per context at most, whatever their bytes: a bound on
 * the books' length, one a MiB of CUDEFER_DEVICE_CACHE beyond 256 MiB (so
 * that a larger cache is not bounded by its count of blocks instead), or
 * as many as the program once held beyond what it holds
 * (CUDEFER_DEVICE_CACHE_PEAK: their records existed then anyway). */
#define CD_CACHE_BLOCKS 256

/* Fences the entries deferred unfenced while captures were live, once none
 * is (the capture gate calls this when the last capture ends). Does not
 * wait. */
void cd_retire_backlog(void);

/* Hands device records (taken off c's books, fenced) to cuMemFreeAsync on
 * stream, each behind its fence's event; the waiter settles them. One the
 * driver refuses goes back on the books. Called with c entered, inside the
 * capture gate. Does not wait. */
void cd_retire_free(struct cd_ctx *c, CUstream stream, struct cd_link *records);

/* Sends c's oldest fenced device blocks to cuMemFreeAsync until the cache is
 * within three quarters of CUDEFER_DEVICE_CACHE and its count of blocks,
 * leaving those whose other contexts' records have not passed (fence.h).
 * Returns whether the cache is still over its limits: the waiter calls it
 * again. Called with c entered. Does not wait. */
bool cd_retire_evict(struct cd_ctx *c);

/* After a device allocation in c (not entered): the program's memory grew,
 * and with it the room under its peak shrank; a cache now over its limits
 * is the waiter's to evict. Does not wait. */
void cd_retire_grown(struct cd_ctx *c);

/* Gives a record's fence event back to its context's pool (c entered). */
void cd_retire_drop_event(struct cd_ctx *c, struct cd_record *r);

#endif
