/* reclaim.h - what the flush points share with the teardown. */
#ifndef CUDEFER_RECLAIM_H
#define CUDEFER_RECLAIM_H

/* A context's teardown begins (+1) or its destruction has returned (-1):
 * an out-of-memory answer waits for the ones under way, since they hold
 * what the program released in those contexts. */
void cd_reclaim_ending(int delta);

#endif
