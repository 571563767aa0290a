/* fuzz_options.c - libFuzzer target for the CUDEFER_* parser (shim/options.c).
 *
 * Built by scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined and
 * linked with shim/options.c directly. The logger (shim/log.c) is replaced
 * by the counting one below, so that a warning can be checked for.
 *
 * Input: the first byte picks a mode.
 *   0-6  cd_option_parse of the rest (up to the first NUL) as a value of type
 *        (byte % 9): the six types (a choice needs its row: always refused
 *        here) and one out of range. Checked: no crash; a rejected value
 *        leaves the output alone; an accepted one is what an independent
 *        reference parser (below) makes of it, and in range for its type (a
 *        size is 0..INT64_MAX, a bool 0 or 1, a level 0..3).
 *   7-8  an environment: the rest is split at '\n' into entries; an entry's
 *        first byte picks a variable (low bits) and whether it is unset
 *        (bit 7), the rest is its value. After cd_options_reload every
 *        option reads back as the reference says (the default when unset,
 *        empty or invalid), exactly one warning names each invalid
 *        variable, and strings come back byte for byte.
 *
 * The environment is set with putenv on static buffers: setenv would copy
 * every value and glibc never frees them, which grows without bound over
 * millions of runs. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "options.h"

/* ---- the logger, replaced ------------------------------------------------ */

static int warnings;
static char last_warning[512];

static enum cd_log_level level = CD_LOG_ERROR;

void cd_log_set_level(enum cd_log_level l)
{
    level = l;
}

enum cd_log_level cd_log_level(void)
{
    return level;
}

void cd_log(enum cd_log_level level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    (void)level;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
}

void cd_log_raw(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_warning, sizeof last_warning, fmt, ap);
    va_end(ap);
    warnings++;
}

/* ---- the reference parser -------------------------------------------------
 * Written from the README's description, independently of options.c:
 * booleans 1/true/yes/on and 0/false/no/off (any case); sizes digits with an
 * optional k/M/G/T (any case, powers of 1024), then an optional 'i', then an
 * optional 'B' or 'b'; counts digits only; levels off/error/info/debug (any
 * case) or a count 0..3; a choice one of its row's words (any case), or a
 * boolean word for the first two. Every value must fit in an int64_t. */

static int lower(int c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

static bool same_word(const char *t, const char *w)
{
    for (; *t && *w; t++, w++)
        if (lower((unsigned char)*t) != *w)
            return false;
    return !*t && !*w;
}

/* Digits at *t (at least one) into *v, saturating above INT64_MAX. */
static bool ref_digits(const char **t, unsigned __int128 *v)
{
    const char *p = *t;
    unsigned __int128 x = 0;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        x = x * 10 + (unsigned)(*p - '0');
        if (x > (unsigned __int128)INT64_MAX)
            x = (unsigned __int128)INT64_MAX + 1; /* stays too big */
    }
    *t = p;
    *v = x;
    return true;
}

static bool ref_parse(enum cd_option_type type, const char *t, long long *out)
{
    unsigned __int128 v;
    switch (type) {
    case CD_TYPE_BOOL:
        if (same_word(t, "1") || same_word(t, "true") || same_word(t, "yes") ||
            same_word(t, "on")) {
            *out = 1;
            return true;
        }
        if (same_word(t, "0") || same_word(t, "false") || same_word(t, "no") ||
            same_word(t, "off")) {
            *out = 0;
            return true;
        }
        return false;
    case CD_TYPE_SIZE: {
        if (!ref_digits(&t, &v))
            return false;
        unsigned shift = 0;
        if (*t) {
            switch (lower((unsigned char)*t)) {
            case 'k': shift = 10; break;
            case 'm': shift = 20; break;
            case 'g': shift = 30; break;
            case 't': shift = 40; break;
            default: return false;
            }
            t++;
            if (*t == 'i')
                t++;
            if (*t == 'B' || *t == 'b')
                t++;
        }
        if (*t)
            return false;
        v <<= shift;
        if (v > (unsigned __int128)INT64_MAX)
            return false;
        *out = (long long)v;
        return true;
    }
    case CD_TYPE_COUNT:
        if (!ref_digits(&t, &v) || *t || v > (unsigned __int128)INT64_MAX)
            return false;
        *out = (long long)v;
        return true;
    case CD_TYPE_LEVEL: {
        static const char *const names[] = {"off", "error", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (same_word(t, names[i])) {
                *out = i;
                return true;
            }
        if (!ref_digits(&t, &v) || *t || v > 3)
            return false;
        *out = (long long)v;
        return true;
    }
    case CD_TYPE_STRING:
    case CD_TYPE_CHOICE:
        return false;
    }
    return false;
}

static bool ref_parse_row(const struct cd_option_desc *d, const char *t, long long *out)
{
    if (d->type != CD_TYPE_CHOICE)
        return ref_parse(d->type, t, out);
    for (long long i = 0; d->choices[i]; i++) {
        if (same_word(t, d->choices[i])) {
            *out = i;
            return true;
        }
    }
    return ref_parse(CD_TYPE_BOOL, t, out);
}

static long long choices_of(const struct cd_option_desc *d)
{
    long long n = 0;
    while (d->choices[n])
        n++;
    return n;
}

static void in_range(enum cd_option_type type, long long v, const char *text)
{
    bool ok = true;
    switch (type) {
    case CD_TYPE_BOOL: ok = v == 0 || v == 1; break;
    case CD_TYPE_SIZE:
    case CD_TYPE_COUNT: ok = v >= 0; break; /* and <= INT64_MAX by its type */
    case CD_TYPE_LEVEL: ok = v >= 0 && v <= 3; break;
    case CD_TYPE_STRING:
    case CD_TYPE_CHOICE: ok = false; break;
    }
    if (!ok) {
        fprintf(stderr, "type %d: '%s' parsed to %lld, out of range\n", (int)type, text, v);
        abort();
    }
}

/* ---- mode 0-6: one value ------------------------------------------------- */

static void fuzz_parse(unsigned mode, const char *text)
{
    enum cd_option_type type = (enum cd_option_type)mode; /* 6: out of range */
    const long long sentinel = 0x5a5a5a5a5a5a5a5all;
    long long got = sentinel, want = sentinel;
    bool ok = cd_option_parse(type, text, &got);
    bool ref_ok = mode < 6 && ref_parse(type, text, &want);
    if (!ok && got != sentinel) {
        fprintf(stderr, "type %d: '%s' rejected but the output changed to %lld\n", (int)type,
                text, got);
        abort();
    }
    if (ok != ref_ok || (ok && got != want)) {
        fprintf(stderr, "type %d: '%s': parser %s (%lld), reference %s (%lld)\n", (int)type,
                text, ok ? "accepts" : "rejects", got, ref_ok ? "accepts" : "rejects", want);
        abort();
    }
    if (ok)
        in_range(type, got, text);
    /* NULL text or output: rejected, nothing written. */
    got = sentinel;
    if (cd_option_parse(type, NULL, &got) || got != sentinel || cd_option_parse(type, text, NULL)) {
        fprintf(stderr, "type %d: a NULL argument was accepted\n", (int)type);
        abort();
    }
}

/* ---- mode 7-8: the environment ------------------------------------------- */

#define VALUE_MAX 1024
static char env_buf[CD_OPT_COUNT][sizeof "CUDEFER_" + 64 + VALUE_MAX];
static bool env_set[CD_OPT_COUNT];

static const char *env_name(int opt)
{
    static char names[CD_OPT_COUNT][sizeof "CUDEFER_" + 64];
    if (!names[opt][0])
        snprintf(names[opt], sizeof names[opt], "CUDEFER_%s",
                 cd_option_desc((enum cd_option)opt)->name);
    return names[opt];
}

static void env_unset(int opt)
{
    unsetenv(env_name(opt));
    env_set[opt] = false;
}

static void env_put(int opt, const char *value, size_t len)
{
    if (len > VALUE_MAX)
        len = VALUE_MAX;
    /* Out of the environment while its buffer changes. */
    env_unset(opt);
    int n = snprintf(env_buf[opt], sizeof env_buf[opt], "%s=", env_name(opt));
    memcpy(env_buf[opt] + n, value, len);
    env_buf[opt][n + (int)len] = 0;
    putenv(env_buf[opt]);
    env_set[opt] = true;
}

static const char *env_value(int opt)
{
    return env_set[opt] ? strchr(env_buf[opt], '=') + 1 : NULL;
}

static void fuzz_environment(const uint8_t *data, size_t size)
{
    for (int i = 0; i < CD_OPT_COUNT; i++)
        env_unset(i);
    while (size) {
        const uint8_t *end = memchr(data, '\n', size);
        size_t len = end ? (size_t)(end - data) : size;
        if (len) {
            int opt = (data[0] & 0x7f) % CD_OPT_COUNT;
            if (data[0] & 0x80) {
                env_unset(opt);
            } else {
                /* Up to a NUL: an environment value is a C string. */
                const uint8_t *nul = memchr(data + 1, 0, len - 1);
                env_put(opt, (const char *)data + 1, nul ? (size_t)(nul - data - 1) : len - 1);
            }
        }
        data += len + (end != NULL);
        size -= len + (end != NULL);
    }

    warnings = 0;
    cd_options_reload();

    int invalid = 0;
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = cd_option_desc((enum cd_option)i);
        const char *text = env_value(i);
        if (d->type == CD_TYPE_STRING) {
            /* Copied when read: the environment may change afterwards. */
            const char *got = cd_option_str((enum cd_option)i);
            if (strcmp(got, text ? text : "") != 0) {
                fprintf(stderr, "%s='%s' reads back as '%s'\n", env_name(i), text ? text : "",
                        got);
                abort();
            }
            continue;
        }
        long long want;
        if (!ref_parse_row(d, d->default_text, &want)) {
            fprintf(stderr, "%s: the default '%s' does not parse\n", env_name(i),
                    d->default_text);
            abort();
        }
        if (text && *text) {
            long long v;
            if (ref_parse_row(d, text, &v))
                want = v;
            else
                invalid++;
        }
        long long got = cd_option_int((enum cd_option)i);
        if (got != want) {
            fprintf(stderr, "%s='%s' reads back as %lld, expected %lld\n", env_name(i),
                    text ? text : "(unset)", got, want);
            abort();
        }
        if (d->type == CD_TYPE_CHOICE) {
            if (got < 0 || got >= choices_of(d))
                abort();
        } else {
            in_range(d->type, got, text ? text : "(unset)");
        }
        if (d->type == CD_TYPE_BOOL && cd_option_bool((enum cd_option)i) != (want != 0))
            abort();
    }
    if (warnings != invalid) {
        fprintf(stderr, "%d invalid values gave %d warnings (last: %s)\n", invalid, warnings,
                last_warning);
        abort();
    }
    /* Out-of-range rows are refused. */
    if (cd_option_desc(CD_OPT_COUNT) || cd_option_desc((enum cd_option)-1))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned mode = data[0] % 9;
    if (mode < 7) {
        char text[4096];
        size_t n = size - 1 < sizeof text - 1 ? size - 1 : sizeof text - 1;
        memcpy(text, data + 1, n);
        text[n] = 0;
        fuzz_parse(mode, text);
        return 0;
    }
    fuzz_environment(data + 1, size - 1);
    return 0;
}
