/* options.c - the one table of CUDEFER_* variables, and their parsing. */
#include "options.h"

#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct cd_option_desc table[CD_OPT_COUNT] = {
    [CD_OPT_ENABLE] = {"ENABLE", CD_TYPE_BOOL, "1",
        "Master switch; 0 makes every wrapped call go straight to the driver."},
    [CD_OPT_DEVICE] = {"DEVICE", CD_TYPE_BOOL, "1",
        "Defer cuMemFree of device memory (fenced cuMemFreeAsync); 0 restores the blocking cudaFree."},
    [CD_OPT_MANAGED] = {"MANAGED", CD_TYPE_BOOL, "1",
        "Defer cuMemFree of managed (cuMemAllocManaged) memory."},
    [CD_OPT_HOST] = {"HOST", CD_TYPE_BOOL, "1",
        "Defer cuMemFreeHost of pinned host memory."},
    [CD_OPT_REGISTERED] = {"REGISTERED", CD_TYPE_BOOL, "1",
        "Defer cuMemHostUnregister."},
    [CD_OPT_ARRAY] = {"ARRAY", CD_TYPE_BOOL, "1",
        "Defer cuArrayDestroy and cuMipmappedArrayDestroy."},
    [CD_OPT_MODULE] = {"MODULE", CD_TYPE_BOOL, "1",
        "Defer cuModuleUnload."},
    [CD_OPT_LIBRARY] = {"LIBRARY", CD_TYPE_BOOL, "1",
        "Defer cuLibraryUnload."},
    [CD_OPT_MAX_DEFERRED_BYTES] = {"MAX_DEFERRED_BYTES", CD_TYPE_SIZE, "256M",
        "Deferred bytes of a context (pinned, registered, managed, arrays) above which its next allocating call releases the queue."},
    [CD_OPT_MAX_DEFERRED_ENTRIES] = {"MAX_DEFERRED_ENTRIES", CD_TYPE_COUNT, "4096",
        "Deferred entries of a context above which its next allocating call releases the queue."},
    [CD_OPT_DEVICE_CACHE] = {"DEVICE_CACHE", CD_TYPE_SIZE, "256M",
        "Released device memory of a context kept to serve allocations of the same size once its fence has passed; beyond it the oldest goes to cuMemFreeAsync. 0 frees every block at once."},
    [CD_OPT_LOG] = {"LOG", CD_TYPE_LEVEL, "error",
        "Log level on stderr: off, error, info (flushes, teardown, options at start) or debug (every door and release)."},
    [CD_OPT_STATS] = {"STATS", CD_TYPE_BOOL, "0",
        "Print statistics on stderr at exit."},
    [CD_OPT_REPORT] = {"REPORT", CD_TYPE_STRING, "",
        "Path of a JSON statistics report written at exit (for CI runs)."},
    [CD_OPT_DRIVER] = {"DRIVER", CD_TYPE_STRING, "",
        "Path of the real driver library to load instead of libcuda.so.1."},
};

static long long values[CD_OPT_COUNT];
static const char *strings[CD_OPT_COUNT];
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

bool cd_option_parse(enum cd_option_type type, const char *text, long long *out)
{
    if (!text || !out)
        return false;
    switch (type) {
    case CD_TYPE_BOOL: return parse_bool(text, out);
    case CD_TYPE_SIZE: return parse_count(text, out, true);
    case CD_TYPE_COUNT: return parse_count(text, out, false);
    case CD_TYPE_LEVEL: return parse_level(text, out);
    case CD_TYPE_STRING: return false;
    }
    return false;
}

static void read_one(enum cd_option opt)
{
    const struct cd_option_desc *d = &table[opt];
    char var[64] = "CUDEFER_";
    strncat(var, d->name, sizeof var - strlen(var) - 1);
    const char *text = getenv(var);
    if (d->type == CD_TYPE_STRING) {
        strings[opt] = text ? text : "";
        return;
    }
    long long def = 0;
    cd_option_parse(d->type, d->default_text, &def);
    values[opt] = def;
    if (!text || !*text)
        return;
    if (!cd_option_parse(d->type, text, &values[opt]))
        cd_log_raw("cudefer: warning: invalid value '%s' for %s; using the default %s\n",
                   text, var, d->default_text);
}

static void read_all(void)
{
    read_one(CD_OPT_LOG);
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
    return strings[opt] ? strings[opt] : "";
}

void cd_options_print(void)
{
    static atomic_flag printed = ATOMIC_FLAG_INIT;
    ensure_read();
    if (atomic_flag_test_and_set(&printed))
        return;
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        if (table[i].type == CD_TYPE_STRING)
            cd_log(CD_LOG_INFO, "option CUDEFER_%s=%s", table[i].name, strings[i]);
        else
            cd_log(CD_LOG_INFO, "option CUDEFER_%s=%lld", table[i].name, values[i]);
    }
}
