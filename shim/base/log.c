/* log.c - messages on the stderr cudefer started with. */
#include "log.h"

#include "nvtx.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* The duplicate of the original stderr, and what it was (device and inode),
 * so that a descriptor closed by the program and reused for another file is
 * recognised and left alone. */
static struct {
    _Atomic int fd;
    dev_t dev;
    ino_t ino;
} out = {-1, 0, 0};

static _Atomic int level = CD_LOG_ERROR;
static _Thread_local bool in_log;

void cd_log_reopen(void)
{
    struct stat st;
    int old = atomic_exchange(&out.fd, -1);
    if (old >= 0)
        close(old);
    /* Above the descriptors programs use for their own files, close-on-exec
     * (an exec'd program loads cudefer anew). */
    int fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 64);
    if (fd < 0)
        return;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return;
    }
    out.dev = st.st_dev;
    out.ino = st.st_ino;
    atomic_store(&out.fd, fd);
}

static pthread_once_t opened = PTHREAD_ONCE_INIT;

/* At load time, and at the first message if that comes first (the
 * options are read by a constructor of their own). */
__attribute__((constructor)) static void log_init(void)
{
    pthread_once(&opened, cd_log_reopen);
}

void cd_log_set_level(enum cd_log_level l)
{
    atomic_store(&level, (int)l);
}

enum cd_log_level cd_log_level(void)
{
    return (enum cd_log_level)atomic_load(&level);
}

/* The descriptor to write to, or -1 when the original stderr is gone. */
static int output(void)
{
    struct stat st;
    pthread_once(&opened, cd_log_reopen);
    int fd = atomic_load(&out.fd);
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_dev != out.dev || st.st_ino != out.ino)
        return -1;
    return fd;
}

static void emit(const char *prefix, const char *fmt, va_list ap)
{
    if (in_log)
        return;
    in_log = true;
    int fd = output();
    if (fd >= 0) {
        char buf[1024];
        int n = snprintf(buf, sizeof buf, "%s", prefix);
        int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
        size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
        if (len > sizeof buf - 1)
            len = sizeof buf - 1;
        if (*prefix && len < sizeof buf - 1)
            buf[len++] = '\n';
        ssize_t w = write(fd, buf, len);
        (void)w;
    }
    in_log = false;
}

void cd_log(enum cd_log_level l, const char *fmt, ...)
{
    if (l == CD_LOG_OFF || (int)l > atomic_load(&level))
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

/* ---- NVTX (nvtx.h) --------------------------------------------------------- */

static pthread_once_t nvtx_once = PTHREAD_ONCE_INIT;

static void nvtx_first_call(void)
{
#ifdef CUDEFER_HAVE_NVTX
    nvtxInitialize(NULL);
#endif
}

void cd_range_init(void)
{
    pthread_once(&nvtx_once, nvtx_first_call);
}
