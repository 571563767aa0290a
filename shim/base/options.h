/* options.h - the CUDEFER_* environment variables.
 *
 * Every tunable is one row of the table in options.c: name, type, default,
 * help. The environment is read once, at the first use of an option, and
 * every value is copied then: a program that rewrites its environment area
 * afterwards (process-title libraries do) changes nothing. A variable that
 * was set when cudefer was loaded and is gone from the environment by the
 * first use (its area written over) keeps its value from the load. An
 * invalid value gives one warning naming the variable, and the default.
 */
#ifndef CUDEFER_OPTIONS_H
#define CUDEFER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

enum cd_option {
    CD_OPT_ENABLE,
    CD_OPT_DEVICE,
    CD_OPT_MANAGED,
    CD_OPT_HOST,
    CD_OPT_REGISTERED,
    CD_OPT_ARRAY,
    CD_OPT_MODULE,
    CD_OPT_LIBRARY,
    CD_OPT_MAX_DEFERRED_BYTES,
    CD_OPT_MAX_DEFERRED_ENTRIES,
    CD_OPT_DEVICE_CACHE,
    CD_OPT_DEVICE_CACHE_PEAK,
    CD_OPT_REUSE_WAIT,
    CD_OPT_FENCE_WORD,
    CD_OPT_KEEP,
    CD_OPT_LOG,
    CD_OPT_STATS,
    CD_OPT_REPORT,
    CD_OPT_SAVINGS,
    CD_OPT_DRIVER,
    CD_OPT_COUNT
};

enum cd_option_type {
    CD_TYPE_BOOL,   /* 1/true/yes/on, 0/false/no/off */
    CD_TYPE_SIZE,   /* a count of bytes, with an optional K, M, G or T suffix */
    CD_TYPE_COUNT,  /* a plain non-negative count */
    CD_TYPE_LEVEL,  /* off, error, info, debug, or 0..3 */
    CD_TYPE_STRING,
    CD_TYPE_CHOICE, /* one of the row's choices (its index); the boolean
                       words name the first two */
};

/* CUDEFER_REGISTERED, in the order of its choices. */
enum cd_registered_mode { CD_REGISTERED_OFF, CD_REGISTERED_WAIT, CD_REGISTERED_DEFER };

struct cd_option_desc {
    const char *name;       /* without the CUDEFER_ prefix */
    enum cd_option_type type;
    const char *default_text;
    const char *help;
    const char *const *choices; /* CD_TYPE_CHOICE: NULL-terminated */
};

/* The row of one option, or NULL past the table. */
const struct cd_option_desc *cd_option_desc(enum cd_option opt);

long long cd_option_int(enum cd_option opt); /* every type but string */
bool cd_option_bool(enum cd_option opt);
const char *cd_option_str(enum cd_option opt); /* "" when unset */

/* The value in force, as text (for the report and the start-up lines). */
void cd_option_text(enum cd_option opt, char *buf, size_t size);

/* Parses text as a value of the given type (not CD_TYPE_CHOICE, whose
 * values depend on the row: cd_option_parse_row). Returns false, leaving
 * *out alone, when text is not a valid value. */
bool cd_option_parse(enum cd_option_type type, const char *text, long long *out);
bool cd_option_parse_row(const struct cd_option_desc *d, const char *text, long long *out);

/* Reads every option from the environment again; a forked child or a test
 * that changed the environment calls this. Not thread-safe against readers. */
void cd_options_reload(void);

/* Prints every option's value, once, at log level info. */
void cd_options_print(void);

#endif
