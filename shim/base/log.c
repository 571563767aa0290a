/* log.c - formatting into a stack buffer and one write(2) per message. */
#include "log.h"

#include "options.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static _Thread_local int in_log;

int cd_log_level(void)
{
    return (int)cd_option_int(CD_OPT_LOG);
}

static void emit(const char *prefix, const char *fmt, va_list ap)
{
    if (in_log)
        return;
    in_log = 1;
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 1)
        len = sizeof buf - 1;
    if (*prefix && len < sizeof buf - 1)
        buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
    in_log = 0;
}

void cd_log(enum cd_log_level level, const char *fmt, ...)
{
    if (level == CD_LOG_OFF || (int)level > cd_log_level())
        return;
    va_list ap;
    va_start(ap, fmt);
    emit("cudefer: ", fmt, ap);
    va_end(ap);
}

void cd_log_raw(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("", fmt, ap);
    va_end(ap);
}
