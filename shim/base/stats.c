/* stats.c - counters and their report at exit. */
#include "stats.h"

#include "driver.h"
#include "log.h"
#include "options.h"

#include <cudefer.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cd_stats cd_stats;

static _Atomic bool used;
static _Atomic bool reported;
static struct timespec started;

static const char *const reason_names[CD_FLUSH_REASON_COUNT] = {
    "oom", "sync", "explicit", "register", "teardown",
};

const char *cd_flush_reason_name(enum cd_flush_reason why)
{
    return reason_names[why];
}

__attribute__((constructor)) static void stats_init(void)
{
    clock_gettime(CLOCK_REALTIME, &started);
}

bool cd_stats_gathered(void)
{
    return cd_option_bool(CD_OPT_SAVINGS) &&
           (cd_option_bool(CD_OPT_STATS) || cd_option_str(CD_OPT_REPORT)[0] != '\0');
}

void cd_stats_note_use(void)
{
    if (!atomic_load_explicit(&used, memory_order_relaxed))
        atomic_store(&used, true);
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

void cd_stats_add_program_device_bytes(int64_t delta)
{
    add_with_peak(&cd_stats.program_device_bytes, &cd_stats.peak_program_device_bytes, delta);
}

void cd_stats_add_avoided(enum cd_kind kind, uint64_t ns, uint64_t longest_ns)
{
    atomic_fetch_add(&cd_stats.avoided_ns[kind], ns);
    uint64_t longest = atomic_load(&cd_stats.longest_avoided_ns);
    while (longest_ns > longest &&
           !atomic_compare_exchange_weak(&cd_stats.longest_avoided_ns, &longest, longest_ns))
        ;
}

static uint64_t sum(_Atomic uint64_t *v)
{
    uint64_t n = 0;
    for (int k = 0; k < CD_KIND_COUNT; k++)
        n += v[k];
    return n;
}

static void print_text(void)
{
    cd_log_raw("cudefer: statistics (pid %d)\n", (int)getpid());
    cd_log_raw("cudefer:   %-10s %9s %9s %9s %9s %9s %9s %9s\n", "kind", "deferred", "released",
               "reused", "dropped", "passed", "errors", "wouldwait");
    bool saved = cd_stats_gathered();
    for (int k = 0; k < CD_KIND_COUNT; k++) {
        char would[24] = "-";
        if (saved)
            snprintf(would, sizeof would, "%llu", (unsigned long long)cd_stats.would_wait[k]);
        cd_log_raw("cudefer:   %-10s %9llu %9llu %9llu %9llu %9llu %9llu %9s\n",
                   cd_kind_name((enum cd_kind)k), (unsigned long long)cd_stats.deferred[k],
                   (unsigned long long)cd_stats.released[k],
                   (unsigned long long)cd_stats.reused[k],
                   (unsigned long long)cd_stats.dropped[k],
                   (unsigned long long)cd_stats.passed[k],
                   (unsigned long long)cd_stats.errors[k], would);
    }
    if (saved)
        cd_log_raw("cudefer:   %llu releases would have waited; at least %.3f s of waiting "
                   "avoided; longest %.1f ms\n", (unsigned long long)sum(cd_stats.would_wait),
                   (double)sum(cd_stats.avoided_ns) / 1e9,
                   (double)cd_stats.longest_avoided_ns / 1e6);
    else
        cd_log_raw("cudefer:   what cudefer saved was not gathered (CUDEFER_SAVINGS=0)\n");
    for (int r = 0; r < CD_FLUSH_REASON_COUNT; r++)
        cd_log_raw("cudefer:   flushes (%s): %llu\n", reason_names[r],
                   (unsigned long long)cd_stats.flushes[r]);
    cd_log_raw("cudefer:   allocations retried: %llu without waiting, %llu after waiting "
               "(%llu flushes of which released entries after their own context's work only: "
               "captures kept other contexts' records from being made, or their work outlasted "
               "the wait's bound); "
               "waits for a reusable block: %llu (%.3f ms; %llu for a managed block the same "
               "thread released); looks at released blocks the fences' words answered: %llu, "
               "the driver answered: %llu, a new block instead (a small bin of a loop "
               "grew): %llu; "
               "unregisters that waited: %llu (%.3f ms; %llu then made with the driver's "
               "own call: another context's work still ran, or a capture kept its record from "
               "being made)\n",
               (unsigned long long)cd_stats.reclaims, (unsigned long long)cd_stats.reclaims_waited,
               (unsigned long long)cd_stats.far_skipped,
               (unsigned long long)cd_stats.reuse_waits, (double)cd_stats.reuse_wait_ns / 1e6,
               (unsigned long long)cd_stats.debt_waits,
               (unsigned long long)cd_stats.word_answers,
               (unsigned long long)cd_stats.fence_queries,
               (unsigned long long)cd_stats.word_lags,
               (unsigned long long)cd_stats.unregister_waits,
               (double)cd_stats.unregister_wait_ns / 1e6,
               (unsigned long long)cd_stats.unregister_passed);
    cd_log_raw("cudefer:   peak deferred bytes: %lld; peak cached device bytes: %lld; "
               "peak device bytes the program held: %lld\n",
               (long long)cd_stats.peak_deferred_bytes,
               (long long)cd_stats.peak_cached_device_bytes,
               (long long)cd_stats.peak_program_device_bytes);
}

/* A JSON string (the program's name, the host, option values). */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void write_counts(FILE *f, const char *key, _Atomic uint64_t *v, bool last)
{
    fprintf(f, "    \"%s\": {", key);
    for (int k = 0; k < CD_KIND_COUNT; k++)
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", cd_kind_name((enum cd_kind)k),
                (unsigned long long)v[k]);
    fprintf(f, "}%s\n", last ? "" : ",");
}

static void iso_time(const struct timespec *ts, char *buf, size_t size)
{
    struct tm tm;
    gmtime_r(&ts->tv_sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03ldZ", ts->tv_nsec / 1000000);
}

static void program_name(char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    buf[n > 0 ? n : 0] = 0;
    if (n <= 0)
        snprintf(buf, size, "?");
}

static void write_header(FILE *f)
{
    char program[1024], host[256] = "?", start[64], end[64];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    program_name(program, sizeof program);
    gethostname(host, sizeof host - 1);
    iso_time(&started, start, sizeof start);
    iso_time(&now, end, sizeof end);
    int version = cd_driver_version();
    fprintf(f, "{\n  \"pid\": %d,\n  \"program\": ", (int)getpid());
    json_string(f, program);
    fprintf(f, ",\n  \"host\": ");
    json_string(f, host);
    fprintf(f, ",\n  \"cudefer_version\": \"%s\",\n  \"driver_version\": ", CUDEFER_VERSION_STRING);
    if (version)
        fprintf(f, "%d", version);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"start\": \"%s\",\n  \"end\": \"%s\",\n  \"options\": {", start, end);
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        char text[4096];
        cd_option_text((enum cd_option)i, text, sizeof text);
        fprintf(f, "%s\n    \"%s\": ", i ? "," : "", cd_option_desc((enum cd_option)i)->name);
        json_string(f, text);
    }
    fprintf(f, "\n  },\n");
}

static void write_json(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        cd_log(CD_LOG_ERROR, "cannot write the report %s", path);
        return;
    }
    write_header(f);
    fprintf(f, "  \"kinds\": {\n");
    write_counts(f, "deferred", cd_stats.deferred, false);
    write_counts(f, "released", cd_stats.released, false);
    write_counts(f, "reused", cd_stats.reused, false);
    write_counts(f, "dropped", cd_stats.dropped, false);
    write_counts(f, "passed", cd_stats.passed, false);
    write_counts(f, "over_limit", cd_stats.over_limit, false);
    write_counts(f, "errors", cd_stats.errors, false);
    /* What cudefer saved: null where it was not gathered (CUDEFER_SAVINGS=0). */
    if (cd_stats_gathered()) {
        write_counts(f, "would_wait", cd_stats.would_wait, false);
        write_counts(f, "avoided_ns", cd_stats.avoided_ns, true);
        fprintf(f, "  },\n  \"saved\": {\"would_wait\": %llu, \"avoided_s\": %.6f, "
                "\"longest_ms\": %.3f},\n",
                (unsigned long long)sum(cd_stats.would_wait),
                (double)sum(cd_stats.avoided_ns) / 1e9,
                (double)cd_stats.longest_avoided_ns / 1e6);
    } else {
        fprintf(f, "    \"would_wait\": null,\n    \"avoided_ns\": null\n  },\n"
                "  \"saved\": null,\n");
    }
    fprintf(f, "  \"flushes\": {");
    for (int r = 0; r < CD_FLUSH_REASON_COUNT; r++)
        fprintf(f, "%s\"%s\": %llu", r ? ", " : "", reason_names[r],
                (unsigned long long)cd_stats.flushes[r]);
    fprintf(f, "},\n  \"retries\": %llu,\n  \"retries_after_waiting\": %llu,\n"
            "  \"oom_flushes_without_other_contexts\": %llu,\n"
            "  \"reuse_waits\": %llu,\n  \"reuse_wait_ms\": %.3f,\n  \"reuse_waits_own\": %llu,\n"
            "  \"reuse_word_answers\": %llu,\n  \"reuse_fence_queries\": %llu,\n"
            "  \"reuse_word_lags\": %llu,\n"
            "  \"unregister_waits\": %llu,\n  \"unregister_wait_ms\": %.3f,\n"
            "  \"unregisters_by_the_driver\": %llu,\n"
            "  \"peak_deferred_bytes\": %lld,\n  \"peak_cached_device_bytes\": %lld,\n"
            "  \"peak_program_device_bytes\": %lld\n}\n",
            (unsigned long long)(cd_stats.reclaims + cd_stats.reclaims_waited),
            (unsigned long long)cd_stats.reclaims_waited,
            (unsigned long long)cd_stats.far_skipped,
            (unsigned long long)cd_stats.reuse_waits, (double)cd_stats.reuse_wait_ns / 1e6,
            (unsigned long long)cd_stats.debt_waits,
            (unsigned long long)cd_stats.word_answers,
            (unsigned long long)cd_stats.fence_queries,
            (unsigned long long)cd_stats.word_lags,
            (unsigned long long)cd_stats.unregister_waits,
            (double)cd_stats.unregister_wait_ns / 1e6,
            (unsigned long long)cd_stats.unregister_passed, (long long)cd_stats.peak_deferred_bytes,
            (long long)cd_stats.peak_cached_device_bytes,
            (long long)cd_stats.peak_program_device_bytes);
    fclose(f);
}

bool cd_stats_report_path(const char *pattern, char *out, unsigned long size)
{
    size_t n = 0;
    char host[256] = "";
    for (const char *p = pattern; *p; p++) {
        char piece[300];
        if (*p != '%' || !p[1]) {
            piece[0] = *p;
            piece[1] = 0;
        } else if (*++p == 'p') {
            snprintf(piece, sizeof piece, "%d", (int)getpid());
        } else if (*p == 'h') {
            if (!host[0] && gethostname(host, sizeof host - 1) != 0)
                snprintf(host, sizeof host, "unknown");
            snprintf(piece, sizeof piece, "%s", host);
        } else if (*p == '%') {
            snprintf(piece, sizeof piece, "%%");
        } else {
            snprintf(piece, sizeof piece, "%%%c", *p); /* kept as written */
        }
        size_t len = strlen(piece);
        if (n + len + 1 > size)
            return false;
        memcpy(out + n, piece, len);
        n += len;
    }
    out[n] = 0;
    return true;
}

void cd_stats_report(void)
{
    if (!atomic_load(&used) || atomic_exchange(&reported, true))
        return;
    if (cd_option_bool(CD_OPT_STATS))
        print_text();
    const char *pattern = cd_option_str(CD_OPT_REPORT);
    char path[4096];
    if (!*pattern)
        return;
    if (!cd_stats_report_path(pattern, path, sizeof path)) {
        cd_log(CD_LOG_ERROR, "the report path %s is too long", pattern);
        return;
    }
    write_json(path);
}

void cd_stats_reset(void)
{
    memset(&cd_stats, 0, sizeof cd_stats);
    atomic_store(&used, false);
    atomic_store(&reported, false);
    clock_gettime(CLOCK_REALTIME, &started);
}
