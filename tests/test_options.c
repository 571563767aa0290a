/* test_options.c - parsing of CUDEFER_* values, and the README's table of
 * variables against the options table. Links shim/options.c directly. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

Test(options, booleans)
{
    long long v = -1;
    const char *yes[] = {"1", "true", "YES", "on"}, *no[] = {"0", "False", "no", "OFF"};
    for (int i = 0; i < 4; i++) {
        cr_expect(cd_option_parse(CD_TYPE_BOOL, yes[i], &v) && v == 1, "%s", yes[i]);
        cr_expect(cd_option_parse(CD_TYPE_BOOL, no[i], &v) && v == 0, "%s", no[i]);
    }
    v = 7;
    cr_expect_not(cd_option_parse(CD_TYPE_BOOL, "maybe", &v));
    cr_expect_eq(v, 7, "a rejected value must leave the output alone");
}

Test(options, sizes)
{
    long long v;
    cr_expect(cd_option_parse(CD_TYPE_SIZE, "4096", &v) && v == 4096);
    cr_expect(cd_option_parse(CD_TYPE_SIZE, "256M", &v) && v == 256ll << 20);
    cr_expect(cd_option_parse(CD_TYPE_SIZE, "2GiB", &v) && v == 2ll << 30);
    cr_expect(cd_option_parse(CD_TYPE_SIZE, "1k", &v) && v == 1024);
    cr_expect_not(cd_option_parse(CD_TYPE_SIZE, "-1", &v));
    cr_expect_not(cd_option_parse(CD_TYPE_SIZE, "12Q", &v));
    cr_expect_not(cd_option_parse(CD_TYPE_SIZE, "", &v));
    cr_expect_not(cd_option_parse(CD_TYPE_SIZE, "99999999999999999999", &v));
    cr_expect_not(cd_option_parse(CD_TYPE_SIZE, "9999999999T", &v), "overflow");
    cr_expect_not(cd_option_parse(CD_TYPE_COUNT, "5M", &v), "counts take no suffix");
}

Test(options, levels)
{
    long long v;
    cr_expect(cd_option_parse(CD_TYPE_LEVEL, "debug", &v) && v == 3);
    cr_expect(cd_option_parse(CD_TYPE_LEVEL, "off", &v) && v == 0);
    cr_expect(cd_option_parse(CD_TYPE_LEVEL, "2", &v) && v == 2);
    cr_expect_not(cd_option_parse(CD_TYPE_LEVEL, "9", &v));
    cr_expect_not(cd_option_parse(CD_TYPE_LEVEL, "loud", &v));
}

Test(options, choices)
{
    const struct cd_option_desc *d = cd_option_desc(CD_OPT_REGISTERED);
    long long v = -1;
    cr_expect(cd_option_parse_row(d, "defer", &v) && v == CD_REGISTERED_DEFER);
    cr_expect(cd_option_parse_row(d, "WAIT", &v) && v == CD_REGISTERED_WAIT);
    cr_expect(cd_option_parse_row(d, "off", &v) && v == CD_REGISTERED_OFF);
    cr_expect(cd_option_parse_row(d, "0", &v) && v == CD_REGISTERED_OFF, "0 is off");
    cr_expect(cd_option_parse_row(d, "on", &v) && v == CD_REGISTERED_WAIT, "on is the first mode");
    v = 7;
    cr_expect_not(cd_option_parse_row(d, "later", &v));
    cr_expect_eq(v, 7, "a rejected value must leave the output alone");
    cr_expect_not(cd_option_parse(CD_TYPE_CHOICE, "wait", &v), "a choice needs its row");
}

Test(options, strings_are_copied)
{
    setenv("CUDEFER_REPORT", "/tmp/first-%p.json", 1);
    cd_options_reload();
    const char *before = cd_option_str(CD_OPT_REPORT);
    /* A program that rewrites its environment (setproctitle) changes
     * nothing cudefer read. */
    setenv("CUDEFER_REPORT", "/tmp/other.json", 1);
    cr_expect_str_eq(cd_option_str(CD_OPT_REPORT), "/tmp/first-%p.json");
    cr_expect_str_eq(before, "/tmp/first-%p.json");
    char text[64];
    cd_option_text(CD_OPT_REGISTERED, text, sizeof text);
    cr_expect_str_eq(text, "wait");
    unsetenv("CUDEFER_REPORT");
}

Test(options, environment_and_defaults)
{
    setenv("CUDEFER_MAX_DEFERRED_BYTES", "64M", 1);
    setenv("CUDEFER_HOST", "off", 1);
    setenv("CUDEFER_MAX_DEFERRED_ENTRIES", "lots", 1);
    cd_options_reload();
    cr_expect_eq(cd_option_int(CD_OPT_MAX_DEFERRED_BYTES), 64ll << 20);
    cr_expect_not(cd_option_bool(CD_OPT_HOST));
    cr_expect(cd_option_bool(CD_OPT_DEVICE), "unset means the default");
    cr_expect_eq(cd_option_int(CD_OPT_MAX_DEFERRED_ENTRIES), 4096, "invalid means the default");
    cr_expect_str_eq(cd_option_str(CD_OPT_DRIVER), "");
}

Test(options, every_default_parses)
{
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = cd_option_desc((enum cd_option)i);
        long long v;
        cr_assert_not_null(d);
        cr_expect(d->type == CD_TYPE_STRING || cd_option_parse_row(d, d->default_text, &v),
                  "CUDEFER_%s: default '%s' does not parse", d->name, d->default_text);
        cr_expect_gt(strlen(d->help), 10, "CUDEFER_%s has no help", d->name);
    }
}

/* The README lists every variable, with the table's default and help. */
Test(options, readme_table_matches)
{
    FILE *f = fopen(README_PATH, "r");
    cr_assert_not_null(f, "cannot open %s", README_PATH);
    static char text[1 << 18];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    int rows = 0;
    /* Rows of the variables table start a line (other tables name the
     * variables inside their rows). */
    for (const char *p = text; (p = strstr(p, "\n| `CUDEFER_")); p++)
        rows++;
    cr_expect_eq(rows, CD_OPT_COUNT, "the README has %d CUDEFER_ rows, the table %d", rows,
                 CD_OPT_COUNT);
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = cd_option_desc((enum cd_option)i);
        char row[1024];
        snprintf(row, sizeof row, "| `CUDEFER_%s` | %s | %s |", d->name,
                 *d->default_text ? d->default_text : "(unset)", d->help);
        cr_expect_not_null(strstr(text, row), "README lacks the row:\n%s", row);
    }
}
