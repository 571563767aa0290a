/* stats.h - counters, the statistics printed at exit and the JSON report. */
#ifndef CUDEFER_STATS_H
#define CUDEFER_STATS_H

#include "kinds.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum cd_flush_reason {
    CD_FLUSH_OOM,        /* an allocation failed */
    CD_FLUSH_SYNC,       /* cuCtxSynchronize */
    CD_FLUSH_EXPLICIT,   /* cudefer_flush() */
    CD_FLUSH_REGISTER,   /* a registration overlapped a pending unregister */
    CD_FLUSH_TEARDOWN,   /* the context is going away */
    CD_FLUSH_REASON_COUNT
};

struct cd_stats {
    _Atomic uint64_t deferred[CD_KIND_COUNT];  /* taken by the engine */
    _Atomic uint64_t released[CD_KIND_COUNT];  /* really released */
    _Atomic uint64_t reused[CD_KIND_COUNT];    /* served a later allocation */
    _Atomic uint64_t word_answers;             /* looks at a released block (whether its
                                                  own context's fence has passed) that a
                                                  fence's word answered, without a driver
                                                  call (fence.h) */
    _Atomic uint64_t fence_queries;            /* looks the words could not answer: the
                                                  driver was asked (an event query) */
    _Atomic uint64_t word_lags;                /* looks the words could not answer in a
                                                  small bin of a loop: a new block
                                                  instead of a query (cache.c) */
    _Atomic uint64_t dropped[CD_KIND_COUNT];   /* freed by their context's destruction */
    _Atomic uint64_t passed[CD_KIND_COUNT];    /* handed to the driver as asked */
    _Atomic uint64_t over_limit[CD_KIND_COUNT]; /* of those: beyond the limits */
    _Atomic uint64_t errors[CD_KIND_COUNT];    /* failed real releases */
    /* What cudefer saved: releases made while the work before them still
     * ran (the driver's call would have waited), and for how long that work
     * ran on after the release returned, at least: releases made while an
     * earlier one's work still runs are timed by that earlier work's end
     * (waiter.c), as the waiter saw it, to about a millisecond. Gathered
     * only where they are shown (cd_stats_gathered); the unregisters' are
     * counted always (their wait needs the query anyway). */
    _Atomic uint64_t would_wait[CD_KIND_COUNT];
    _Atomic uint64_t avoided_ns[CD_KIND_COUNT];
    _Atomic uint64_t longest_avoided_ns;
    /* Waits cudefer made itself. */
    _Atomic uint64_t reuse_waits;              /* allocations that waited for a block */
    _Atomic uint64_t reuse_wait_ns;
    _Atomic uint64_t debt_waits;               /* of those, for a managed block the
                                                  same thread released (cache.c) */
    _Atomic uint64_t unregister_waits;         /* unregisters that waited for work */
    _Atomic uint64_t unregister_wait_ns;
    _Atomic uint64_t unregister_passed;        /* unregisters made with the driver's own
                                                  call after waiting: another context's
                                                  work still ran, or a capture kept its
                                                  record from being made (retire.c) */
    _Atomic uint64_t flushes[CD_FLUSH_REASON_COUNT];
    _Atomic uint64_t reclaims;                 /* allocations retried, no waiting */
    _Atomic uint64_t reclaims_waited;          /* retried after waiting for the GPU */
    _Atomic uint64_t far_skipped;              /* out-of-memory flushes that released
                                                  entries after their own context's work
                                                  only: captures kept other contexts'
                                                  records from being made, or their work
                                                  outlasted the wait's bound (reclaim.c) */
    _Atomic int64_t deferred_bytes;            /* now, all contexts */
    _Atomic int64_t peak_deferred_bytes;
    _Atomic int64_t cached_device_bytes;       /* now, all contexts */
    _Atomic int64_t peak_cached_device_bytes;
    _Atomic int64_t program_device_bytes;      /* the program holds now, all contexts */
    _Atomic int64_t peak_program_device_bytes;
};

extern struct cd_stats cd_stats;

const char *cd_flush_reason_name(enum cd_flush_reason why);
/* Whether the figures of what cudefer saved are gathered: only where they
 * will be shown (CUDEFER_STATS=1 or CUDEFER_REPORT set), unless
 * CUDEFER_SAVINGS=0. They cost event queries on a release's path, and a
 * watch the waiter follows. */
bool cd_stats_gathered(void);
void cd_stats_add_deferred_bytes(int64_t delta);
void cd_stats_add_cached_device_bytes(int64_t delta);
/* Device memory the program holds (tracked allocations not released). */
void cd_stats_add_program_device_bytes(int64_t delta);
/* ns of waiting avoided by releases of kind; the longest of them lasted
 * longest_ns. */
void cd_stats_add_avoided(enum cd_kind kind, uint64_t ns, uint64_t longest_ns);

/* The process has used the driver through cudefer: only then are the
 * statistics printed and the report written. Cheap after the first call. */
void cd_stats_note_use(void);

/* Prints the statistics (CUDEFER_STATS) and writes the report
 * (CUDEFER_REPORT), once per process, if the process used the driver. */
void cd_stats_report(void);

/* The report's path for this process: CUDEFER_REPORT with %p, %h and %%
 * replaced. False when the result does not fit. */
bool cd_stats_report_path(const char *pattern, char *out, unsigned long size);

/* Zeroes everything and starts a new process's clock (a forked child). */
void cd_stats_reset(void);

#endif
