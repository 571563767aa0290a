/* options.c - the one table of CUDEFER_* variables, and their parsing. */
#include "options.h"

#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const registered_modes[] = {"off", "wait", "defer", NULL};

static const struct cd_option_desc table[CD_OPT_COUNT] = {
    [CD_OPT_ENABLE] = {"ENABLE", CD_TYPE_BOOL, "1",
        "Master switch; 0 makes every wrapped call go straight to the driver.", NULL},
    [CD_OPT_DEVICE] = {"DEVICE", CD_TYPE_BOOL, "1",
        "Defer cuMemFree of device memory (fenced; kept for reuse or freed with cuMemFreeAsync); 0 restores the blocking cudaFree.", NULL},
    [CD_OPT_MANAGED] = {"MANAGED", CD_TYPE_BOOL, "1",
        "Defer cuMemFree of managed (cuMemAllocManaged) memory.", NULL},
    [CD_OPT_HOST] = {"HOST", CD_TYPE_BOOL, "1",
        "Defer cuMemFreeHost of pinned host memory.", NULL},
    [CD_OPT_REGISTERED] = {"REGISTERED", CD_TYPE_CHOICE, "wait",
        "cuMemHostUnregister: wait (returns once the work submitted before it has finished; the driver's own unregister follows later), defer (returns at once: only for programs that do not reuse, free or unmap the pages before they synchronise the context), off (the driver's own call).",
        registered_modes},
    [CD_OPT_ARRAY] = {"ARRAY", CD_TYPE_BOOL, "1",
        "Defer cuArrayDestroy and cuMipmappedArrayDestroy.", NULL},
    [CD_OPT_MODULE] = {"MODULE", CD_TYPE_BOOL, "1",
        "Defer cuModuleUnload.", NULL},
    [CD_OPT_LIBRARY] = {"LIBRARY", CD_TYPE_BOOL, "1",
        "Defer cuLibraryUnload.", NULL},
    [CD_OPT_MAX_DEFERRED_BYTES] = {"MAX_DEFERRED_BYTES", CD_TYPE_SIZE, "256M",
        "Bytes of pinned, managed and registered memory and arrays that a context holds for the program (queued or kept for reuse) before cudefer says so (once, at level info) and counts its releases as over the limit; they are still deferred without waiting, and what is held goes back at the next flush point.", NULL},
    [CD_OPT_MAX_DEFERRED_ENTRIES] = {"MAX_DEFERRED_ENTRIES", CD_TYPE_COUNT, "4096",
        "Entries (all kinds but device memory) that a context holds for the program, counted the same way; past it releases are still deferred until the next flush point.", NULL},
    [CD_OPT_DEVICE_CACHE] = {"DEVICE_CACHE", CD_TYPE_SIZE, "256M",
        "Released device memory that a context keeps to serve allocations of the same size; beyond it the oldest goes back through cuMemFreeAsync, without waiting. 0 sends every block back at once.", NULL},
    [CD_OPT_DEVICE_CACHE_PEAK] = {"DEVICE_CACHE_PEAK", CD_TYPE_COUNT, "200",
        "Percent of a context's peak of device memory (the most the program has held at once, in bytes and in blocks) up to which the memory the program holds plus the device cache may reach, where CUDEFER_DEVICE_CACHE alone allows less: 100 holds what a caching allocator would; the default, 200, also keeps the blocks whose last use the GPU has not reached yet when the program allocates their sizes again (a GPU that runs behind); 0 holds the cache to CUDEFER_DEVICE_CACHE alone.", NULL},
    [CD_OPT_REUSE_WAIT] = {"REUSE_WAIT", CD_TYPE_BOOL, "1",
        "An allocation may wait for a released block of its size to finish its last use instead of allocating anew, for at most what an allocation of that kind and size was measured to take (managed memory: until that use ends, for a block the same thread released while the GPU still used it, as the driver's release would have waited); 0 never waits.", NULL},
    [CD_OPT_FENCE_WORD] = {"FENCE_WORD", CD_TYPE_BOOL, "1",
        "1 (the default): an allocation that may reuse a released device, managed or pinned block reads a word of host memory (4 bytes of pinned memory a context) that the GPU writes, on cudefer's private stream, with the number of the newest releases whose work has finished, instead of asking the driver about that block's fence (an event query, up to 1.6 us while the GPU runs behind, measured on an H200); a look at a released block asks for the next write (a record, a stream wait and the write) once four releases wait for one, and a release makes no call for it; in a loop over small blocks that the word keeps missing, a look it misses takes a new block instead of querying (up to 16 blocks and 1 MiB a size). Measured on an H200: a 4 KiB pinned allocate-touch-release loop 0.89-1.53x the driver's pool with it, 1.55-2.78x without (medians 1.05-1.10x and 1.98-2.22x). 0: every reuse asks the driver, and no pinned word is made.", NULL},
    [CD_OPT_KEEP] = {"KEEP", CD_TYPE_SIZE, "0",
        "Released device, managed and pinned memory that a context keeps for reuse across cuCtxSynchronize (the newest blocks whose last use has finished, up to this many bytes), as a stream-ordered pool's release threshold does; 0 gives everything back at each synchronisation. cudefer_flush(), an allocation that runs short of memory and the context's teardown still take it all back.", NULL},
    [CD_OPT_LOG] = {"LOG", CD_TYPE_LEVEL, "error",
        "Log level on stderr: off, error, info (flushes, waits, teardown, options at start) or debug (every door and release).", NULL},
    [CD_OPT_STATS] = {"STATS", CD_TYPE_BOOL, "0",
        "Print statistics on stderr at exit (processes that used the driver only).", NULL},
    [CD_OPT_REPORT] = {"REPORT", CD_TYPE_STRING, "",
        "Path of a JSON report written at exit by each process that used the driver; %p is replaced by the pid, %h by the host name, %% by %.", NULL},
    [CD_OPT_SAVINGS] = {"SAVINGS", CD_TYPE_BOOL, "1",
        "Gather what cudefer saved (the releases that would have waited in the driver, and for how long at least) where it is shown: with CUDEFER_STATS=1 or CUDEFER_REPORT. That costs an event query or two for each release made while the GPU runs behind; without either, nothing is gathered. 0 never gathers it: the statistics and the report then show none.", NULL},
    [CD_OPT_DRIVER] = {"DRIVER", CD_TYPE_STRING, "",
        "Path of the driver library cudefer calls instead of libcuda.so.1; the program must load the same file (cudefer steps aside if it finds two drivers).", NULL},
};

/* Strings are copied when read: the environment area may be rewritten
 * later (process-title libraries do), and the report's path is used at
 * exit. */
#define STRING_MAX 4096
static long long values[CD_OPT_COUNT];
static char strings[CD_OPT_COUNT][STRING_MAX];
enum { UNREAD, READING, READ };
static _Atomic int state;

const struct cd_option_desc *cd_option_desc(enum cd_option opt)
{
    return (unsigned)opt < CD_OPT_COUNT ? &table[opt] : NULL;
}

static bool parse_bool(const char *t, long long *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0) {
            *out = 1;
            return true;
        }
        if (strcasecmp(t, no[i]) == 0) {
            *out = 0;
            return true;
        }
    }
    return false;
}

static bool parse_count(const char *t, long long *out, bool suffix)
{
    if (*t < '0' || *t > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(t, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    if (suffix && *end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        case 't': case 'T': shift = 40; break;
        default: return false;
        }
        end++;
        if (*end == 'i')
            end++;
        if (*end == 'B' || *end == 'b')
            end++;
    }
    if (*end)
        return false;
    if (v > ((unsigned long long)INT64_MAX >> shift))
        return false;
    *out = (long long)(v << shift);
    return true;
}

static bool parse_level(const char *t, long long *out)
{
    static const char *const names[] = {"off", "error", "info", "debug"};
    for (long long i = 0; i < 4; i++) {
        if (strcasecmp(t, names[i]) == 0) {
            *out = i;
            return true;
        }
    }
    long long v;
    if (parse_count(t, &v, false) && v <= CD_LOG_DEBUG) {
        *out = v;
        return true;
    }
    return false;
}

static bool parse_choice(const char *const *choices, const char *t, long long *out)
{
    for (long long i = 0; choices[i]; i++) {
        if (strcasecmp(t, choices[i]) == 0) {
            *out = i;
            return true;
        }
    }
    /* The boolean words name the first two choices (off, on). */
    return parse_bool(t, out);
}

bool cd_option_parse(enum cd_option_type type, const char *text, long long *out)
{
    if (!text || !out)
        return false;
    switch (type) {
    case CD_TYPE_BOOL: return parse_bool(text, out);
    case CD_TYPE_SIZE: return parse_count(text, out, true);
    case CD_TYPE_COUNT: return parse_count(text, out, false);
    case CD_TYPE_LEVEL: return parse_level(text, out);
    case CD_TYPE_STRING:
    case CD_TYPE_CHOICE: return false;
    }
    return false;
}

bool cd_option_parse_row(const struct cd_option_desc *d, const char *text, long long *out)
{
    if (!d || !text || !out)
        return false;
    if (d->type == CD_TYPE_CHOICE)
        return d->choices && parse_choice(d->choices, text, out);
    return cd_option_parse(d->type, text, out);
}

/* The CUDEFER_* values as they were when cudefer was loaded: a variable the
 * program's environment no longer has when the options are read (its area
 * was written over, as process-title libraries do) is taken from here. */
static char *at_load[CD_OPT_COUNT];

static void variable_name(enum cd_option opt, char *var, size_t size)
{
    snprintf(var, size, "CUDEFER_%s", table[opt].name);
}

__attribute__((constructor)) static void options_at_load(void)
{
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        char var[64];
        variable_name((enum cd_option)i, var, sizeof var);
        const char *text = getenv(var);
        if (text)
            at_load[i] = strdup(text);
    }
}

static void read_one(enum cd_option opt)
{
    const struct cd_option_desc *d = &table[opt];
    char var[64];
    variable_name(opt, var, sizeof var);
    const char *text = getenv(var);
    if (!text)
        text = at_load[opt];
    if (d->type == CD_TYPE_STRING) {
        snprintf(strings[opt], STRING_MAX, "%s", text ? text : "");
        if (text && strlen(text) >= STRING_MAX)
            cd_log_raw("cudefer: warning: %s is longer than %d characters; it is cut\n", var,
                       STRING_MAX - 1);
        return;
    }
    long long def = 0;
    cd_option_parse_row(d, d->default_text, &def);
    values[opt] = def;
    if (!text || !*text)
        return;
    if (!cd_option_parse_row(d, text, &values[opt]))
        cd_log_raw("cudefer: warning: invalid value '%s' for %s; using the default %s\n", text,
                   var, d->default_text);
}

static void read_all(void)
{
    /* The level first, so that the warnings below know it. */
    read_one(CD_OPT_LOG);
    cd_log_set_level((enum cd_log_level)values[CD_OPT_LOG]);
    for (int i = 0; i < CD_OPT_COUNT; i++)
        if (i != CD_OPT_LOG)
            read_one((enum cd_option)i);
}

static void ensure_read(void)
{
    for (;;) {
        int s = atomic_load_explicit(&state, memory_order_acquire);
        if (s == READ)
            return;
        if (s == UNREAD && atomic_compare_exchange_weak(&state, &s, READING)) {
            read_all();
            atomic_store_explicit(&state, READ, memory_order_release);
            return;
        }
        /* Another thread is reading the environment: microseconds. */
    }
}

void cd_options_reload(void)
{
    atomic_store(&state, UNREAD);
    ensure_read();
}

long long cd_option_int(enum cd_option opt)
{
    ensure_read();
    return values[opt];
}

bool cd_option_bool(enum cd_option opt)
{
    return cd_option_int(opt) != 0;
}

const char *cd_option_str(enum cd_option opt)
{
    ensure_read();
    return strings[opt];
}

/* Copies s into buf, cut to size - 1 bytes: an option's text is shown
 * cut, never overrun (snprintf("%s") there trips -Wformat-truncation at
 * -O3, which -Werror makes a failed release build). */
static void put_text(char *buf, size_t size, const char *s)
{
    if (!size)
        return;
    size_t n = strnlen(s, size - 1);
    memcpy(buf, s, n);
    buf[n] = '\0';
}

void cd_option_text(enum cd_option opt, char *buf, size_t size)
{
    ensure_read();
    const struct cd_option_desc *d = &table[opt];
    switch (d->type) {
    case CD_TYPE_STRING:
        put_text(buf, size, strings[opt]);
        return;
    case CD_TYPE_CHOICE:
        put_text(buf, size, d->choices[values[opt]]);
        return;
    case CD_TYPE_LEVEL: {
        static const char *const names[] = {"off", "error", "info", "debug"};
        put_text(buf, size, names[values[opt]]);
        return;
    }
    default:
        snprintf(buf, size, "%lld", values[opt]);
        return;
    }
}

void cd_options_print(void)
{
    static atomic_flag printed = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&printed))
        return;
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        char text[256];
        cd_option_text((enum cd_option)i, text, sizeof text);
        cd_log(CD_LOG_INFO, "option CUDEFER_%s=%s", table[i].name, text);
    }
}
