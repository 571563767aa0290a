/* reclaim.h - what the flush points share with the teardown. */
#ifndef CUDEFER_RECLAIM_H
#define CUDEFER_RECLAIM_H

/* A context of device dev (negative: not known) begins its teardown (+1)
 * or its destruction has returned (-1): an out-of-memory answer for that
 * device's memory waits for the ones under way, since they hold what the
 * program released in those contexts. */
void cd_reclaim_ending(int dev, int delta);

#endif
