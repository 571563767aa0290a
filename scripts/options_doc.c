/* options_doc.c - fills the CUDEFER_* table of shim/base/options.c into the
 * templates of the cudefer command and of its man page, at build time, so
 * that the variables they list are the table's own rows.
 *
 * usage: options_doc [--executable] TEMPLATE OUTPUT [NAME=VALUE]...
 *
 * Copies TEMPLATE to OUTPUT, replacing:
 *   a line @OPTIONS_HELP@  with every variable as the command's --help lists
 *                          it: "  CUDEFER_NAME=DEFAULT" ("  CUDEFER_NAME
 *                          (unset)" without a default), then its help text
 *                          wrapped at 79 columns and indented by 6
 *   a line @OPTIONS_MAN@   with the same as man(7) paragraphs (.TP)
 *   @KINDS@                with the kinds that --off takes: the per-kind
 *                          switches, CUDEFER_DEVICE to CUDEFER_LIBRARY, in
 *                          lower case and separated by spaces
 *   @NAME@                 with VALUE, for each NAME=VALUE argument
 * Any other @NAME@ (capitals, digits and '_') is an error, so that a
 * misspelt token cannot reach an installed file. --executable makes OUTPUT
 * rwxr-xr-x. Exit status 0, or 1 with a message on stderr.
 */
#include "options.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { WIDTH = 79, HELP_INDENT = 6, MAX_VALUES = 16 };

struct value {
    const char *name; /* without the @s */
    size_t len;
    const char *text;
};

static struct value values[MAX_VALUES];
static int nvalues;
static const char *output_path;

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "options_doc: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    if (output_path)
        remove(output_path);
    exit(1);
}

static const struct cd_option_desc *row(int i)
{
    return cd_option_desc((enum cd_option)i);
}

/* Writes text as lines of at most width columns (a longer word gets a line
 * of its own), each indented by indent spaces. */
static void write_wrapped(FILE *out, const char *text, int indent, int width)
{
    const char *p = text;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p)
            return;
        const char *end = p;
        int col = indent;
        for (;;) {
            const char *word = end;
            while (*word == ' ')
                word++;
            const char *word_end = word;
            while (*word_end && *word_end != ' ')
                word_end++;
            if (word_end == word)
                break;
            int add = (int)(word_end - end);
            if (end != p && col + add > width)
                break;
            col += add;
            end = word_end;
        }
        fprintf(out, "%*s%.*s\n", indent, "", (int)(end - p), p);
        p = end;
    }
}

static void write_help(FILE *out)
{
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = row(i);
        if (*d->default_text)
            fprintf(out, "  CUDEFER_%s=%s\n", d->name, d->default_text);
        else
            fprintf(out, "  CUDEFER_%s (unset)\n", d->name);
        write_wrapped(out, d->help, HELP_INDENT, WIDTH);
    }
}

/* Text for one roff line: backslashes escaped, and a leading '.' or '\''
 * kept from being read as a request. */
static void write_roff_text(FILE *out, const char *text)
{
    if (*text == '.' || *text == '\'')
        fputs("\\&", out);
    for (const char *p = text; *p; p++) {
        if (*p == '\\')
            fputs("\\e", out);
        else
            fputc(*p, out);
    }
}

static void write_man(FILE *out)
{
    for (int i = 0; i < CD_OPT_COUNT; i++) {
        const struct cd_option_desc *d = row(i);
        fprintf(out, ".TP\n.BR CUDEFER_%s \"", d->name);
        if (*d->default_text) {
            fputc('=', out);
            write_roff_text(out, d->default_text);
        } else {
            fputs(" (unset)", out);
        }
        fputs("\"\n", out);
        write_roff_text(out, d->help);
        fputc('\n', out);
    }
}

/* The per-kind switches, which --off KIND sets to 0. */
static void write_kinds(FILE *out)
{
    for (int i = CD_OPT_DEVICE; i <= CD_OPT_LIBRARY; i++) {
        if (i > CD_OPT_DEVICE)
            fputc(' ', out);
        for (const char *p = row(i)->name; *p; p++)
            fputc(tolower((unsigned char)*p), out);
    }
}

/* The length of the token name at p (just after an '@') when a valid token
 * NAME@ starts there, else 0. */
static size_t token_length(const char *p)
{
    size_t n = 0;
    if (!isupper((unsigned char)p[0]))
        return 0;
    while (isupper((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '_')
        n++;
    return p[n] == '@' ? n : 0;
}

static void write_line(FILE *out, const char *line, const char *template, long lineno)
{
    for (const char *p = line; *p; p++) {
        size_t n = *p == '@' ? token_length(p + 1) : 0;
        if (!n) {
            fputc(*p, out);
            continue;
        }
        const char *name = p + 1;
        if (n == 5 && strncmp(name, "KINDS", n) == 0) {
            write_kinds(out);
        } else {
            int v = 0;
            while (v < nvalues && !(values[v].len == n && strncmp(values[v].name, name, n) == 0))
                v++;
            if (v == nvalues) {
                char where[512];
                snprintf(where, sizeof where, "@%.*s@ in %s, line %ld", (int)n, name, template,
                         lineno);
                fail("no value for", where);
            }
            fputs(values[v].text, out);
        }
        p += n + 1;
    }
}

int main(int argc, char **argv)
{
    int arg = 1;
    int executable = arg < argc && strcmp(argv[arg], "--executable") == 0;
    arg += executable;
    if (argc - arg < 2) {
        fprintf(stderr, "usage: options_doc [--executable] TEMPLATE OUTPUT [NAME=VALUE]...\n");
        return 1;
    }
    const char *template = argv[arg++];
    const char *output = argv[arg++];
    for (; arg < argc; arg++) {
        const char *eq = strchr(argv[arg], '=');
        if (!eq || eq == argv[arg] || nvalues == MAX_VALUES)
            fail("not a NAME=VALUE argument, or too many", argv[arg]);
        values[nvalues++] = (struct value){argv[arg], (size_t)(eq - argv[arg]), eq + 1};
    }

    FILE *in = fopen(template, "r");
    if (!in)
        fail("cannot read", template);
    FILE *out = fopen(output, "w");
    if (!out)
        fail("cannot write", output);
    output_path = output;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    while ((len = getline(&line, &cap, in)) >= 0) {
        lineno++;
        if (strcmp(line, "@OPTIONS_HELP@\n") == 0)
            write_help(out);
        else if (strcmp(line, "@OPTIONS_MAN@\n") == 0)
            write_man(out);
        else
            write_line(out, line, template, lineno);
    }
    free(line);
    fclose(in);
    if (fclose(out) != 0)
        fail("cannot write", output);
    if (executable && chmod(output, 0755) != 0)
        fail("cannot make executable", output);
    return 0;
}
