/* stats.c - counters and their report at exit. */
#include "stats.h"

#include "backends.h"
#include "log.h"
#include "options.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct cd_stats cd_stats;

static const char *const reason_names[CD_FLUSH_REASON_COUNT] = {
    "oom", "sync", "explicit", "limit", "register", "teardown",
};

const char *cd_flush_reason_name(enum cd_flush_reason why)
{
    return reason_names[why];
}

static void add_with_peak(_Atomic int64_t *now_bytes, _Atomic int64_t *peak_bytes, int64_t delta)
{
    int64_t now = atomic_fetch_add(now_bytes, delta) + delta;
    int64_t peak = atomic_load(peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(peak_bytes, &peak, now))
        ;
}

void cd_stats_add_deferred_bytes(int64_t delta)
{
    add_with_peak(&cd_stats.deferred_bytes, &cd_stats.peak_deferred_bytes, delta);
}

void cd_stats_add_cached_device_bytes(int64_t delta)
{
    add_with_peak(&cd_stats.cached_device_bytes, &cd_stats.peak_cached_device_bytes, delta);
}

static void print_text(void)
{
    cd_log_raw("cudefer: statistics\n");
    cd_log_raw("cudefer:   %-10s %10s %10s %10s %10s %10s %10s\n", "kind", "deferred",
               "released", "reused", "dropped", "passed", "errors");
    for (int k = 0; k < CD_KIND_COUNT; k++)
        cd_log_raw("cudefer:   %-10s %10llu %10llu %10llu %10llu %10llu %10llu\n",
                   cd_backend((enum cd_kind)k)->name,
                   (unsigned long long)cd_stats.deferred[k],
                   (unsigned long long)cd_stats.released[k],
                   (unsigned long long)cd_stats.reused[k],
                   (unsigned long long)cd_stats.dropped[k],
                   (unsigned long long)cd_stats.passed[k],
                   (unsigned long long)cd_stats.errors[k]);
    for (int r = 0; r < CD_FLUSH_REASON_COUNT; r++)
        cd_log_raw("cudefer:   flushes (%s): %llu\n", reason_names[r],
                   (unsigned long long)cd_stats.flushes[r]);
    cd_log_raw("cudefer:   allocations retried: %llu; peak deferred bytes: %lld; "
               "peak cached device bytes: %lld\n",
               (unsigned long long)cd_stats.retries, (long long)cd_stats.peak_deferred_bytes,
               (long long)cd_stats.peak_cached_device_bytes);
}

static void write_counts(FILE *f, const char *key, _Atomic uint64_t *v, bool last)
{
    fprintf(f, "    \"%s\": {", key);
    for (int k = 0; k < CD_KIND_COUNT; k++)
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", cd_backend((enum cd_kind)k)->name,
                (unsigned long long)v[k]);
    fprintf(f, "}%s\n", last ? "" : ",");
}

static void write_json(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        cd_log(CD_LOG_ERROR, "cannot write the report %s", path);
        return;
    }
    fprintf(f, "{\n  \"kinds\": {\n");
    write_counts(f, "deferred", cd_stats.deferred, false);
    write_counts(f, "released", cd_stats.released, false);
    write_counts(f, "reused", cd_stats.reused, false);
    write_counts(f, "dropped", cd_stats.dropped, false);
    write_counts(f, "passed", cd_stats.passed, false);
    write_counts(f, "errors", cd_stats.errors, true);
    fprintf(f, "  },\n  \"flushes\": {");
    for (int r = 0; r < CD_FLUSH_REASON_COUNT; r++)
        fprintf(f, "%s\"%s\": %llu", r ? ", " : "", reason_names[r],
                (unsigned long long)cd_stats.flushes[r]);
    fprintf(f, "},\n  \"retries\": %llu,\n  \"peak_deferred_bytes\": %lld,\n"
            "  \"peak_cached_device_bytes\": %lld\n}\n",
            (unsigned long long)cd_stats.retries, (long long)cd_stats.peak_deferred_bytes,
            (long long)cd_stats.peak_cached_device_bytes);
    fclose(f);
}

void cd_stats_report(void)
{
    static atomic_flag done = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&done))
        return;
    if (cd_option_bool(CD_OPT_STATS))
        print_text();
    const char *path = cd_option_str(CD_OPT_REPORT);
    if (*path)
        write_json(path);
}

void cd_stats_reset(void)
{
    memset(&cd_stats, 0, sizeof cd_stats);
}
