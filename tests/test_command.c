/* test_command.c - the cudefer command (scripts/cudefer.in, as the build
 * makes it): its --help and its man page list the options table of
 * shim/base/options.c, row for row (the README's table is checked against
 * the same table by test_options.c), and its options set the environment of
 * the program it runs. Links shim/base/options.c directly.
 *
 * Compiled with COMMAND_PATH, MAN_PATH (the built command and man page) and
 * VERSION (the project's). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "options.h"

enum { OUTPUT_MAX = 1 << 16 };

/* Runs a shell command line; its standard output goes to out. Returns its
 * exit status (-1 when it did not exit). */
static int run(const char *command, char *out, size_t size)
{
    FILE *p = popen(command, "r");
    cr_assert_not_null(p, "popen(%s)", command);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s", path);
    char *text = malloc(OUTPUT_MAX);
    size_t n = fread(text, 1, OUTPUT_MAX - 1, f);
    fclose(f);
    text[n] = 0;
    return text;
}

/* Collapses runs of white space to one space and trims both ends, in place. */
static char *squeeze(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (isspace((unsigned char)*r)) {
            if (w != s && w[-1] != ' ')
                *w++ = ' ';
        } else {
            *w++ = *r;
        }
    }
    if (w != s && w[-1] == ' ')
        w--;
    *w = 0;
    return s;
}

/* What the command and the man page show as a row's default: "=DEFAULT",
 * or " (unset)" when it has none. */
static void shown_default(const struct cd_option_desc *d, char *buf, size_t size)
{
    if (*d->default_text)
        snprintf(buf, size, "=%s", d->default_text);
    else
        snprintf(buf, size, " (unset)");
}

/* One variable as a document lists it. */
struct entry {
    char name[64];  /* without CUDEFER_ */
    char shown[64]; /* "=DEFAULT" or " (unset)" */
    char help[2048];
};

/* --help: "  CUDEFER_NAME=DEFAULT" or "  CUDEFER_NAME (unset)", then the
 * help text on lines indented by 6. Returns the number of entries. */
static int parse_help(char *text, struct entry *e, int max)
{
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "  CUDEFER_", 10) == 0) {
            cr_assert_lt(n, max, "more entries than the table has rows");
            const char *name = line + 10;
            size_t len = strcspn(name, "= ");
            snprintf(e[n].name, sizeof e[n].name, "%.*s", (int)len, name);
            snprintf(e[n].shown, sizeof e[n].shown, "%s", name + len);
            e[n].help[0] = 0;
            n++;
        } else if (n && strncmp(line, "      ", 6) == 0 && line[6] != ' ') {
            size_t used = strlen(e[n - 1].help);
            snprintf(e[n - 1].help + used, sizeof e[n - 1].help - used, " %s", line + 6);
        } else if (n && line[0] != ' ') {
            break; /* the next section */
        }
    }
    for (int i = 0; i < n; i++)
        squeeze(e[i].help);
    return n;
}

/* Undoes the man page's escapes of plain text: "\&" at the start, "\e". */
static void unroff(const char *in, char *out, size_t size)
{
    size_t w = 0;
    if (strncmp(in, "\\&", 2) == 0)
        in += 2;
    for (; *in && w + 1 < size; in++) {
        if (in[0] == '\\' && in[1] == 'e') {
            out[w++] = '\\';
            in++;
        } else {
            out[w++] = *in;
        }
    }
    out[w] = 0;
}

/* The man page: ".BR CUDEFER_NAME \"=DEFAULT\"" (or "\" (unset)\""), then
 * the help text on one line. */
static int parse_man(char *text, struct entry *e, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, ".BR CUDEFER_", 12) != 0)
            continue;
        cr_assert_lt(n, max, "more entries than the table has rows");
        const char *name = line + 12;
        size_t len = strcspn(name, " ");
        snprintf(e[n].name, sizeof e[n].name, "%.*s", (int)len, name);
        const char *quoted = strchr(name + len, '"');
        cr_assert_not_null(quoted, "man: no default on the line %s", line);
        snprintf(e[n].shown, sizeof e[n].shown, "%.*s", (int)strcspn(quoted + 1, "\""),
                 quoted + 1);
        char *help = strtok_r(NULL, "\n", &save);
        cr_assert_not_null(help, "man: CUDEFER_%s has no text", e[n].name);
        unroff(help, e[n].help, sizeof e[n].help);
        squeeze(e[n].help);
        n++;
    }
    return n;
}

/* Each entry is the table's row of the same position. */
static void expect_table(const char *document, const struct entry *e, int n)
{
    cr_expect_eq(n, CD_OPT_COUNT, "%s lists %d variables, the options table %d", document, n,
                 CD_OPT_COUNT);
    for (int i = 0; i < n && i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = cd_option_desc((enum cd_option)i);
        char shown[64], help[2048];
        shown_default(d, shown, sizeof shown);
        snprintf(help, sizeof help, "%s", d->help);
        squeeze(help);
        cr_expect_str_eq(e[i].name, d->name, "%s, entry %d: CUDEFER_%s where the table has %s",
                         document, i, e[i].name, d->name);
        cr_expect_str_eq(e[i].shown, shown, "%s, CUDEFER_%s: default '%s', table '%s'", document,
                         d->name, e[i].shown, shown);
        cr_expect_str_eq(e[i].help, help, "%s, CUDEFER_%s: help\n  '%s'\ntable:\n  '%s'",
                         document, d->name, e[i].help, help);
    }
}

Test(command, help_lists_the_options_table)
{
    static char out[OUTPUT_MAX];
    cr_assert_eq(run("bash '" COMMAND_PATH "' --help", out, sizeof out), 0);
    static struct entry e[CD_OPT_COUNT + 1];
    expect_table("cudefer --help", e, parse_help(out, e, CD_OPT_COUNT + 1));
}

Test(command, man_page_lists_the_options_table)
{
    char *text = read_file(MAN_PATH);
    static struct entry e[CD_OPT_COUNT + 1];
    expect_table("cudefer.1", e, parse_man(text, e, CD_OPT_COUNT + 1));
    cr_expect_null(strstr(text, "@OPTIONS_"), "a template line was left");
    free(text);
}

/* The kinds of --off are the table's per-kind switches. */
Test(command, off_kinds_name_rows_of_the_table)
{
    char *text = read_file(COMMAND_PATH);
    const char *line = strstr(text, "\nkinds=(");
    cr_assert_not_null(line, "the command has no kinds=(...) line");
    char list[256];
    snprintf(list, sizeof list, "%.*s", (int)strcspn(line + 8, ")"), line + 8);
    int kinds = 0;
    for (char *k = strtok(list, " "); k; k = strtok(NULL, " "), kinds++) {
        bool found = false;
        for (int i = 0; i < CD_OPT_COUNT; i++)
            found |= strcasecmp(cd_option_desc((enum cd_option)i)->name, k) == 0;
        cr_expect(found, "--off %s names no CUDEFER_ variable", k);
    }
    cr_expect_eq(kinds, CD_OPT_LIBRARY - CD_OPT_DEVICE + 1);
    free(text);
}

/* The path of the library that holds fn. */
static const char *library_of(void *fn)
{
    Dl_info info;
    cr_assert(dladdr(fn, &info) && info.dli_fname, "dladdr");
    return info.dli_fname;
}

/* The options become the program's environment; LD_PRELOAD gets the
 * library in front of what it had. Two of glibc's own libraries stand in
 * for the preloaded ones, so that /usr/bin/env runs unchanged. */
Test(command, options_set_the_programs_environment)
{
    char libm[1024], libc[1024];
    double (*volatile cosine)(double) = cos;
    snprintf(libm, sizeof libm, "%s", library_of((void *)cosine));
    snprintf(libc, sizeof libc, "%s", library_of((void *)gnu_get_libc_version));
    char cwd[1024];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));

    static char command[8192], out[OUTPUT_MAX];
    snprintf(command, sizeof command,
             "env -u CUDEFER_STATS -u CUDEFER_REPORT -u CUDEFER_LOG CUDEFER_ARRAY=0 "
             "LD_PRELOAD='%s' bash '" COMMAND_PATH "' --library '%s' --stats "
             "--report out/r-%%p.json --log=info --off device -o HOST -- /usr/bin/env",
             libc, libm);
    cr_assert_eq(run(command, out, sizeof out), 0, "%s", command);

    char want[4096];
    snprintf(want, sizeof want, "\nLD_PRELOAD=%s:%s\n", libm, libc);
    cr_expect_not_null(strstr(out, want), "no line %s in:\n%s", want + 1, out);
    snprintf(want, sizeof want, "\nCUDEFER_REPORT=%s/out/r-%%p.json\n", cwd);
    cr_expect_not_null(strstr(out, want), "no line %s in:\n%s", want + 1, out);
    const char *lines[] = {"\nCUDEFER_STATS=1\n", "\nCUDEFER_LOG=info\n", "\nCUDEFER_DEVICE=0\n",
                           "\nCUDEFER_HOST=0\n", "\nCUDEFER_ARRAY=0\n"};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
        cr_expect_not_null(strstr(out, lines[i]), "no line %s in:\n%s", lines[i] + 1, out);
    cr_expect_null(strstr(out, "\nCUDEFER_MANAGED="), "an option nobody set is set");
}

Test(command, quiet_then_log_the_last_wins)
{
    static char out[OUTPUT_MAX];
    char libm[1024], command[4096];
    double (*volatile cosine)(double) = cos;
    snprintf(libm, sizeof libm, "%s", library_of((void *)cosine));
    snprintf(command, sizeof command,
             "env -u LD_PRELOAD bash '" COMMAND_PATH "' --library '%s' -q /usr/bin/env", libm);
    cr_assert_eq(run(command, out, sizeof out), 0);
    cr_expect_not_null(strstr(out, "\nCUDEFER_LOG=off\n"), "%s", out);
    char want[2048];
    snprintf(want, sizeof want, "\nLD_PRELOAD=%s\n", libm);
    cr_expect_not_null(strstr(out, want), "without an LD_PRELOAD, only the library: %s", out);
}

Test(command, version)
{
    static char out[OUTPUT_MAX];
    cr_assert_eq(run("bash '" COMMAND_PATH "' --version", out, sizeof out), 0);
    cr_expect_eq(strncmp(out, "cudefer " VERSION "\n", strlen("cudefer " VERSION "\n")), 0,
                 "%s", out);
}

Test(command, wrong_uses_exit_with_their_status)
{
    static char out[OUTPUT_MAX];
    struct {
        const char *args;
        int status;
    } cases[] = {
        {"--off bogus true", 2},
        {"--bogus true", 2},
        {"--stats", 2},            /* no program */
        {"--report", 2},           /* no value */
        {"--stats=1 true", 2},     /* a value for a flag */
        {"--library /nonexistent/libcudefer.so true", 1},
        {"--library '" COMMAND_PATH "' cudefer-no-such-program", 127}, /* any file will do */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char command[1024];
        snprintf(command, sizeof command, "bash '" COMMAND_PATH "' %s 2>/dev/null",
                 cases[i].args);
        cr_expect_eq(run(command, out, sizeof out), cases[i].status, "cudefer %s",
                     cases[i].args);
    }
}
