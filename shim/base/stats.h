/* stats.h - counters, the statistics printed at exit and the JSON report. */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include "engine.h"

#include <stdatomic.h>
#include <stdint.h>

enum cd_flush_reason {
    CD_FLUSH_OOM,        /* an allocation failed */
    CD_FLUSH_SYNC,       /* cuCtxSynchronize */
    CD_FLUSH_EXPLICIT,   /* cudefer_flush() */
    CD_FLUSH_LIMIT,      /* a context went over CUDEFER_MAX_DEFERRED_* */
    CD_FLUSH_REGISTER,   /* a registration overlapped a queued unregister */
    CD_FLUSH_TEARDOWN,   /* the context is going away */
    CD_FLUSH_REASON_COUNT
};

struct cd_stats {
    _Atomic uint64_t deferred[CD_KIND_COUNT];  /* taken by the engine */
    _Atomic uint64_t released[CD_KIND_COUNT];  /* really released */
    _Atomic uint64_t reused[CD_KIND_COUNT];    /* served a later allocation */
    _Atomic uint64_t dropped[CD_KIND_COUNT];   /* left to a context teardown */
    _Atomic uint64_t passed[CD_KIND_COUNT];    /* handed to the driver as asked */
    _Atomic uint64_t errors[CD_KIND_COUNT];    /* failed real releases */
    _Atomic uint64_t flushes[CD_FLUSH_REASON_COUNT];
    _Atomic uint64_t retries;                  /* allocations retried after a flush */
    _Atomic int64_t deferred_bytes;            /* now, all contexts */
    _Atomic int64_t peak_deferred_bytes;
    _Atomic int64_t cached_device_bytes;       /* now, all contexts */
    _Atomic int64_t peak_cached_device_bytes;
};

extern struct cd_stats cd_stats;

const char *cd_flush_reason_name(enum cd_flush_reason why);
void cd_stats_add_deferred_bytes(int64_t delta);
void cd_stats_add_cached_device_bytes(int64_t delta);

/* Prints the statistics (CUDEFER_STATS) and writes the report
 * (CUDEFER_REPORT), once. */
void cd_stats_report(void);

/* Zeroes everything (a forked child). */
void cd_stats_reset(void);

#endif
